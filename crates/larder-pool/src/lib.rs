//! The storage client: per storage node a pool of N HTTP/2 connections, requests spread
//! round-robin, each connection carrying many concurrent streams (Ambry's design: few connections,
//! many streams, large windows and frames for multi-MiB blobs).
//!
//! The pool knows addresses, not the cluster: the router owns placement and quorum.

mod batched;
mod body;
mod config;
mod connection;
mod http1;
mod pool;

pub use batched::BatchedWrites;
pub use body::{empty, full, Body, BoxError};
pub use config::{PoolConfig, PoolProtocol};
pub use pool::{NodePool, PoolError, StoragePool};
