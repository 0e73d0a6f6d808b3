//! The change feed: durable records in log order, read straight from the segments.
//!
//! A cursor is logical (`DESIGN.md` 6.1): the store's incarnation and the sequence number of the
//! last record the reader saw. Records are in sequence order in the log (appended under the log
//! mutex, and compaction keeps the order), so "records after a cursor" are the records with a
//! larger sequence found by scanning forward from any physical position before them. A
//! [`FeedReader`] (a bootstrap export) starts each page exactly where its last one stopped.
//! Other readers (replication pulls over HTTP, which carry only the logical cursor) start from a
//! hint (where an earlier page of the feed stopped: a reader that keeps asking with the `next`
//! it got starts exactly there, unless its hint was forgotten, least recently used first) or
//! else from the start of the last segment whose first sequence is not past the cursor, so a
//! cold cursor costs at most one segment's headers. A place in the log is used only in the
//! segment generation it was found in (compaction rewrites a segment as a new generation).
//! A cursor whose records compaction dropped resumes at the next surviving record; a cursor of
//! another incarnation (a rebuilt replica) starts from the beginning. Records the index no
//! longer serves (superseded puts and removes) are left out even before compaction drops them.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use crate::engine::Engine;
use crate::format::RecordInfo;
use crate::format::FILE_HEADER_LEN;
use crate::index::BlobState;
use crate::scan::{Found, Scanner};
use crate::segment::Segment;
use crate::types::{Change, ChangeBatch, Cursor, LogPos, Op, Result};

/// Most hints kept; the least recently used is forgotten first, so a reader far behind the
/// tail keeps its hint while others pull at the tail (forgetting the smallest sequence first made
/// exactly that reader start its every page from its segment's start: a quadratic export).
const MAX_HINTS: usize = 256;

/// An exact place in the log, valid only in the generation of the segment it names: compaction
/// rewrites a segment under a new generation, where the same offset means nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FeedPos {
    pos: LogPos,
    gen: u32,
}

impl FeedPos {
    /// The place if its segment is still in `segments` in the same generation.
    fn valid_in(self, segments: &[Segment]) -> Option<LogPos> {
        segments
            .iter()
            .any(|s| s.id == self.pos.segment && s.gen == self.gen)
            .then_some(self.pos)
    }
}

/// Where the feed can start scanning for a sequence: `hint(s)` is a position such that every
/// record with a sequence larger than `s` lies at or after it.
#[derive(Default)]
pub(crate) struct FeedHints {
    /// Sequence -> (position, the tick it was last inserted or found at).
    hints: BTreeMap<u64, (FeedPos, u64)>,
    tick: u64,
}

impl FeedHints {
    fn find(&mut self, after_seq: u64) -> Option<FeedPos> {
        self.tick = self.tick.wrapping_add(1);
        let (_, (pos, used)) = self.hints.range_mut(..=after_seq).next_back()?;
        *used = self.tick;
        Some(*pos)
    }

    fn insert(&mut self, seq: u64, pos: FeedPos) {
        self.tick = self.tick.wrapping_add(1);
        self.hints.insert(seq, (pos, self.tick));
        if self.hints.len() > MAX_HINTS {
            // A linear pass over a few hundred entries, once per page that adds a hint.
            let oldest = self.hints.iter().min_by_key(|(_, (_, used))| *used);
            if let Some((&seq, _)) = oldest {
                self.hints.remove(&seq);
            }
        }
    }

    /// Forgets every hint into `segment`: for a segment compaction rewrote or removed.
    pub(crate) fn forget_segment(&mut self, segment: u32) {
        self.hints.retain(|_, (p, _)| p.pos.segment != segment);
    }
}

/// A reader of the change feed that keeps its exact place in the log between pages (a bootstrap
/// export, `Store::feed`): each page starts where the last one stopped, whatever other readers
/// do to the shared hints, so a pass over the feed reads each byte of the log about once. The
/// place is private and only ever used in the segment generation it was found in; the cursor
/// stays the logical one (`DESIGN.md` 6.1).
pub struct FeedReader {
    store: crate::Store,
    after: Cursor,
    /// Where the page after `after` starts, if a page of this reader stopped there.
    at: Option<FeedPos>,
}

impl FeedReader {
    pub(crate) fn new(store: crate::Store, after: Cursor) -> FeedReader {
        FeedReader {
            store,
            after,
            at: None,
        }
    }

    /// The next page: at most `limit` durable changes after the reader's cursor, which then
    /// moves to the page's `next`.
    pub fn next_page(&mut self, limit: usize) -> Result<ChangeBatch> {
        let (batch, at) = self.store.engine.changes_from(self.after, self.at, limit)?;
        (self.after, self.at) = (batch.next, at);
        Ok(batch)
    }

    /// The cursor the next page starts after.
    pub fn cursor(&self) -> Cursor {
        self.after
    }
}

/// Whether a scan stopped because the page was full, and where.
enum Stop {
    Full(LogPos),
    End,
}

impl Engine {
    pub(crate) fn changes(&self, after: Cursor, limit: usize) -> Result<ChangeBatch> {
        self.changes_from(after, None, limit)
            .map(|(batch, _)| batch)
    }

    /// A page of the feed after `after`, starting at `resume` if it is a place where a page
    /// after that same cursor stopped (and its segment was not rewritten since), else at a hint;
    /// also the place where this page stopped (`None` when there is nothing to resume from).
    pub(crate) fn changes_from(
        &self,
        after: Cursor,
        resume: Option<FeedPos>,
        limit: usize,
    ) -> Result<(ChangeBatch, Option<FeedPos>)> {
        let (durable, last_seq) = {
            let index = self.index.read();
            (index.durable, index.last_seq)
        };
        let ours = after.incarnation == self.incarnation;
        let after_seq = if ours { after.sequence } else { 0 };
        let mut batch = ChangeBatch {
            changes: Vec::new(),
            next: Cursor {
                incarnation: self.incarnation,
                sequence: after_seq,
            },
        };
        if limit == 0 {
            return Ok((batch, resume.filter(|_| ours)));
        }
        let segments = self.segments.read().clone();
        let start = match resume.filter(|_| ours).and_then(|r| r.valid_in(&segments)) {
            Some(pos) => pos,
            None => self.feed_start(&segments, after_seq),
        };
        let mut full = None;
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
            let mut scanner = Scanner::new(&seg.file, seg.id, to);
            let scanned = self.scan_changes(&mut scanner, from, to, after_seq, limit, &mut batch);
            (self.counters.feed_read).fetch_add(scanner.bytes_read(), Ordering::Relaxed);
            if let Stop::Full(pos) = scanned? {
                full = Some(FeedPos { pos, gen: seg.gen });
                break;
            }
        }
        let stopped = match full {
            Some(pos) => Some(pos),
            // Everything durable was seen: the reader is at the durable end, even if the last
            // records it skipped are gone (compacted garbage).
            None => {
                batch.next.sequence = batch.next.sequence.max(last_seq);
                segments
                    .iter()
                    .find(|s| s.id == durable.segment)
                    .map(|s| FeedPos {
                        pos: durable,
                        gen: s.gen,
                    })
            }
        };
        if let Some(pos) = stopped.filter(|_| batch.next.sequence > 0) {
            self.feed_hints.lock().insert(batch.next.sequence, pos);
        }
        Ok((batch, stopped))
    }

    /// A position before every record with a sequence larger than `after_seq`.
    fn feed_start(&self, segments: &[Segment], after_seq: u64) -> LogPos {
        let hint = self.feed_hints.lock().find(after_seq);
        if let Some(pos) = hint.and_then(|h| h.valid_in(segments)) {
            return pos;
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
        scanner: &mut Scanner,
        mut pos: u64,
        to: u64,
        after_seq: u64,
        limit: usize,
        batch: &mut ChangeBatch,
    ) -> Result<Stop> {
        let segment = scanner.segment();
        while pos < to {
            if batch.changes.len() >= limit {
                return Ok(Stop::Full(LogPos {
                    segment,
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
                segment,
                offset: pos,
            }));
        }
        Ok(Stop::End)
    }
}
