//! The frontend: Larder's public API (`/v1/blobs`, operations endpoints) served as HTTP/1.1 and
//! HTTP/2 on one cleartext port (h2c prior knowledge) and optionally one TLS port (ALPN). It
//! reaches storage nodes only through the router.

mod activity;
mod api;
mod body;
mod body_budget;
mod config;
mod connection;
mod error;
mod expect;
mod map_follow;
mod metrics;
mod per_ip;
mod server;
mod sniff;
mod state;

/// Entry points for fuzzers (`fuzz/`): not part of the stable API.
#[doc(hidden)]
pub use api::fuzzing;
pub use config::{DocumentsConfig, FrontendAuth, FrontendConfig, Limits, PublicTls};
pub use server::{serve, Listeners, ShutdownSignal, Signals};
