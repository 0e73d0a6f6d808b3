//! The frontend: Larder's public API (`/v1/blobs`, operations endpoints) served as HTTP/1.1 and
//! HTTP/2 (h2c prior knowledge) on one port. It reaches storage nodes only through the router.

mod api;
mod body;
mod config;
mod error;
mod metrics;
mod server;
mod state;

pub use config::{DocumentsConfig, FrontendConfig, Limits};
pub use server::{serve, ShutdownSignal};
