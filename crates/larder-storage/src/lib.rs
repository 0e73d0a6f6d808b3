//! The storage node: serves the internal HTTP/2 API (see `larder-proto`) over one log store per
//! partition replica it hosts. It never talks to clients directly and knows nothing of routing.

mod authority;
mod auto_replace;
mod background;
mod blobs;
mod body;
mod bootstrap;
mod bootstrap_apply;
mod changes;
mod compaction;
mod config;
mod connection;
mod documents;
mod error;
mod export;
mod get_batch;
mod horizon;
mod internal_auth;
mod map_routes;
mod map_state;
mod membership;
mod metrics;
mod node;
mod props;
mod put_batch;
mod read_budget;
mod rebuild;
mod replication;
mod reply;
mod routes;
mod server;
mod streamed;
mod validate;
mod visit;

pub use config::{
    AuthSettings, CompactionConfig, ConfigError, Http2Settings, Limits, RedistributionConfig,
    ReplicationConfig, StorageConfig, StoreSettings,
};
pub use map_state::{MapState, OfferKind, MAP_FILE};
pub use node::OpenError;
pub use node::StorageNode;
pub use server::{serve, Listen, ShutdownSignal, Signals};
