//! Index records this frontend has read, kept by version. A read of one name (GET, HEAD, a
//! CopyObject source) or a listing page reads a whole index record of up to 1,000 names (a
//! quarter of a megabyte of JSON): storage read it from disk, sent it, and this frontend parsed
//! it, for every request. With a copy here, the read still asks a quorum, but names the version
//! it holds (`DocRouter::get_checking`): replicas holding exactly it answer without the body,
//! and when no answer is newer the copy is the newest state, so consistency is the quorum
//! read's as before, and only the bytes and the parsing are saved.
//!
//! A record is kept as its JSON when first read (the read itself decodes only what it needs,
//! `keep.rs`), and decoded whole the first time a read finds it unchanged; from then on reads
//! of that version clone what they keep from the decoded record. The cache holds at most
//! `budget` bytes (each record counted at `DECODED_FACTOR` times its JSON) and
//! `MAX_RECORDS` records, and forgets the least recently used past either (an ordered index of
//! last uses: no scan of every record).

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::error::S3Error;
use crate::keep::Keep;
use crate::metrics::ReadLabels;
use crate::records::Record;
use crate::use_order::UseOrder;

/// Records kept at most, whatever their size.
const MAX_RECORDS: usize = 4096;

/// What a record is counted at against the budget, per byte of its JSON: the decoded form's
/// strings, maps and allocations, plus the JSON kept beside it and each entry's own
/// (`records::EntryJson`).
const DECODED_FACTOR: usize = 5;

/// An index record that can be kept here and read from its decoded copy.
pub trait Cacheable: Record {
    /// A copy keeping only what `keep` says of the entries (for reading only, like a record
    /// decoded by `keep::decode_keeping`).
    fn keeping(&self, keep: &Keep) -> Self;
}

pub struct RecordCache {
    budget: usize,
    inner: Mutex<Inner>,
    /// `larder_frontend_s3_index_cache_reads_total` by outcome: `unchanged` (the copy kept
    /// here answered), `changed` (a copy was kept, but the quorum held another version, read
    /// whole) or `unkept` (none was kept; read whole).
    reads: Family<ReadLabels, Counter>,
}

#[derive(Default)]
struct Inner {
    records: HashMap<String, Kept>,
    bytes: usize,
    uses: UseOrder<String>,
}

struct Kept {
    version: u64,
    json: Bytes,
    decoded: Option<Arc<dyn Any + Send + Sync>>,
    /// Bytes of JSON the decoded copy holds beyond `json`'s: an index record's base, whose
    /// names it holds merged (`leaf_base.rs`), counted again even if the base is kept too.
    extra: usize,
    used: u64,
}

/// What a record of `json_bytes` bytes of JSON, holding `extra` more decoded, counts.
fn cost(json_bytes: usize, extra: usize) -> usize {
    json_bytes
        .saturating_add(extra)
        .saturating_mul(DECODED_FACTOR)
}

impl Kept {
    fn cost(&self) -> usize {
        cost(self.json.len(), self.extra)
    }
}

impl RecordCache {
    /// A cache of at most `budget` bytes; 0 keeps nothing.
    pub fn new(budget: usize) -> RecordCache {
        RecordCache {
            budget,
            inner: Mutex::default(),
            reads: Family::default(),
        }
    }

    /// The counter of reads by outcome, for the frontend's registry.
    pub fn reads(&self) -> Family<ReadLabels, Counter> {
        self.reads.clone()
    }

    pub fn count(&self, outcome: &'static str) {
        self.reads.get_or_create(&ReadLabels { outcome }).inc();
    }

    /// The version of record `id` kept here.
    pub fn known(&self, id: &str) -> Option<u64> {
        self.inner.lock().records.get(id).map(|kept| kept.version)
    }

    /// Keeps `json`, version `version` of record `id`, in place of any other version.
    pub fn keep(&self, id: &str, version: u64, json: Bytes) {
        self.keep_with(id, version, json, None, 0);
    }

    /// Keeps version `version` of record `id` as this frontend wrote it: its JSON and the
    /// record it was encoded from (holding `extra` bytes of a base's JSON more), so the next
    /// read of it decodes nothing.
    pub fn keep_written<R: Send + Sync + 'static>(
        &self,
        id: &str,
        version: u64,
        (json, extra): (Bytes, usize),
        record: R,
    ) {
        self.keep_with(id, version, json, Some(Arc::new(record)), extra);
    }

    fn keep_with(
        &self,
        id: &str,
        version: u64,
        json: Bytes,
        decoded: Option<Arc<dyn Any + Send + Sync>>,
        extra: usize,
    ) {
        let cost = cost(json.len(), extra);
        if cost > self.budget / 4 {
            // One record never takes most of the cache (nor any of a cache of 0).
            self.forget(id);
            return;
        }
        let mut inner = self.inner.lock();
        if inner
            .records
            .get(id)
            .is_some_and(|k| k.version == version && k.decoded.is_some())
        {
            return;
        }
        inner.remove(id);
        while inner.bytes.saturating_add(cost) > self.budget || inner.records.len() >= MAX_RECORDS {
            if !inner.evict_least_recent() {
                break;
            }
        }
        let used = inner.uses.used(id.to_owned(), None);
        inner.bytes += cost;
        let kept = Kept {
            version,
            json,
            decoded,
            extra,
            used,
        };
        inner.records.insert(id.to_owned(), kept);
    }

    pub fn forget(&self, id: &str) {
        self.inner.lock().remove(id);
    }

    /// Replaces the decoded copy of version `version` of record `id` with `record`, holding
    /// `extra` bytes of a base's JSON more (one made whole with its base, `leaf_base.rs`), if
    /// that version is still kept; forgets it if it no longer fits.
    pub fn set_decoded<R: Send + Sync + 'static>(
        &self,
        id: &str,
        version: u64,
        (record, extra): (Arc<R>, usize),
    ) {
        let mut inner = self.inner.lock();
        let Some(kept) = inner.records.get_mut(id).filter(|k| k.version == version) else {
            return;
        };
        let before = kept.cost();
        kept.decoded = Some(record);
        kept.extra = extra;
        let after = kept.cost();
        inner.bytes = inner.bytes.saturating_sub(before).saturating_add(after);
        if after > self.budget / 4 {
            inner.remove(id);
        }
        while inner.bytes > self.budget {
            if !inner.evict_least_recent() {
                break;
            }
        }
    }

    /// Version `version` of record `id`, decoded (once per version, outside the lock); `None`
    /// when no longer kept at that version (evicted or replaced meanwhile).
    pub fn record<R: Record>(&self, id: &str, version: u64) -> Option<Result<Arc<R>, S3Error>> {
        let json = {
            let mut inner = self.inner.lock();
            let kept = inner.touch(id, version)?;
            if let Some(decoded) = kept.decoded.clone() {
                // Another type under this ID would be a bug; it reads as not kept.
                return decoded.downcast::<R>().ok().map(Ok);
            }
            kept.json.clone()
        };
        let decoded = match R::decode(&json) {
            Ok(record) => Arc::new(record),
            Err(err) => return Some(Err(err)),
        };
        let mut inner = self.inner.lock();
        if let Some(kept) = inner.records.get_mut(id).filter(|k| k.version == version) {
            kept.decoded = Some(decoded.clone());
        }
        Some(Ok(decoded))
    }
}

impl Inner {
    /// Record `id` at `version`, now its most recent use.
    fn touch(&mut self, id: &str, version: u64) -> Option<&mut Kept> {
        let kept = self.records.get_mut(id).filter(|k| k.version == version)?;
        kept.used = self.uses.used(id.to_owned(), Some(kept.used));
        Some(kept)
    }

    fn remove(&mut self, id: &str) {
        if let Some(kept) = self.records.remove(id) {
            self.uses.forget(kept.used);
            self.bytes = self.bytes.saturating_sub(kept.cost());
        }
    }

    /// Forgets the least recently used record; false when there is none.
    fn evict_least_recent(&mut self) -> bool {
        match self.uses.oldest() {
            Some(id) => {
                self.remove(&id);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::Leaf;

    fn leaf_json(names: &[&str]) -> Bytes {
        let mut leaf = Leaf {
            v: crate::records::FORMAT_SPLIT,
            low: String::new(),
            ..Leaf::default()
        };
        for name in names {
            leaf.objects.insert((*name).to_owned(), Default::default());
        }
        leaf.encode()
    }

    #[test]
    fn a_kept_record_answers_only_for_its_version_and_is_decoded_once() {
        let cache = RecordCache::new(1 << 20);
        assert_eq!(cache.known("a"), None);
        cache.keep("a", 7, leaf_json(&["x", "y"]));
        assert_eq!(cache.known("a"), Some(7));
        assert!(cache.record::<Leaf>("a", 6).is_none(), "another version");
        let first = cache.record::<Leaf>("a", 7).unwrap().unwrap();
        let second = cache.record::<Leaf>("a", 7).unwrap().unwrap();
        assert!(Arc::ptr_eq(&first, &second), "decoded once");
        let one = second.keeping(&Keep::One("y".into()));
        assert_eq!(one.objects.keys().collect::<Vec<_>>(), ["y"]);
        cache.keep("a", 8, leaf_json(&["x"]));
        assert!(cache.record::<Leaf>("a", 7).is_none(), "replaced");
        cache.forget("a");
        assert_eq!(cache.known("a"), None);
    }

    #[test]
    fn the_budget_forgets_the_least_recently_used() {
        let json = leaf_json(&["x"]);
        let cost = json.len() * DECODED_FACTOR;
        let cache = RecordCache::new(cost * 4);
        for id in ["a", "b", "c", "d"] {
            cache.keep(id, 1, json.clone());
        }
        let _ = cache.record::<Leaf>("a", 1); // "b" is now the least recently used
        cache.keep("e", 1, json.clone());
        assert_eq!(cache.known("b"), None);
        for id in ["a", "c", "d", "e"] {
            assert_eq!(cache.known(id), Some(1), "{id}");
        }
        assert!(cache.inner.lock().bytes <= cost * 4);
        let inner = cache.inner.lock();
        assert_eq!(inner.uses.len(), inner.records.len(), "one use per record");
        drop(inner);
        let big = Bytes::from(vec![b' '; cost * 2]);
        cache.keep("big", 1, big);
        assert_eq!(
            cache.known("big"),
            None,
            "one record never takes most of it"
        );
        let none = RecordCache::new(0);
        none.keep("a", 1, json);
        assert_eq!(none.known("a"), None, "a cache of 0 keeps nothing");
    }

    proptest::proptest! {
        /// Whatever is kept, read and forgotten, in any order: the cache stays within its
        /// budget and record count, its use index matches its records, and a read answers
        /// only for the version kept.
        #[test]
        fn the_cache_keeps_its_bounds(ops in proptest::collection::vec((0u8..3, 0u8..12, 0u64..3, 1usize..4), 0..200)) {
            let unit = leaf_json(&["x"]);
            let cache = RecordCache::new(unit.len() * DECODED_FACTOR * 6);
            for (op, id, version, names) in ops {
                let id = format!("r{id}");
                match op {
                    0 => {
                        let names: Vec<String> = (0..names).map(|n| format!("n{n}")).collect();
                        let names: Vec<&str> = names.iter().map(String::as_str).collect();
                        cache.keep(&id, version, leaf_json(&names));
                    }
                    1 => {
                        let known = cache.known(&id);
                        let read = cache.record::<Leaf>(&id, version);
                        proptest::prop_assert_eq!(read.is_some(), known == Some(version));
                    }
                    _ => cache.forget(&id),
                }
                let inner = cache.inner.lock();
                proptest::prop_assert!(inner.bytes <= cache.budget);
                proptest::prop_assert!(inner.records.len() <= MAX_RECORDS);
                proptest::prop_assert_eq!(inner.uses.len(), inner.records.len());
                let counted: usize = inner.records.values().map(Kept::cost).sum();
                proptest::prop_assert_eq!(counted, inner.bytes);
            }
        }
    }
}
