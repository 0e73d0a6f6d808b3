//! Visiting: a replica's documents in a stable key order, a page at a time.
//!
//! Documents are ordered by `(h, key)`, where `h` is [`visit_hash`] of the key: the first 8
//! bytes (big-endian) of its SHA-256, the same in every process and every release, so a
//! position `(h, key)` means the same thing on every replica and after any restart. A visit
//! that asks for "documents after `(h, key)` with `h <= last`" gets each document of the
//! range exactly once however the documents are rewritten meanwhile (an update does not move
//! a key, unlike in the change feed), and a range of `h` is a slice of the corpus that does
//! not depend on the partition count.
//!
//! The ordered set ([`DocOrder`]) lives beside the index's map of documents and is kept in
//! step by the index's `apply` (a key enters the set when it enters the map). Compaction may
//! drop a key from the map without telling the set (an entry it forgets); a scan skips such
//! keys and removes them afterwards, so the set never answers for a key the map dropped.

use std::collections::BTreeSet;
use std::ops::Bound;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::engine::Engine;
use crate::index::{DocState, Index};
use crate::types::Result;

/// The position of a document in visiting order: its key's [`visit_hash`], then the key.
pub type VisitPos = (u64, Bytes);

/// The fixed 64-bit hash that orders documents for visiting: the first 8 bytes of the key's
/// SHA-256, big-endian. Part of the internal API (continuations and slices depend on it):
/// never change it.
pub fn visit_hash(key: &[u8]) -> u64 {
    let digest = Sha256::digest(key);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// Every document key of the index (live and removed) in visiting order.
#[derive(Default)]
pub(crate) struct DocOrder {
    keys: BTreeSet<VisitPos>,
}

impl DocOrder {
    /// Adds a key that just entered the index's map of documents.
    pub(crate) fn insert(&mut self, key: &Bytes) {
        self.keys.insert((visit_hash(key), key.clone()));
    }

    /// Rebuilds the set from the map (after a checkpoint was loaded into it).
    pub(crate) fn rebuild<'a>(&mut self, keys: impl Iterator<Item = &'a Bytes>) {
        self.keys = keys.map(|k| (visit_hash(k), k.clone())).collect();
    }

    fn remove(&mut self, pos: &VisitPos) {
        self.keys.remove(pos);
    }
}

/// Where a page starts: after a position already returned, or at the first `h` of a range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VisitFrom {
    /// Documents whose `h` is at least this.
    Start(u64),
    /// Documents strictly after this position.
    After(VisitPos),
}

/// A document's state on this replica, as a visit returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VisitState {
    Live(Bytes),
    /// A versioned tombstone: returned so that a visit merging replicas lets a newer remove
    /// win over an older put another replica still holds.
    Removed,
}

/// One document of a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisitEntry {
    pub h: u64,
    pub key: Bytes,
    pub version: u64,
    pub time_ms: u64,
    pub state: VisitState,
}

/// A page of documents in visiting order.
#[derive(Debug, Default)]
pub struct VisitPage {
    pub entries: Vec<VisitEntry>,
    /// Whether the range may hold documents after the last entry (the page was cut by its
    /// limit or byte budget). False: the range is exhausted on this replica.
    pub more: bool,
}

/// A state copied out of the index, read once the index lock is released.
enum Planned {
    Live {
        loc: crate::types::Location,
        size: u64,
    },
    Removed,
}

impl Engine {
    /// Up to `limit` documents (live and removed) from `from` to `last` (inclusive) in visiting
    /// order, stopping early once the live documents' bytes reach `max_bytes` (at least one
    /// entry is returned). Reads the documents after releasing the index lock: blocking I/O,
    /// call it off the async workers.
    pub(crate) fn visit_docs(
        &self,
        from: &VisitFrom,
        last: u64,
        limit: usize,
        max_bytes: u64,
    ) -> Result<VisitPage> {
        let (planned, more) = loop {
            let (planned, more, dropped) = {
                let index = self.index.read();
                plan(&index, from, last, limit.max(1), max_bytes)
            };
            if !dropped.is_empty() {
                let mut index = self.index.write();
                for pos in &dropped {
                    if !index.docs.contains_key(&pos.1) {
                        index.doc_order.remove(pos);
                    }
                }
            }
            // A scan cut by dropped keys alone returned nothing: those are pruned now, so the
            // next scan gets further.
            if !(planned.is_empty() && more) {
                break (planned, more);
            }
        };
        let mut page = VisitPage {
            entries: Vec::with_capacity(planned.len()),
            more,
        };
        for ((h, key), version, time_ms, state) in planned {
            let state = match state {
                Planned::Live { loc, size } => {
                    VisitState::Live(crate::reader::read_whole(&loc, &key, size)?)
                }
                Planned::Removed => VisitState::Removed,
            };
            page.entries.push(VisitEntry {
                h,
                key,
                version,
                time_ms,
                state,
            });
        }
        Ok(page)
    }
}

impl crate::Store {
    /// Up to `limit` documents, live and removed, from `from` through `h <= last`, in visiting
    /// order (see the module docs), cut early once the live documents reach `max_bytes`.
    /// Blocking I/O: call it off the async workers.
    pub fn visit_docs(
        &self,
        from: &VisitFrom,
        last: u64,
        limit: usize,
        max_bytes: u64,
    ) -> Result<VisitPage> {
        self.engine.visit_docs(from, last, limit, max_bytes)
    }
}

type PlannedEntry = (VisitPos, u64, u64, Planned);

/// Most keys the map no longer has that one scan steps over before it returns.
/// (Smaller in tests, so that a test crosses it with few writes.)
const MAX_DROPPED_PER_SCAN: usize = if cfg!(test) { 64 } else { 4096 };

/// The page's entries as index states, whether more follow, and the positions whose key the
/// map no longer has (to prune).
fn plan(
    index: &Index,
    from: &VisitFrom,
    last: u64,
    limit: usize,
    max_bytes: u64,
) -> (Vec<PlannedEntry>, bool, Vec<VisitPos>) {
    let lower = match from {
        VisitFrom::Start(h) => Bound::Included((*h, Bytes::new())),
        VisitFrom::After(pos) => Bound::Excluded(pos.clone()),
    };
    let mut planned = Vec::new();
    let mut dropped = Vec::new();
    let mut bytes = 0u64;
    for pos in index.doc_order.keys.range((lower, Bound::Unbounded)) {
        if pos.0 > last {
            return (planned, false, dropped);
        }
        let spent = bytes >= max_bytes && !planned.is_empty();
        // Bounds the time the read lock is held over keys the map dropped (after a mass
        // delete whose tombstones were dropped): the caller prunes them and scans again.
        if planned.len() >= limit || spent || dropped.len() >= MAX_DROPPED_PER_SCAN {
            return (planned, true, dropped);
        }
        let (version, time_ms, state) = match index.docs.get(&pos.1) {
            Some(DocState::Live {
                version,
                time_ms,
                size,
                loc,
                ..
            }) => {
                bytes = bytes.saturating_add(*size);
                let live = Planned::Live {
                    loc: loc.clone(),
                    size: *size,
                };
                (*version, *time_ms, live)
            }
            Some(DocState::Removed { version, tomb }) => (*version, tomb.time_ms, Planned::Removed),
            None => {
                dropped.push(pos.clone());
                continue;
            }
        };
        planned.push((pos.clone(), version, time_ms, state));
    }
    (planned, false, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fixed() {
        // SHA-256("") starts e3b0c44298fc1c14; this must never change (continuations).
        assert_eq!(visit_hash(b""), 0xe3b0_c442_98fc_1c14);
        assert_ne!(visit_hash(b"id:n:t::1"), visit_hash(b"id:n:t::2"));
    }

    #[test]
    fn keys_the_map_dropped_are_skipped_and_pruned_a_bounded_number_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::Store::open(dir.path(), crate::Options::default()).unwrap();
        let n = 3 * MAX_DROPPED_PER_SCAN as u64;
        for i in 0..n {
            let key = format!("id:n:t::{i}");
            store
                .begin_put_doc(key.as_bytes(), 1, 1, Bytes::from_static(b"{}"))
                .wait()
                .unwrap();
        }
        // What compaction (or dropping tombstones) does: the map forgets keys, the set not yet.
        store
            .engine
            .index
            .write()
            .docs
            .retain(|k, _| k.as_ref() == b"id:n:t::7" || k.as_ref() == b"id:n:t::9");
        let all = visit_all(&store, 0, u64::MAX, 5);
        let mut keys: Vec<_> = all.iter().map(|e| e.key.clone()).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                Bytes::from_static(b"id:n:t::7"),
                Bytes::from_static(b"id:n:t::9")
            ]
        );
        assert_eq!(store.engine.index.read().doc_order.keys.len(), 2);
    }

    /// Every page of a visit, with `after` positions carried, from `first` through `last`.
    fn visit_all(store: &crate::Store, first: u64, last: u64, limit: usize) -> Vec<VisitEntry> {
        let mut from = VisitFrom::Start(first);
        let mut all = Vec::new();
        loop {
            let page = store.visit_docs(&from, last, limit, 1 << 20).unwrap();
            if let Some(e) = page.entries.last() {
                from = VisitFrom::After((e.h, e.key.clone()));
            }
            all.extend(page.entries);
            if !page.more {
                return all;
            }
        }
    }

    #[test]
    fn pages_cover_each_key_once_in_order_across_updates_and_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::Store::open(dir.path(), crate::Options::default()).unwrap();
        for i in 0..300u64 {
            let key = format!("id:n:t::{i}");
            store
                .put_doc(key.as_bytes(), 10, 1, Bytes::from(format!("{{\"i\":{i}}}")))
                .unwrap();
        }
        for i in (0..300u64).step_by(3) {
            let key = format!("id:n:t::{i}");
            store.remove_doc(key.as_bytes(), 20, 1).unwrap();
        }
        let check = |store: &crate::Store| {
            let all = visit_all(store, 0, u64::MAX, 7);
            assert_eq!(all.len(), 300);
            assert!(all
                .windows(2)
                .all(|w| (w[0].h, &w[0].key) < (w[1].h, &w[1].key)));
            let removed = all
                .iter()
                .filter(|e| e.state == VisitState::Removed)
                .count();
            assert_eq!(removed, 100);
            // Two halves of the hash space are a partition of the whole.
            let half = u64::MAX / 2;
            let low = visit_all(store, 0, half, 13);
            let high = visit_all(store, half + 1, u64::MAX, 13);
            assert_eq!(low.len() + high.len(), 300);
            assert!(low.iter().all(|e| e.h <= half) && high.iter().all(|e| e.h > half));
        };
        check(&store);
        // An update moves nothing: a visit in progress sees the key once.
        let page = store
            .visit_docs(&VisitFrom::Start(0), u64::MAX, 50, 1 << 20)
            .unwrap();
        let pos = page.entries.last().map(|e| (e.h, e.key.clone())).unwrap();
        for e in page
            .entries
            .iter()
            .filter(|e| e.state != VisitState::Removed)
        {
            store
                .put_doc(&e.key, 30, 1, Bytes::from_static(b"{}"))
                .unwrap();
        }
        let rest = store.visit_docs(&VisitFrom::After(pos.clone()), u64::MAX, 1000, 1 << 30);
        assert_eq!(rest.unwrap().entries.len(), 250);
        store.close().unwrap();
        drop(store);
        let store = crate::Store::open(dir.path(), crate::Options::default()).unwrap();
        check(&store);
    }
}
