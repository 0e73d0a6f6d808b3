//! The write path and group commit.
//!
//! Writers encode and checksum their record outside any lock, then append it under the log mutex
//! (so records never interleave and the "already exists / stale" decision is atomic with the
//! append). A small record is only copied into a batch under the mutex; the next sync round
//! writes the batch with one `pwrite` before its `fdatasync` (one system call per batch instead
//! of per record, and a far shorter hold of the mutex). Writers then wait until a sync covers
//! their record: a writer that finds no sync in progress becomes the leader, releases the mutex,
//! `fdatasync`s for everyone appended so far, publishes those records to the index and wakes the
//! others (see `waiters`), handing the lead of the next round to one of those still waiting.
//! Records are published only after they are durable, so readers and the change feed never see
//! a write that could be lost.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::MutexGuard;

use crate::engine::Engine;
use crate::format::{block_crcs, encode_head, RecordInfo, FILE_HEADER_LEN};
use crate::index::Index;
use crate::segment::{create_segment, fdatasync, io_error, Segment};
use crate::types::{Cursor, Durability, Error, Location, Op, Result};
use crate::waiters::{self, Waiter, Wake};

/// Records up to this size (head included) are batched; larger ones are written at once.
const BATCH_RECORD_MAX: u64 = 64 << 10;
/// A batch is written out once it would grow past this, without waiting for the sync round.
const BATCH_MAX: usize = 1 << 20;

/// What a not-yet-durable blob record will do once published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PendingBlob {
    Live,
    Deleted,
}

/// A record appended but not yet published to the index.
struct Queued {
    end: Cursor,
    info: RecordInfo,
    loc: Location,
}

pub(crate) struct LogState {
    pub active: Segment,
    pub active_len: u64,
    /// Bytes in segments before the active one.
    pub sealed_bytes: u64,
    /// End of the last appended record.
    written: Cursor,
    /// Small records appended to the active segment but not yet written to it: the bytes just
    /// before `active_len`.
    batch: Vec<u8>,
    /// End of the last record known durable and published.
    durable: Cursor,
    /// Sealed segments whose tail still needs a sync before anything after it counts as durable.
    unsynced: Vec<Arc<File>>,
    syncing: bool,
    /// Writers parked until a sync covers their record.
    waiting: Vec<Arc<Waiter>>,
    queue: VecDeque<Queued>,
    /// Effects of queued records, consulted with the index so decisions see pending writes.
    pub pending_blobs: HashMap<Bytes, (Cursor, PendingBlob)>,
    pub pending_docs: HashMap<Bytes, (Cursor, u64)>,
    failed: Option<String>,
    closed: bool,
}

impl LogState {
    pub fn new(active: Segment, active_len: u64, sealed_bytes: u64) -> Self {
        let end = Cursor {
            segment: active.id,
            offset: active_len,
        };
        LogState {
            active,
            active_len,
            sealed_bytes,
            written: end,
            batch: Vec::new(),
            durable: end,
            unsynced: Vec::new(),
            syncing: false,
            waiting: Vec::new(),
            queue: VecDeque::new(),
            pending_blobs: HashMap::new(),
            pending_docs: HashMap::new(),
            failed: None,
            closed: false,
        }
    }
}

impl Engine {
    /// Appends `info` + `data` unless `check` (run under the log lock, seeing pending writes and
    /// the index) returns an early answer. Returns `None` once the record is durable.
    pub(crate) fn append<R>(
        &self,
        info: RecordInfo,
        data: &[Bytes],
        check: impl FnOnce(&LogState, &Index) -> Option<R>,
    ) -> Result<Option<R>> {
        // Data checksums, the expensive part, outside the lock; the head (which checksums the
        // record's position) once the position is known.
        let crcs = block_crcs(data);
        let mut st = self.log.lock();
        writable(&st)?;
        if let Some(early) = check(&st, &self.index.read()) {
            return Ok(Some(early));
        }
        self.maybe_rotate(&mut st, info.head_len() + info.size)?;
        let head = encode_head(&info, &crcs, st.active.id, st.active_len);
        let start = self.add_record(&mut st, &head, data)?;
        let end = Cursor {
            segment: st.active.id,
            offset: st.active_len,
        };
        st.written = end;
        remember_pending(&mut st, &info, end);
        let loc = Location {
            segment: st.active.id,
            offset: start,
            file: st.active.file.clone(),
        };
        st.queue.push_back(Queued { end, info, loc });
        self.counters.appended.fetch_add(1, Ordering::Relaxed);
        self.wait_durable(st, end)?;
        Ok(None)
    }

    fn wait_durable<'a>(&'a self, mut st: MutexGuard<'a, LogState>, target: Cursor) -> Result<()> {
        if self.opts.durability == Durability::RelaxedNoSyncForBenchmarks {
            self.publish(&mut st, target);
            return Ok(());
        }
        // Registered even while leading: the round that covers the record, or cuts it off after a
        // failed batch write, says so through it like to any other writer.
        let me = Waiter::new(target);
        st.waiting.push(me.clone());
        loop {
            match me.take() {
                Some(Wake::Durable) => return Ok(()),
                Some(Wake::Lost(e)) => return Err(io_error(e)),
                Some(Wake::Recheck) => st.waiting.push(me.clone()),
                None => {}
            }
            if let Some(why) = &st.failed {
                return Err(Error::Unavailable(why.clone()));
            }
            if !st.syncing {
                self.sync_round(&mut st)?;
                continue;
            }
            drop(st);
            match me.wait() {
                Wake::Durable => return Ok(()),
                Wake::Lost(e) => return Err(io_error(e)),
                Wake::Recheck => {
                    st = self.log.lock();
                    st.waiting.push(me.clone());
                }
            }
        }
    }

    /// One group commit: sync everything appended so far, outside the lock, then publish it.
    fn sync_round(&self, st: &mut MutexGuard<'_, LogState>) -> Result<()> {
        // A failed batch write cuts off (and fails) only the batched records; the rest still
        // needs its sync.
        let _ = self.write_batch(st);
        st.syncing = true;
        let goal = st.written;
        let mut files = std::mem::take(&mut st.unsynced);
        files.push(st.active.file.clone());
        let res = MutexGuard::unlocked(st, || self.sync_files(&files));
        st.syncing = false;
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        match &res {
            Ok(()) => self.publish(st, goal),
            // After a failed fsync the page cache state is unknown (the kernel may have dropped
            // the dirty pages), so retrying could acknowledge lost data: refuse writes instead.
            Err(e) => st.failed = Some(format!("fdatasync failed: {e}")),
        }
        let everyone = st.failed.is_some();
        let durable = st.durable;
        let woken = waiters::to_wake(&mut st.waiting, durable, everyone);
        self.synced.notify_all();
        MutexGuard::unlocked(st, || waiters::wake(woken));
        res.map_err(io_error)
    }

    /// Moves queued records up to `upto` into the index and advances the durable cursor.
    fn publish(&self, st: &mut LogState, upto: Cursor) {
        let mut published = 0;
        {
            let mut index = self.index.write();
            while st.queue.front().is_some_and(|q| q.end <= upto) {
                let q = st.queue.pop_front().expect("front exists");
                forget_pending(st, &q);
                index.apply(q.info, q.loc);
                published += 1;
            }
            index.durable = index.durable.max(upto);
        }
        st.durable = st.durable.max(upto);
        self.note_published(published);
    }

    /// Starts a new segment once the active one would exceed `segment_size` (a record larger
    /// than a segment gets a segment of its own).
    fn maybe_rotate(&self, st: &mut LogState, record_len: u64) -> Result<()> {
        if st.active_len <= FILE_HEADER_LEN || st.active_len + record_len <= self.opts.segment_size
        {
            return Ok(());
        }
        self.write_batch(st)?;
        let durable = self.opts.durability == Durability::Durable;
        let seg = create_segment(&self.dir, st.active.id + 1, durable)?;
        let old = std::mem::replace(&mut st.active, seg.clone());
        if durable {
            st.unsynced.push(old.file);
        }
        st.sealed_bytes += st.active_len;
        st.active_len = FILE_HEADER_LEN;
        self.segments.write().push(seg);
        Ok(())
    }

    /// Adds a record at the end of the active segment: into the batch when it is small (and
    /// syncs are real: relaxed mode publishes at once, so its records must be in the file),
    /// otherwise straight to the file, after the batch.
    fn add_record(&self, st: &mut LogState, head: &[u8], data: &[Bytes]) -> Result<u64> {
        let len = head.len() + data.iter().map(|d| d.len()).sum::<usize>();
        let durable = self.opts.durability == Durability::Durable;
        if !durable || len as u64 > BATCH_RECORD_MAX {
            self.write_batch(st)?;
            return self.write_record(st, head, data);
        }
        if st.batch.len() + len > BATCH_MAX {
            self.write_batch(st)?;
        }
        let start = st.active_len;
        st.batch.extend_from_slice(head);
        data.iter().for_each(|d| st.batch.extend_from_slice(d));
        st.active_len += len as u64;
        Ok(start)
    }

    /// Writes the batch to the active segment. On failure the file is cut back to where the
    /// batch starts and its records are taken out of the log: their writers are told they are
    /// lost, and nothing after them exists, so the log goes on from there.
    fn write_batch(&self, st: &mut LogState) -> Result<()> {
        if st.batch.is_empty() {
            return Ok(());
        }
        let start = st.active_len - st.batch.len() as u64;
        let res = self.write_at(&st.active.file, start, &[&st.batch]);
        st.batch.clear();
        let Err(e) = res else { return Ok(()) };
        if let Err(te) = self.truncate(&st.active.file, start) {
            tracing::error!(error = %te, "cannot truncate after a failed write; refusing writes");
            st.failed = Some(format!("truncate after failed write failed: {te}"));
        }
        let from = Cursor {
            segment: st.active.id,
            offset: start,
        };
        self.cut_back(st, from, &e);
        Err(io_error(e))
    }

    /// Forgets every record after `from` (none of them was written or published).
    fn cut_back(&self, st: &mut LogState, from: Cursor, why: &io::Error) {
        st.active_len = from.offset;
        st.written = from;
        let mut dropped = 0;
        while st.queue.back().is_some_and(|q| q.end > from) {
            st.queue.pop_back();
            dropped += 1;
        }
        self.counters.appended.fetch_sub(dropped, Ordering::Relaxed);
        // A dropped record may have replaced an earlier pending one of its key: rebuild.
        st.pending_blobs.clear();
        st.pending_docs.clear();
        let queued: Vec<(RecordInfo, Cursor)> =
            st.queue.iter().map(|q| (q.info.clone(), q.end)).collect();
        for (info, end) in &queued {
            remember_pending(st, info, *end);
        }
        waiters::lose_after(&mut st.waiting, from, why);
    }

    /// Writes one record at the end of the active segment. On failure the file is cut back to
    /// the record's start so no half-written record is left to be found by a later reader.
    fn write_record(&self, st: &mut LogState, head: &[u8], data: &[Bytes]) -> Result<u64> {
        let start = st.active_len;
        let mut bufs: Vec<&[u8]> = Vec::with_capacity(data.len() + 1);
        bufs.push(head);
        bufs.extend(data.iter().map(|d| &d[..]));
        if let Err(e) = self.write_at(&st.active.file, start, &bufs) {
            if let Err(te) = self.truncate(&st.active.file, start) {
                tracing::error!(error = %te, "cannot truncate after a failed write; refusing writes");
                st.failed = Some(format!("truncate after failed write failed: {te}"));
            }
            return Err(io_error(e));
        }
        st.active_len = start + bufs.iter().map(|b| b.len() as u64).sum::<u64>();
        Ok(start)
    }

    fn write_at(&self, file: &File, offset: u64, bufs: &[&[u8]]) -> io::Result<()> {
        #[cfg(test)]
        if let Some(e) = self.fail.partial_write(file, offset, bufs) {
            return Err(e);
        }
        crate::segment::write_all_vectored_at(file, offset, bufs)
    }

    fn sync_files(&self, files: &[Arc<File>]) -> io::Result<()> {
        #[cfg(test)]
        if let Some(e) = self.fail.sync() {
            return Err(e);
        }
        files.iter().try_for_each(|f| fdatasync(f))
    }

    fn truncate(&self, file: &File, len: u64) -> io::Result<()> {
        #[cfg(test)]
        if self.fail.truncate_fails() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        file.set_len(len)
    }

    /// Final sync and publish; afterwards writes are refused.
    pub(crate) fn close_log(&self) -> Result<()> {
        let mut st = self.log.lock();
        if st.closed {
            return Ok(());
        }
        st.closed = true;
        while st.syncing {
            self.synced.wait(&mut st);
        }
        if st.failed.is_some() {
            return Ok(());
        }
        self.sync_round(&mut st)
    }

    /// Total bytes of all segment files.
    pub(crate) fn bytes_on_disk(&self) -> u64 {
        let st = self.log.lock();
        st.sealed_bytes + st.active_len
    }
}

fn writable(st: &LogState) -> Result<()> {
    if st.closed {
        return Err(Error::Unavailable("store is closed".into()));
    }
    match &st.failed {
        Some(why) => Err(Error::Unavailable(why.clone())),
        None => Ok(()),
    }
}

fn remember_pending(st: &mut LogState, info: &RecordInfo, end: Cursor) {
    let key = info.key.clone();
    match info.op {
        Op::PutBlob => st
            .pending_blobs
            .insert(key, (end, PendingBlob::Live))
            .map(|_| ()),
        Op::DeleteBlob => st
            .pending_blobs
            .insert(key, (end, PendingBlob::Deleted))
            .map(|_| ()),
        Op::PutDoc | Op::RemoveDoc => st.pending_docs.insert(key, (end, info.version)).map(|_| ()),
    };
}

/// Drops the pending entry for `q`'s key unless a later record for the key replaced it.
fn forget_pending(st: &mut LogState, q: &Queued) {
    match q.info.op {
        Op::PutBlob | Op::DeleteBlob => {
            if st
                .pending_blobs
                .get(&q.info.key)
                .is_some_and(|(end, _)| *end == q.end)
            {
                st.pending_blobs.remove(&q.info.key);
            }
        }
        Op::PutDoc | Op::RemoveDoc => {
            if st
                .pending_docs
                .get(&q.info.key)
                .is_some_and(|(end, _)| *end == q.end)
            {
                st.pending_docs.remove(&q.info.key);
            }
        }
    }
}
