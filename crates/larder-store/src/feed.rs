//! The change feed: durable records in log order, read straight from the segments.
//!
//! A cursor is logical (`DESIGN.md` 6.1): the store's incarnation and the sequence number of the
//! last record the reader saw. Records are in sequence order in the log (appended under the log
//! mutex, and compaction keeps the order), so "records after a cursor" are the records with a
//! larger sequence found by scanning forward from any physical position before them. The scan
//! starts from a hint (where an earlier page of the feed stopped: a reader that keeps asking
//! with the `next` it got starts exactly there) or else from the start of the last segment whose
//! first sequence is not past the cursor, so a cold cursor costs at most one segment's headers.
//! A cursor whose records compaction dropped resumes at the next surviving record; a cursor of
//! another incarnation (a rebuilt replica) starts from the beginning. Records the index no
//! longer serves (superseded puts and removes) are left out even before compaction drops them.

use std::collections::BTreeMap;

use crate::engine::Engine;
use crate::format::RecordInfo;
use crate::format::FILE_HEADER_LEN;
use crate::index::BlobState;
use crate::scan::{Found, Scanner};
use crate::segment::Segment;
use crate::types::{Change, ChangeBatch, Cursor, LogPos, Op, Result};

/// Most hints kept; the smallest sequences are forgotten first (readers move forward).
const MAX_HINTS: usize = 256;

/// Where the feed can start scanning for a sequence: `hint(s)` is a position such that every
/// record with a sequence larger than `s` lies at or after it.
#[derive(Default)]
pub(crate) struct FeedHints {
    hints: BTreeMap<u64, LogPos>,
}

impl FeedHints {
    fn find(&self, after_seq: u64) -> Option<LogPos> {
        self.hints.range(..=after_seq).next_back().map(|(_, p)| *p)
    }

    fn insert(&mut self, seq: u64, pos: LogPos) {
        self.hints.insert(seq, pos);
        while self.hints.len() > MAX_HINTS {
            self.hints.pop_first();
        }
    }

    /// Forgets every hint into `segment`: for a segment compaction rewrote or removed.
    #[allow(dead_code)]
    pub(crate) fn forget_segment(&mut self, segment: u32) {
        self.hints.retain(|_, p| p.segment != segment);
    }
}

/// Whether a scan stopped because the page was full, and where.
enum Stop {
    Full(LogPos),
    End,
}

impl Engine {
    pub(crate) fn changes(&self, after: Cursor, limit: usize) -> Result<ChangeBatch> {
        let (durable, last_seq) = {
            let index = self.index.read();
            (index.durable, index.last_seq)
        };
        let after_seq = if after.incarnation == self.incarnation {
            after.sequence
        } else {
            0
        };
        let mut batch = ChangeBatch {
            changes: Vec::new(),
            next: Cursor {
                incarnation: self.incarnation,
                sequence: after_seq,
            },
        };
        if limit == 0 {
            return Ok(batch);
        }
        let segments = self.segments.read().clone();
        let start = self.feed_start(&segments, after_seq);
        let mut stop = Stop::End;
        for seg in segments
            .iter()
            .filter(|s| s.id >= start.segment && s.id <= durable.segment)
        {
            let from = if seg.id == start.segment {
                start.offset.max(FILE_HEADER_LEN)
            } else {
                FILE_HEADER_LEN
            };
            // Sealed segments are complete; in the durable position's segment stop there.
            // (Clamped: compaction may have rewritten that segment shorter meanwhile.)
            let len = seg.file.metadata()?.len();
            let to = if seg.id == durable.segment {
                durable.offset.min(len)
            } else {
                len
            };
            stop = self.scan_changes(seg, from, to, after_seq, limit, &mut batch)?;
            if matches!(stop, Stop::Full(_)) {
                break;
            }
        }
        let hint = match stop {
            Stop::Full(pos) => pos,
            // Everything durable was seen: the reader is at the durable end, even if the last
            // records it skipped are gone (compacted garbage).
            Stop::End => {
                batch.next.sequence = batch.next.sequence.max(last_seq);
                durable
            }
        };
        if batch.next.sequence > 0 {
            self.feed_hints.lock().insert(batch.next.sequence, hint);
        }
        Ok(batch)
    }

    /// A position before every record with a sequence larger than `after_seq`.
    fn feed_start(&self, segments: &[Segment], after_seq: u64) -> LogPos {
        if let Some(pos) = self.feed_hints.lock().find(after_seq) {
            if segments.iter().any(|s| s.id == pos.segment) {
                return pos;
            }
        }
        // Records of earlier segments all have sequences below this one's first.
        let seg = segments
            .iter()
            .rev()
            .find(|s| s.first_seq <= after_seq.saturating_add(1))
            .or(segments.first());
        LogPos {
            segment: seg.map_or(0, |s| s.id),
            offset: FILE_HEADER_LEN,
        }
    }

    /// Whether the index still serves this record: the feed leaves out garbage (puts a
    /// tombstone or a newer version superseded, superseded removes), which compaction will drop
    /// anyway. What a peer pulls is then the same before and after compaction, it never fetches
    /// a blob only to be told it is gone, and nothing the index no longer knows is handed out.
    /// Blobs have at most one put record per key and a key's document versions are unique, so
    /// key and version identify the record whatever segment generation it was read from.
    fn in_feed(&self, info: &RecordInfo) -> bool {
        let index = self.index.read();
        match info.op {
            Op::PutBlob => matches!(index.blobs.get(&info.key), Some(BlobState::Live(_))),
            Op::DeleteBlob => matches!(index.blobs.get(&info.key), Some(BlobState::Deleted(_))),
            Op::PutDoc | Op::RemoveDoc => index
                .docs
                .get(&info.key)
                .is_some_and(|d| d.version() == info.version),
        }
    }

    fn scan_changes(
        &self,
        seg: &Segment,
        mut pos: u64,
        to: u64,
        after_seq: u64,
        limit: usize,
        batch: &mut ChangeBatch,
    ) -> Result<Stop> {
        let mut scanner = Scanner::new(&seg.file, seg.id, to);
        while pos < to {
            if batch.changes.len() >= limit {
                return Ok(Stop::Full(LogPos {
                    segment: seg.id,
                    offset: pos,
                }));
            }
            let rec = match scanner.read_at(pos, false)? {
                Found::Valid(rec) | Found::BadData(rec, _) => rec,
                // Recovery already reported this region; step over it like recovery did.
                Found::Invalid => match scanner.resync(pos + 1)? {
                    Some(next) => {
                        pos = next;
                        continue;
                    }
                    None => break,
                },
            };
            pos = rec.end;
            let info = rec.info;
            if info.seq <= after_seq || !self.in_feed(&info) {
                continue;
            }
            let cursor = Cursor {
                incarnation: self.incarnation,
                sequence: info.seq,
            };
            batch.changes.push(Change {
                cursor,
                op: info.op,
                key: info.key,
                time_ms: info.time_ms,
                version: info.version,
                size: info.size,
                expires_ms: info.expires_ms,
            });
            batch.next = cursor;
        }
        if batch.changes.len() >= limit {
            return Ok(Stop::Full(LogPos {
                segment: seg.id,
                offset: pos,
            }));
        }
        Ok(Stop::End)
    }
}
