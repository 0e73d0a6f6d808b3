//! A bucket's index as a tree of records split by key range, so that a bucket of any size is
//! read and changed a leaf (at most `index_leaf_entries` names) at a time, and a PUT rewrites
//! one leaf, not the bucket.
//!
//! - **Small buckets are one record**, the root (`larder-s3:bucket:<name>`), which holds the
//!   names itself (format 1, as before the split existed: nothing to migrate).
//! - **Past the bound the root splits** into two leaves and from then on lists its leaves by
//!   the first key each covers (format 2). A leaf past the bound splits in two the same way.
//!   Past `SPLIT_BYTES` of entries a record splits too, whatever its count (`split_point`).
//!   A leaf's first key (`low`) never changes. A leaf emptied or thinned by deletes is merged
//!   into the leaf on its left (`merge.rs`), which extends its range over it and takes its
//!   names; the merged leaf's record stays as a stub that sends walks left.
//! - **B-link walk.** Each leaf knows the first key after it (`high`) and the leaf holding it
//!   (`right`). A split writes the new right leaf before it cuts the old one, and cuts in one
//!   write, so starting from any leaf whose `low` is at or before a key and moving right while
//!   the key is at or past `high` always finds the key's leaf, however stale the start. That
//!   is why the root's list of leaves is only a hint, and why a frontend may cache it.
//! - **Splits** (`split`): (1) mark the record "splitting at K" in a read-modify-write at its
//!   primary (changes of names from K on now wait); (2) write the new leaf (or leaves, for the
//!   root) with those names, if it does not exist; (3) cut the old record in one write; (4) add
//!   the new leaf to the root's hints. Every step is idempotent, and a writer that keeps finding
//!   a mark finishes the split itself, so a frontend that dies half-way stalls nothing for long.
//! - **DeleteBucket of a split bucket** (`delete_split_bucket`) is decided at the root: mark the
//!   root `deleting` with a ticket, seal every leaf that is empty (a sealed leaf links nothing;
//!   a leaf with names cancels the delete: `BucketNotEmpty`), then remove the root if its
//!   ticket is still there. A writer that finds a seal whose deleter seems gone clears the
//!   root's ticket first, so exactly one of the two wins, decided by one record.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use rand::distr::{Alphanumeric, SampleString};
use tokio::time::Instant;

use crate::blobs;
use crate::error::S3Error;
use crate::keep::Keep;
use crate::list::{self, Page};
use crate::pager::{Pager, Resume, Step};
use crate::records::{
    bucket_doc, leaf_doc, BucketIndex, Garbage, Leaf, ObjectEntry, Objects, Record, Seal, Split,
    FORMAT_SPLIT,
};
use crate::service::now_ms;
use crate::store::{Change, Kept, Records};

mod merge;
mod merge_queue;
mod stubs;

use merge::few_names;

/// Leaves a walk from a cached hint follows before it starts again from a fresh root.
const MAX_HOPS: usize = 64;
/// Leaves a walk from a fresh root may pass before it adds the leaf it found to the root's
/// hints (the split that made it lost its last step).
const REPAIR_AFTER_HOPS: usize = 8;
/// Leaves any walk follows at most (~10⁹ names): a cycle of `right` links, which no correct
/// split makes, is reported as corruption instead of walked forever.
const MAX_LEAVES: usize = 1 << 20;
/// Bytes of entries past which an index record splits whatever its count of names: entries
/// of multipart objects list every part (10,000 parts are most of a megabyte), so a few big
/// uploads in one range would otherwise fill its record's 8 MiB, refuse every later write to
/// it, and make every GET there read megabytes.
pub const SPLIT_BYTES: usize = 1 << 20;
/// Buckets whose leaf hints a frontend keeps.
const MAX_CACHED_BUCKETS: usize = 4096;
/// How long a seal stays before a writer that finds it takes its deleter for gone.
const SEAL_PATIENCE: Duration = Duration::from_secs(60);
/// Pause before a change that waits for a split, a merge or a delete tries again.
pub(crate) const WAIT: Duration = Duration::from_millis(20);
/// Times a read starts again from a fresh root when a leaf on its way is gone or the walk is
/// cut short.
const FRESH_ROOT_TRIES: usize = 8;

/// Which record holds the names of a key's range.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// The bucket's root, while it is the only leaf.
    Root,
    Leaf(String),
}

impl Target {
    pub fn doc(&self, bucket: &str) -> String {
        match self {
            Target::Root => bucket_doc(bucket),
            Target::Leaf(id) => leaf_doc(bucket, id),
        }
    }
}

/// Why a change of a name could not be applied where it was sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reroute {
    /// The name's range is further right: in leaf `Some(id)`, or (`None`) the root has split.
    Right(Option<String>),
    /// A split of the range is under way.
    Busy,
    /// A DeleteBucket sealed the leaf (of the bucket made at `created_ms`).
    Sealed { seal: Seal, created_ms: u64 },
    /// The leaf does not exist (the bucket was deleted, or made again).
    Gone,
    /// The leaf is merged, or being merged, into leaf `into`, on its left (`merge.rs`).
    Merging { into: String },
}

/// A record that holds names: the root of a small bucket, or a leaf.
pub trait Holder: Record {
    /// Whether a change of `key` belongs here now.
    fn admits(&self, key: &str) -> Result<(), Reroute>;
    fn objects(&self) -> &Objects;
    fn objects_mut(&mut self) -> &mut Objects;
    fn garbage_mut(&mut self) -> &mut Vec<Garbage>;
    fn splitting(&self) -> Option<&Split>;
    /// Whether this record is a leaf of at most `few` names (`IndexTree::merge_entries`) to
    /// merge into the leaf on its left now.
    fn merge_due(&self, _few: usize) -> bool {
        false
    }
}

/// The accessors of `Holder`, for a record with `objects`, `garbage` and `splitting` fields.
macro_rules! holds_names {
    () => {
        fn objects(&self) -> &Objects {
            &self.objects
        }
        fn objects_mut(&mut self) -> &mut Objects {
            &mut self.objects
        }
        fn garbage_mut(&mut self) -> &mut Vec<Garbage> {
            &mut self.garbage
        }
        fn splitting(&self) -> Option<&Split> {
            self.splitting.as_ref()
        }
    };
}

impl Holder for BucketIndex {
    fn admits(&self, _key: &str) -> Result<(), Reroute> {
        if self.is_split() {
            return Err(Reroute::Right(None));
        }
        match self.splitting {
            Some(_) => Err(Reroute::Busy),
            None => Ok(()),
        }
    }
    holds_names!();
}

impl Holder for Leaf {
    fn admits(&self, key: &str) -> Result<(), Reroute> {
        if let Some(seal) = &self.sealed {
            return Err(Reroute::Sealed {
                seal: seal.clone(),
                created_ms: self.bucket_created_ms,
            });
        }
        if let Some(merging) = &self.merging {
            return Err(Reroute::Merging {
                into: merging.into.clone(),
            });
        }
        if self.high.as_deref().is_some_and(|high| key >= high) {
            return Err(Reroute::Right(self.right.clone()));
        }
        // Sent here by a route taken for another key: start again from the root.
        if key < self.low.as_str() {
            return Err(Reroute::Right(None));
        }
        match &self.splitting {
            Some(split) if key >= split.at.as_str() => Err(Reroute::Busy),
            _ => Ok(()),
        }
    }
    fn merge_due(&self, few: usize) -> bool {
        // The first leaf has none on its left: it stays, empty or not.
        let settled = self.sealed.is_none() && self.splitting.is_none() && self.merging.is_none();
        self.objects.len() <= few && !self.low.is_empty() && settled
    }
    holds_names!();
}

/// The names of one key range as read: a small bucket's root or a leaf.
#[derive(Debug, Default)]
pub struct Node {
    /// The leaf's ID and first key (empty for a small bucket's root).
    pub id: String,
    pub low: String,
    pub objects: Names,
    /// The first key after this range (`None`: to the end).
    pub high: Option<String>,
    pub right: Option<String>,
    /// A leaf being merged, reached from its left neighbour before that took its range over
    /// (so it still answers for it, with the names it held when the merge began): never a
    /// hint.
    pub merging: bool,
}

impl Node {
    fn of(id: String, leaf: Kept<Leaf>) -> Node {
        match leaf {
            Kept::Owned(leaf) => Node {
                id,
                low: leaf.low,
                merging: leaf.merging.is_some(),
                objects: Names::Owned(leaf.objects),
                high: leaf.high,
                right: leaf.right,
            },
            Kept::Shared(leaf) => Node {
                id,
                low: leaf.low.clone(),
                high: leaf.high.clone(),
                right: leaf.right.clone(),
                merging: leaf.merging.is_some(),
                objects: Names::Leaf(leaf),
            },
        }
    }
}

/// A node's names: its own, or those of a record the record cache shares with it (a listing
/// page reads a leaf of up to 1,000 names and clones only the ones it lists).
#[derive(Debug)]
pub enum Names {
    Owned(Objects),
    Leaf(Arc<Leaf>),
    Root(Arc<BucketIndex>),
}

impl Default for Names {
    fn default() -> Names {
        Names::Owned(Objects::new())
    }
}

impl std::ops::Deref for Names {
    type Target = Objects;

    fn deref(&self) -> &Self::Target {
        match self {
            Names::Owned(names) => names,
            Names::Leaf(leaf) => &leaf.objects,
            Names::Root(root) => &root.objects,
        }
    }
}

impl Names {
    fn of_root(root: Kept<BucketIndex>) -> Names {
        match root {
            Kept::Shared(root) => Names::Root(root),
            Kept::Owned(root) => Names::Owned(root.objects),
        }
    }

    /// The entry of `key`, moved out of names of its own, cloned out of shared ones; either way
    /// without the JSON its record kept (`records::EntryJson`): the caller owns it and may
    /// change it.
    fn take(self, key: &str) -> Option<ObjectEntry> {
        match self {
            Names::Owned(mut names) => names
                .remove(key)
                .map(|entry| Arc::unwrap_or_clone(entry).without_json()),
            shared => shared.get(key).map(|entry| ObjectEntry::clone(entry)),
        }
    }
}

/// The leaf of `hints` whose range starts at or before `key`.
fn pick(hints: &BTreeMap<String, String>, key: &str) -> String {
    hints
        .range::<str, _>((Bound::Unbounded, Bound::Included(key)))
        .next_back()
        .or_else(|| hints.iter().next())
        .map(|(_, id)| id.clone())
        .unwrap_or_default()
}

fn new_id() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), 16)
}

/// The index trees of every bucket, as this frontend sees them: where each split bucket's
/// leaves start (cached; see the module's "B-link walk" for why a stale copy is safe).
pub struct IndexTree {
    /// Names a leaf holds before it splits.
    pub leaf_entries: usize,
    /// Names a leaf holds at most to be merged into its left neighbour (`merge.rs`).
    pub merge_entries: usize,
    hints: Mutex<HashMap<String, Arc<BTreeMap<String, String>>>>,
    /// Leaves this frontend is to merge, one after another (`merge_queue.rs`).
    queue: merge_queue::MergeQueue,
    /// Records this frontend is splitting or merging now (one at a time per record).
    restructuring: Mutex<HashSet<String>>,
    /// Leaves merged into the leaf on their left by this frontend (`merge`).
    merged: Counter,
    /// `[s3] max_held_garbage`: a merge holds the left leaf's garbage list to it too.
    max_held_garbage: usize,
    /// `[s3] merged_leaf_grace`: how long a merged leaf's stub stays (`stubs.rs`).
    merged_leaf_grace: Duration,
    /// Stubs of merged leaves this frontend removed.
    stubs_removed: Counter,
}

impl IndexTree {
    /// With leaves of `leaf_entries` names, merged at `merge_entries` (`merge::few_names`
    /// when absent, at most half a leaf).
    pub fn new(
        (leaf_entries, merge_entries): (usize, Option<usize>),
        max_held_garbage: usize,
        merged_leaf_grace: Duration,
    ) -> IndexTree {
        let leaf_entries = leaf_entries.max(2);
        let asked = merge_entries.unwrap_or(few_names(leaf_entries));
        let merge_entries = asked.min(leaf_entries / 2);
        if merge_entries < asked {
            tracing::warn!(
                asked,
                merge_entries,
                "[s3] index_merge_entries is at most half of index_leaf_entries: taken as that"
            );
        }
        IndexTree {
            leaf_entries,
            merge_entries,
            hints: Mutex::default(),
            queue: Default::default(),
            restructuring: Mutex::default(),
            merged: Counter::default(),
            max_held_garbage,
            merged_leaf_grace,
            stubs_removed: Counter::default(),
        }
    }

    /// The count of leaves this frontend merged, for the metrics.
    pub fn merges(&self) -> Counter {
        self.merged.clone()
    }

    /// The count of merged leaves' stubs this frontend removed, for the metrics.
    pub fn stubs_removed(&self) -> Counter {
        self.stubs_removed.clone()
    }

    /// Marks record `doc` as being split or merged by this frontend; false if it is already.
    fn begin_restructuring(&self, doc: &str) -> bool {
        self.restructuring.lock().insert(doc.to_owned())
    }

    fn end_restructuring(&self, doc: &str) {
        self.restructuring.lock().remove(doc);
    }

    fn cached(&self, bucket: &str) -> Option<Arc<BTreeMap<String, String>>> {
        self.hints.lock().get(bucket).cloned()
    }

    /// Remembers where the root says the leaves start; an empty map for a root that is its
    /// only leaf (changes are then sent to the root: one that has split since sends them on).
    fn remember(&self, bucket: &str, root: &BucketIndex) {
        let mut hints = self.hints.lock();
        if hints.len() >= MAX_CACHED_BUCKETS {
            hints.clear();
        }
        hints.insert(bucket.to_owned(), Arc::new(root.leaves.clone()));
    }

    pub fn forget(&self, bucket: &str) {
        self.hints.lock().remove(bucket);
    }

    /// Takes the hint `low` → `id` off the cached hints, as a merge took it off the root's;
    /// the other hints stay good (a merge moves no range but the merged leaf's).
    fn unremember(&self, bucket: &str, (low, id): (&str, &str)) {
        let mut hints = self.hints.lock();
        let Some(cached) = hints.get_mut(bucket) else {
            return;
        };
        if cached.get(low).map(String::as_str) == Some(id) {
            Arc::make_mut(cached).remove(low);
        }
    }

    /// The bucket's root from a quorum (and its hints remembered).
    pub async fn root(&self, records: &Records, bucket: &str) -> Result<BucketIndex, S3Error> {
        let root = self.root_keeping(records, bucket, &Keep::All).await?;
        Ok(root.into_owned())
    }

    /// `root`, keeping only what `keep` says of its entries (for reading only: `keep.rs`).
    async fn root_keeping(
        &self,
        records: &Records,
        bucket: &str,
        keep: &Keep,
    ) -> Result<Kept<BucketIndex>, S3Error> {
        let root = records
            .read_keeping::<BucketIndex>(&bucket_doc(bucket), keep)
            .await?
            .ok_or(S3Error::NoSuchBucket)?;
        self.remember(bucket, &root);
        Ok(root)
    }

    /// Where a change of `key` goes first.
    pub async fn route(
        &self,
        records: &Records,
        bucket: &str,
        key: &str,
    ) -> Result<Target, S3Error> {
        let hints = match self.cached(bucket) {
            Some(hints) => hints,
            None => Arc::new(
                self.root_keeping(records, bucket, &Keep::All)
                    .await?
                    .leaves
                    .clone(),
            ),
        };
        Ok(match hints.is_empty() {
            true => Target::Root,
            false => Target::Leaf(pick(&hints, key)),
        })
    }

    /// Where a change of `key` goes next, after `from` sent it on for `why`; waits first when
    /// a split or a delete must end. Past `deadline`: `Unavailable`.
    pub async fn reroute(
        &self,
        records: &Records,
        bucket: &str,
        key: &str,
        (from, why): (Target, Reroute),
        deadline: Instant,
    ) -> Result<Target, S3Error> {
        if Instant::now() >= deadline {
            return Err(S3Error::Unavailable(format!(
                "bucket {bucket}: the index range of a name stayed busy ({why:?}); try again"
            )));
        }
        match why {
            Reroute::Right(Some(id)) => {
                self.forget(bucket);
                Ok(Target::Leaf(id))
            }
            Reroute::Right(None) => {
                self.forget(bucket);
                self.route(records, bucket, key).await
            }
            Reroute::Gone => {
                if let Target::Leaf(id) = &from {
                    drop_hint(records, bucket, (id, None)).await?;
                }
                self.forget(bucket);
                self.route(records, bucket, key).await
            }
            Reroute::Busy => {
                tokio::time::sleep(WAIT).await;
                // Whoever marked the split may be gone: finishing it is idempotent.
                self.split(records, bucket, &from).await?;
                Ok(from)
            }
            Reroute::Merging { .. } => {
                // Whoever began the merge may be gone: finishing it is idempotent. Once it is
                // done the root no longer names the leaf, and the change goes where it says.
                if let Target::Leaf(id) = &from {
                    if !self.merge(records, bucket, id).await? {
                        tokio::time::sleep(WAIT).await;
                    }
                }
                self.forget(bucket);
                self.route(records, bucket, key).await
            }
            Reroute::Sealed { seal, created_ms } => {
                let root = self.root(records, bucket).await?;
                if root.created_ms != created_ms {
                    // A leaf of a deleted bucket of this name: never written again.
                    self.forget(bucket);
                    return self.route(records, bucket, key).await;
                }
                self.settle_seal(records, bucket, root, &from, &seal)
                    .await?;
                Ok(from)
            }
        }
    }

    /// A leaf of `root`'s bucket sealed by a DeleteBucket: wait while that delete may be under
    /// way; if its ticket is no longer the root's, or its deleter seems gone (cancelling it at
    /// the root first), unseal.
    async fn settle_seal(
        &self,
        records: &Records,
        bucket: &str,
        root: BucketIndex,
        leaf: &Target,
        seal: &Seal,
    ) -> Result<(), S3Error> {
        if root.deleting.as_ref().map(|d| &d.ticket) == Some(&seal.ticket) {
            if !stale(seal) {
                tokio::time::sleep(WAIT).await;
                return Ok(());
            }
            let ticket = seal.ticket.clone();
            let created_ms = root.created_ms;
            records
                .update(&bucket_doc(bucket), |root: Option<BucketIndex>| {
                    let mut root = root
                        .filter(|r| r.created_ms == created_ms)
                        .ok_or(S3Error::NoSuchBucket)?;
                    if root.deleting.as_ref().map(|d| &d.ticket) != Some(&ticket) {
                        return Ok((Change::Keep, ()));
                    }
                    root.deleting = None;
                    Ok((Change::Put(root), ()))
                })
                .await?;
        }
        unseal(records, &leaf.doc(bucket), &seal.ticket).await
    }

    /// The names of the range holding `key`, from a quorum.
    pub async fn locate(
        &self,
        records: &Records,
        bucket: &str,
        key: &str,
        keep: &Keep,
    ) -> Result<Node, S3Error> {
        if let Some(hints) = self.cached(bucket).filter(|h| !h.is_empty()) {
            let start = pick(&hints, key);
            let walked = walk(
                records,
                (bucket, None),
                &start,
                key,
                (false, MAX_HOPS),
                keep,
            )
            .await?;
            if let Ok((node, _)) = walked {
                return Ok(node);
            }
            self.forget(bucket);
        }
        // A leaf on the way may be gone: its bucket was deleted (the root goes before its
        // leaves, so the next read of the root answers `NoSuchBucket`), or a hint outlived its
        // leaf (it is dropped, and the root read again).
        for _ in 0..FRESH_ROOT_TRIES {
            let root = self.root_keeping(records, bucket, keep).await?;
            if !root.is_split() {
                return Ok(Node {
                    objects: Names::of_root(root),
                    ..Default::default()
                });
            }
            // From a fresh root a sealed leaf is read as it is (empty, a delete under way),
            // and the walk goes as far as the leaves go (a hint whose write was lost is
            // repaired).
            let start = pick(&root.leaves, key);
            let hints = Some(&root.leaves);
            let walked = walk(
                records,
                (bucket, hints),
                &start,
                key,
                (true, MAX_LEAVES),
                keep,
            )
            .await?;
            let (node, hops) = match walked {
                Ok(found) => found,
                Err(Miss::Gone(id)) => {
                    drop_hint(records, bucket, (&id, None)).await?;
                    continue;
                }
                Err(Miss::Stopped) => continue,
            };
            let lost = hops > REPAIR_AFTER_HOPS && !root.leaves.contains_key(&node.low);
            if lost && !node.merging {
                add_hint(records, bucket, (&node.low, &node.id)).await?;
            }
            return Ok(node);
        }
        Err(S3Error::Unavailable(format!(
            "bucket {bucket}: the index leaves of a name kept changing under the read; try again"
        )))
    }

    /// What `key` names in `bucket` now, from a quorum.
    pub async fn entry(
        &self,
        records: &Records,
        bucket: &str,
        key: &str,
    ) -> Result<Option<ObjectEntry>, S3Error> {
        // Only this name's entry is built of the record that holds it.
        let keep = Keep::One(key.to_owned());
        let node = self.locate(records, bucket, key, &keep).await?;
        Ok(node.objects.take(key))
    }

    /// One page of a listing, walking the leaves in key order from where it starts. With
    /// `limit`, a page ends after that many leaves past its first without reaching
    /// `max_keys` (a run of empty leaves), truncated, and says where the next page resumes as
    /// the listing's kind can (`pager.rs`).
    pub async fn page(
        self: &Arc<Self>,
        records: &Arc<Records>,
        bucket: &str,
        query: &list::Query<'_>,
        limit: Option<(usize, Resume)>,
    ) -> Result<Page, S3Error> {
        let start = query.start_key();
        let mut node = self.locate(records, bucket, &start, &Keep::All).await?;
        let mut pager = Pager::new(query, limit, MAX_LEAVES);
        let mut to_merge = Vec::new();
        // Names of the leaf walked just before (the one on its left), once there is one.
        let mut left_names = None;
        let page = loop {
            // Those being merged too: a merge whose merger is gone is finished so.
            if self.worth_merging(&node, left_names) {
                to_merge.push(node.id.clone());
            }
            left_names = Some(node.objects.len());
            match pager.visit(&node.objects, &node.low, node.high.as_deref()) {
                Step::Done(page) => break page,
                Step::TooManyLeaves => return Err(too_many_leaves(bucket)),
                Step::Next => {}
            }
            let (Some(right), Some(high)) = (node.right.take(), node.high.take()) else {
                return Err(S3Error::Corrupt(format!(
                    "bucket {bucket}: an index leaf has an end or a leaf after it, not both"
                )));
            };
            let leaf = records
                .read_keeping::<Leaf>(&leaf_doc(bucket, &right), &Keep::All)
                .await?;
            node = match leaf {
                Some(leaf) => Node::of(right, leaf),
                // Gone since the leaf before it was read (its bucket deleted, and the next read
                // of the root says so): the leaf holding its range is found from the root. The
                // pager lists only names past what it listed, so a range read twice adds
                // nothing twice.
                None => {
                    left_names = None;
                    self.locate(records, bucket, &high, &Keep::All).await?
                }
            };
        };
        // Empty or nearly empty leaves a listing walks (left by deletes a merge did not
        // follow, or by builds before merges): merged now, so the next listing walks fewer.
        self.merge_soon(records, bucket, to_merge);
        Ok(page)
    }

    /// Splits the record `target` of `bucket` if it holds more than `leaf_entries` names, or
    /// finishes a split marked in it. Idempotent; a second call while this frontend is
    /// splitting the same record returns at once.
    pub async fn split(
        &self,
        records: &Records,
        bucket: &str,
        target: &Target,
    ) -> Result<(), S3Error> {
        let doc = target.doc(bucket);
        if !self.begin_restructuring(&doc) {
            return Ok(());
        }
        let result = match target {
            Target::Root => self.split_root(records, bucket).await,
            Target::Leaf(id) => self.split_leaf(records, bucket, id).await,
        };
        self.end_restructuring(&doc);
        // Its new leaf's hint is the root's now: read again at the next change.
        self.forget(bucket);
        result
    }

    async fn split_root(&self, records: &Records, bucket: &str) -> Result<(), S3Error> {
        let doc = bucket_doc(bucket);
        let bound = self.leaf_entries;
        let Some(split) = mark::<BucketIndex>(records, &doc, bound, true).await? else {
            return Ok(());
        };
        let Some(root) = records.read::<BucketIndex>(&doc).await? else {
            return Ok(());
        };
        if root.splitting.as_ref() != Some(&split) {
            return Ok(());
        }
        let left_id = split.left.clone().unwrap_or_default();
        let mut lower = root.objects.clone();
        let upper = split_off(&mut lower, &split.at);
        let left = Leaf {
            v: FORMAT_SPLIT,
            bucket_created_ms: root.created_ms,
            low: String::new(),
            high: Some(split.at.clone()),
            right: Some(split.right.clone()),
            objects: lower,
            ..Default::default()
        };
        let right = Leaf {
            v: FORMAT_SPLIT,
            bucket_created_ms: root.created_ms,
            low: split.at.clone(),
            objects: upper,
            ..Default::default()
        };
        create(records, &leaf_doc(bucket, &left_id), left).await?;
        create(records, &leaf_doc(bucket, &split.right), right).await?;
        records
            .update(&doc, |root: Option<BucketIndex>| {
                let Some(mut root) = root.filter(|r| r.splitting.as_ref() == Some(&split)) else {
                    return Ok((Change::Keep, ()));
                };
                root.objects.clear();
                root.splitting = None;
                root.leaves.insert(String::new(), left_id.clone());
                root.leaves.insert(split.at.clone(), split.right.clone());
                Ok((Change::Put(root), ()))
            })
            .await
    }

    async fn split_leaf(&self, records: &Records, bucket: &str, id: &str) -> Result<(), S3Error> {
        let doc = leaf_doc(bucket, id);
        let Some(split) = mark::<Leaf>(records, &doc, self.leaf_entries, false).await? else {
            return Ok(());
        };
        let Some(leaf) = records.read::<Leaf>(&doc).await? else {
            return Ok(());
        };
        if leaf.splitting.as_ref() != Some(&split) {
            return Ok(());
        }
        let upper = Leaf {
            v: FORMAT_SPLIT,
            bucket_created_ms: leaf.bucket_created_ms,
            low: split.at.clone(),
            high: leaf.high.clone(),
            right: leaf.right.clone(),
            objects: split_off(&mut leaf.objects.clone(), &split.at),
            ..Default::default()
        };
        let new_doc = leaf_doc(bucket, &split.right);
        create(records, &new_doc, upper).await?;
        let cut = records
            .update(&doc, |leaf: Option<Leaf>| {
                let Some(mut leaf) = leaf else {
                    return Ok((Change::Keep, false));
                };
                // Only a cut takes a split's mark away: someone finished this split (the leaf
                // may have split again since), and the new leaf is live.
                if leaf.splitting.as_ref() != Some(&split) {
                    return Ok((Change::Keep, true));
                }
                split_off(&mut leaf.objects, &split.at);
                leaf.high = Some(split.at.clone());
                leaf.right = Some(split.right.clone());
                leaf.splitting = None;
                Ok((Change::Put(leaf), true))
            })
            .await?;
        if !cut {
            // The old leaf went (its bucket deleted) before anyone cut it: the new leaf is
            // reachable from nothing, and goes too.
            records
                .update(&new_doc, |_: Option<Leaf>| Ok((Change::Remove, ())))
                .await?;
            return Ok(());
        }
        records
            .update(&bucket_doc(bucket), |root: Option<BucketIndex>| {
                let Some(mut root) = root.filter(BucketIndex::is_split) else {
                    return Ok((Change::Keep, ()));
                };
                if root.leaves.get(&split.at) == Some(&split.right) {
                    return Ok((Change::Keep, ()));
                }
                root.leaves.insert(split.at.clone(), split.right.clone());
                Ok((Change::Put(root), ()))
            })
            .await
    }

    /// Every record of `bucket` that holds names or garbage, in key order (the root, then, once
    /// split, each leaf), with its garbage list.
    pub async fn garbage(
        &self,
        records: &Records,
        bucket: &str,
    ) -> Result<Vec<(Target, Vec<Garbage>)>, S3Error> {
        // Garbage and links only: no base is read (a sweep passes every leaf of every bucket).
        let doc = bucket_doc(bucket);
        let Some(root) = records.read_unresolved::<BucketIndex>(&doc).await? else {
            return Ok(Vec::new());
        };
        let mut found = vec![(Target::Root, root.garbage.clone())];
        let mut next = root.leaves.get("").cloned();
        let mut left: Option<String> = None;
        let mut misses = 0;
        while let Some(id) = next {
            if found.len() > MAX_LEAVES {
                return Err(too_many_leaves(bucket));
            }
            if misses > MAX_HOPS {
                break; // leaves merging faster than this walk: the next sweep goes on
            }
            let doc = leaf_doc(bucket, &id);
            let Some(leaf) = records.read_unresolved::<Leaf>(&doc).await? else {
                // Gone since the leaf on its left was read (a bucket being deleted): if that
                // leaf's `right` says otherwise now, go on there.
                next = match &left {
                    Some(left) => self.right_now(records, bucket, left, &id).await?,
                    None => None,
                };
                misses += 1;
                continue;
            };
            next = leaf.right.clone();
            left = Some(id.clone());
            found.push((Target::Leaf(id), leaf.garbage));
        }
        Ok(found)
    }

    /// The leaf after `left` now, if that is no longer `gone` (`None`: the walk ends).
    async fn right_now(
        &self,
        records: &Records,
        bucket: &str,
        left: &str,
        gone: &str,
    ) -> Result<Option<String>, S3Error> {
        let leaf = records
            .read_unresolved::<Leaf>(&leaf_doc(bucket, left))
            .await?;
        Ok(leaf
            .and_then(|leaf| leaf.right)
            .filter(|right| right != gone))
    }

    /// DeleteBucket of a split bucket (see the module's comment). The blobs on the garbage
    /// lists are tombstoned before the root goes (after it nothing would find them): first
    /// those listed now, before any leaf is sealed (writers wait on seals), then any added
    /// since; the leaf records are removed after the root. Runs in a task of its own, so a
    /// client that hangs up does not leave seals behind, and a failure cancels it.
    pub async fn delete_split_bucket(
        self: &Arc<Self>,
        records: &Arc<Records>,
        bucket: &str,
    ) -> Result<(), S3Error> {
        let (tree, records, bucket) = (self.clone(), records.clone(), bucket.to_owned());
        let task = tokio::spawn(async move {
            let mut tombstoned = HashSet::new();
            let garbage: Vec<Garbage> = tree
                .garbage(&records, &bucket)
                .await?
                .into_iter()
                .flat_map(|(_, g)| g)
                .collect();
            tombstone(&records, &garbage, &mut tombstoned).await?;
            let ticket = Seal {
                ticket: new_id(),
                at_ms: now_ms(),
            };
            let first = begin_delete(&records, &bucket, &ticket).await?;
            let mut sealed = Vec::new();
            let outcome = tree
                .seal_and_remove(
                    &records,
                    &bucket,
                    (&ticket, first),
                    (&mut sealed, &mut tombstoned),
                )
                .await;
            if outcome.is_err() {
                tree.cancel_delete(&records, &bucket, &ticket.ticket, &sealed)
                    .await;
            }
            outcome
        });
        task.await
            .map_err(|e| S3Error::Internal(format!("the DeleteBucket task ended: {e}")))?
    }

    /// Seals every leaf from `first` for `ticket`, tombstones garbage not yet tombstoned,
    /// removes the root if it still carries the ticket, then the leaves.
    async fn seal_and_remove(
        &self,
        records: &Records,
        bucket: &str,
        (ticket, first): (&Seal, Option<String>),
        (sealed, tombstoned): (&mut Vec<String>, &mut HashSet<String>),
    ) -> Result<(), S3Error> {
        let mut garbage = Vec::new();
        let mut next = first;
        while let Some(id) = next {
            if sealed.len() > MAX_LEAVES {
                return Err(too_many_leaves(bucket));
            }
            let (right, leaf_garbage) = seal(records, &leaf_doc(bucket, &id), ticket).await?;
            sealed.push(id);
            garbage.extend(leaf_garbage);
            next = right;
        }
        tombstone(records, &garbage, tombstoned).await?;
        let removed = records
            .update(&bucket_doc(bucket), |root: Option<BucketIndex>| {
                let root = root.ok_or(S3Error::NoSuchBucket)?;
                if root.deleting.as_ref().map(|d| &d.ticket) != Some(&ticket.ticket) {
                    return Ok((Change::Keep, None));
                }
                Ok((Change::Remove, Some(root.created_ms)))
            })
            .await?;
        let Some(created_ms) = removed else {
            return Err(S3Error::OperationAborted(
                "a conflicting operation on this bucket ran at the same time; try again".into(),
            ));
        };
        self.forget(bucket);
        for id in sealed.iter() {
            let doc = leaf_doc(bucket, id);
            if let Err(err) = records
                .update(&doc, |_: Option<Leaf>| Ok((Change::Remove, ())))
                .await
            {
                tracing::warn!(%err, doc, "a deleted bucket's leaf stays (sealed, unreachable)");
            }
        }
        if let Err(err) = stubs::remove_all_stubs(records, bucket, created_ms).await {
            tracing::warn!(%err, bucket, "a deleted bucket's merged leaves stay (unreachable)");
        }
        Ok(())
    }

    /// Clears `ticket` from the root (if still there) and unseals what it sealed.
    async fn cancel_delete(
        &self,
        records: &Records,
        bucket: &str,
        ticket: &str,
        sealed: &[String],
    ) {
        let cleared = records
            .update(&bucket_doc(bucket), |root: Option<BucketIndex>| {
                let ours =
                    |r: &BucketIndex| r.deleting.as_ref().is_some_and(|d| d.ticket == ticket);
                let Some(mut root) = root.filter(ours) else {
                    return Ok((Change::Keep, ()));
                };
                root.deleting = None;
                Ok((Change::Put(root), ()))
            })
            .await;
        if let Err(err) = cleared {
            tracing::warn!(%err, bucket, "a cancelled delete's ticket stays on the root");
        }
        for id in sealed {
            if let Err(err) = unseal(records, &leaf_doc(bucket, id), ticket).await {
                tracing::warn!(%err, bucket, leaf = id, "a cancelled delete's seal stays");
            }
        }
    }
}

fn too_many_leaves(bucket: &str) -> S3Error {
    S3Error::Corrupt(format!(
        "bucket {bucket}: more than {MAX_LEAVES} index leaves in a row (a cycle?)"
    ))
}

/// Why a walk did not find a key's leaf.
#[derive(Debug, PartialEq, Eq)]
enum Miss {
    /// This leaf is gone (its bucket deleted); for good, as leaf IDs are never used again.
    Gone(String),
    /// A leaf on the way is sealed, or the walk is longer than allowed.
    Stopped,
}

/// From leaf `id` rightwards to the leaf holding `key`, with the leaves passed. A miss: a leaf
/// on the way is gone, or sealed when `sealed_ok` is false, or the walk is longer than
/// `max_hops` (from a stale cached hint): start again from the root.
///
/// A leaf being merged (`index_tree/merge.rs`) is read as its range's holder only when the
/// walk came to it from the leaf on its left, which then still ended at it: its range is not
/// that leaf's yet, and holds the names it held when the merge began (it takes no change
/// since).
/// Reached any other way (a hint), the walk goes to a leaf on its left instead, which may hold
/// its range already: the last one of `hints` before it, else the one it merges into.
async fn walk(
    records: &Records,
    (bucket, hints): (&str, Option<&BTreeMap<String, String>>),
    id: &str,
    key: &str,
    (sealed_ok, max_hops): (bool, usize),
    keep: &Keep,
) -> Result<Result<(Node, usize), Miss>, S3Error> {
    let mut id = id.to_owned();
    let mut from_left = false;
    for hops in 0..max_hops {
        let doc = leaf_doc(bucket, &id);
        let Some(leaf) = records.read_keeping::<Leaf>(&doc, keep).await? else {
            return Ok(Err(Miss::Gone(id)));
        };
        if leaf.sealed.is_some() && !sealed_ok {
            return Ok(Err(Miss::Stopped));
        }
        if let Some(merging) = leaf.merging.as_ref().filter(|_| !from_left) {
            let before = hints.and_then(|hints| hint_before(hints, &leaf.low));
            (id, from_left) = (before.unwrap_or_else(|| merging.into.clone()), false);
            continue;
        }
        match (&leaf.high, &leaf.right) {
            (Some(high), Some(right)) if key >= high.as_str() => {
                (id, from_left) = (right.clone(), true);
            }
            _ => return Ok(Ok((Node::of(id, leaf), hops))),
        }
    }
    Ok(Err(Miss::Stopped))
}

/// The leaf of `hints` that starts last before `low` (`None`: `low` is the first key).
fn hint_before(hints: &BTreeMap<String, String>, low: &str) -> Option<String> {
    hints
        .range::<str, _>((Bound::Unbounded, Bound::Excluded(low)))
        .next_back()
        .map(|(_, id)| id.clone())
}

/// Takes leaf `id` off the root's hints: the hint at `low` if it names `id` (a merge's step 3),
/// or, with no `low`, whichever names it (a leaf found gone: a hint can outlive its leaf when a
/// split finished late, or a walk's repair, adds it back after a merge removed the leaf).
/// Never the first leaf's (a bucket's first leaf goes only with its root).
async fn drop_hint(
    records: &Records,
    bucket: &str,
    (id, low): (&str, Option<&str>),
) -> Result<(), S3Error> {
    records
        .update(&bucket_doc(bucket), |root: Option<BucketIndex>| {
            let Some(mut root) = root.filter(BucketIndex::is_split) else {
                return Ok((Change::Keep, ()));
            };
            let hinted = match low {
                Some(low) => root
                    .leaves
                    .get_key_value(low)
                    .filter(|(_, leaf)| *leaf == id),
                None => root.leaves.iter().find(|(_, leaf)| *leaf == id),
            };
            let Some(low) = hinted.map(|(low, _)| low.clone()).filter(|l| !l.is_empty()) else {
                return Ok((Change::Keep, ()));
            };
            root.leaves.remove(&low);
            Ok((Change::Put(root), ()))
        })
        .await
}

/// Adds leaf `id`, starting at `low`, to the root's hints (a split's last step that was lost).
async fn add_hint(records: &Records, bucket: &str, (low, id): (&str, &str)) -> Result<(), S3Error> {
    records
        .update(&bucket_doc(bucket), |root: Option<BucketIndex>| {
            let Some(mut root) = root.filter(BucketIndex::is_split) else {
                return Ok((Change::Keep, ()));
            };
            if root.leaves.contains_key(low) {
                return Ok((Change::Keep, ()));
            }
            root.leaves.insert(low.to_owned(), id.to_owned());
            Ok((Change::Put(root), ()))
        })
        .await
}

/// Marks the record `doc` for a split at its middle name, if it holds more than `bound` names
/// and no split is marked; returns the split marked (a new one or the one found).
async fn mark<H: Holder + SplitMark>(
    records: &Records,
    doc: &str,
    bound: usize,
    root: bool,
) -> Result<Option<Split>, S3Error> {
    records
        .update(doc, |holder: Option<H>| {
            let Some(mut holder) = holder.filter(|h| h.can_split()) else {
                return Ok((Change::Keep, None));
            };
            if let Some(split) = holder.splitting() {
                return Ok((Change::Keep, Some(split.clone())));
            }
            let Some(at) = split_of(&holder, bound) else {
                return Ok((Change::Keep, None));
            };
            let split = Split {
                at,
                left: root.then(new_id),
                right: new_id(),
            };
            holder.set_splitting(split.clone());
            Ok((Change::Put(holder), Some(split)))
        })
        .await
}

/// Moves the names from `at` on out of `names` (`BTreeMap::split_off`; imbl's `split` drops
/// the name at the split point).
fn split_off(names: &mut Objects, at: &str) -> Objects {
    let upper: Objects = names
        .range::<_, str>((Bound::Included(at), Bound::Unbounded))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for key in upper.keys() {
        names.remove(key);
    }
    upper
}

/// Where `holder` splits, if it must (`split_point`), without adding up the size of every
/// entry when its base's size and the entries changed since already show it need not split
/// by size (that sum over up to 1,000 entries was ~5 % of the frontend's CPU per PutObject).
pub fn split_of<H: Holder>(holder: &H, bound: usize) -> Option<String> {
    let names = holder.objects();
    let small = holder
        .names_bytes_at_most()
        .is_some_and(|b| b <= SPLIT_BYTES);
    if names.len() <= bound && small {
        return None;
    }
    split_point(names, bound)
}

/// Where a record holding `names` splits, if it must: past `bound` names at the middle one,
/// past `SPLIT_BYTES` of entries at the name that halves the bytes. `None` if it need not, or
/// cannot (one name is one entry, however large).
pub fn split_point(names: &Objects, bound: usize) -> Option<String> {
    if names.len() < 2 {
        return None;
    }
    if names.len() > bound {
        return names.keys().nth(names.len() / 2).cloned();
    }
    let sizes: Vec<usize> = names
        .iter()
        .map(|(key, entry)| key.len() + entry.approx_bytes())
        .collect();
    let total: usize = sizes.iter().sum();
    if total <= SPLIT_BYTES {
        return None;
    }
    // The name whose entry crosses the half, then the side of it that leaves the larger part
    // smaller (both sides keep a name at least).
    let mut below = 0;
    let crossing = sizes
        .iter()
        .position(|size| {
            below += size;
            below * 2 >= total
        })
        .unwrap_or(0);
    let before: usize = sizes[..crossing].iter().sum();
    let after = before + sizes[crossing];
    let larger_part = |left: usize| left.max(total - left);
    let at = match larger_part(before) <= larger_part(after) {
        true => crossing,
        false => crossing + 1,
    };
    names.keys().nth(at.clamp(1, names.len() - 1)).cloned()
}

/// What a split needs of a record beyond `Holder`.
trait SplitMark: Holder {
    /// Not sealed, and (a root) not split already.
    fn can_split(&self) -> bool;
    fn set_splitting(&mut self, split: Split);
}

impl SplitMark for BucketIndex {
    fn can_split(&self) -> bool {
        !self.is_split() && self.deleting.is_none()
    }
    fn set_splitting(&mut self, split: Split) {
        self.splitting = Some(split);
    }
}

impl SplitMark for Leaf {
    fn can_split(&self) -> bool {
        self.sealed.is_none() && self.merging.is_none()
    }
    fn set_splitting(&mut self, split: Split) {
        self.splitting = Some(split);
    }
}

/// Writes `leaf` at `doc` unless a leaf is there already (a split being finished twice).
async fn create(records: &Records, doc: &str, leaf: Leaf) -> Result<(), S3Error> {
    records
        .update(doc, |existing: Option<Leaf>| match existing {
            Some(_) => Ok((Change::Keep, ())),
            // Cloned, not taken: an attempt that loses a race runs this again.
            None => Ok((Change::Put(leaf.clone()), ())),
        })
        .await
}

/// Marks the split bucket's root for the delete `ticket`, unless another delete that is not
/// stale holds it; returns the first leaf.
async fn begin_delete(
    records: &Records,
    bucket: &str,
    ticket: &Seal,
) -> Result<Option<String>, S3Error> {
    records
        .update(&bucket_doc(bucket), |root: Option<BucketIndex>| {
            let mut root = root.ok_or(S3Error::NoSuchBucket)?;
            if root.deleting.as_ref().is_some_and(|d| !stale(d)) {
                return Err(busy_deleting());
            }
            let first = root.leaves.get("").cloned();
            root.deleting = Some(ticket.clone());
            Ok((Change::Put(root), first))
        })
        .await
}

fn busy_deleting() -> S3Error {
    S3Error::OperationAborted("another DeleteBucket of this bucket is under way; try again".into())
}

/// A seal (or a root's delete ticket) old enough that its deleter is taken for gone.
fn stale(seal: &Seal) -> bool {
    now_ms().saturating_sub(seal.at_ms) >= SEAL_PATIENCE.as_millis() as u64
}

/// Tombstones the blobs of `garbage` not in `done` yet, a few at a time, adding them to it.
async fn tombstone(
    records: &Records,
    garbage: &[Garbage],
    done: &mut HashSet<String>,
) -> Result<(), S3Error> {
    use futures_util::{StreamExt, TryStreamExt};
    let due: Vec<String> = garbage
        .iter()
        .filter(|g| !done.contains(g.blob()))
        .map(|g| g.blob().to_owned())
        .collect();
    let router = records.router();
    futures_util::stream::iter(due.clone())
        .map(|blob| {
            let router = router.clone();
            async move { blobs::delete(&router, &blob).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    done.extend(due);
    Ok(())
}

/// Seals the empty leaf `doc` for the delete `ticket`: its right neighbour and its garbage.
/// A leaf with names (or being split, which only a full one is) is `BucketNotEmpty`; one
/// sealed by another delete that is not stale is `OperationAborted` (never overwritten: a
/// writer would take the older ticket's seal for stale and unseal it).
async fn seal(
    records: &Records,
    doc: &str,
    ticket: &Seal,
) -> Result<(Option<String>, Vec<Garbage>), S3Error> {
    records
        .update(doc, |leaf: Option<Leaf>| {
            let mut leaf = leaf.ok_or(S3Error::NoSuchBucket)?;
            if !leaf.objects.is_empty() || leaf.splitting.is_some() {
                return Err(S3Error::BucketNotEmpty);
            }
            let found = (leaf.right.clone(), leaf.garbage.clone());
            match &leaf.sealed {
                Some(s) if s.ticket == ticket.ticket => return Ok((Change::Keep, found)),
                Some(s) if !stale(s) => return Err(busy_deleting()),
                _ => {}
            }
            leaf.sealed = Some(ticket.clone());
            Ok((Change::Put(leaf), found))
        })
        .await
}

async fn unseal(records: &Records, doc: &str, ticket: &str) -> Result<(), S3Error> {
    records
        .update(doc, |leaf: Option<Leaf>| {
            let Some(mut leaf) =
                leaf.filter(|l| l.sealed.as_ref().is_some_and(|s| s.ticket == ticket))
            else {
                return Ok((Change::Keep, ()));
            };
            leaf.sealed = None;
            Ok((Change::Put(leaf), ()))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::Merging;

    fn leaf(low: &str, high: Option<&str>) -> Leaf {
        Leaf {
            v: FORMAT_SPLIT,
            low: low.into(),
            high: high.map(str::to_owned),
            right: high.map(|_| "r".to_owned()),
            ..Default::default()
        }
    }

    /// An object of `parts` parts with blob IDs of 40 characters.
    fn object(parts: usize) -> ObjectEntry {
        ObjectEntry {
            body: (0..parts)
                .map(|i| crate::records::Piece {
                    blob: format!("{i:040}"),
                    size: 8 << 20,
                })
                .collect(),
            etag: "0123456789abcdef0123456789abcdef-10000".into(),
            ..Default::default()
        }
    }

    fn names(parts: &[usize]) -> Objects {
        let named = parts.iter().enumerate();
        named
            .map(|(i, p)| (format!("k{i:02}"), Arc::new(object(*p))))
            .collect()
    }

    #[test]
    fn split_off_moves_the_split_name_and_those_after_it() {
        let mut lower = names(&[0; 5]);
        let kept = lower.clone();
        let upper = split_off(&mut lower, "k02");
        let keys = |m: &Objects| m.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&lower), ["k00", "k01"]);
        assert_eq!(keys(&upper), ["k02", "k03", "k04"]);
        assert_eq!(kept.len(), 5, "a clone it was made from keeps every name");
        assert!(split_off(&mut lower, "z").is_empty());
        assert_eq!(keys(&split_off(&mut lower, "")), ["k00", "k01"]);
        assert!(lower.is_empty());
    }

    #[test]
    fn a_record_splits_past_its_count_at_the_middle_name() {
        assert_eq!(split_point(&names(&[1; 4]), 4), None);
        assert_eq!(split_point(&names(&[1; 5]), 4).as_deref(), Some("k02"));
    }

    #[test]
    fn a_record_of_few_large_entries_splits_by_size_where_the_bytes_halve() {
        // Two 10,000-part objects, then small ones: about 1.5 MB, most of it the first two.
        let mut parts = vec![10_000, 10_000];
        parts.extend([1; 20]);
        let at = split_point(&names(&parts), 1000);
        assert_eq!(at.as_deref(), Some("k01"), "one large object on each side");
        // Small entries never split by size below the count bound.
        assert_eq!(split_point(&names(&[1; 900]), 1000), None);
        // One entry cannot split, however large; two always can.
        assert_eq!(split_point(&names(&[30_000]), 1000), None);
        assert_eq!(
            split_point(&names(&[30_000, 1]), 1000).as_deref(),
            Some("k01")
        );
        assert_eq!(
            split_point(&names(&[1, 30_000]), 1000).as_deref(),
            Some("k01")
        );
    }

    #[test]
    fn approx_bytes_is_near_the_entrys_json() {
        for parts in [0, 1, 100, 10_000] {
            let entry = object(parts);
            let json = serde_json::to_vec(&entry).unwrap().len();
            let approx = entry.approx_bytes();
            let near = approx * 10 >= json * 8 && approx * 10 <= json * 13 + 640;
            assert!(near, "{parts}: {approx} vs {json}");
        }
    }

    #[test]
    fn a_hint_picks_the_last_leaf_starting_at_or_before_the_key() {
        let hints: BTreeMap<String, String> = [("", "a"), ("m", "b"), ("t", "c")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(pick(&hints, "a"), "a");
        assert_eq!(pick(&hints, "m"), "b");
        assert_eq!(pick(&hints, "s~"), "b");
        assert_eq!(pick(&hints, "zzz"), "c");
    }

    #[test]
    fn a_leaf_sends_keys_past_its_range_right_and_waits_for_its_split() {
        let mut l = leaf("", Some("m"));
        assert_eq!(l.admits("a"), Ok(()));
        assert_eq!(l.admits("m"), Err(Reroute::Right(Some("r".into()))));
        l.splitting = Some(Split {
            at: "g".into(),
            left: None,
            right: "n".into(),
        });
        assert_eq!(l.admits("f"), Ok(()));
        assert_eq!(l.admits("g"), Err(Reroute::Busy));
        l.sealed = Some(Seal {
            ticket: "t".into(),
            at_ms: 1,
        });
        assert!(matches!(l.admits("a"), Err(Reroute::Sealed { .. })));
    }

    #[test]
    fn a_leaf_being_merged_sends_every_change_to_its_left_and_is_written_as_format_4() {
        let mut l = leaf("m", Some("t"));
        assert!(l.merge_due(0), "empty, and not the first leaf");
        assert!(!leaf("", Some("m")).merge_due(0), "the first leaf stays");
        l.merging = Some(Merging {
            into: "left".into(),
            names: false,
        });
        assert!(!l.merge_due(0) && !l.can_split());
        for key in ["m", "p", "t", "z", "a"] {
            let into = "left".to_owned();
            assert_eq!(l.admits(key), Err(Reroute::Merging { into }), "{key}");
        }
        let encoded = l.encode();
        let decoded = Leaf::decode(&encoded).unwrap();
        assert_eq!(decoded.v, crate::records::FORMAT_MERGING);
        assert_eq!(decoded.merging, l.merging);
        // Format 4 without the merge, or the merge in format 2: no record this code wrote.
        let text = String::from_utf8(encoded.to_vec()).unwrap();
        let unmerged = text.replace(r#","merging":{"into":"left"}"#, "");
        assert_ne!(unmerged, text);
        assert!(Leaf::decode(unmerged.as_bytes()).is_err());
        let old = text.replace(r#""v":4"#, r#""v":2"#);
        assert!(Leaf::decode(old.as_bytes()).is_err());
        let mut full = leaf("m", Some("t"));
        full.objects = names(&[0]);
        assert!(
            !full.merge_due(0),
            "a leaf with a name is no merge of empty leaves"
        );
    }

    #[test]
    fn a_leaf_of_few_names_is_merged_with_them_as_format_5() {
        let mut l = leaf("m", Some("t"));
        l.objects = names(&[0, 0]);
        assert!(l.merge_due(2) && !l.merge_due(1), "at most `few` names");
        assert_eq!(super::few_names(1000), 250);
        assert_eq!(super::few_names(2), 0, "leaves of 2 names merge only empty");
        l.merging = Some(Merging {
            into: "left".into(),
            names: true,
        });
        let encoded = l.encode();
        let decoded = Leaf::decode(&encoded).unwrap();
        assert_eq!(decoded.v, crate::records::FORMAT_MERGING_NAMES);
        assert_eq!(decoded.merging, l.merging);
        assert_eq!(
            decoded.objects.len(),
            2,
            "its names stay until the left leaf takes them"
        );
        // Builds before it know format 4 with `{"into"}` only: the names flag or format 5
        // alone, or format 4 with the flag, is no record this code wrote.
        let text = String::from_utf8(encoded.to_vec()).unwrap();
        let as_4 = text.replace(r#""v":5"#, r#""v":4"#);
        assert_ne!(as_4, text);
        assert!(Leaf::decode(as_4.as_bytes()).is_err());
        let unflagged = text.replace(r#","names":true"#, "");
        assert_ne!(unflagged, text);
        assert!(Leaf::decode(unflagged.as_bytes()).is_err());
    }

    #[test]
    fn a_split_root_sends_every_change_to_its_leaves() {
        let mut root = BucketIndex {
            v: 1,
            ..Default::default()
        };
        assert_eq!(root.admits("k"), Ok(()));
        root.leaves.insert(String::new(), "a".into());
        assert_eq!(root.admits("k"), Err(Reroute::Right(None)));
        let decoded = BucketIndex::decode(&root.encode()).unwrap();
        assert_eq!(
            decoded.v, FORMAT_SPLIT,
            "a split root is written as format 2"
        );
    }
}
