//! A leaf's names in an immutable base blob, so that a write of the leaf sends only what
//! changed since (its delta) instead of every name. A small bucket's root, which holds its
//! names itself, takes a base the same way (format 3 of the root; a split root is format 2
//! and holds no names).
//!
//! A leaf of `index_leaf_entries` names is ~220 KB of JSON. A bucket written at random names
//! changes a different leaf with nearly every PUT, so batching gathers little, and each PUT
//! rewrote a whole leaf: encoded on the frontend, sent, written and synced on every replica
//! (`benchmarks/s3-compare/RESULTS-leaf-size.md`: leaves of 50 names ran at 1.27× the rate
//! with 0.75× the CPU). Smaller leaves would make the root's list of leaves 20× longer; this
//! keeps the leaves and writes less of them:
//!
//! - **A fold** writes the leaf's names as a blob (`LeafBaseBlob`, naming its leaf), stored
//!   like an object body, at quorum, before the leaf's record names it. The record is then
//!   format 3: its fields as before, `base` (the blob), `objects` only the names changed
//!   since and `removed` the names gone since. Every later write of the leaf sends that delta.
//! - **When**: a write whose delta would pass `[s3] index_delta_bytes` folds, if the leaf's
//!   names take `FOLD_FACTOR` times that; a smaller leaf is written whole again and gives its
//!   base up (as does an empty one, so a sealed leaf holds no base). 0 turns bases off: every
//!   leaf is written whole, as before (and a based one whole at its next write).
//! - **Reads** read the record from a quorum as before (it is small now), then the base by
//!   its blob ID. A blob's bytes never change, so a frontend keeps a base it read in the record
//!   cache under its ID, with no check against storage, and applies the record's delta to it
//!   (shared structure: `Objects` is a persistent map).
//! - **Nothing leaks**: the new base is held in the upload journal (`HeldFor::Base`) from
//!   before it is stored until the record's write is settled. Applied: the entry goes. Lost to
//!   a concurrent change, or refused: the blob is tombstoned (nothing named it). Outcome
//!   unknown, or the process died: a fence (the record written again as it is, at its
//!   primary), then the blob is kept only if the record names it as its base or holds it on
//!   its garbage list. The base a fold replaces goes on the leaf's garbage list, in the same
//!   write, and is tombstoned after a grace of a few operation timeouts (`base_grace`: a
//!   read that read the record just before may still be reading the old base). A leaf removed
//!   while it has a base (the stub of a leaf merged with its names, which keeps them; an empty
//!   leaf gives its base up) holds it the same way and tombstones it once the removal
//!   applied.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use larder_cluster::{BlobId, BlobKind};
use larder_proto::BlobProperties;
use larder_router::{DocRouter, DocState, JournalEntry, Router, Written};
use serde::Deserialize;
use tokio::time::Instant;

use crate::blobs;
use crate::error::S3Error;
use crate::held::{Held, HeldFor};
use crate::keep::Keep;
use crate::record_cache::RecordCache;
use crate::records::{LeafBase, LeafBaseBlob, Record, MAX_RECORD_BYTES};

/// How a frontend writes leaves: deltas of at most `delta_bytes` (0: whole), the bases it
/// replaces tombstoned after `grace`.
#[derive(Clone, Copy, Debug)]
pub struct BasePolicy {
    pub delta_bytes: usize,
    pub grace: Duration,
    /// Longest base stored (one simple blob: a chunk); a leaf whose names take more is
    /// written whole.
    pub max_blob: usize,
}

impl BasePolicy {
    /// Leaves written whole (what a `Records` without `with_leaf_bases` does).
    pub const WHOLE: BasePolicy = BasePolicy {
        delta_bytes: 0,
        grace: Duration::ZERO,
        max_blob: 0,
    };
}

/// How long a replaced base stays readable: `BASE_GRACE_OPERATIONS` times the router's
/// operation timeout, at most `replaced_blob_grace`. Only a read that read the record just
/// before its base was replaced fetches that base (the record cache keeps leaves with their
/// names merged, and a kept record found unchanged names the current base), and it does so
/// within its operation; a replaced object body, by contrast, may be streamed for minutes.
pub fn base_grace(replaced_blob_grace: Duration, router: &Router) -> Duration {
    (router.config().operation_timeout * BASE_GRACE_OPERATIONS).min(replaced_blob_grace)
}

/// See `base_grace`.
const BASE_GRACE_OPERATIONS: u32 = 4;

/// The cache key of base blob `blob` (a blob ID has no `:`, so no record's ID is this).
fn cache_key(blob: &str) -> String {
    format!("base:{blob}")
}

/// Base blob `blob` as `keep` keeps its names: the copy kept in `cache` (a blob never
/// changes), else read. Read for every name, it is kept decoded; read for one, it is kept as
/// its JSON and decoded whole by the next read that finds it there (as records are,
/// `record_cache.rs`), and this read builds only the name it wants.
pub async fn read_base(
    router: &Arc<Router>,
    cache: &RecordCache,
    blob: &str,
    keep: &Keep,
) -> Result<Arc<LeafBaseBlob>, S3Error> {
    let key = cache_key(blob);
    if let Some(kept) = cache.record::<LeafBaseBlob>(&key, 0) {
        return kept;
    }
    let id = blobs::parse_id(blob)?;
    let Some(bytes) = blobs::fetch_whole(router, &id, MAX_RECORD_BYTES).await? else {
        // Stored at a quorum before any record named it: a read of a record that was
        // replaced long ago (past the grace period), or a replica not yet caught up.
        return Err(S3Error::Unavailable(format!(
            "index base blob {blob} not found; try again"
        )));
    };
    let base = crate::keep::decode_keeping(keep, || LeafBaseBlob::decode(&bytes))?;
    match keep {
        Keep::All => cache.keep_written(&key, 0, (bytes, 0), base.clone()),
        Keep::One(_) => cache.keep(&key, 0, bytes),
    }
    Ok(Arc::new(base))
}

/// Makes `record` (decoded from `doc`) whole with its base's names, as `keep` keeps them.
pub async fn resolve<R: Record>(
    router: &Arc<Router>,
    cache: &RecordCache,
    doc: &str,
    record: &mut R,
    keep: &Keep,
) -> Result<(), S3Error> {
    if !record.unresolved() {
        return Ok(());
    }
    let blob = record.base_blob().unwrap_or_default().to_owned();
    let base = read_base(router, cache, &blob, keep).await?;
    record.resolve_base(doc, &base, keep)
}

/// A new base stored for a write, held until the write is settled.
pub struct Folded {
    pub blob: BlobId,
    pub held: Held,
    /// Its bytes and names, kept in the record cache once the write naming it applied.
    stored: (Bytes, LeafBaseBlob),
}

impl Folded {
    /// The write naming the base applied: keeps it in `cache` (the reads after the write find
    /// it there) and forgets its journal entry.
    pub fn named(self, cache: &RecordCache) {
        let (bytes, base) = self.stored;
        cache.keep_written(&cache_key(&self.blob.to_string()), 0, (bytes, 0), base);
        self.held.linked();
    }
}

/// Stores `base` as a blob held for `doc`'s base in the journal; `None` when it is longer than
/// `max_blob` (the leaf is then written whole).
pub async fn store_base(
    router: &Arc<Router>,
    (doc, base): (&str, LeafBaseBlob),
    max_blob: usize,
) -> Result<Option<(Folded, LeafBase)>, S3Error> {
    let bytes = base.encode();
    if bytes.len() > max_blob {
        return Ok(None);
    }
    let journal = hold(router, doc, None).await?;
    let props = BlobProperties {
        created_ms: crate::service::now_ms(),
        ..Default::default()
    };
    let put = router.put_blob_kind(BlobKind::Simple, &props, bytes.clone(), journal.as_ref());
    let blob = match put.await {
        Ok(blob) => blob,
        Err(err) => {
            Held::new(journal).unlinked(router, None);
            return Err(err.into());
        }
    };
    let leaf_base = LeafBase {
        blob: blob.to_string(),
        objects: Some(base.objects.clone()),
        bytes: bytes.len(),
    };
    let held = Held::new(journal);
    let base = LeafBaseBlob {
        bytes: bytes.len(),
        ..base
    };
    let stored = (bytes, base);
    Ok(Some((Folded { blob, held, stored }, leaf_base)))
}

/// A journal entry held for `doc`'s base, listing `existing` (a base already stored) when
/// given; `None` without a journal.
pub async fn hold(
    router: &Arc<Router>,
    doc: &str,
    existing: Option<&BlobId>,
) -> Result<Option<JournalEntry>, S3Error> {
    let name = HeldFor::Base {
        doc: doc.to_owned(),
    }
    .name();
    let Some(entry) = router.begin_journal_entry()? else {
        return Ok(None);
    };
    let failed =
        |e: std::io::Error| S3Error::Unavailable(format!("cannot write the upload journal: {e}"));
    entry.hold(&name).await.map_err(failed)?;
    if let Some(id) = existing {
        entry.record(id).await.map_err(failed)?;
    }
    Ok(Some(entry))
}

/// What a record's bytes say of base blobs, read leniently (any record, any version): the
/// one it names and those on its garbage list.
#[derive(Deserialize, Default)]
struct BlobsNamed {
    #[serde(default)]
    base: Option<Named>,
    #[serde(default)]
    garbage: Vec<Named>,
}

#[derive(Deserialize)]
struct Named {
    blob: String,
}

/// Whether `json` (a record's bytes; `None`: removed or absent) names one of `ids` as its
/// base or holds it on its garbage list.
fn names_any(json: Option<&[u8]>, ids: &[BlobId]) -> Result<bool, S3Error> {
    let Some(json) = json else {
        return Ok(false);
    };
    let named: BlobsNamed = serde_json::from_slice(json)
        .map_err(|e| S3Error::Corrupt(format!("an index record: {e}")))?;
    let ids: Vec<String> = ids.iter().map(BlobId::to_string).collect();
    let mut blobs = named.base.into_iter().chain(named.garbage);
    Ok(blobs.any(|n| ids.contains(&n.blob)))
}

/// Until storage answers: fences record `doc` (written again as it is, at its primary, after
/// which no write based on an older state applies), then tombstones `ids` unless it names
/// one of them as its base or holds it as garbage.
pub async fn settle(records_router: &Arc<Router>, router: &Arc<Router>, doc: &str, ids: &[BlobId]) {
    let docs = DocRouter::new(records_router.clone());
    let mut pause = Duration::from_millis(500);
    loop {
        match fence(&docs, records_router, doc).await {
            Ok(json) => match names_any(json.as_deref(), ids) {
                Ok(true) => return,
                Ok(false) => {
                    let failed = router
                        .delete_chunks(ids.to_vec(), "S3 index base never named")
                        .await;
                    if failed == 0 {
                        return;
                    }
                }
                Err(err) => tracing::warn!(%err, doc, "cannot settle an index base yet"),
            },
            Err(err) => tracing::warn!(%err, doc, "cannot settle an index base yet"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(30));
    }
}

/// Writes record `doc` again as the primary holds it (a tombstone if it holds none); returns
/// what it wrote.
async fn fence(
    docs: &DocRouter,
    records_router: &Arc<Router>,
    doc: &str,
) -> Result<Option<Bytes>, S3Error> {
    let deadline = Instant::now() + records_router.config().operation_timeout;
    loop {
        let state = docs.get_for_update(doc, deadline).await?;
        let seen = state.version();
        let json = match state {
            DocState::Found { json, .. } => Some(json),
            DocState::Removed { .. } | DocState::NotFound => None,
        };
        let version = docs.next_version(seen)?;
        let written = docs
            .write_serialised(doc, seen, version, json.clone(), deadline)
            .await?;
        if let Written::Applied = written {
            return Ok(json);
        }
    }
}

/// Settles a held base's entry in the background (the write naming it had no answer).
pub fn settle_later(records_router: &Arc<Router>, router: &Arc<Router>, doc: &str, held: Held) {
    let Some(entry) = held.into_entry() else {
        return;
    };
    let (records_router, router, doc) = (records_router.clone(), router.clone(), doc.to_owned());
    tokio::spawn(async move {
        settle(&records_router, &router, &doc, &entry.ids()).await;
        if let Err(err) = entry.remove().await {
            tracing::warn!(%err, "cannot remove a settled journal entry");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{delta, BasePlan, Leaf, ObjectEntry, Objects, FOLD_FACTOR, FORMAT_BASED};
    use proptest::prelude::*;

    fn entry(size: u64) -> Arc<ObjectEntry> {
        Arc::new(ObjectEntry {
            size,
            etag: format!("e{size}"),
            ..Default::default()
        })
    }

    fn names(pairs: &[(String, u64)]) -> Objects {
        pairs.iter().map(|(k, v)| (k.clone(), entry(*v))).collect()
    }

    const DOC: &str = "larder-s3:leaf:b:L1";

    /// A leaf as a fold leaves it: its names in a base (here not stored anywhere).
    fn based(objects: Objects) -> (Leaf, LeafBaseBlob) {
        let base = LeafBaseBlob {
            v: 1,
            leaf: DOC.into(),
            objects: objects.clone(),
            bytes: 0,
        };
        let mut leaf = Leaf {
            v: FORMAT_BASED,
            low: String::new(),
            objects,
            ..Default::default()
        };
        leaf.rebase(
            Some(LeafBase {
                blob: "B1".into(),
                objects: Some(base.objects.clone()),
                bytes: 0,
            }),
            0,
        );
        (leaf, base)
    }

    proptest! {
        /// Any base and any changes: the record written as a delta, read back and resolved
        /// with the base, is every name as changed; one name kept reads as in full.
        #[test]
        fn a_delta_applied_to_its_base_is_the_leaf(
            before in proptest::collection::btree_map("[a-c]{1,3}", 0u64..4, 0..24),
            changes in proptest::collection::vec(("[a-c]{1,3}", proptest::option::of(0u64..4)), 0..12),
        ) {
            let before: Vec<(String, u64)> = before.into_iter().collect();
            let (mut leaf, base) = based(names(&before));
            for (name, change) in changes {
                match change {
                    Some(size) => { leaf.objects.insert(name, entry(size)); }
                    None => { leaf.objects.remove(&name); }
                }
            }
            let stored = leaf.encode();
            let (changed, removed) = delta(&base.objects, &leaf.objects);
            let read = Leaf::decode(&stored).unwrap();
            prop_assert!(read.unresolved());
            prop_assert_eq!(read.objects.len(), changed.len());
            prop_assert_eq!(read.removed.len(), removed.len());
            // Written again unresolved: the same bytes.
            prop_assert_eq!(read.encode(), stored.clone());
            let mut whole = read.clone();
            whole.resolve_base(DOC, &base, &Keep::All).unwrap();
            prop_assert_eq!(&whole.objects, &leaf.objects);
            prop_assert_eq!(whole.encode(), stored.clone());
            for name in ["a", "b", "ab", "ccc"] {
                let mut one = read.clone();
                one.resolve_base(DOC, &base, &Keep::One(name.into())).unwrap();
                prop_assert_eq!(one.objects.get(name), leaf.objects.get(name));
                prop_assert!(one.objects.len() <= 1);
            }
        }
    }

    /// A small bucket's root takes a base the same way, in format 3; once split it is
    /// format 2 again and gives the base up at its next write.
    #[test]
    fn a_roots_names_take_a_base_too() {
        use crate::records::{BucketIndex, FORMAT, FORMAT_SPLIT};
        let doc = "larder-s3:bucket:b";
        let many: Vec<(String, u64)> = (0..400).map(|i| (format!("k{i:04}"), i)).collect();
        let mut root = BucketIndex {
            v: FORMAT,
            objects: names(&many),
            ..Default::default()
        };
        let limit = 20 * entry(1).approx_bytes();
        assert_eq!(root.base_plan((limit, usize::MAX)), BasePlan::Fold);
        let base = root.base_of(doc).unwrap();
        let stored = LeafBase {
            blob: "R1".into(),
            objects: Some(base.objects.clone()),
            bytes: 0,
        };
        root.rebase(Some(stored), 0);
        root.objects.remove("k0007");
        root.objects.insert("new".into(), entry(7));
        let bytes = root.encode();
        assert!(bytes.len() < 1024, "the delta only: {} bytes", bytes.len());
        let mut read = BucketIndex::decode(&bytes).unwrap();
        assert_eq!(read.v, FORMAT_BASED);
        assert!(read.unresolved());
        read.resolve_base(doc, &base, &Keep::All).unwrap();
        assert_eq!(read.objects, root.objects);
        assert!(read
            .resolve_base("larder-s3:bucket:other", &base, &Keep::All)
            .is_ok());
        let mut other = BucketIndex::decode(&bytes).unwrap();
        assert!(other
            .resolve_base("larder-s3:bucket:other", &base, &Keep::All)
            .is_err());
        // Split: the names move out, and the base goes on the garbage list.
        read.objects.clear();
        read.leaves.insert(String::new(), "L1".into());
        assert_eq!(read.base_plan((limit, usize::MAX)), BasePlan::Inline);
        read.rebase(None, 5);
        assert_eq!(read.v, FORMAT_SPLIT);
        assert_eq!(
            read.garbage.last().map(crate::records::Garbage::blob),
            Some("R1")
        );
        assert_eq!(BucketIndex::decode(&read.encode()).unwrap(), read);
        // Format 1 with a base is no record this code wrote.
        let one_with_base = br#"{"v":1,"created_ms":0,"objects":{},"base":{"blob":"B"}}"#;
        assert!(BucketIndex::decode(one_with_base).is_err());
    }

    #[test]
    fn a_base_of_another_leaf_is_refused() {
        let (leaf, mut base) = based(names(&[("a".into(), 1)]));
        let mut read = Leaf::decode(&leaf.encode()).unwrap();
        base.leaf = "larder-s3:leaf:b:other".into();
        assert!(read.resolve_base(DOC, &base, &Keep::All).is_err());
    }

    #[test]
    fn formats_and_fields_must_agree() {
        let two_with_base =
            br#"{"v":2,"bucket_created_ms":0,"low":"","objects":{},"base":{"blob":"B"}}"#;
        assert!(Leaf::decode(two_with_base).is_err());
        let three_without = br#"{"v":3,"bucket_created_ms":0,"low":"","objects":{}}"#;
        assert!(Leaf::decode(three_without).is_err());
        let removed_without_base =
            br#"{"v":2,"bucket_created_ms":0,"low":"","objects":{},"removed":["a"]}"#;
        assert!(Leaf::decode(removed_without_base).is_err());
        let three = br#"{"v":3,"bucket_created_ms":0,"low":"","objects":{},"base":{"blob":"B"},"removed":["a"]}"#;
        assert!(Leaf::decode(three).unwrap().unresolved());
    }

    #[test]
    fn the_plan_follows_the_sizes() {
        let many: Vec<(String, u64)> = (0..400).map(|i| (format!("k{i:04}"), i)).collect();
        let per = entry(1).approx_bytes();
        let limit = 20 * per;
        // Big enough and no base: fold. Bases off: as it is (whole).
        let (mut leaf, _) = based(names(&many));
        leaf.base = None;
        assert!(400 * per >= FOLD_FACTOR * limit);
        assert_eq!(leaf.base_plan((limit, usize::MAX)), BasePlan::Fold);
        assert_eq!(leaf.base_plan((0, usize::MAX)), BasePlan::AsIs);
        // A base and a small delta: as it is; a delta past the limit: fold again.
        let (mut leaf, _) = based(names(&many));
        leaf.objects.insert("new".into(), entry(9));
        assert_eq!(leaf.base_plan((limit, usize::MAX)), BasePlan::AsIs);
        assert_eq!(leaf.base_plan((0, usize::MAX)), BasePlan::Inline);
        for i in 0..30 {
            leaf.objects.insert(format!("n{i:04}"), entry(i));
        }
        assert_eq!(leaf.base_plan((limit, usize::MAX)), BasePlan::Fold);
        // Small again, or empty: written whole, the base given up.
        let (mut leaf, _) = based(names(&many[..10]));
        for i in 0..4 {
            leaf.objects.remove(&format!("k{i:04}"));
        }
        for i in 4..9 {
            leaf.objects.insert(format!("k{i:04}"), entry(100 + i));
        }
        assert_eq!(leaf.base_plan((2 * per, usize::MAX)), BasePlan::Inline);
        leaf.objects.clear();
        assert_eq!(leaf.base_plan((limit, usize::MAX)), BasePlan::Inline);
        // Names past the largest base: written whole, never folded.
        let (mut leaf, _) = based(names(&many));
        leaf.base = None;
        assert_eq!(leaf.base_plan((limit, 100 * per)), BasePlan::AsIs);
        let (mut leaf, _) = based(names(&many));
        for i in 0..30 {
            leaf.objects.insert(format!("n{i:04}"), entry(i));
        }
        assert_eq!(leaf.base_plan((limit, 100 * per)), BasePlan::Inline);
    }

    /// The split check takes a based leaf's size from its base and what changed since, and
    /// adds up every entry only when that does not settle it.
    #[test]
    fn a_based_leafs_split_check_reads_its_size_from_the_base() {
        use crate::index_tree::{split_of, split_point, SPLIT_BYTES};
        let many: Vec<(String, u64)> = (0..300).map(|i| (format!("k{i:04}"), i)).collect();
        let (mut leaf, _) = based(names(&many));
        leaf.objects.insert("new".into(), entry(1));
        assert_eq!(
            leaf.names_bytes_at_most(),
            None,
            "the base's size unknown: no bound"
        );
        leaf.base.as_mut().unwrap().bytes = 40_000;
        let at_most = leaf.names_bytes_at_most().unwrap();
        assert!(at_most > 40_000 && at_most < 41_000, "{at_most}");
        assert_eq!(split_of(&leaf, 1000), None);
        // Past the count bound: split at the middle name, as without a base.
        assert_eq!(split_of(&leaf, 200), split_point(&leaf.objects, 200));
        // A base that says it is past the size bound: every entry is added up, as without one.
        leaf.base.as_mut().unwrap().bytes = SPLIT_BYTES + 1;
        assert_eq!(split_of(&leaf, 1000), split_point(&leaf.objects, 1000));
        assert_eq!(
            split_of(&leaf, 1000),
            None,
            "the entries themselves are small"
        );
    }

    /// A change that made a record anew (no base) leaks not the base it had.
    #[test]
    fn a_base_dropped_by_a_change_goes_on_the_garbage_list_once() {
        let (mut leaf, _) = based(names(&[("a".into(), 1)]));
        leaf.remember_base("B1", 5);
        assert!(leaf.garbage.is_empty(), "still its base");
        leaf.base = None;
        leaf.remember_base("B1", 5);
        leaf.remember_base("B1", 6);
        assert_eq!(leaf.garbage.len(), 1);
        assert_eq!(
            (leaf.garbage[0].blob(), leaf.garbage[0].after_ms()),
            ("B1", 5)
        );
    }

    /// Deltas of a leaf of a thousand names (a B-tree of several levels: the nodes a change
    /// does not touch are shared with the base, and `OrdMap::diff` skips them), one change
    /// at each position: the delta holds exactly it (imbl before 7.0.2 lost changes next to
    /// shared nodes).
    #[test]
    fn a_delta_of_a_big_leaf_holds_exactly_its_change() {
        let many: Vec<(String, u64)> = (0..1000).map(|i| (format!("k{i:04}"), i)).collect();
        let (leaf, base) = based(names(&many));
        for i in 0..1000 {
            let name = format!("k{i:04}");
            for removing in [false, true] {
                let mut changed = leaf.clone();
                if removing {
                    changed.objects.remove(&name);
                } else {
                    changed.objects.insert(name.clone(), entry(5000 + i));
                }
                let (objects, removed) = delta(&base.objects, &changed.objects);
                let read = Leaf::decode(&changed.encode()).unwrap();
                match removing {
                    true => assert_eq!((objects.len(), removed), (0, vec![name.clone()])),
                    false => {
                        assert_eq!(objects.keys().collect::<Vec<_>>(), [&name]);
                        assert!(removed.is_empty());
                    }
                }
                let mut whole = read;
                whole.resolve_base(DOC, &base, &Keep::All).unwrap();
                assert_eq!(whole.objects, changed.objects, "{name} removing={removing}");
            }
        }
    }

    #[test]
    fn a_replaced_base_goes_on_the_garbage_list() {
        let (mut leaf, _) = based(names(&[("a".into(), 1)]));
        leaf.rebase(None, 77);
        assert_eq!(leaf.base, None);
        assert_eq!(leaf.garbage.len(), 1);
        assert_eq!(leaf.garbage[0].blob(), "B1");
        assert_eq!(leaf.garbage[0].after_ms(), 77);
        assert_eq!(
            Leaf::decode(&leaf.encode()).unwrap().v,
            crate::records::FORMAT_SPLIT
        );
    }

    #[test]
    fn a_record_names_a_base_as_base_or_garbage() {
        let id = BlobId::mint(BlobKind::Simple, 0, 3);
        let text = id.to_string();
        let as_base = format!(r#"{{"v":3,"base":{{"blob":"{text}"}},"objects":{{}}}}"#);
        let as_garbage = format!(r#"{{"v":2,"garbage":[{{"blob":"{text}","after_ms":1}}]}}"#);
        let neither = r#"{"v":3,"base":{"blob":"other"},"objects":{}}"#;
        assert!(names_any(Some(as_base.as_bytes()), &[id]).unwrap());
        assert!(names_any(Some(as_garbage.as_bytes()), &[id]).unwrap());
        assert!(!names_any(Some(neither.as_bytes()), &[id]).unwrap());
        assert!(!names_any(None, &[id]).unwrap());
    }
}
