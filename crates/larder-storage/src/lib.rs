//! The storage node: serves the internal HTTP/2 API (see `larder-proto`) over one log store per
//! partition replica it hosts. It never talks to clients directly and knows nothing of routing.

mod config;
mod documents;
mod handlers;
mod internal_auth;
mod metrics;
mod node;
mod props;
mod replication;
mod reply;
mod server;

pub use config::{AuthSettings, StorageConfig, StoreSettings};
pub use node::StorageNode;
pub use replication::ReplicationConfig;
pub use server::{serve, ShutdownSignal, Signals};
