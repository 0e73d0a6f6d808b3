//! The store's public types: a leaf module (it imports nothing from the crate), so every other
//! module can use them without a cycle. The `Store` facade lives in `store`.

use std::sync::Arc;

use bytes::Bytes;

/// Largest key the store accepts, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// How writes reach the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// A write returns only once it is on stable storage: in its disk's journal, synced by a
    /// commit round that covers the writes of every store on the disk (and its segment synced
    /// too when the record was too large to batch). The only mode a server should run in.
    #[default]
    Durable,
    /// Writes return after `write(2)`, without syncing. For benchmarks that want to measure
    /// everything except the disk; a crash can lose acknowledged writes.
    RelaxedNoSyncForBenchmarks,
}

/// Options for [`Store::open`].
#[derive(Clone, Debug)]
pub struct Options {
    /// A segment file is closed and a new one started once it reaches this size.
    pub segment_size: u64,
    /// Largest data a single record may carry.
    pub max_record_size: u64,
    /// Size of the pieces [`BlobReader`] yields.
    pub read_chunk_size: usize,
    /// Write an index checkpoint after this many records were appended since the last one.
    pub checkpoint_every_records: u64,
    pub durability: Durability,
    /// Blob and document puts are refused with [`Error::OutOfSpace`] while the filesystem has
    /// less than this many bytes free (deletes and removes are not). 0: no reserve.
    pub min_free_space: u64,
    /// Foreground work compaction gives way to (none: compaction only keeps its rate limit).
    pub compaction_yields_to: Option<Foreground>,
    /// A record of at least this size (head included) that its commit round syncs in its
    /// segment file is dropped from the page cache (`POSIX_FADV_DONTNEED`) once the large
    /// records synced after it on its disk add up to `DiskOptions::uncache_after_recent`;
    /// none: never. Why: see `uncache.rs`.
    pub uncache_synced_from: Option<u64>,
    /// A piece of the data of a record of at least this size (the large records that
    /// `uncache_synced_from` drops from the page cache) that the page cache does not hold whole
    /// is read with `O_DIRECT`, past the cache (`cold.rs`); none: every read goes through the
    /// page cache.
    pub direct_cold_reads_from: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            segment_size: 256 << 20,
            max_record_size: 64 << 20,
            read_chunk_size: 256 << 10,
            checkpoint_every_records: 100_000,
            durability: Durability::Durable,
            min_free_space: 0,
            compaction_yields_to: None,
            uncache_synced_from: Some(1 << 20),
            direct_cold_reads_from: Some(1 << 20),
        }
    }
}

/// Errors of the store. Expected outcomes (not found, deleted, stale version) are values, not errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Stored bytes failed their checksum; the record is not served.
    #[error("corrupt data in {location}: {detail}")]
    Corrupt { location: String, detail: String },
    /// The disk is full. No partial record was left behind.
    #[error("out of space")]
    OutOfSpace,
    /// The key is empty or longer than [`MAX_KEY_LEN`].
    #[error("bad key: {0}")]
    BadKey(String),
    /// The record is larger than [`Options::max_record_size`].
    #[error("record of {size} bytes is larger than the limit of {limit} bytes")]
    TooLarge { size: u64, limit: u64 },
    /// The directory holds a format this build does not understand.
    #[error(
        "unsupported format version {found} in {location} (this build reads version {supported})"
    )]
    UnsupportedVersion {
        found: u8,
        supported: u8,
        location: String,
    },
    /// The store was closed, or an earlier I/O failure made it refuse writes.
    #[error("store is closed or failed: {0}")]
    Unavailable(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A physical position in the log (segment id, byte offset): where replay and the commit path
/// are. Private to the store: it changes when compaction copies records forward, so it never
/// appears in a cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct LogPos {
    pub segment: u32,
    pub offset: u64,
}

/// A logical position in a replica's change feed (`DESIGN.md` 6.1): the replica's incarnation
/// (random, made when the store directory was created) and the sequence number of the last
/// record seen. Every record gets the next sequence number of its log when it is appended and
/// keeps it when compaction copies it forward, so a cursor survives compaction and moves with the
/// log. `Cursor::START` (incarnation 0) is before every record of every incarnation. Its string
/// form (`Display`/`FromStr`) is stable and opaque to clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Cursor {
    pub incarnation: u64,
    pub sequence: u64,
}

impl Cursor {
    pub const START: Cursor = Cursor {
        incarnation: 0,
        sequence: 0,
    };
}

/// What a blob put stores besides its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobMeta {
    /// Opaque properties (the storage node's own encoding of content type, user metadata...).
    pub props: Bytes,
    /// Operation time, milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// Expiry time in milliseconds since the Unix epoch; `None` = never expires.
    pub expires_ms: Option<u64>,
}

/// A live blob record found by [`Store::get_blob`].
#[derive(Clone, Debug)]
pub struct BlobRecord {
    pub key: Bytes,
    pub meta: BlobMeta,
    /// Length of the data in bytes.
    pub size: u64,
    /// Where the record lives (private to the store).
    pub(crate) location: Location,
}

/// Where a record starts. Holds its segment's file handle so the record stays readable even if
/// the segment is later rewritten and unlinked (compaction).
#[derive(Clone, Debug)]
pub(crate) struct Location {
    pub(crate) segment: u32,
    pub(crate) offset: u64,
    pub(crate) file: Arc<std::fs::File>,
}

/// Result of [`Store::get_blob`].
#[derive(Clone, Debug)]
pub enum BlobLookup {
    Found(BlobRecord),
    /// A tombstone exists; `time_ms` is the delete's operation time.
    Deleted {
        time_ms: u64,
    },
    /// The blob exists but its TTL has passed.
    Expired(BlobRecord),
    NotFound,
}

/// Result of [`Store::put_blob`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// The record was appended and is durable.
    Stored,
    /// A put for this key already exists (blobs are immutable); nothing was written.
    AlreadyExists,
    /// A tombstone for this key exists, so the put was not stored (tombstones win).
    Deleted,
}

/// Result of [`Store::delete_blob`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// A tombstone was appended and is durable (also for a key never seen).
    Deleted,
    /// A tombstone already existed; nothing was written.
    AlreadyDeleted,
}

/// A stored document: last writer (highest version) wins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DocLookup {
    Found {
        version: u64,
        time_ms: u64,
        json: Bytes,
    },
    /// Removed by a versioned tombstone.
    Removed {
        version: u64,
        time_ms: u64,
    },
    NotFound,
}

/// Result of [`Store::put_doc`] and [`Store::remove_doc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DocOutcome {
    /// Appended, durable and now the newest version.
    Applied,
    /// The store already holds this or a newer version; nothing was written.
    Stale { current: u64 },
}

/// Kind of a log record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    PutBlob,
    DeleteBlob,
    PutDoc,
    RemoveDoc,
}

/// One entry of the change feed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// Position of this record; resuming `after` it yields the records that follow.
    pub cursor: Cursor,
    pub op: Op,
    pub key: Bytes,
    pub time_ms: u64,
    /// Document version (0 for blob records).
    pub version: u64,
    /// Data length (0 for tombstones).
    pub size: u64,
    pub expires_ms: Option<u64>,
}

/// A page of the change feed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeBatch {
    pub changes: Vec<Change>,
    /// Cursor to pass as `after` to continue; equals the input when nothing new is durable.
    pub next: Cursor,
}

/// What [`crate::Store::compact`] does.
#[derive(Clone, Debug)]
pub struct CompactOptions {
    /// A sealed segment is rewritten once at least this fraction of its bytes is garbage
    /// (0.0: any garbage at all).
    pub min_garbage_ratio: f64,
    /// Expiry is decided at this time (ms since the Unix epoch): blobs expired by then are
    /// dropped.
    pub now_ms: u64,
    /// Seal the active segment first, so every record written so far can be compacted (an
    /// operator's "compact now"; a background pass leaves the active segment alone).
    pub seal_active: bool,
    /// Copy at most this many bytes per second (0: as fast as the disk goes), so foreground
    /// reads and writes keep their share of the disk.
    pub max_bytes_per_sec: u64,
    /// Tombstones (blob deletes, document removes) whose sequence is at most this may be
    /// dropped: every other current replica of the partition has replicated past them (the
    /// caller knows its peers; the store does not). `None`: keep every tombstone.
    pub tombstone_horizon: Option<u64>,
    /// ... and only once their operation time is at least this old at `now_ms`.
    pub tombstone_retention_ms: u64,
}

/// What one [`crate::Store::compact`] pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactReport {
    pub segments_compacted: u64,
    /// Bytes of garbage the rewritten segments no longer hold.
    pub bytes_reclaimed: u64,
    /// Bytes of live records copied forward.
    pub live_bytes_copied: u64,
    /// Records whose data failed its checksum: dropped (never copied) and reported.
    pub corrupt_records_dropped: u64,
    /// Tombstones dropped from the log and the index (past the horizon and the retention, and
    /// shadowing no put left in the log).
    pub tombstones_dropped: u64,
    /// What the pass measured of the sealed segments it looked at, as they are after it: their
    /// record bytes (segment headers excluded), and how many of those are garbage (in segments
    /// it left alone: below the threshold, or no room to rewrite them).
    pub sealed_bytes: u64,
    pub garbage_bytes: u64,
    /// Sealed segments the pass did not read: nothing in them could be reclaimed since their
    /// last reading (their `garbage_bytes` are the estimate kept since; `ledger.rs`).
    pub segments_skipped: u64,
    /// Bytes of sealed segments the pass read (and verified) to plan them.
    pub bytes_read: u64,
}

/// Options for [`crate::Disk::open`].
#[derive(Clone, Debug)]
pub struct DiskOptions {
    /// A journal file is replaced by a new one once it reaches this size (after every segment
    /// it holds records of was synced, so it can be deleted).
    pub journal_file_size: u64,
    /// Rounds whose `fdatasync` may be in flight at once (at least 1). With 2, a round written
    /// while another's sync is in flight starts its own at once instead of waiting for it: a
    /// writer waits about one sync rather than one and a half on average.
    pub sync_threads: usize,
    /// Group commit under load: a round starts no sooner than this after the one before it
    /// started, so that its sync covers the writes that came meanwhile. Each round costs an
    /// `fdatasync` and the wake-ups of its writers whatever it carries. A write that comes
    /// later than this after the last round (any write at a low rate) starts its round at once.
    pub min_round_interval: std::time::Duration,
    /// Large records synced in their segment (`Options::uncache_synced_from`) stay in the page
    /// cache until the ones synced after them on this disk add up to this many bytes; then they
    /// are dropped from it, oldest first (`uncache.rs`). 0: dropped as soon as synced.
    pub uncache_after_recent: u64,
}

impl Default for DiskOptions {
    fn default() -> Self {
        DiskOptions {
            journal_file_size: 64 << 20,
            sync_threads: 2,
            min_round_interval: std::time::Duration::ZERO,
            uncache_after_recent: 1 << 30,
        }
    }
}

/// Counters of one disk (shared by every store on it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Time the commit rounds spent syncing (writers wait for it).
    pub sync_time: std::time::Duration,
    /// Round syncs that started while compaction write-back was in flight on this disk...
    pub syncs_during_writeback: u64,
    /// ... and the bytes of it in flight then, summed over those syncs.
    pub writeback_bytes_during_syncs: u64,
    /// Commit rounds run.
    pub rounds: u64,
    /// Rounds whose journal append failed (a full disk) and that were made durable by syncing
    /// their segment files instead.
    pub unjournaled_rounds: u64,
    /// `fdatasync`s of the journal: one per round that had anything to make durable (but an
    /// unjournaled one).
    pub journal_syncs: u64,
    /// `fdatasync`s of segment files: a segment that got a record too large to batch, a sealed
    /// segment, every segment a journal file covers before that file is deleted, and every
    /// segment an unjournaled round wrote to.
    pub segment_syncs: u64,
}

impl DiskStats {
    /// Every `fdatasync` the disk's commit thread issued.
    pub fn fdatasyncs(&self) -> u64 {
        self.journal_syncs + self.segment_syncs
    }
}

/// Counters for metrics.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub live_keys: u64,
    pub records_appended: u64,
    /// Commit rounds that covered records of this store.
    pub syncs: u64,
    /// The counters of the disk this store is on (shared with the other stores there).
    pub disk: DiskStats,
    pub corrupt_records_found: u64,
    pub bytes_on_disk: u64,
    pub segments: u64,
    /// The cursor of the last durable record (`sequence` 0: none yet): a change feed reader whose
    /// `next` equals it has caught up.
    pub durable_cursor: Cursor,
    /// This replica's incarnation: made when its directory was created, so a rebuilt replica
    /// (new directory) has a new one and its peers' cursors restart from the beginning.
    pub incarnation: u64,
    /// Bytes of large records' data read from the page cache...
    pub large_read_bytes_cached: u64,
    /// ... and from the disk, past it (`Options::direct_cold_reads_from`).
    pub large_read_bytes_direct: u64,
}

/// Foreground work that compaction gives way to ([`Options::compaction_yields_to`]): its owner
/// (the storage node) counts the requests it is serving; while more than `busy_above` are in
/// flight, a rewrite waits before copying its next record, for at most 90% of its time, so that a
/// node that is never idle still compacts at a tenth of its rate. Clones share the counters.
#[derive(Clone, Debug, Default)]
pub struct Foreground {
    in_flight: Arc<std::sync::atomic::AtomicU64>,
    yielded_us: Arc<std::sync::atomic::AtomicU64>,
    busy_above: u64,
}

/// One foreground request in flight, counted until dropped ([`Foreground::enter`]).
#[must_use = "the request counts only while the guard lives"]
pub struct InFlight(Arc<std::sync::atomic::AtomicU64>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Foreground {
    /// Busy while more than `busy_above` requests are in flight.
    pub fn new(busy_above: u64) -> Foreground {
        Foreground {
            busy_above,
            ..Foreground::default()
        }
    }

    /// Counts a request in flight until the guard is dropped.
    pub fn enter(&self) -> InFlight {
        self.in_flight
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        InFlight(self.in_flight.clone())
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn is_busy(&self) -> bool {
        self.in_flight() > self.busy_above
    }

    /// Total time compactions waited for foreground work.
    pub fn yielded(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.yielded_us.load(std::sync::atomic::Ordering::Relaxed))
    }

    pub(crate) fn add_yielded(&self, waited: std::time::Duration) {
        let us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.yielded_us
            .fetch_add(us, std::sync::atomic::Ordering::Relaxed);
    }
}
