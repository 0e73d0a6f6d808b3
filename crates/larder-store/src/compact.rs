//! Segment compaction: a sealed segment whose garbage passes a threshold gets its live records
//! copied, in order and with their sequence numbers, into the segment's next generation, which
//! then takes its place (protocol in `FORMAT.md`, "Compaction").
//!
//! Garbage: blob puts superseded by a tombstone or expired, document puts and removes superseded
//! by a newer version, records whose data fails its checksum (dropped and reported, never
//! copied: a copy would get a valid-looking head), and tombstones the drop rule lets go (past
//! the caller's horizon and retention, shadowing no put left in the log: `FORMAT.md`).
//! Every copied record is verified (head and every data block) before it is copied; its block
//! checksum table is copied as stored, and only the head is re-encoded for its new offset.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use crate::engine::Engine;
use crate::format::{
    blocks_for, decode_record, encode_file_header, encode_head, RecordInfo, SegmentHeader,
    FILE_HEADER_LEN,
};
use crate::index::{BlobState, DocState, Index, Tomb};
use crate::ledger::{Kept, Planned};
use crate::scan::{Found, Scanner};
use crate::segment::{io_error, segment_file_name, sync_dir, Segment};
use crate::types::{CompactOptions, CompactReport, Location, Op, Result};

/// A rewrite being written: `<next generation's name>.tmp`, removed on open.
pub(crate) const TMP_SUFFIX: &str = ".log.tmp";

/// A record of the segment that stays, where it was and its info.
struct Keep {
    info: RecordInfo,
    start: u64,
    end: u64,
}

/// What one scan of a sealed segment found.
struct Plan {
    keep: Vec<Keep>,
    /// Put records left out that a newer state of their key shadowed: once the rewrite is
    /// committed, their keys' shadow counts go down (`index::Tomb`).
    shadowed: Vec<RecordInfo>,
    /// Tombstones left out under the drop rule: removed from the index once committed.
    tombstones: Vec<RecordInfo>,
    /// How many of `shadowed` each key has (they go in the same atomic rewrite as a tombstone
    /// after them in this segment).
    shadowed_per_key: HashMap<Bytes, u32>,
    corrupt: u64,
    len: u64,
}

impl Plan {
    fn live_bytes(&self) -> u64 {
        self.keep.iter().map(|k| k.end - k.start).sum()
    }
    fn garbage(&self) -> u64 {
        self.len - FILE_HEADER_LEN - self.live_bytes()
    }
    /// What the ledger keeps of the records that stay.
    fn kept(&self) -> impl Iterator<Item = Kept> + '_ {
        self.keep.iter().map(|k| Kept {
            expires_ms: k.info.expires_ms,
            tombstone: matches!(k.info.op, Op::DeleteBlob | Op::RemoveDoc)
                .then_some((k.info.time_ms, k.info.seq)),
        })
    }

    fn shadow(&mut self, put: RecordInfo) {
        *self.shadowed_per_key.entry(put.key.clone()).or_default() += 1;
        self.shadowed.push(put);
    }

    /// Whether rewriting pays: enough garbage bytes, or more droppable tombstones than records
    /// to copy (tombstones are small, but each costs an index entry: this keeps the index
    /// bounded by live records even where garbage bytes stay under the ratio).
    fn worth_it(&self, min_garbage_ratio: f64) -> bool {
        let garbage = self.garbage();
        let payload = self.len - FILE_HEADER_LEN;
        garbage > 0
            && ((garbage as f64) >= min_garbage_ratio * payload as f64
                || self.tombstones.len() > self.keep.len())
    }
}

/// What compaction does with one record.
enum Fate {
    Keep,
    /// Garbage nothing refers to (an expired or corrupt put, a superseded remove).
    Drop,
    /// A put a newer state of its key supersedes: that state counts it among its shadows.
    DropShadowed,
    /// A tombstone the drop rule lets go.
    DropTombstone,
}

/// The drop rule (`FORMAT.md`, "Dropping tombstones"): past the peers' horizon, older than the
/// retention, and no older put of the key left anywhere in this log once this rewrite is
/// committed (`dropping`: the key's shadowed puts this same rewrite leaves out).
fn may_drop(tomb: &Tomb, dropping: u32, opts: &CompactOptions) -> bool {
    tomb.shadows <= dropping
        && opts.tombstone_horizon.is_some_and(|h| tomb.seq <= h)
        && tomb
            .time_ms
            .checked_add(opts.tombstone_retention_ms)
            .is_some_and(|due| due <= opts.now_ms)
}

/// Share of a rewrite's time it may spend waiting for foreground work: a node that is never
/// idle still compacts, at a tenth of the rate.
const MAX_YIELD_SHARE: f64 = 0.9;
/// How long a rewrite waits before it looks at the foreground again.
const YIELD_STEP: std::time::Duration = std::time::Duration::from_millis(2);

/// A rewrite hands its pages to the kernel's write-back every this many bytes, and waits for
/// the previous such range to be on disk: its dirty pages stay bounded, so its final `fsync`
/// is short and does not stall the journal's `fdatasync`s behind a segment's worth of write-back.
/// Small, because each range goes to the disk as one burst that the foreground's syncs queue
/// behind: 1 MiB is about a millisecond of this machine's disk, 8 MiB was ten.
const WRITEBACK_CHUNK: u64 = 1 << 20;

/// A throttled rewrite that yields to a foreground (a storage node's) instead hands this many
/// bytes to write-back at a time and waits until they are written: at most this much of it is
/// ever between the page cache and the disk, ahead of a writer's sync (a quarter of a
/// millisecond of this machine's disk), and it starts none while a commit round syncs.
const YIELDING_WRITEBACK_CHUNK: u64 = 256 << 10;
/// Longest one chunk waits for the disk's round syncs to end: a disk that is always syncing
/// still gets compacted.
const MAX_SYNC_WAIT: std::time::Duration = std::time::Duration::from_millis(5);
/// Recent round syncs this much slower than those with no write-back in flight make a rewrite
/// pause after each chunk ...
const SLOWDOWN_TOLERATED: f64 = 1.2;
/// ... for `SLOWDOWN_PAUSE` times the chunk's own write time per unit of slowdown (twice the
/// idle latency: twice the chunk's time), at most `MAX_SLOWDOWN_PAUSE`.
const SLOWDOWN_PAUSE: f64 = 2.0;
const MAX_SLOWDOWN_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// Records a plan scans (and verifies) at idle priority before deciding their fates.
const PLAN_BATCH: usize = 1024;

/// A record a plan's scan found: its data block that fails its checksum, if one does.
type Scanned = (crate::scan::Scanned, Option<u64>);

/// Scans records from `pos` into `batch` (at most `PLAN_BATCH`), stepping over what is not a
/// record; returns where the next batch starts (`len`: the segment's end).
fn scan_batch(
    scanner: &mut Scanner,
    mut pos: u64,
    len: u64,
    batch: &mut Vec<Scanned>,
) -> Result<u64> {
    while pos < len && batch.len() < PLAN_BATCH {
        match scanner.read_at(pos, true)? {
            Found::Valid(rec) => {
                pos = rec.end;
                batch.push((rec, None));
            }
            Found::BadData(rec, block) => {
                pos = rec.end;
                batch.push((rec, Some(block)));
            }
            Found::Invalid => match scanner.resync(pos + 1)? {
                Some(next) => pos = next,
                None => return Ok(len),
            },
        }
    }
    Ok(pos)
}

/// How long a pass waits for readers still holding a replaced segment before leaving its space
/// to be freed by the last of them, all at once (`release.rs`).
const READERS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// How fast a rewrite may copy: `rate` bytes per second (0: no limit), counted over the time it
/// did not spend yielding, and not while `foreground` is busy; and its write-back as it goes.
struct Pace<'a> {
    started: std::time::Instant,
    rate: u64,
    foreground: Option<&'a crate::types::Foreground>,
    yielded: std::time::Duration,
    /// The rewrite's file, and the end of the bytes already handed to write-back (from 0).
    file: &'a File,
    written_back: u64,
    /// Where the range last handed to write-back starts (it ends at `written_back`).
    in_flight_from: u64,
    /// The disk's round syncs, when the rewrite yields to them (throttled, with a foreground).
    syncs: Option<&'a crate::sync_watch::SyncWatch>,
}

impl<'a> Pace<'a> {
    fn new(
        rate: u64,
        foreground: Option<&'a crate::types::Foreground>,
        file: &'a File,
        syncs: &'a crate::sync_watch::SyncWatch,
    ) -> Pace<'a> {
        Pace {
            syncs: (rate > 0 && foreground.is_some()).then_some(syncs),
            started: std::time::Instant::now(),
            rate,
            foreground,
            yielded: std::time::Duration::ZERO,
            file,
            written_back: 0,
            in_flight_from: 0,
        }
    }

    /// Starts write-back of the bytes up to `end` once a chunk has gathered, after waiting for
    /// the chunk before it. Advisory: errors are left to the final `fsync`, which is what counts.
    fn write_back(&mut self, end: u64) {
        use std::os::fd::AsRawFd;
        if let Some(syncs) = self.syncs {
            return self.write_back_yielding(end, syncs);
        }
        if end < self.written_back + WRITEBACK_CHUNK {
            return;
        }
        let fd = self.file.as_raw_fd();
        let (from, len) = (self.written_back, end - self.written_back);
        let previous = self.in_flight_from;
        // SAFETY: plain syscalls on a file descriptor this rewrite owns for its whole life.
        unsafe {
            libc::sync_file_range(fd, from as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE);
            let wait = libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER;
            // A length of 0 would mean "to the end of the file": the first chunk waits for none.
            if from > previous {
                libc::sync_file_range(fd, previous as i64, (from - previous) as i64, wait);
            }
        }
        self.in_flight_from = from;
        self.written_back = end;
    }

    /// `write_back` giving way to the disk's round syncs, a chunk at a time (a record may be
    /// larger than one).
    fn write_back_yielding(&mut self, end: u64, syncs: &crate::sync_watch::SyncWatch) {
        if end < self.written_back + YIELDING_WRITEBACK_CHUNK {
            return;
        }
        while self.written_back < end {
            let len = (end - self.written_back).min(YIELDING_WRITEBACK_CHUNK);
            self.write_chunk_yielding(len, syncs);
        }
    }

    /// Waits until no round sync is in flight, writes the next `len` bytes and waits for them,
    /// then pauses while recent syncs are slower than idle ones (the disk is busier than the
    /// foreground alone makes it). Waiting for a sync to end only moves the chunk in time: the
    /// rate limit's own sleep absorbs it. The pause lowers the rate: it counts as yielded
    /// (within `MAX_YIELD_SHARE`), so the rate limit does not make it up in a burst.
    fn write_chunk_yielding(&mut self, len: u64, syncs: &crate::sync_watch::SyncWatch) {
        use std::os::fd::AsRawFd;
        let waited_from = std::time::Instant::now();
        while syncs.syncing() && waited_from.elapsed() < MAX_SYNC_WAIT {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        let from = self.written_back;
        let end = from + len;
        let writing = std::time::Instant::now();
        {
            let _in_flight = syncs.writeback(len);
            let all = libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER;
            // SAFETY: a plain syscall on a file descriptor this rewrite owns for its whole life.
            unsafe { libc::sync_file_range(self.file.as_raw_fd(), from as i64, len as i64, all) };
        }
        let took = writing.elapsed();
        self.in_flight_from = end;
        self.written_back = end;
        let slowdown = syncs.slowdown();
        if slowdown > SLOWDOWN_TOLERATED && self.may_yield() {
            let pause = took
                .mul_f64(SLOWDOWN_PAUSE * (slowdown - 1.0))
                .min(MAX_SLOWDOWN_PAUSE);
            std::thread::sleep(pause);
            self.yielded += pause;
        }
        let waited = waited_from.elapsed().saturating_sub(took);
        if let Some(foreground) = self.foreground {
            foreground.add_yielded(waited);
        }
    }

    /// Whether the rewrite may still wait for the foreground (`MAX_YIELD_SHARE`).
    fn may_yield(&self) -> bool {
        self.yielded.as_secs_f64() < MAX_YIELD_SHARE * self.started.elapsed().as_secs_f64()
    }
}

/// Called before each record is copied, with the bytes copied so far: first gives way while the
/// node is busy with foreground requests (one atomic load when it is not), within
/// `MAX_YIELD_SHARE` of the time; then sleeps until `copied` is within the rate. Time spent
/// yielding does not count toward the rate, so a rewrite never bursts to catch up afterwards.
fn throttle(pace: &mut Pace, copied: u64) {
    pace.write_back(FILE_HEADER_LEN + copied);
    if let Some(foreground) = pace.foreground {
        let waited_from = std::time::Instant::now();
        while foreground.is_busy()
            && pace.yielded.as_secs_f64() < MAX_YIELD_SHARE * pace.started.elapsed().as_secs_f64()
        {
            let step = std::time::Instant::now();
            std::thread::sleep(YIELD_STEP);
            pace.yielded += step.elapsed();
        }
        let waited = waited_from.elapsed();
        if waited >= YIELD_STEP {
            foreground.add_yielded(waited);
        }
    }
    if pace.rate == 0 {
        return;
    }
    let due = std::time::Duration::from_secs_f64(copied as f64 / pace.rate as f64);
    let working = pace.started.elapsed().saturating_sub(pace.yielded);
    if let Some(wait) = due.checked_sub(working) {
        std::thread::sleep(wait);
    }
}

impl Engine {
    pub(crate) fn compact(&self, opts: &CompactOptions) -> Result<CompactReport> {
        let mut ledger = self.compaction.lock();
        let unpublished = self.seal_active(opts.seal_active)?;
        let sealed: Vec<Segment> = self
            .segments
            .read()
            .iter()
            .filter(|s| s.id < unpublished)
            .cloned()
            .collect();
        let mut report = CompactReport::default();
        let mut shadows_dropped = false;
        for seg in sealed {
            let payload = seg.file.metadata()?.len().saturating_sub(FILE_HEADER_LEN);
            let notes = self.index.write().notes.take(seg.id);
            if !ledger.should_plan(seg.id, payload, notes, opts, shadows_dropped) {
                report.segments_skipped += 1;
                report.sealed_bytes += payload;
                report.garbage_bytes += ledger.garbage(seg.id).min(payload);
                continue;
            }
            // Planned after the previous segment's rewrite was published: a put it dropped no
            // longer shadows a tombstone here (segments go oldest first, and a key's older
            // puts lie in this segment or before it).
            let plan = self.plan(&seg, opts)?;
            report.bytes_read += plan.len;
            let payload = plan.len - FILE_HEADER_LEN;
            let garbage = plan.garbage();
            // What a segment left alone holds, for the report's garbage measure.
            let left_alone = |report: &mut CompactReport| {
                report.sealed_bytes += payload;
                report.garbage_bytes += garbage;
            };
            let room = crate::space::free_bytes(&self.dir)
                // A full disk can still compact: the rewrite needs room only for the live bytes.
                .is_none_or(|free| free >= plan.live_bytes() + FILE_HEADER_LEN);
            if !plan.worth_it(opts.min_garbage_ratio) || !room {
                left_alone(&mut report);
                ledger.planned(seg.id, Planned::after(garbage, plan.kept(), opts));
                continue;
            }
            self.rewrite(&seg, &plan, opts.max_bytes_per_sec)?;
            ledger.planned(seg.id, Planned::after(0, plan.kept(), opts));
            shadows_dropped |= !plan.shadowed.is_empty();
            report.sealed_bytes += plan.live_bytes();
            report.segments_compacted += 1;
            report.bytes_reclaimed += garbage;
            report.live_bytes_copied += plan.live_bytes();
            report.corrupt_records_dropped += plan.corrupt;
            report.tombstones_dropped += plan.tombstones.len() as u64;
            // The old generation's name is gone; its blocks go back a few MiB at a time.
            crate::release::release_gradually(seg.file, READERS_WAIT);
        }
        Ok(report)
    }

    /// What happens to the record at `start` of `seg`, decided from the index.
    fn fate(
        &self,
        info: &RecordInfo,
        seg: &Segment,
        start: u64,
        plan: &Plan,
        opts: &CompactOptions,
    ) -> Fate {
        let here = |loc: &Location| loc.segment == seg.id && loc.offset == start;
        let dropping = plan.shadowed_per_key.get(&info.key).copied().unwrap_or(0);
        let index = self.index.read();
        match info.op {
            Op::PutBlob => match index.blobs.get(&info.key) {
                Some(BlobState::Live(b)) if here(&b.loc) => {
                    if b.meta.expires_ms.is_none_or(|exp| opts.now_ms < exp) {
                        Fate::Keep
                    } else {
                        Fate::Drop
                    }
                }
                Some(BlobState::Deleted(_)) => Fate::DropShadowed,
                _ => Fate::Drop,
            },
            Op::PutDoc => match index.docs.get(&info.key) {
                Some(DocState::Live { loc, .. }) if here(loc) => Fate::Keep,
                Some(state) if state.version() > info.version => Fate::DropShadowed,
                _ => Fate::Drop,
            },
            // A tombstone that is not exactly the index's is kept: only the rule drops one.
            Op::DeleteBlob => match index.blobs.get(&info.key) {
                Some(BlobState::Deleted(t)) if t.seq == info.seq && may_drop(t, dropping, opts) => {
                    Fate::DropTombstone
                }
                _ => Fate::Keep,
            },
            Op::RemoveDoc => match index.docs.get(&info.key) {
                Some(DocState::Removed { tomb, .. }) if tomb.seq == info.seq => {
                    if may_drop(tomb, dropping, opts) {
                        Fate::DropTombstone
                    } else {
                        Fate::Keep
                    }
                }
                // Superseded by a newer put: every older put loses to that one anyway.
                Some(state) if state.version() > info.version => Fate::Drop,
                _ => Fate::Keep,
            },
        }
    }

    fn plan(&self, seg: &Segment, opts: &CompactOptions) -> Result<Plan> {
        let len = seg.file.metadata()?.len();
        let mut scanner = Scanner::new(&seg.file, seg.id, len);
        let mut plan = Plan {
            keep: Vec::new(),
            shadowed: Vec::new(),
            tombstones: Vec::new(),
            shadowed_per_key: HashMap::new(),
            corrupt: 0,
            len,
        };
        let mut pos = FILE_HEADER_LEN;
        let mut batch = Vec::with_capacity(PLAN_BATCH);
        while pos < len {
            // Reading and verifying every block is the CPU-heavy part and takes no lock: it
            // runs idle. The fates take the index's read lock: they run at normal priority.
            pos = {
                let _idle = crate::idle_cpu::IdleCpu::enter();
                scan_batch(&mut scanner, pos, len, &mut batch)?
            };
            for found in batch.drain(..) {
                self.decide(found, seg, &mut plan, opts);
            }
        }
        Ok(plan)
    }

    /// Adds the record `found` to `plan` as its fate says (`fate`); one whose data fails its
    /// checksum (`bad_block`) is never kept.
    fn decide(&self, found: Scanned, seg: &Segment, plan: &mut Plan, opts: &CompactOptions) {
        let (rec, bad_block) = found;
        let fate = self.fate(&rec.info, seg, rec.start, plan, opts);
        let Some(block) = bad_block else {
            match fate {
                Fate::Keep => plan.keep.push(Keep {
                    info: rec.info,
                    start: rec.start,
                    end: rec.end,
                }),
                Fate::Drop => {}
                Fate::DropShadowed => plan.shadow(rec.info),
                Fate::DropTombstone => plan.tombstones.push(rec.info),
            }
            return;
        };
        if matches!(fate, Fate::DropShadowed) {
            plan.shadow(rec.info);
        }
        tracing::warn!(
            segment = seg.id,
            offset = rec.start,
            block,
            "compaction drops a record whose data fails its checksum"
        );
        plan.corrupt += 1;
    }

    /// Writes the next generation of `seg` with the planned records, syncs it, swaps it in.
    fn rewrite(&self, seg: &Segment, plan: &Plan, rate: u64) -> Result<()> {
        let gen = seg.gen + 1;
        let final_name = segment_file_name(seg.id, gen);
        let tmp = self.dir.join(format!("{final_name}.tmp"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        let began = std::time::Instant::now();
        let moved = match self.copy_records(seg, plan, &file, rate) {
            Ok(moved) => moved,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let copied = began.elapsed();
        self.fail_point(1)?;
        self.record_dropped(plan)?;
        // The commit point is the rename; the checkpoint (whose locations point into the old
        // layout) goes first, and no checkpoint is written until the index points to the new.
        let _no_checkpoint = self.ckpt.lock.lock();
        self.remove_checkpoint_locked()?;
        std::fs::rename(&tmp, self.dir.join(&final_name))?;
        sync_dir(&self.dir).map_err(io_error)?;
        let renamed = began.elapsed();
        self.fail_point(2)?;
        std::fs::remove_file(self.dir.join(segment_file_name(seg.id, seg.gen)))?;
        sync_dir(&self.dir).map_err(io_error)?;
        let unlinked = began.elapsed();
        // Held for a sync (by the log or the journal), the deleted file's space stays in use.
        self.forget_deleted_segment(&seg.file);
        self.fail_point(3)?;
        let new = Segment {
            id: seg.id,
            file: Arc::new(file),
            first_seq: seg.first_seq,
            gen,
        };
        self.publish_rewrite(seg, &new, &moved, plan);
        let published = began.elapsed();
        let checkpointed = self.write_checkpoint_locked();
        tracing::debug!(
            segment = seg.id,
            copy_ms = ms(copied),
            swap_ms = ms(renamed - copied),
            unlink_ms = ms(unlinked - renamed),
            publish_ms = ms(published - unlinked),
            checkpoint_ms = ms(began.elapsed() - published),
            "segment rewritten"
        );
        checkpointed
    }

    /// Before a rewrite that drops tombstones commits: `tombstones.dropped` covers them.
    fn record_dropped(&self, plan: &Plan) -> Result<()> {
        let Some(newest) = plan.tombstones.iter().map(|t| t.seq).max() else {
            return Ok(());
        };
        if newest <= self.dropped_through.load(Ordering::Acquire) {
            return Ok(());
        }
        crate::dropped::save(&self.dir, newest).map_err(io_error)?;
        self.dropped_through.store(newest, Ordering::Release);
        Ok(())
    }

    /// Copies every planned record, verified, to `file`; returns (old offset, new offset) pairs.
    fn copy_records(
        &self,
        seg: &Segment,
        plan: &Plan,
        file: &File,
        rate: u64,
    ) -> Result<Vec<(u64, u64)>> {
        let header = SegmentHeader {
            incarnation: self.incarnation,
            first_seq: seg.first_seq,
        };
        file.write_all_at(&encode_file_header(seg.id, header), 0)?;
        let mut at = FILE_HEADER_LEN;
        let mut moved = Vec::with_capacity(plan.keep.len());
        let syncs = &self.disk.shared().syncs;
        let mut pace = Pace::new(rate, self.opts.compaction_yields_to.as_ref(), file, syncs);
        let mut copied = 0u64;
        // The copy loop takes no lock (reads and writes of two files this rewrite owns, and
        // the foreground counters, atomics): it may run at idle CPU priority.
        let idle = crate::idle_cpu::IdleCpu::enter();
        for k in &plan.keep {
            throttle(&mut pace, copied);
            let bytes =
                crate::segment::read_exact_at(&seg.file, k.start, (k.end - k.start) as usize)?;
            // Verified again as read now: what is copied is exactly what passed its checksums.
            let rec = decode_record(&bytes, seg.id, k.start).map_err(|e| {
                crate::types::Error::Corrupt {
                    location: format!("{} offset {}", segment_file_name(seg.id, seg.gen), k.start),
                    detail: format!("changed while compacting: {e:?}"),
                }
            })?;
            let head_len = k.info.head_len() as usize;
            let table = &bytes[head_len - 4 * blocks_for(k.info.size) as usize..head_len];
            let crcs: Vec<u32> = table
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4-byte chunks")))
                .collect();
            let head = encode_head(&rec.info, &crcs, seg.id, at);
            crate::segment::write_all_vectored_at(file, at, &[&head, rec.data])?;
            moved.push((k.start, at));
            at += (head.len() + rec.data.len()) as u64;
            copied += k.end - k.start;
        }
        drop(idle);
        let syncing = std::time::Instant::now();
        file.sync_all()?;
        tracing::debug!(
            segment = seg.id,
            final_sync_ms = ms(syncing.elapsed()),
            "rewrite synced"
        );
        Ok(moved)
    }

    /// Points the index, the segment list and the byte count at the new generation.
    fn publish_rewrite(&self, old: &Segment, new: &Segment, moved: &[(u64, u64)], plan: &Plan) {
        let new_loc = |offset| Location {
            segment: new.id,
            offset,
            file: new.file.clone(),
        };
        let is_old = |loc: &Location, offset| {
            loc.segment == old.id && loc.offset == offset && Arc::ptr_eq(&loc.file, &old.file)
        };
        {
            let mut index = self.index.write();
            for (k, (from, to)) in plan.keep.iter().zip(moved) {
                match k.info.op {
                    Op::PutBlob => {
                        if let Some(BlobState::Live(b)) = index.blobs.get_mut(&k.info.key) {
                            if is_old(&b.loc, *from) {
                                b.loc = new_loc(*to);
                            }
                        }
                    }
                    Op::PutDoc => {
                        if let Some(DocState::Live { loc, .. }) = index.docs.get_mut(&k.info.key) {
                            if is_old(loc, *from) {
                                *loc = new_loc(*to);
                            }
                        }
                    }
                    Op::DeleteBlob | Op::RemoveDoc => {}
                }
            }
            forget_dropped(&mut index, plan);
            // What still points into the old generation was dropped (expired or corrupt): the
            // index forgets it, so it stays bounded by live data.
            let before = index.blobs.len();
            index.blobs.retain(|_, b| match b {
                BlobState::Live(b) => !Arc::ptr_eq(&b.loc.file, &old.file),
                BlobState::Deleted(_) => true,
            });
            let gone_blobs = (before - index.blobs.len()) as u64;
            let before = index.docs.len();
            index.docs.retain(|_, d| match d {
                DocState::Live { loc, .. } => !Arc::ptr_eq(&loc.file, &old.file),
                DocState::Removed { .. } => true,
            });
            let gone = gone_blobs + (before - index.docs.len()) as u64;
            index.live_keys -= gone;
        }
        {
            let mut segments = self.segments.write();
            if let Some(slot) = segments.iter_mut().find(|s| s.id == old.id) {
                *slot = new.clone();
            }
        }
        self.feed_hints.lock().forget_segment(old.id);
        let new_len = FILE_HEADER_LEN + plan.live_bytes();
        self.log.lock().sealed_bytes -= plan.len - new_len;
        self.clamp_positions(old.id, new_len);
        let mut index = self.index.write();
        if index.durable.segment == old.id {
            index.durable.offset = index.durable.offset.min(new_len);
        }
    }

    #[cfg(test)]
    fn fail_point(&self, point: u8) -> Result<()> {
        self.fail.compaction_point(point)
    }

    #[cfg(not(test))]
    fn fail_point(&self, _point: u8) -> Result<()> {
        Ok(())
    }
}

/// Once a rewrite is committed: each shadowed put it left out no longer shadows its key's
/// state, and each tombstone it dropped leaves the index (unless a newer write of the key
/// replaced it meanwhile: that state stands, and carries the count).
fn forget_dropped(index: &mut Index, plan: &Plan) {
    for put in &plan.shadowed {
        let shadows = match put.op {
            Op::PutBlob => match index.blobs.get_mut(&put.key) {
                Some(BlobState::Deleted(t)) => Some(&mut t.shadows),
                _ => None,
            },
            _ => match index.docs.get_mut(&put.key) {
                Some(DocState::Live { shadows, .. }) => Some(shadows),
                Some(DocState::Removed { tomb, .. }) => Some(&mut tomb.shadows),
                None => None,
            },
        };
        if let Some(n) = shadows {
            *n = n.saturating_sub(1);
        }
    }
    for tomb in &plan.tombstones {
        let same = |t: &Tomb| t.seq == tomb.seq;
        match tomb.op {
            Op::DeleteBlob => {
                if matches!(index.blobs.get(&tomb.key), Some(BlobState::Deleted(t)) if same(t)) {
                    index.blobs.remove(&tomb.key);
                }
            }
            _ => {
                if matches!(index.docs.get(&tomb.key), Some(DocState::Removed { tomb: t, .. }) if same(t))
                {
                    index.docs.remove(&tomb.key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttled_yielding_write_back_starts_no_chunk_while_a_round_syncs() {
        let file = tempfile::tempfile().unwrap();
        file.write_all_at(&vec![7u8; 1 << 20], 0).unwrap();
        let syncs = crate::sync_watch::SyncWatch::default();
        let foreground = crate::types::Foreground::new(u64::MAX);
        let mut pace = Pace::new(1 << 30, Some(&foreground), &file, &syncs);
        let syncing = syncs.sync();
        let started = std::time::Instant::now();
        pace.write_back(1 << 20);
        // Four chunks, each of which waited as long as it may for the sync to end.
        let chunks = (1 << 20) / YIELDING_WRITEBACK_CHUNK as u32;
        assert!(started.elapsed() >= MAX_SYNC_WAIT * chunks);
        assert_eq!(pace.written_back, 1 << 20);
        drop(syncing);
        // That sync started before any write-back; none is in flight now.
        let _next = syncs.sync();
        assert_eq!(syncs.counters().1, 0);
    }
}
