//! Opening a replica: segment headers, checkpoint, replay, torn-tail repair.
//!
//! Replay verifies every data block, because a checkpoint only vouches for records before its
//! cursor and the tail after it may have been cut short by a crash. A bad region at the very end
//! of the last segment is a torn write and is cut off; anywhere else it is corruption: reported,
//! counted, stepped over, and never served.

use std::path::Path;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::checkpoint::{self, CheckpointState, TMP_PREFIX};
use crate::commit::LogState;
use crate::disk::Disk;
use crate::engine::{Counters, Engine};
use crate::format::{
    check_file_header, FileHeader, RecordInfo, SegmentHeader, FILE_HEADER_LEN, FORMAT_VERSION,
};
use crate::index::Index;
use crate::scan::{Found, Scanned, Scanner};
use crate::segment::{
    create_segment, list_segments, open_segment, read_exact_at, rewrite_header, Segment,
};
use crate::types::{DiskOptions, Error, Location, LogPos, Options, Result};

/// Records per batch handed from the scanning thread to the indexing thread.
const BATCH: usize = 4096;

/// The scanning side of replay. Replay runs as a two-stage pipeline: one thread reads and
/// verifies records while the caller's thread inserts them into the index, so the two halves
/// of the work (checksums, hash inserts) use both cores.
struct Feed {
    tx: SyncSender<Vec<(RecordInfo, Location)>>,
    batch: Vec<(RecordInfo, Location)>,
    corrupt: u64,
    records: u64,
}

impl Feed {
    fn apply(&mut self, seg: &Segment, rec: Scanned) {
        let loc = Location {
            segment: seg.id,
            offset: rec.start,
            file: seg.file.clone(),
        };
        self.batch.push((rec.info, loc));
        self.records += 1;
        if self.batch.len() >= BATCH {
            self.flush();
        }
    }

    fn flush(&mut self) {
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        // The receiver only goes away if the indexing side panicked; the scan result says so.
        let _ = self.tx.send(batch);
    }
}

/// Replays every segment from `from` into `index`. Returns (corrupt records, records replayed)
/// and updates each segment's valid length.
fn replay(segments: &mut [(Segment, u64)], from: LogPos, index: &mut Index) -> Result<(u64, u64)> {
    let (tx, rx) = sync_channel(4);
    std::thread::scope(|scope| {
        let scanner = scope.spawn(move || {
            let mut feed = Feed {
                tx,
                batch: Vec::with_capacity(BATCH),
                corrupt: 0,
                records: 0,
            };
            let last = segments.len().saturating_sub(1);
            for (i, (seg, len)) in segments
                .iter_mut()
                .enumerate()
                .filter(|(_, (s, _))| s.id >= from.segment)
            {
                let start = if seg.id == from.segment {
                    from.offset
                } else {
                    FILE_HEADER_LEN
                };
                *len = replay_segment(seg, *len, start, i == last, &mut feed)?;
            }
            feed.flush();
            Ok::<_, Error>((feed.corrupt, feed.records))
        });
        for batch in rx {
            for (info, loc) in batch {
                index.apply(info, loc);
            }
        }
        scanner.join().expect("replay scanner panicked")
    })
}

/// Opens the store in `dir` on `disk`, or (`None`) on a private disk rooted at `dir` whose
/// journal is replayed first.
pub(crate) fn open(dir: &Path, opts: Options, disk: Option<Disk>) -> Result<Arc<Engine>> {
    crate::segment::create_dir_all_durable(dir)?;
    let lock = crate::lock::lock_dir(dir)?;
    let private_disk = disk.is_none();
    let disk = match disk {
        Some(disk) => disk,
        None => Disk::open(dir, DiskOptions::default())?,
    };
    let rel_path = disk.relative_path(dir)?;
    remove_stale_temp_files(dir);
    let mut corrupt = 0;
    let (mut segments, incarnation) = open_segments(dir, &mut corrupt)?;
    let mut index = checkpoint::load(dir, &segments)?.unwrap_or_default();
    index.doc_order.rebuild(index.docs.keys());
    let from = index.durable;
    let (replay_corrupt, replayed) = replay(&mut segments, from, &mut index)?;
    corrupt += replay_corrupt;
    // Compaction may have dropped the newest records of sealed segments (a tombstone, an
    // expired put); the last segment's first sequence still says how far sequences went, so
    // none is ever handed out twice.
    if let Some((last, _)) = segments.last() {
        index.last_seq = index.last_seq.max(last.first_seq.saturating_sub(1));
    }
    let next_seq = index
        .last_seq
        .checked_add(1)
        .ok_or_else(|| Error::Corrupt {
            location: dir.display().to_string(),
            detail: "sequence numbers exhausted".into(),
        })?;
    if segments.is_empty() {
        let header = SegmentHeader {
            incarnation,
            first_seq: next_seq,
        };
        segments.push((create_segment(dir, 1, header, true)?, FILE_HEADER_LEN));
    }
    let dropped_through = crate::dropped::load(dir, index.last_seq)?;
    let (active, active_len) = segments.last().cloned().expect("at least one segment");
    // Records replayed from the tail may never have been synced (the process died before its
    // group commit); sync them before they are served as durable.
    active.file.sync_data()?;
    let sealed: u64 = segments[..segments.len() - 1]
        .iter()
        .map(|(_, len)| len)
        .sum();
    index.durable = LogPos {
        segment: active.id,
        offset: active_len,
    };
    if corrupt > 0 {
        tracing::warn!(dir = %dir.display(), corrupt, "opened with corrupt records");
    }
    Ok(Arc::new_cyclic(|me| Engine {
        dir: dir.to_path_buf(),
        lock: parking_lot::Mutex::new(Some(lock)),
        log: Mutex::new(LogState::new(active, active_len, sealed, next_seq)),
        disk,
        rel_path,
        private_disk,
        index: RwLock::new(index),
        segments: RwLock::new(segments.into_iter().map(|(s, _)| s).collect()),
        counters: Counters {
            corrupt: corrupt.into(),
            ..Counters::default()
        },
        // A long replay is worth a checkpoint soon, so the next open is quick.
        ckpt: CheckpointState::with_since(replayed),
        incarnation,
        feed_hints: Default::default(),
        compaction: Default::default(),
        dropped_through: dropped_through.into(),
        space: crate::space::SpaceGuard::new(dir, opts.min_free_space),
        me: me.clone(),
        opts,
        #[cfg(test)]
        fail: Default::default(),
    }))
}

/// Leftovers of checkpoints and compactions interrupted by a crash.
fn remove_stale_temp_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(TMP_PREFIX) || name.ends_with(crate::compact::TMP_SUFFIX) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// A new store's incarnation: random and never 0 (0 is [`crate::Cursor::START`]'s).
fn new_incarnation() -> u64 {
    loop {
        let i: u64 = rand::random();
        if i != 0 {
            return i;
        }
    }
}

/// Opens every segment and checks its header. Returns each with its length, and the store's
/// incarnation (from the headers; a new one for a directory without a valid header).
fn open_segments(dir: &Path, corrupt: &mut u64) -> Result<(Vec<(Segment, u64)>, u64)> {
    let (found, stale) = list_segments(dir)?;
    // A compaction that crashed after its rewrite was renamed into place: the older generation
    // is garbage (the rewrite was synced before the rename).
    for path in stale {
        std::fs::remove_file(&path)?;
    }
    let mut out = Vec::with_capacity(found.len());
    let mut incarnation = None;
    let mut short_last = None;
    for (i, crate::segment::Found { id, gen, path }) in found.iter().enumerate() {
        let file = open_segment(path)?;
        let mut len = file.metadata()?.len();
        let head = read_exact_at(&file, 0, len.min(FILE_HEADER_LEN) as usize)?;
        // A header that cannot be read keeps the previous segment's first sequence: still a
        // lower bound for its records.
        let mut first_seq = out.last().map_or(0, |(s, _): &(Segment, u64)| s.first_seq);
        match check_file_header(&head, *id) {
            FileHeader::Valid(h) => {
                if *incarnation.get_or_insert(h.incarnation) != h.incarnation {
                    return Err(Error::Corrupt {
                        location: path.display().to_string(),
                        detail: "segment of another incarnation".into(),
                    });
                }
                first_seq = h.first_seq;
            }
            FileHeader::Unsupported(found) => {
                return Err(Error::UnsupportedVersion {
                    found,
                    supported: FORMAT_VERSION,
                    location: path.display().to_string(),
                })
            }
            FileHeader::Short if i + 1 == found.len() => {
                // Cut short while being created: nothing in it was ever acknowledged. Its header
                // is rewritten below, once the incarnation is known.
                short_last = Some(file.try_clone()?);
                len = FILE_HEADER_LEN;
            }
            FileHeader::Short | FileHeader::Corrupt => {
                tracing::warn!(segment = %path.display(), "segment header is corrupt; scanning it anyway");
                *corrupt += 1;
            }
        }
        out.push((
            Segment {
                id: *id,
                file: Arc::new(file),
                first_seq,
                gen: *gen,
            },
            len,
        ));
    }
    let incarnation = incarnation.unwrap_or_else(new_incarnation);
    if let (Some(file), Some((seg, _))) = (short_last, out.last()) {
        let header = SegmentHeader {
            incarnation,
            first_seq: seg.first_seq,
        };
        rewrite_header(&file, seg.id, header)?;
    }
    Ok((out, incarnation))
}

/// Replays `seg` from `from`; returns its valid length (shorter than `len` after a torn tail).
fn replay_segment(seg: &Segment, len: u64, from: u64, is_last: bool, r: &mut Feed) -> Result<u64> {
    let mut scanner = Scanner::new(&seg.file, seg.id, len);
    let mut pos = from;
    while pos < len {
        match scanner.read_at(pos, true)? {
            Found::Valid(rec) => {
                pos = rec.end;
                r.apply(seg, rec);
            }
            Found::BadData(rec, block) => {
                if is_last && scanner.resync(rec.end)?.is_none() {
                    return truncate_tail(seg, pos);
                }
                tracing::warn!(
                    segment = seg.id,
                    offset = pos,
                    block,
                    "record data fails its checksum"
                );
                r.corrupt += 1;
                pos = rec.end;
                // Indexed anyway: reads of its good blocks work, bad blocks report Corrupt.
                r.apply(seg, rec);
            }
            Found::Invalid => match scanner.resync(pos + 1)? {
                Some(next) => {
                    tracing::warn!(
                        segment = seg.id,
                        offset = pos,
                        skipped = next - pos,
                        "corrupt record skipped"
                    );
                    r.corrupt += 1;
                    pos = next;
                }
                None if is_last => return truncate_tail(seg, pos),
                None => {
                    tracing::warn!(
                        segment = seg.id,
                        offset = pos,
                        "corrupt tail of a sealed segment"
                    );
                    r.corrupt += 1;
                    break;
                }
            },
        }
    }
    Ok(len)
}

/// Cuts off a record the process was writing when it died; it was never acknowledged.
fn truncate_tail(seg: &Segment, at: u64) -> Result<u64> {
    tracing::warn!(segment = seg.id, offset = at, "truncating torn tail");
    seg.file.set_len(at)?;
    seg.file.sync_data()?;
    Ok(at)
}
