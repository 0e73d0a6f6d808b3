//! Small object bodies this frontend has read, kept by blob ID.
//!
//! A GET of a small object costs two storage round trips: the quorum check of its name's index
//! record (a 304 when the record kept in `record_cache.rs` is still the newest) and the read of
//! its blob. The second one is only ever a read of bytes that cannot change: a blob ID is
//! minted once and its bytes are never rewritten (a new body is a new blob). So a body read
//! once can be served again from memory for as long as a name points at its blob, and
//! whether one does is what the first round trip decides, at every GET, from a quorum. Nothing
//! here can make a read stale: a name changed or deleted through any frontend resolves to
//! another blob (or none) before this cache is asked.
//!
//! A blob no name points at any more is tombstoned only after the grace period, and is never
//! reached through a name again, so a copy kept here is simply forgotten in time. Bytes enter
//! only as storage served them: after their checksums verified, whole.
//!
//! Bounded by `budget` bytes (each body counted with `OVERHEAD`) and by `max_body` per body;
//! the least recently used go first (an ordered index of last uses, as in `record_cache.rs`).

use std::collections::HashMap;

use bytes::Bytes;
use larder_cluster::BlobId;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::metrics::ReadLabels;
use crate::use_order::UseOrder;

/// What each kept body costs beyond its bytes (its ID, its map and index slots).
const OVERHEAD: usize = 128;

pub struct BodyCache {
    budget: usize,
    max_body: u64,
    inner: Mutex<Inner>,
    /// `larder_frontend_s3_body_cache_reads_total` by outcome: `hit` (served from here) or
    /// `miss` (read from storage, and kept).
    reads: Family<ReadLabels, Counter>,
}

#[derive(Default)]
struct Inner {
    bodies: HashMap<BlobId, Kept>,
    bytes: usize,
    uses: UseOrder<BlobId>,
}

struct Kept {
    body: Bytes,
    used: u64,
}

fn cost(body: &Bytes) -> usize {
    body.len().saturating_add(OVERHEAD)
}

impl BodyCache {
    /// Keeps bodies of at most `max_body` bytes, `budget` bytes in all (0: none).
    pub fn new(budget: usize, max_body: u64) -> BodyCache {
        BodyCache {
            budget,
            max_body,
            inner: Mutex::default(),
            reads: Family::default(),
        }
    }

    /// Whether a body of `size` bytes is kept here once read.
    pub fn keeps(&self, size: u64) -> bool {
        size <= self.max_body && usize::try_from(size).is_ok_and(|s| s + OVERHEAD <= self.budget)
    }

    /// The body of `id`, if kept (counted as a hit or a miss).
    pub fn get(&self, id: &BlobId) -> Option<Bytes> {
        let found = {
            let mut inner = self.inner.lock();
            let inner = &mut *inner;
            inner.bodies.get_mut(id).map(|kept| {
                kept.used = inner.uses.used(*id, Some(kept.used));
                kept.body.clone()
            })
        };
        let outcome = if found.is_some() { "hit" } else { "miss" };
        self.reads.get_or_create(&ReadLabels { outcome }).inc();
        found
    }

    /// Keeps `body`, the whole of blob `id` as storage served it, forgetting the least
    /// recently used bodies to make room.
    pub fn insert(&self, id: BlobId, body: Bytes) {
        if !self.keeps(body.len() as u64) {
            return;
        }
        let mut inner = self.inner.lock();
        let added = cost(&body);
        let before = inner.bodies.get(&id).map(|kept| kept.used);
        let used = inner.uses.used(id, before);
        if let Some(old) = inner.bodies.insert(id, Kept { body, used }) {
            inner.bytes -= cost(&old.body);
        }
        inner.bytes += added;
        while inner.bytes > self.budget {
            let Some(oldest) = inner.uses.oldest() else {
                break;
            };
            if let Some(gone) = inner.bodies.remove(&oldest) {
                inner.bytes -= cost(&gone.body);
            }
        }
    }

    /// Reads by outcome, for `/metrics`.
    pub fn reads(&self) -> Family<ReadLabels, Counter> {
        self.reads.clone()
    }

    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let inner = self.inner.lock();
        (inner.bodies.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use larder_cluster::BlobKind;
    use proptest::prelude::*;

    fn id(p: u32) -> BlobId {
        BlobId::mint(BlobKind::Simple, 1, p)
    }

    #[test]
    fn keeps_what_fits_and_forgets_the_least_recently_used() {
        let cache = BodyCache::new(3 * (100 + OVERHEAD), 1000);
        let ids: Vec<BlobId> = (0..4).map(id).collect();
        for i in &ids[..3] {
            cache.insert(*i, Bytes::from(vec![1u8; 100]));
        }
        assert!(cache.get(&ids[0]).is_some(), "a use makes 0 the newest");
        cache.insert(ids[3], Bytes::from(vec![2u8; 100]));
        assert!(
            cache.get(&ids[1]).is_none(),
            "1 was the least recently used"
        );
        for kept in [0, 2, 3] {
            assert!(cache.get(&ids[kept]).is_some(), "{kept} is kept");
        }
        assert!(!cache.keeps(1001), "past the per-body bound");
        cache.insert(id(9), Bytes::from(vec![0u8; 1001]));
        assert!(cache.get(&id(9)).is_none());
    }

    proptest! {
        #[test]
        fn never_holds_more_than_its_budget(
            ops in proptest::collection::vec((0u32..20, 0usize..600, any::<bool>()), 1..200),
        ) {
            let budget = 2000;
            let cache = BodyCache::new(budget, 500);
            let ids: Vec<BlobId> = (0..20).map(id).collect();
            for (i, size, read) in ops {
                let id = ids[i as usize];
                if read {
                    if let Some(body) = cache.get(&id) {
                        // An ID's bytes never change: what comes back is what went in.
                        prop_assert!(body.iter().all(|b| *b == i as u8));
                    }
                } else {
                    cache.insert(id, Bytes::from(vec![i as u8; size]));
                }
                let (bodies, bytes) = cache.held();
                prop_assert!(bytes <= budget);
                let inner = cache.inner.lock();
                prop_assert_eq!(inner.uses.len(), bodies);
                let counted: usize = inner.bodies.values().map(|k| cost(&k.body)).sum();
                prop_assert_eq!(counted, bytes);
            }
        }
    }
}
