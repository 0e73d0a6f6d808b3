//! The router: turns a blob operation into requests to the right replicas. It owns placement
//! (which partition, which replicas, in which order), quorum, failover, timeouts and node health;
//! the pool below it owns connections, the frontend above it owns the public API.

mod config;
mod health;
mod latency;
mod order;
mod read;
mod router;
mod write;

pub use config::RouterConfig;
pub use health::{NodeHealth, NodeState};
pub use router::{GetAnswer, Router, RouterError, RouterMetrics};
