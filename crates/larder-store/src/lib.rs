//! Larder's log store: the durable, checksummed, recoverable store behind every partition replica.
//!
//! One [`Store`] owns one replica directory. It knows nothing about HTTP or the cluster; everything
//! above it relies on one promise: **an acknowledged write survives a crash, and nothing that fails
//! its checksum is ever returned.**
//!
//! Stores live on a [`Disk`]: one journal and one commit thread per disk directory, shared by
//! every store opened there ([`Store::open_on`]; [`Store::open`] gives a store a private disk).
//! A commit round syncs the journal once for the writes of every store on the disk. Writes are
//! acknowledged only once their record is on stable storage. The blocking methods (`put_blob`...)
//! wait on the calling thread; the `begin_*` methods return a [`Commit`], a plain `std` future
//! (no async runtime here) an async caller awaits, also `wait()`able. See `FORMAT.md` in this
//! crate for the on-disk format.
//!
//! Layout of the implementation, leaves first: `types` (the public types; imports nothing from
//! the crate), `format` (record encoding), `segment` (files and I/O), `scan` (sequential reading),
//! `index`, `completion` (a writer's wait for durability), `journal` (the disk journal's format),
//! `reader` (verified reads), `space` (the free-space reserve), `release` (a deleted file's
//! space given back a step at a time); then `engine` (the state of one
//! open store and the decisions of each operation), with its parts `commit` (write path, the log's
//! side of a commit round), `bulk` (a batch of records made durable by one round), `checkpoint`,
//! `recovery` (open) and `feed` (change feed); `disk` (the
//! journal and commit thread shared by the stores of a disk, and journal replay); and last
//! `store`, the public facade over an `engine`.

mod bulk;
mod checkpoint;
mod cold;
mod commit;
mod compact;
mod completion;
mod cursor;
mod disk;
mod dropped;
mod engine;
#[cfg(test)]
mod failpoint;
mod feed;
mod format;
mod idle_cpu;
mod index;
mod journal;
mod ledger;
mod lock;
mod reader;
mod recovery;
mod release;
mod scan;
mod segment;
mod space;
mod store;
mod sync_watch;
#[cfg(test)]
mod tests;
mod types;
mod uncache;
mod visit;

#[doc(hidden)]
pub mod fuzzing;

pub use bulk::{BulkOutcome, BulkRecord};
pub use cursor::ParseCursorError;
pub use disk::Disk;
pub use feed::FeedReader;
pub use segment::create_dir_all_durable;
pub use store::{is_batched, BlobReader, Commit, Store};
pub use types::*;
pub use visit::{visit_hash, VisitEntry, VisitFrom, VisitPage, VisitPos, VisitState};
