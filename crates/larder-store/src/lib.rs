//! Larder's log store: the durable, checksummed, recoverable store behind every partition replica.
//!
//! One [`Store`] owns one replica directory. It knows nothing about HTTP or the cluster; everything
//! above it relies on one promise: **an acknowledged write survives a crash, and nothing that fails
//! its checksum is ever returned.**
//!
//! The API is blocking (file I/O and `fdatasync`); async callers run it on a blocking thread pool.
//! Writes return only once their record is on stable storage; concurrent writers share one sync
//! (group commit). See `FORMAT.md` in this crate for the on-disk format.
//!
//! Layout of the implementation, leaves first: `types` (the public types; imports nothing from
//! the crate), `format` (record encoding), `segment` (files and I/O), `scan` (sequential reading),
//! `index`, `waiters` (writers parked on a group commit), `reader` (verified reads), `space` (the
//! free-space reserve); then `engine` (the state of one open store and the decisions of each
//! operation), with its parts `commit` (write path and group commit), `checkpoint`, `recovery`
//! (open) and `feed` (change feed); and last `store`, the public facade over an `engine`.

mod checkpoint;
mod commit;
mod completion;
mod cursor;
mod disk;
mod engine;
#[cfg(test)]
mod failpoint;
mod feed;
mod format;
mod index;
mod journal;
mod lock;
mod reader;
mod recovery;
mod scan;
mod segment;
mod space;
mod store;
#[cfg(test)]
mod tests;
mod types;

#[doc(hidden)]
pub mod fuzzing;

pub use cursor::ParseCursorError;
pub use disk::Disk;
pub use store::{is_batched, BlobReader, Commit, Store};
pub use types::*;
