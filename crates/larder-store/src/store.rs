//! The `Store` facade: the crate's public handle over one open store (an [`Engine`]), and the
//! verified reader of a blob's data.

use std::future::Future;
use std::ops::Range;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;

use crate::bulk::{BulkOutcome, BulkRecord};
use crate::commit::{Appended, BATCH_RECORD_MAX};
use crate::completion::Completion;
use crate::disk::Disk;
use crate::engine::Engine;
use crate::reader::BlobReaderState;
use crate::types::*;

/// A replica's log store. Cheap to clone; all clones share one store.
#[derive(Clone)]
pub struct Store {
    pub(crate) engine: Arc<Engine>,
}

/// Streams a byte range of a blob in verified pieces of at most [`Options::read_chunk_size`].
/// Every piece is checked against its stored checksum before it is returned; a failing check
/// yields [`Error::Corrupt`] and ends the stream.
pub struct BlobReader {
    state: BlobReaderState,
}

impl Iterator for BlobReader {
    type Item = Result<Bytes>;
    fn next(&mut self) -> Option<Self::Item> {
        self.state.next()
    }
}

/// A write on its way to stable storage. Await it (async callers: no thread is parked, the
/// commit thread wakes the task) or [`Commit::wait`] for it (blocking callers). It resolves to
/// the write's outcome once the record is durable and visible, or to the error that lost it.
#[must_use = "a write is acknowledged only once its commit resolved"]
pub struct Commit<T> {
    waiting: Option<Completion>,
    then: Option<Result<T>>,
}

impl<T> Commit<T> {
    fn new(appended: Result<Appended<T>>, written: T) -> Commit<T> {
        match appended {
            Ok(Appended::Waiting(completion)) => Commit {
                waiting: Some(completion),
                then: Some(Ok(written)),
            },
            Ok(Appended::Done) => Commit::ready(Ok(written)),
            Ok(Appended::Early(outcome)) => Commit::ready(Ok(outcome)),
            Err(e) => Commit::ready(Err(e)),
        }
    }

    fn ready(result: Result<T>) -> Commit<T> {
        Commit {
            waiting: None,
            then: Some(result),
        }
    }

    /// Blocks the calling thread until the write is durable (or lost).
    pub fn wait(mut self) -> Result<T> {
        if let Some(completion) = self.waiting.take() {
            completion.wait()?;
        }
        self.then.take().expect("a commit resolves once")
    }
}

impl<T: Unpin> Future for Commit<T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let this = self.get_mut();
        if let Some(completion) = &mut this.waiting {
            match Pin::new(completion).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    this.waiting = None;
                    this.then = None;
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(())) => this.waiting = None,
            }
        }
        Poll::Ready(
            this.then.take().unwrap_or_else(|| {
                Err(Error::Unavailable("commit polled after it resolved".into()))
            }),
        )
    }
}

/// Whether a record of this key, props and data length is small enough to be batched: its
/// `begin_*` call then only encodes, checksums and copies it (no I/O), so an async caller may
/// make it on its own thread. A larger record is written to its segment by the `begin_*` call
/// (blocking I/O: run that call on a blocking thread).
pub fn is_batched(key_len: usize, props_len: usize, data_len: u64) -> bool {
    crate::format::head_len(key_len, props_len, data_len).saturating_add(data_len)
        <= BATCH_RECORD_MAX
}

impl Store {
    /// Opens (creating if needed) the replica directory `dir` on a private disk whose journal
    /// lives in `dir` (standalone use: tests, tools): replays that journal, loads the newest
    /// index checkpoint, replays the log after it, cuts off a torn tail, reports corrupt records.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store> {
        Ok(Store {
            engine: crate::recovery::open(dir.as_ref(), options, None)?,
        })
    }

    /// Opens the replica directory `dir`, which must lie below `disk`'s root, on that disk: its
    /// writes share the disk's journal and commit rounds with every other store opened there.
    pub fn open_on(disk: &Disk, dir: impl AsRef<Path>, options: Options) -> Result<Store> {
        Ok(Store {
            engine: crate::recovery::open(dir.as_ref(), options, Some(disk.clone()))?,
        })
    }

    /// Appends a blob whose data is the concatenation of `data` (chunks as they arrived; not
    /// copied into one buffer). Returns once durable.
    pub fn put_blob(&self, key: &[u8], meta: BlobMeta, data: &[Bytes]) -> Result<PutOutcome> {
        self.begin_put_blob(key, meta, data).wait()
    }

    /// Starts [`Store::put_blob`]; the returned commit resolves once the record is durable.
    /// Blocking I/O only for a record that is not [`is_batched`].
    pub fn begin_put_blob(&self, key: &[u8], meta: BlobMeta, data: &[Bytes]) -> Commit<PutOutcome> {
        Commit::new(self.engine.put_blob(key, meta, data), PutOutcome::Stored)
    }

    /// Appends a tombstone, also for a key never seen (a late put must not resurrect it).
    pub fn delete_blob(&self, key: &[u8], time_ms: u64) -> Result<DeleteOutcome> {
        self.begin_delete_blob(key, time_ms).wait()
    }

    /// Starts [`Store::delete_blob`] (a tombstone is always batched: no blocking I/O).
    pub fn begin_delete_blob(&self, key: &[u8], time_ms: u64) -> Commit<DeleteOutcome> {
        Commit::new(
            self.engine.delete_blob(key, time_ms),
            DeleteOutcome::Deleted,
        )
    }

    /// Applies `records` in order as a bulk batch (`bulk.rs`): every record gets the answer its
    /// single write would get (per record: a validation error, a refusal, or the outcome), and
    /// the ones written become durable together, in one commit round that syncs their segment
    /// (they are not copied into the disk journal). The returned commit resolves once all of
    /// them are durable and published, or to the error that failed the batch (records written
    /// before it may still land, as a failed single write may have). Blocking I/O: the records
    /// are written to their segment by this call.
    pub fn begin_bulk(&self, records: Vec<BulkRecord>) -> Commit<Vec<Result<BulkOutcome>>> {
        match self.engine.bulk(records) {
            Ok((outcomes, waiting)) => Commit {
                waiting,
                then: Some(Ok(outcomes)),
            },
            Err(e) => Commit::ready(Err(e)),
        }
    }

    /// [`Store::begin_bulk`], waiting until the batch is durable.
    pub fn bulk(&self, records: Vec<BulkRecord>) -> Result<Vec<Result<BulkOutcome>>> {
        self.begin_bulk(records).wait()
    }

    /// Looks a blob up; `now_ms` decides TTL expiry.
    pub fn get_blob(&self, key: &[u8], now_ms: u64) -> Result<BlobLookup> {
        self.engine.get_blob(key, now_ms)
    }

    /// How this store's readers read large pieces (`Options::direct_cold_reads_from`).
    fn cold_reads(&self) -> Option<crate::reader::ColdReads> {
        let from = self.engine.opts.direct_cold_reads_from?;
        Some(crate::reader::ColdReads {
            from,
            count: self.engine.counters.large_reads.clone(),
        })
    }

    /// Streams `range` (clamped to the blob's size) of `blob`'s data.
    pub fn read_blob(&self, blob: &BlobRecord, range: Range<u64>) -> Result<BlobReader> {
        let state = BlobReaderState::open(
            &blob.location,
            &blob.key,
            blob.meta.props.len(),
            blob.size,
            range,
            (self.engine.opts.read_chunk_size, self.cold_reads()),
        )?;
        Ok(BlobReader { state })
    }

    /// Applies a document put if `version` is newer than what the store holds.
    pub fn put_doc(
        &self,
        key: &[u8],
        version: u64,
        time_ms: u64,
        json: Bytes,
    ) -> Result<DocOutcome> {
        self.begin_put_doc(key, version, time_ms, json).wait()
    }

    /// Starts [`Store::put_doc`]. Blocking I/O only for a document that is not [`is_batched`].
    pub fn begin_put_doc(
        &self,
        key: &[u8],
        version: u64,
        time_ms: u64,
        json: Bytes,
    ) -> Commit<DocOutcome> {
        let appended = self
            .engine
            .write_doc(Op::PutDoc, key, version, time_ms, json);
        Commit::new(appended, DocOutcome::Applied)
    }

    /// Applies a versioned document remove (a tombstone) if `version` is newer.
    pub fn remove_doc(&self, key: &[u8], version: u64, time_ms: u64) -> Result<DocOutcome> {
        self.begin_remove_doc(key, version, time_ms).wait()
    }

    /// Starts [`Store::remove_doc`] (always batched: no blocking I/O).
    pub fn begin_remove_doc(&self, key: &[u8], version: u64, time_ms: u64) -> Commit<DocOutcome> {
        let appended = self
            .engine
            .write_doc(Op::RemoveDoc, key, version, time_ms, Bytes::new());
        Commit::new(appended, DocOutcome::Applied)
    }

    pub fn get_doc(&self, key: &[u8]) -> Result<DocLookup> {
        self.engine.get_doc(key)
    }

    /// The version and operation time of document `key`, live or removed, from the index alone
    /// (nothing is read from disk); `None` when never written.
    pub fn doc_version(&self, key: &[u8]) -> Result<Option<(u64, u64)>> {
        self.engine.doc_version(key)
    }

    /// Durable records after `after`, at most `limit` of them, in log (= sequence) order. A
    /// cursor of another incarnation starts from the beginning; one whose next records were
    /// dropped by compaction resumes at the next surviving record. A page that reaches the end
    /// returns the durable cursor as `next`.
    pub fn changes(&self, after: Cursor, limit: usize) -> Result<ChangeBatch> {
        self.engine.changes(after, limit)
    }

    /// The durable end of the change feed ([`crate::Stats::durable_cursor`]), read without the locks
    /// and counters the rest of [`Store::stats`] takes: for every pull of the feed.
    pub fn durable_cursor(&self) -> Cursor {
        Cursor {
            incarnation: self.engine.incarnation,
            sequence: self.engine.index.read().last_seq,
        }
    }

    /// The page [`Store::changes`] answers `after` when nothing durable follows it (empty, its
    /// `next` the same cursor); `None` when something may. Cheap, no I/O: a peer that polls an
    /// idle replica's feed is answered without leaving the async thread.
    pub fn idle_page(&self, after: Cursor) -> Option<ChangeBatch> {
        let head = self.durable_cursor();
        let idle = after.incarnation == head.incarnation && after.sequence >= head.sequence;
        idle.then(|| ChangeBatch {
            changes: Vec::new(),
            next: after,
        })
    }

    /// A reader paging through the change feed after `after` that keeps its exact place in the
    /// log between pages (pages as [`Store::changes`] gives them): for a pass over a long feed,
    /// such as a bootstrap export, whose every page must start where the last one stopped.
    pub fn feed(&self, after: Cursor) -> crate::FeedReader {
        crate::FeedReader::new(self.clone(), after)
    }

    /// Calls `f` for every live document key (for visiting); stops when it returns false.
    pub fn for_each_doc(&self, f: &mut dyn FnMut(&[u8], u64) -> bool) {
        self.engine.for_each_doc(f)
    }

    /// The disk whose journal and commit thread this store's writes go through.
    pub fn disk(&self) -> &Disk {
        &self.engine.disk
    }

    /// Rewrites the sealed segments whose garbage passes `opts.min_garbage_ratio` (and whose live
    /// data fits in the free space), each crash-safely (`FORMAT.md`, "Compaction"). Readers
    /// holding a record of a rewritten segment keep reading the old file; cursors stay valid.
    /// Blocking I/O: call it off the async workers.
    pub fn compact(&self, opts: &CompactOptions) -> Result<CompactReport> {
        self.engine.compact(opts)
    }

    /// The largest sequence number of a tombstone compaction ever dropped here (0: none). A
    /// peer reading the change feed from a position of this incarnation before it cannot have
    /// seen every tombstone (`FORMAT.md`, "Dropping tombstones"); cheap.
    pub fn dropped_through(&self) -> u64 {
        self.engine
            .dropped_through
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// This replica's incarnation (see [`Stats::incarnation`]); cheap.
    pub fn incarnation(&self) -> u64 {
        self.engine.incarnation
    }

    pub fn stats(&self) -> Stats {
        self.engine.stats()
    }

    /// Syncs, writes an index checkpoint and refuses further writes. Reads keep working.
    pub fn close(&self) -> Result<()> {
        self.engine.close()
    }
}
