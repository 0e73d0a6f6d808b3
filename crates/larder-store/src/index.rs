//! The in-memory index: key -> newest effective record. The same `apply` serves the write path
//! (after durability) and replay, so a reopened store decides exactly as the live one did.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use bytes::Bytes;

use crate::format::RecordInfo;
use crate::types::{BlobMeta, Location, LogPos, Op};

#[derive(Clone, Debug)]
pub(crate) struct LiveBlob {
    pub meta: BlobMeta,
    pub size: u64,
    pub loc: Location,
}

/// A tombstone in the index: its record's time and sequence (which the drop rule reads), and
/// how many put records of the key it shadows may still be in the log (older puts it made
/// garbage). It may be dropped only once that count is 0: otherwise a replay without it would
/// find the older put and bring the data back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tomb {
    pub time_ms: u64,
    pub seq: u64,
    pub shadows: u32,
}

#[derive(Clone, Debug)]
pub(crate) enum BlobState {
    Live(LiveBlob),
    /// A later put of the key is refused for as long as the tombstone is kept (until
    /// compaction drops it: `FORMAT.md`, "Dropping tombstones").
    Deleted(Tomb),
}

/// A document's newest version. `shadows` counts the key's older put records that may still be
/// in the log (superseded: garbage until compaction drops them); a remove is dropped only once
/// it is 0, so a replay without the remove cannot bring an older version back.
#[derive(Clone, Debug)]
pub(crate) enum DocState {
    Live {
        version: u64,
        time_ms: u64,
        size: u64,
        loc: Location,
        shadows: u32,
    },
    Removed {
        version: u64,
        tomb: Tomb,
    },
}

impl DocState {
    pub fn version(&self) -> u64 {
        match self {
            DocState::Live { version, .. } | DocState::Removed { version, .. } => *version,
        }
    }

    pub fn shadows(&self) -> u32 {
        match self {
            DocState::Live { shadows, .. } => *shadows,
            DocState::Removed { tomb, .. } => tomb.shadows,
        }
    }

    fn shadows_mut(&mut self) -> &mut u32 {
        match self {
            DocState::Live { shadows, .. } => shadows,
            DocState::Removed { tomb, .. } => &mut tomb.shadows,
        }
    }
}

/// Blobs and documents live in separate key spaces.
#[derive(Default)]
pub(crate) struct Index {
    pub blobs: HashMap<Bytes, BlobState>,
    pub docs: HashMap<Bytes, DocState>,
    /// Every key of `docs` in visiting order (`visit.rs`); may still hold keys `docs` dropped.
    pub doc_order: crate::visit::DocOrder,
    /// Everything before this position is durable and applied; published together with entries
    /// so a checkpoint snapshot and its cursor always agree.
    pub durable: LogPos,
    /// The highest sequence number applied: the durable end of the change feed.
    pub last_seq: u64,
    pub live_keys: u64,
    /// What landed in each segment since compaction last looked (`ledger.rs`).
    pub notes: crate::ledger::SegmentNotes,
}

impl Index {
    /// Applies one record in log order. Returns whether it changed anything. Takes the record
    /// by value so the key moves into the map (replay inserts millions of them).
    pub fn apply(&mut self, rec: RecordInfo, loc: Location) -> bool {
        self.last_seq = self.last_seq.max(rec.seq);
        match rec.op {
            Op::PutBlob => self.put_blob(rec, loc),
            Op::DeleteBlob => self.delete_blob(rec, loc),
            Op::PutDoc | Op::RemoveDoc => self.apply_doc(rec, loc),
        }
    }

    fn put_blob(&mut self, rec: RecordInfo, loc: Location) -> bool {
        let len = rec.head_len().saturating_add(rec.size);
        let slot = match self.blobs.entry(rec.key) {
            Entry::Vacant(slot) => slot,
            // Blobs are immutable and tombstones win, whichever came first. (A put found after
            // its tombstone only by a replay: still a record the tombstone shadows.)
            Entry::Occupied(mut o) => {
                if let BlobState::Deleted(tomb) = o.get_mut() {
                    tomb.shadows = tomb.shadows.saturating_add(1);
                }
                self.notes.garbage(loc.segment, len);
                return false;
            }
        };
        self.notes.expires(loc.segment, rec.expires_ms);
        let meta = BlobMeta {
            props: rec.props,
            time_ms: rec.time_ms,
            expires_ms: rec.expires_ms,
        };
        slot.insert(BlobState::Live(LiveBlob {
            meta,
            size: rec.size,
            loc,
        }));
        self.live_keys += 1;
        true
    }

    fn delete_blob(&mut self, rec: RecordInfo, loc: Location) -> bool {
        let mut tomb = Tomb {
            time_ms: rec.time_ms,
            seq: rec.seq,
            shadows: 0,
        };
        self.notes.tombstone(loc.segment, rec.time_ms);
        let key_len = rec.key.len();
        match self.blobs.entry(rec.key) {
            Entry::Vacant(slot) => {
                slot.insert(BlobState::Deleted(tomb));
            }
            // The first tombstone's time stands.
            Entry::Occupied(o) if matches!(o.get(), BlobState::Deleted(_)) => return false,
            Entry::Occupied(mut o) => {
                // The put it replaces stays in the log (garbage) until compaction drops it.
                if let BlobState::Live(b) = o.get() {
                    let len = crate::ledger::record_len(key_len, b.meta.props.len(), b.size);
                    self.notes.garbage(b.loc.segment, len);
                }
                tomb.shadows = 1;
                o.insert(BlobState::Deleted(tomb));
                self.live_keys -= 1;
            }
        }
        true
    }

    fn apply_doc(&mut self, rec: RecordInfo, loc: Location) -> bool {
        let is_put = rec.op == Op::PutDoc;
        let (segment, key_len) = (loc.segment, rec.key.len());
        let len = rec.head_len().saturating_add(rec.size);
        if !is_put {
            self.notes.tombstone(segment, rec.time_ms);
        }
        let mut new = if is_put {
            DocState::Live {
                version: rec.version,
                time_ms: rec.time_ms,
                size: rec.size,
                loc,
                shadows: 0,
            }
        } else {
            DocState::Removed {
                version: rec.version,
                tomb: Tomb {
                    time_ms: rec.time_ms,
                    seq: rec.seq,
                    shadows: 0,
                },
            }
        };
        match self.docs.entry(rec.key) {
            Entry::Vacant(slot) => {
                self.doc_order.insert(slot.key());
                slot.insert(new);
            }
            Entry::Occupied(mut o) if o.get().version() >= rec.version => {
                // Only a replay meets an older version in the log: a put of it is shadowed.
                let shadows = o.get_mut().shadows_mut();
                *shadows = shadows.saturating_add(is_put as u32);
                self.notes.garbage(segment, len);
                return false;
            }
            Entry::Occupied(mut o) => {
                let was_live = matches!(o.get(), DocState::Live { .. });
                if let DocState::Live { loc, size, .. } = o.get() {
                    let len = crate::ledger::record_len(key_len, 0, *size);
                    self.notes.garbage(loc.segment, len);
                }
                // Every older put record of the key (the one replaced, if live, and those it
                // shadowed) may still be in the log.
                *new.shadows_mut() = o.get().shadows().saturating_add(was_live as u32);
                o.insert(new);
                self.live_keys -= was_live as u64;
            }
        }
        self.live_keys += is_put as u64;
        true
    }
}
