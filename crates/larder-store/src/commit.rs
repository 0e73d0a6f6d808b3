//! The write path: appending to a log, and the log's side of its disk's commit rounds.
//!
//! Writers encode and checksum their record outside any lock, then append it under the log mutex
//! (so records never interleave and the "already exists / stale" decision is atomic with the
//! append). A small record is only copied into the log's batch under the mutex; the writer marks
//! the log dirty with its disk and gets a completion to wait on (blocking or awaited). The disk's
//! commit thread (`disk`) then, for every dirty log, writes its batch to the segment with one
//! `pwrite`, appends the same bytes to the disk's journal, syncs the journal once for all the
//! logs of the round, and only then publishes the records to the index and completes their
//! writers. Records are published only after they are durable, so readers and the change feed
//! never see a write that could be lost.
//!
//! A record too large to batch is written to its segment by its writer (a blocking `pwrite`, as
//! before, not copied into a batch under the mutex). The round then either journals it too (from
//! the writer's buffers, no copy) or syncs its segment file: journaled while the round's large
//! records add up to little (`JOURNALED_LARGE_PER_ROUND`), so that a few 64 KiB records cost no
//! `fdatasync` of their own; synced once they add up to more, so that many writers of large
//! records do not all funnel through the commit thread's one journal write.
//!
//! A large record that its round syncs leaves the page cache once the large records synced
//! after it on its disk add up to a window (`uncache.rs`; 1 MiB and 1 GiB by default), after
//! its writer has heard back. Its pages are clean by then, so they are freed at once, and the
//! next records' writes take those pages again instead of fresh ones: a durable 4 MiB put cost
//! this store 3.8–5.1 ms of system CPU kept cached, 1.4–1.7 ms dropped, at 2.0× the rate
//! (`benchmarks/store/UNCACHE.md`). Small records stay cached.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use crate::completion::{pair, Completer, Completion, Outcome};
use crate::engine::Engine;
use crate::format::{block_crcs, encode_head, RecordInfo, SegmentHeader, FILE_HEADER_LEN};
use crate::index::Index;
use crate::segment::{create_segment, io_error, Segment};
use crate::types::{Durability, Error, Location, LogPos, Op, Result};

/// Records up to this size (head included) are batched; larger ones are written at once.
pub(crate) const BATCH_RECORD_MAX: u64 = 64 << 10;
/// A batch is written out once it would grow past this, without waiting for the sync round.
const BATCH_MAX: usize = 1 << 20;
/// Most bytes of large (unbatched) records one round journals; past this, the round syncs their
/// segment files instead. Larger records are never journaled.
pub(crate) const JOURNALED_LARGE_PER_ROUND: usize = 1 << 20;

/// What a not-yet-durable blob record will do once published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PendingBlob {
    Live,
    Deleted,
}

/// A record appended but not yet published to the index.
pub(crate) struct Queued {
    pub end: LogPos,
    pub info: RecordInfo,
    pub loc: Location,
}

/// Bytes written to a segment (page cache only) that the next round must put in the journal.
pub(crate) struct Frame {
    pub segment: u32,
    pub offset: u64,
    pub file: Arc<File>,
    /// The bytes, in order: a batch, or a large record's head and its writer's buffers.
    pub pieces: Vec<Bytes>,
}

impl Frame {
    pub fn len(&self) -> usize {
        self.pieces.iter().map(Bytes::len).sum()
    }
}

/// What one log hands to a commit round.
pub(crate) struct Collected {
    pub frames: Vec<Frame>,
    /// Segment files to sync in the round (a sealed segment, a record too large to journal).
    pub sync: Vec<Arc<File>>,
    /// Large records written to their segment, for the round to journal or sync (`disk.rs`).
    pub large: Vec<Frame>,
    /// The end of the last record the round covers.
    pub goal: LogPos,
    /// Records the round syncs (not journals) that are to leave the page cache
    /// (`Engine::uncaches`), as file, offset and length: the ones too large to journal, and
    /// those the round decides to sync rather than journal (`disk.rs`).
    pub uncache: Vec<(Arc<File>, u64, u64)>,
}

/// How an append ended before the commit round.
pub(crate) enum Appended<R> {
    /// The check answered; nothing was written.
    Early(R),
    /// Written and already published (relaxed mode).
    Done,
    /// Written; durable once the completion says so.
    Waiting(Completion),
}

pub(crate) struct LogState {
    pub active: Segment,
    pub active_len: u64,
    /// Bytes in segments before the active one.
    pub sealed_bytes: u64,
    /// The sequence number the next appended record gets. Never reused, even for a record cut
    /// back after a failed write (gaps are allowed; order is what cursors rely on).
    pub(crate) next_seq: u64,
    /// End of the last appended record.
    pub(crate) written: LogPos,
    /// Small records appended to the active segment but not yet written to it: the bytes just
    /// before `active_len`.
    pub(crate) batch: Vec<u8>,
    /// Batches written to their segment but not yet journaled.
    frames: Vec<Frame>,
    /// Large records written to their segment: their round journals them or syncs their files.
    large: Vec<Frame>,
    /// Records too large to journal, to drop from the page cache once synced (`Collected`).
    uncache: Vec<(Arc<File>, u64, u64)>,
    /// End of the last record known durable and published.
    pub(crate) durable: LogPos,
    /// Segment files the next round must sync (sealed ones, and one that got an unbatched record).
    pub(crate) unsynced: Vec<Arc<File>>,
    /// Whether the log is queued for the next round of its disk.
    pub(crate) dirty: bool,
    /// Writers waiting for a round to cover their record, by the end of their record.
    pub(crate) waiting: Vec<(LogPos, Completer)>,
    /// Writers whose records were cut from the log, told by the round's end (never under a lock,
    /// nor while the round still holds the store).
    lost: Vec<(Completer, Outcome)>,
    pub(crate) queue: VecDeque<Queued>,
    /// Effects of queued records, consulted with the index so decisions see pending writes.
    pub pending_blobs: HashMap<Bytes, (LogPos, PendingBlob)>,
    pub pending_docs: HashMap<Bytes, (LogPos, u64)>,
    pub(crate) failed: Option<String>,
    closed: bool,
}

impl LogState {
    pub fn new(active: Segment, active_len: u64, sealed_bytes: u64, next_seq: u64) -> Self {
        let end = LogPos {
            segment: active.id,
            offset: active_len,
        };
        LogState {
            active,
            active_len,
            sealed_bytes,
            next_seq,
            written: end,
            batch: Vec::new(),
            frames: Vec::new(),
            large: Vec::new(),
            uncache: Vec::new(),
            durable: end,
            unsynced: Vec::new(),
            dirty: false,
            waiting: Vec::new(),
            lost: Vec::new(),
            queue: VecDeque::new(),
            pending_blobs: HashMap::new(),
            pending_docs: HashMap::new(),
            failed: None,
            closed: false,
        }
    }

    pub(crate) fn needs_sync(&mut self, file: &Arc<File>) {
        if !self.unsynced.iter().any(|f| Arc::ptr_eq(f, file)) {
            self.unsynced.push(file.clone());
        }
    }
}

impl Drop for LogState {
    fn drop(&mut self) {
        // A store dropped with writes in flight: their writers must not wait forever.
        for (completer, outcome) in self.lost.drain(..) {
            completer.complete(outcome);
        }
        for (_, completer) in self.waiting.drain(..) {
            completer.complete(Outcome::Failed("store was dropped".into()));
        }
    }
}

impl Engine {
    /// Takes the record at `start` of the active segment, which ends at `active_len`, as
    /// written: it has the next sequence, its key is pending, and it waits in the queue for the
    /// round that makes it durable. Returns where it ends. (Single and bulk appends alike.)
    pub(crate) fn queue_written(&self, st: &mut LogState, info: RecordInfo, start: u64) -> LogPos {
        let end = LogPos {
            segment: st.active.id,
            offset: st.active_len,
        };
        st.written = end;
        st.next_seq += 1;
        remember_pending(st, &info, end);
        let loc = Location {
            segment: st.active.id,
            offset: start,
            file: st.active.file.clone(),
        };
        st.queue.push_back(Queued { end, info, loc });
        self.counters.appended.fetch_add(1, Ordering::Relaxed);
        end
    }

    /// Appends `info` + `data` unless `check` (run under the log lock, seeing pending writes and
    /// the index) returns an early answer. A small record is only copied into the batch; a large
    /// one is written to its segment here (blocking). Durability comes with the next round.
    pub(crate) fn append<R>(
        &self,
        mut info: RecordInfo,
        data: &[Bytes],
        check: impl FnOnce(&LogState, &Index) -> Option<R>,
    ) -> Result<Appended<R>> {
        // Data checksums, the expensive part, outside the lock; the head (which checksums the
        // record's position) once the position is known.
        let crcs = block_crcs(data);
        let mut st = self.log.lock();
        self.writable(&st)?;
        if let Some(early) = check(&st, &self.index.read()) {
            return Ok(Appended::Early(early));
        }
        self.maybe_rotate(&mut st, info.head_len() + info.size)?;
        info.seq = st.next_seq;
        let head = encode_head(&info, &crcs, st.active.id, st.active_len);
        let start = self.add_record(&mut st, &head, data)?;
        let end = self.queue_written(&mut st, info, start);
        if self.opts.durability == Durability::RelaxedNoSyncForBenchmarks {
            self.publish(&mut st, end);
            return Ok(Appended::Done);
        }
        let (completer, completion) = pair();
        st.waiting.push((end, completer));
        let queue = !std::mem::replace(&mut st.dirty, true);
        drop(st);
        if queue {
            let me = self.me.upgrade().expect("a writer holds the store");
            self.disk.shared().mark_dirty(me);
        }
        Ok(Appended::Waiting(completion))
    }

    /// The log's part of a commit round, under its mutex: write the batch out (page cache only)
    /// and hand over what the round must journal and sync.
    pub(crate) fn collect_for_round(&self) -> Collected {
        let mut st = self.log.lock();
        st.dirty = false;
        // A failed batch write cuts off (and fails) only the batched records; the rest still
        // needs its round.
        let _ = self.write_batch(&mut st);
        Collected {
            frames: std::mem::take(&mut st.frames),
            sync: std::mem::take(&mut st.unsynced),
            large: std::mem::take(&mut st.large),
            goal: st.written,
            uncache: std::mem::take(&mut st.uncache),
        }
    }

    /// The end of a round: on success publish everything up to `goal`; on failure refuse writes
    /// from now on. Returns the writers to tell (the caller tells them without holding a lock).
    pub(crate) fn finish_round(
        &self,
        goal: LogPos,
        failed: Option<&String>,
    ) -> Vec<(Completer, Outcome)> {
        let mut st = self.log.lock();
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        let mut done = std::mem::take(&mut st.lost);
        done.extend(self.round_outcomes(&mut st, goal, failed));
        done
    }

    fn round_outcomes(
        &self,
        st: &mut LogState,
        goal: LogPos,
        failed: Option<&String>,
    ) -> Vec<(Completer, Outcome)> {
        match failed {
            Some(why) => {
                // After a failed fsync the page cache state is unknown (the kernel may have
                // dropped the dirty pages), so retrying could acknowledge lost data.
                let why = format!("fdatasync failed: {why}");
                st.failed.get_or_insert(why.clone());
                let outcome = Outcome::Failed(why);
                st.waiting
                    .drain(..)
                    .map(|(_, c)| (c, outcome.clone()))
                    .collect()
            }
            None => {
                self.publish(st, goal);
                let durable = st.durable;
                let mut done = Vec::new();
                st.waiting.retain(|(end, c)| {
                    let covered = *end <= durable;
                    if covered {
                        done.push((c.clone(), Outcome::Durable));
                    }
                    !covered
                });
                done
            }
        }
    }

    /// Moves queued records up to `upto` into the index and advances the durable cursor.
    pub(crate) fn publish(&self, st: &mut LogState, upto: LogPos) {
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
    pub(crate) fn maybe_rotate(&self, st: &mut LogState, record_len: u64) -> Result<()> {
        if st.active_len <= FILE_HEADER_LEN || st.active_len + record_len <= self.opts.segment_size
        {
            return Ok(());
        }
        self.rotate(st)
    }

    /// Seals the active segment (unless it is empty) so compaction may take it. Returns the
    /// first segment that may still hold records not yet durable and published: compaction
    /// takes only segments before it (an unpublished record is not in the index and would look
    /// like garbage).
    pub(crate) fn seal_active(&self, seal: bool) -> Result<u32> {
        let mut st = self.log.lock();
        if seal && st.active_len > FILE_HEADER_LEN {
            self.writable(&st)?;
            self.rotate(&mut st)?;
        }
        Ok(st.queue.front().map_or(st.active.id, |q| q.loc.segment))
    }

    /// Forgets `file`, a sealed segment compaction deleted after syncing its replacement: it
    /// needs no sync any more, and every handle kept of it keeps its disk space in use (sealing
    /// queues a sync for the next round, which never comes if the store is written no more).
    pub(crate) fn forget_deleted_segment(&self, file: &Arc<File>) {
        self.log
            .lock()
            .unsynced
            .retain(|held| !Arc::ptr_eq(held, file));
        self.disk.shared().forget_deleted_segment(file);
    }

    /// Compaction rewrote sealed segment `segment` to `len` bytes: positions at its old end
    /// (where the log was when it was sealed) move to its new end.
    pub(crate) fn clamp_positions(&self, segment: u32, len: u64) {
        let mut guard = self.log.lock();
        let st = &mut *guard;
        for pos in [&mut st.written, &mut st.durable] {
            if pos.segment == segment {
                pos.offset = pos.offset.min(len);
            }
        }
    }

    fn rotate(&self, st: &mut LogState) -> Result<()> {
        self.write_batch(st)?;
        let durable = self.opts.durability == Durability::Durable;
        let header = SegmentHeader {
            incarnation: self.incarnation,
            first_seq: st.next_seq,
        };
        let seg = create_segment(&self.dir, st.active.id + 1, header, durable)?;
        let old = std::mem::replace(&mut st.active, seg.clone());
        if durable {
            st.needs_sync(&old.file);
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
    pub(crate) fn write_batch(&self, st: &mut LogState) -> Result<()> {
        if st.batch.is_empty() {
            return Ok(());
        }
        let start = st.active_len - st.batch.len() as u64;
        let res = self.write_at(&st.active.file, start, &[&st.batch]);
        let bytes = std::mem::take(&mut st.batch);
        let Err(e) = res else {
            let frame = Frame {
                segment: st.active.id,
                offset: start,
                file: st.active.file.clone(),
                pieces: vec![Bytes::from(bytes)],
            };
            st.frames.push(frame);
            return Ok(());
        };
        if let Err(te) = self.truncate(&st.active.file, start) {
            tracing::error!(error = %te, "cannot truncate after a failed write; refusing writes");
            st.failed = Some(format!("truncate after failed write failed: {te}"));
        }
        let from = LogPos {
            segment: st.active.id,
            offset: start,
        };
        self.cut_back(st, from, &e);
        Err(io_error(e))
    }

    /// Forgets every record after `from` (none of them was written or published).
    pub(crate) fn cut_back(&self, st: &mut LogState, from: LogPos, why: &io::Error) {
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
        let queued: Vec<(RecordInfo, LogPos)> =
            st.queue.iter().map(|q| (q.info.clone(), q.end)).collect();
        for (info, end) in &queued {
            remember_pending(st, info, *end);
        }
        let outcome = Outcome::lost(why);
        let mut lost = Vec::new();
        st.waiting.retain(|(end, c)| {
            let cut = *end > from;
            if cut {
                lost.push((c.clone(), outcome.clone()));
            }
            !cut
        });
        st.lost.extend(lost);
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
        let len = bufs.iter().map(|b| b.len()).sum::<usize>();
        st.active_len = start + len as u64;
        if self.opts.durability != Durability::Durable {
            return Ok(start);
        }
        let file = st.active.file.clone();
        if len > JOURNALED_LARGE_PER_ROUND {
            st.needs_sync(&file);
            if self.uncaches(len as u64) {
                st.uncache.push((file, start, len as u64));
            }
            return Ok(start);
        }
        // Kept for the round, which may journal it: the head copied (small), the data shared.
        let mut pieces = Vec::with_capacity(data.len() + 1);
        pieces.push(Bytes::copy_from_slice(head));
        pieces.extend(data.iter().cloned());
        let frame = Frame {
            segment: st.active.id,
            offset: start,
            file,
            pieces,
        };
        st.large.push(frame);
        Ok(start)
    }

    /// Whether a synced record of `len` bytes (head included) is to leave the page cache once
    /// past its disk's window of recent ones (`Options::uncache_synced_from`, `uncache.rs`).
    pub(crate) fn uncaches(&self, len: u64) -> bool {
        self.opts
            .uncache_synced_from
            .is_some_and(|from| len >= from)
    }

    pub(crate) fn write_at(&self, file: &File, offset: u64, bufs: &[&[u8]]) -> io::Result<()> {
        #[cfg(test)]
        if let Some(e) = self.fail.partial_write(file, offset, bufs) {
            return Err(e);
        }
        crate::segment::write_all_vectored_at(file, offset, bufs)
    }

    pub(crate) fn truncate(&self, file: &File, len: u64) -> io::Result<()> {
        #[cfg(test)]
        if self.fail.truncate_fails() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        file.set_len(len)
    }

    /// A last round for what was appended, then the active segment synced, so the journal no
    /// longer needs to replay into this store; afterwards writes are refused.
    pub(crate) fn close_log(&self) -> Result<()> {
        let mut st = self.log.lock();
        if st.closed {
            return Ok(());
        }
        st.closed = true;
        // A failed log or disk has nothing more it could make durable.
        if st.failed.is_some() || self.disk.shared().failed().is_some() {
            return Ok(());
        }
        if self.opts.durability != Durability::Durable {
            // Nothing waits for a round in relaxed mode; a clean close still syncs the log.
            let active = st.active.file.clone();
            drop(st);
            return crate::segment::fdatasync(&active).map_err(io_error);
        }
        let (completer, completion) = pair();
        let target = st.written;
        st.waiting.push((target, completer));
        let queue = !std::mem::replace(&mut st.dirty, true);
        let active = st.active.file.clone();
        drop(st);
        if queue {
            let me = self
                .me
                .upgrade()
                .expect("the closing caller holds the store");
            self.disk.shared().mark_dirty(me);
        }
        completion.wait()?;
        self.disk.shared().sync_segment(&active).map_err(io_error)
    }

    /// Total bytes of all segment files.
    pub(crate) fn bytes_on_disk(&self) -> u64 {
        let st = self.log.lock();
        st.sealed_bytes + st.active_len
    }
}

impl Engine {
    pub(crate) fn writable(&self, st: &LogState) -> Result<()> {
        if st.closed {
            return Err(Error::Unavailable("store is closed".into()));
        }
        if let Some(why) = &st.failed {
            return Err(Error::Unavailable(why.clone()));
        }
        match self.disk.shared().failed() {
            Some(why) => Err(Error::Unavailable(why)),
            None => Ok(()),
        }
    }
}

pub(crate) fn remember_pending(st: &mut LogState, info: &RecordInfo, end: LogPos) {
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
