//! The in-memory index: key -> newest effective record. The same `apply` serves the write path
//! (after durability) and replay, so a reopened store decides exactly as the live one did.

use std::collections::HashMap;

use bytes::Bytes;

use crate::api::{BlobMeta, Cursor, Location, Op};
use crate::format::RecordInfo;

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
    /// Everything before this position is durable and applied; published together with entries
    /// so a checkpoint snapshot and its cursor always agree.
    pub durable: Cursor,
    pub live_keys: u64,
}

impl Index {
    /// Applies one record in log order. Returns whether it changed anything.
    pub fn apply(&mut self, rec: &RecordInfo, loc: Location) -> bool {
        match rec.op {
            Op::PutBlob => self.put_blob(rec, loc),
            Op::DeleteBlob => self.delete_blob(rec),
            Op::PutDoc | Op::RemoveDoc => self.apply_doc(rec, loc),
        }
    }

    fn put_blob(&mut self, rec: &RecordInfo, loc: Location) -> bool {
        if self.blobs.contains_key(&rec.key) {
            // Blobs are immutable and tombstones win, whichever came first.
            return false;
        }
        let meta = BlobMeta {
            props: rec.props.clone(),
            time_ms: rec.time_ms,
            expires_ms: rec.expires_ms,
        };
        self.blobs.insert(
            rec.key.clone(),
            BlobState::Live(LiveBlob {
                meta,
                size: rec.size,
                loc,
            }),
        );
        self.live_keys += 1;
        true
    }

    fn delete_blob(&mut self, rec: &RecordInfo) -> bool {
        let tomb = BlobState::Deleted {
            time_ms: rec.time_ms,
        };
        match self.blobs.insert(rec.key.clone(), tomb) {
            Some(BlobState::Live(_)) => self.live_keys -= 1,
            Some(old @ BlobState::Deleted { .. }) => {
                // The first tombstone's time stands.
                self.blobs.insert(rec.key.clone(), old);
                return false;
            }
            None => {}
        }
        true
    }

    fn apply_doc(&mut self, rec: &RecordInfo, loc: Location) -> bool {
        let old = self.docs.get(&rec.key);
        if old.is_some_and(|d| d.version() >= rec.version) {
            return false;
        }
        let was_live = matches!(old, Some(DocState::Live { .. }));
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
        self.docs.insert(rec.key.clone(), new);
        self.live_keys = self.live_keys + is_live as u64 - was_live as u64;
        true
    }
}
