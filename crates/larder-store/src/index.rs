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

#[derive(Clone, Debug)]
pub(crate) enum BlobState {
    Live(LiveBlob),
    /// Tombstones are permanent: a later put of the key is refused.
    Deleted {
        time_ms: u64,
    },
}

#[derive(Clone, Debug)]
pub(crate) enum DocState {
    Live {
        version: u64,
        time_ms: u64,
        size: u64,
        loc: Location,
    },
    Removed {
        version: u64,
        time_ms: u64,
    },
}

impl DocState {
    pub fn version(&self) -> u64 {
        match self {
            DocState::Live { version, .. } | DocState::Removed { version, .. } => *version,
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
}

impl Index {
    /// Applies one record in log order. Returns whether it changed anything. Takes the record
    /// by value so the key moves into the map (replay inserts millions of them).
    pub fn apply(&mut self, rec: RecordInfo, loc: Location) -> bool {
        self.last_seq = self.last_seq.max(rec.seq);
        match rec.op {
            Op::PutBlob => self.put_blob(rec, loc),
            Op::DeleteBlob => self.delete_blob(rec),
            Op::PutDoc | Op::RemoveDoc => self.apply_doc(rec, loc),
        }
    }

    fn put_blob(&mut self, rec: RecordInfo, loc: Location) -> bool {
        let Entry::Vacant(slot) = self.blobs.entry(rec.key) else {
            // Blobs are immutable and tombstones win, whichever came first.
            return false;
        };
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

    fn delete_blob(&mut self, rec: RecordInfo) -> bool {
        let tomb = BlobState::Deleted {
            time_ms: rec.time_ms,
        };
        match self.blobs.entry(rec.key) {
            Entry::Vacant(slot) => {
                slot.insert(tomb);
            }
            // The first tombstone's time stands.
            Entry::Occupied(o) if matches!(o.get(), BlobState::Deleted { .. }) => return false,
            Entry::Occupied(mut o) => {
                o.insert(tomb);
                self.live_keys -= 1;
            }
        }
        true
    }

    fn apply_doc(&mut self, rec: RecordInfo, loc: Location) -> bool {
        let new = match rec.op {
            Op::PutDoc => DocState::Live {
                version: rec.version,
                time_ms: rec.time_ms,
                size: rec.size,
                loc,
            },
            _ => DocState::Removed {
                version: rec.version,
                time_ms: rec.time_ms,
            },
        };
        let is_live = matches!(new, DocState::Live { .. });
        match self.docs.entry(rec.key) {
            Entry::Vacant(slot) => {
                self.doc_order.insert(slot.key());
                slot.insert(new);
            }
            Entry::Occupied(o) if o.get().version() >= rec.version => return false,
            Entry::Occupied(mut o) => {
                let old = o.insert(new);
                self.live_keys -= matches!(old, DocState::Live { .. }) as u64;
            }
        }
        self.live_keys += is_live as u64;
        true
    }
}
