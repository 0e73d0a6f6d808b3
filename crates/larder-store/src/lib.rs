//! Larder's log store: the durable, checksummed, recoverable store behind every partition replica.
//!
//! One [`Store`] owns one replica directory. It knows nothing about HTTP or the cluster; everything
//! above it relies on one promise: **an acknowledged write survives a crash, and nothing that fails
//! its checksum is ever returned.**
//!
//! The API is blocking (file I/O and `fdatasync`); async callers run it on a blocking thread pool.
//! Writes return only once their record is on stable storage; concurrent writers share one sync
//! (group commit). See `FORMAT.md` in this crate for the on-disk format.

mod api;

pub use api::*;
