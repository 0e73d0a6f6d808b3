//! Merging an index leaf emptied or thinned by deletes into the leaf on its left, so that
//! deletes leave no runs of empty or nearly empty leaves behind: every listing would walk them
//! (`pager.rs` ends a page after 64 with nothing to list), and the root's hints would keep
//! growing with leaves that hold little or nothing.
//!
//! Which leaves: one of at most `[s3] index_merge_entries` names (a quarter of a leaf by
//! default) that is not its bucket's first, when its left neighbour has room for its names
//! (looked at before the seal; a neighbour that grew since is split after the merge). Four
//! idempotent steps, as a split has (`index_tree.rs`), for such a leaf M:
//!
//! 1. **Seal M for the merge** in a read-modify-write at its primary, naming the leaf L that
//!    ended at it (`Leaf::merging`; format 4, or 5 when M holds names), if it still holds few
//!    enough names. The seal never lifts: M takes no change again, and its names are frozen.
//!    A change of a name in its range is sent to L (`Reroute::Merging`), which sends it back
//!    to M, after a pause, while L still ends at M.
//! 2. **Extend the leaf that ends at M** (L, or a leaf split off L since) over M's range in one
//!    write: its `high` and `right` become M's, M's names become its own, and M's garbage is
//!    added to its own (held to `[s3] max_held_garbage` as a write's is). Refused while that
//!    leaf is marked for a split (the split is finished first), sealed by a DeleteBucket
//!    (waited for, or lifted if that delete is gone, as a writer does) or being merged itself
//!    (that merge is finished first). Done once: a leaf that no longer ends at M is not
//!    written again, so a name changed in it since is never set back to M's copy.
//! 3. **Drop M from the root's hints.**
//! 4. **Clear M's garbage list** (its left neighbour's now). M's record stays, as a stub, its
//!    names in it unread: a split's step 2 writes its new leaf "unless it exists", so a
//!    frontend that was paused inside a split whose new leaf has since been merged would
//!    write that leaf again, with the names of before, if M were gone. Found, the stub sends a
//!    walk left; written again, it is there already.
//!
//! Why every read stays right: from 1 to 2 no name can be linked into or unlinked from M's
//! range (M refuses, and L ends before it), so M's range holds exactly M's names then, as M
//! reads, and from 2 on L holds them. A walk that comes to M from the leaf on its left, which
//! still ended at M when it was read, reads M so (`index_tree::walk`); a walk that starts at M
//! (a hint) goes to L instead, whose `right` links lead to the leaf holding the key either
//! way. A hint to M that comes back (a split's step 4 finished late, a walk's repair) is
//! harmless for the same reason, and dropped again by the next change that meets it. A leaf
//! that is gone (its bucket deleted) is taken off the root's hints by the first read that
//! finds it so. M's names keep their blobs: the stub's copies are never read or reclaimed.
//!
//! Who merges: the frontend whose delete left a leaf with few names (`index_batch.rs`), a
//! listing that walked one (next to a left neighbour with room, or empty: for those left by a
//! merge that did not finish, or by builds before merges), both through the frontend's merge
//! queue (`merge_queue.rs`: a few tasks, one merge at a time each, after the writes that asked
//! for them), and a change that finds a merge under way (its merger may be gone), at once.
//! Stubs are listed before the seal and removed after `[s3] merged_leaf_grace`, or with their
//! bucket (`stubs.rs`).
//!
//! Builds before merges with names refuse format 5 (its `names` flag too), so none of them
//! finishes such a merge without moving the names: where they meet such a leaf (during a
//! rolling upgrade, or after a rollback, until its stub goes) they answer an error instead.

use std::collections::HashSet;
use std::sync::Arc;

use crate::error::S3Error;
use crate::objects::hurry;
use crate::records::{
    bucket_doc, leaf_doc, names_bytes, BucketIndex, Leaf, Merging, Objects, Seal,
};
use crate::service::now_ms;
use crate::store::{Change, Records};

use super::{drop_hint, hint_before, IndexTree, Target, MAX_HOPS, SPLIT_BYTES};

/// Leaves whose merges one call finishes before its own (each blocked by the next one left).
const MAX_CHAINED: usize = 8;
/// Steps one call takes at most (each a merge finished, or one found blocking).
const MAX_STEPS: usize = 32;
/// Leaves (empty, or of few names) one listing merges after it answered.
const MERGES_PER_PAGE: usize = 16;
/// Unless `[s3] index_merge_entries` says otherwise, a leaf holding at most
/// `index_leaf_entries` / this many names is merged into its left neighbour when they fit in
/// one leaf together. Splits leave halves, far above it, so a split leaf is not merged back at
/// once, and a merge that overfills its left leaf (it grew since it was looked at) is followed
/// by a split of that leaf into halves that stay.
const FEW_NAMES_FRACTION: usize = 4;

/// Names a leaf holds at most to be merged into its left neighbour, by default (with leaves
/// of `leaf_entries` names).
pub(super) fn few_names(leaf_entries: usize) -> usize {
    leaf_entries / FEW_NAMES_FRACTION
}

/// How far a merge of one leaf got.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Its range is its left neighbour's (or it is not to be merged: it holds too many names,
    /// its left neighbour has no room for them, it is gone, it is the first leaf).
    Done,
    /// The leaf ending at it is being merged too: that merge goes first.
    Blocked(String),
    /// The leaf ending at it is marked for a split, or sealed by a DeleteBucket: that is
    /// settled first (the split finished; the seal waited for, or lifted if its delete is
    /// gone), then the merge tries again.
    Obstructed(String, Obstacle),
    /// Another task of this frontend is merging it: wait, and look again.
    Busy,
    /// Not now (a leaf on the way is gone); whoever finds it next tries again.
    Later,
}

/// What keeps the leaf ending at a merged one from taking its range.
#[derive(Debug, PartialEq, Eq)]
enum Obstacle {
    Split,
    Sealed(Seal, u64),
}

/// The leaf whose `right` is the leaf being merged, as a walk from a leaf left of it finds it.
enum Found {
    Leaf(String, Box<Leaf>),
    /// A leaf reaches past the merged leaf's first key: nothing ends at it any more.
    Covered,
    /// A leaf on the way is gone (this one, if it is sure), or the walk is too long.
    Lost(Option<String>),
}

impl IndexTree {
    /// Whether a listing that walked `node` (after a leaf of `left_names` names, on its left)
    /// should have it merged: it is empty, or holds few names that fit beside its left
    /// neighbour's, or its merge is under way (its merger may be gone).
    pub(super) fn worth_merging(&self, node: &super::Node, left_names: Option<usize>) -> bool {
        let names = node.objects.len();
        let fits = |left: usize| left.saturating_add(names) <= self.leaf_entries;
        let few = names <= self.merge_entries && left_names.is_some_and(fits);
        !node.low.is_empty() && (node.merging || names == 0 || few)
    }

    /// Merges the leaf `id` of `bucket` into the leaf on its left if it holds few names, or
    /// finishes its merge (see the module's comment). True when its range is its left
    /// neighbour's now, or it is no leaf to merge; false when that has to wait.
    pub async fn merge(&self, records: &Records, bucket: &str, id: &str) -> Result<bool, S3Error> {
        let mut pending = vec![id.to_owned()];
        // Whether `id` was dropped from `pending`: then its merge is not known to be done.
        let mut restarted = false;
        for _ in 0..MAX_STEPS {
            let Some(id) = pending.last().cloned() else {
                return Ok(!restarted);
            };
            match self.merge_one(records, bucket, &id).await? {
                Step::Done => {
                    pending.pop();
                }
                // A chain longer than the bound starts again from its leftmost leaf, so every
                // call finishes one merge at least.
                Step::Blocked(left) if pending.len() >= MAX_CHAINED => {
                    (pending, restarted) = (vec![left], true);
                }
                Step::Blocked(left) if pending.contains(&left) => return Ok(false),
                Step::Blocked(left) => pending.push(left),
                Step::Obstructed(left, obstacle) => {
                    self.clear(records, bucket, &left, obstacle).await?;
                }
                Step::Busy => tokio::time::sleep(super::WAIT).await,
                Step::Later => return Ok(false),
            }
        }
        Ok(false)
    }

    /// Settles what keeps leaf `left` from taking a merged leaf's range: finishes its split,
    /// or waits on its seal (lifted if the delete that set it is gone).
    async fn clear(
        &self,
        records: &Records,
        bucket: &str,
        left: &str,
        obstacle: Obstacle,
    ) -> Result<(), S3Error> {
        let target = Target::Leaf(left.to_owned());
        match obstacle {
            Obstacle::Split => self.split(records, bucket, &target).await,
            Obstacle::Sealed(seal, created_ms) => {
                let root = self.root(records, bucket).await?;
                if root.created_ms != created_ms {
                    return Err(S3Error::NoSuchBucket);
                }
                self.settle_seal(records, bucket, root, &target, &seal)
                    .await
            }
        }
    }

    /// Queues the merges of `ids` (leaves a listing walked that are worth it; `merge_queue.rs`).
    pub fn merge_soon(self: &Arc<Self>, records: &Arc<Records>, bucket: &str, ids: Vec<String>) {
        for id in ids.into_iter().take(MERGES_PER_PAGE) {
            self.merge_later(records, bucket, &id);
        }
    }

    async fn merge_one(&self, records: &Records, bucket: &str, id: &str) -> Result<Step, S3Error> {
        let doc = leaf_doc(bucket, id);
        if !self.begin_restructuring(&doc) {
            return Ok(Step::Busy);
        }
        let step = self.merge_leaf(records, bucket, id).await;
        // The cached hints stay: one to a merged leaf is safe (a walk from it goes left), and
        // step 3 takes it off them too.
        self.end_restructuring(&doc);
        step
    }

    async fn merge_leaf(&self, records: &Records, bucket: &str, id: &str) -> Result<Step, S3Error> {
        let doc = leaf_doc(bucket, id);
        // Its names resolved: a leaf with a base and no change since reads empty unresolved.
        let Some(leaf) = records.read::<Leaf>(&doc).await? else {
            return Ok(Step::Done);
        };
        if leaf.merging.is_none() {
            if !super::Holder::merge_due(&leaf, self.merge_entries) {
                return Ok(Step::Done);
            }
            let root = match self.root(records, bucket).await {
                Err(S3Error::NoSuchBucket) => return Ok(Step::Done),
                root => root?,
            };
            let Some(start) = hint_before(&root.leaves, &leaf.low) else {
                return Ok(Step::Done);
            };
            let left = match ending_at(records, bucket, &start, (id, &leaf.low)).await? {
                Found::Leaf(left, left_leaf) => {
                    let names = &leaf.objects;
                    if !names.is_empty()
                        && !self
                            .fit(records, bucket, (&left, &left_leaf), names)
                            .await?
                    {
                        // Not now: its left neighbour is too full to take them.
                        return Ok(Step::Done);
                    }
                    left
                }
                Found::Lost(Some(gone)) => {
                    drop_hint(records, bucket, (&gone, None)).await?;
                    return Ok(Step::Later);
                }
                Found::Covered | Found::Lost(None) => return Ok(Step::Later),
            };
            // Listed first, so that its stub is removed in time whatever step this stops at.
            let incarnation = (bucket, root.created_ms);
            let Some(listed_ms) = self.list_merged(records, incarnation, id).await? else {
                return Ok(Step::Later);
            };
            if !seal_for_merge(records, &doc, &left, self.merge_entries).await? {
                // Not to be merged (it took names, or went with its bucket): off the list.
                super::stubs::unlist_one(records, incarnation, (id, listed_ms)).await?;
                return Ok(Step::Done);
            }
        }
        // Read again after the seal: its names and garbage as the seal left them, which no
        // write changes since but a sweep's (that only takes garbage off).
        let Some(merged) = records.read::<Leaf>(&doc).await? else {
            return Ok(Step::Done);
        };
        let Some(Merging { into, .. }) = merged.merging.clone() else {
            return Ok(Step::Later);
        };
        let bounds = (bucket, self.max_held_garbage);
        let extended = match extend_over(records, bounds, (id, &merged), &into).await? {
            (Step::Done, extended) => extended,
            (step, _) => return Ok(step),
        };
        if let Some(left) = &extended {
            self.merged.inc();
            let names = merged.objects.len();
            tracing::info!(
                bucket,
                leaf = id,
                into = left,
                names,
                "merged an index leaf into its left"
            );
        }
        // Step 3.
        drop_hint(records, bucket, (id, Some(&merged.low))).await?;
        self.unremember(bucket, (&merged.low, id));
        // Its garbage is the left leaf's now; the rest of it stays, as a stub.
        records
            .update(&doc, |leaf: Option<Leaf>| match leaf {
                Some(mut leaf) if leaf.merging.is_some() && !leaf.garbage.is_empty() => {
                    leaf.garbage.clear();
                    Ok((Change::Put(leaf), ()))
                }
                _ => Ok((Change::Keep, ())),
            })
            .await?;
        let incarnation = (bucket, merged.bucket_created_ms);
        super::stubs::mark_finished(records, incarnation, id).await?;
        if let Some(left) = extended.filter(|_| !merged.objects.is_empty()) {
            // It may hold more than a leaf's bound now (it took names since it was looked at).
            if let Err(err) = self.split(records, bucket, &Target::Leaf(left)).await {
                tracing::debug!(%err, bucket, "a split after a merge failed; the next write tries again");
            }
        }
        Ok(Step::Done)
    }

    /// Whether leaf `left` (as `ending_at` read it) has room for `names`: together at most a
    /// leaf's bound of names, and half the bytes past which a record splits (so that a leaf
    /// split by size is not merged straight back). Read whole if it has a base (its record
    /// holds only what changed since).
    async fn fit(
        &self,
        records: &Records,
        bucket: &str,
        (left, leaf): (&str, &Leaf),
        names: &Objects,
    ) -> Result<bool, S3Error> {
        let whole;
        let held = match leaf.base {
            None => &leaf.objects,
            Some(_) => match records.read::<Leaf>(&leaf_doc(bucket, left)).await? {
                Some(leaf) => {
                    whole = leaf;
                    &whole.objects
                }
                None => return Ok(false),
            },
        };
        let count = held.len().saturating_add(names.len());
        let bytes = names_bytes(held).saturating_add(names_bytes(names));
        Ok(count <= self.leaf_entries && bytes <= SPLIT_BYTES / 2)
    }
}

/// From leaf `start`, left of the leaf `id` starting at `low`, rightwards to the leaf whose
/// `right` is `id`. A leaf being merged is passed as `index_tree::walk` passes it.
async fn ending_at(
    records: &Records,
    bucket: &str,
    start: &str,
    (id, low): (&str, &str),
) -> Result<Found, S3Error> {
    let mut at = start.to_owned();
    let mut from_left = false;
    for _ in 0..MAX_HOPS {
        let doc = leaf_doc(bucket, &at);
        let Some(leaf) = records.read_unresolved::<Leaf>(&doc).await? else {
            return Ok(Found::Lost(Some(at)));
        };
        if let Some(merging) = leaf.merging.as_ref().filter(|_| !from_left) {
            (at, from_left) = (merging.into.clone(), false);
            continue;
        }
        if leaf.right.as_deref() == Some(id) {
            return Ok(Found::Leaf(at, Box::new(leaf)));
        }
        match (&leaf.high, &leaf.right) {
            (Some(high), Some(right)) if high.as_str() < low => {
                (at, from_left) = (right.clone(), true);
            }
            _ => return Ok(Found::Covered),
        }
    }
    Ok(Found::Lost(None))
}

/// Seals the leaf `doc` for its merge into `left` if it is still to be merged (holds at most
/// `few` names); false if it is not (it took names, or was sealed or removed meanwhile). A
/// seal found is kept as it is.
async fn seal_for_merge(
    records: &Records,
    doc: &str,
    left: &str,
    few: usize,
) -> Result<bool, S3Error> {
    records
        .update(doc, |leaf: Option<Leaf>| {
            let Some(mut leaf) = leaf else {
                return Ok((Change::Keep, false));
            };
            if leaf.merging.is_some() {
                return Ok((Change::Keep, true));
            }
            if !super::Holder::merge_due(&leaf, few) {
                return Ok((Change::Keep, false));
            }
            leaf.merging = Some(Merging {
                into: left.to_owned(),
                names: !leaf.objects.is_empty(),
            });
            Ok((Change::Put(leaf), true))
        })
        .await
}

/// What a read-modify-write of the leaf ending at a merged one found.
enum Extended {
    /// Done, and whether its garbage list went past the bound (`objects::hurry`).
    Done(bool),
    /// It no longer ends there (it split, or was extended): look for that leaf again.
    Again,
    Blocked,
    Obstructed(Obstacle),
}

/// Step 2: the leaf ending at `merged` (found from `into`, or from the root's last hint
/// before it once `into` is gone) takes its range, its names and its garbage. With that leaf
/// if this call wrote it.
async fn extend_over(
    records: &Records,
    (bucket, max_held_garbage): (&str, usize),
    (id, merged): (&str, &Leaf),
    into: &str,
) -> Result<(Step, Option<String>), S3Error> {
    let mut start = into.to_owned();
    for _ in 0..MAX_HOPS {
        let (left, leaf) = match ending_at(records, bucket, &start, (id, &merged.low)).await? {
            Found::Covered => return Ok((Step::Done, None)),
            Found::Leaf(left, leaf) => (left, leaf),
            Found::Lost(gone) => {
                if let Some(gone) = gone {
                    drop_hint(records, bucket, (&gone, None)).await?;
                }
                let root = records
                    .read_unresolved::<BucketIndex>(&bucket_doc(bucket))
                    .await?;
                let before = root.and_then(|root| hint_before(&root.leaves, &merged.low));
                match before {
                    Some(before) if before != start => start = before,
                    _ => return Ok((Step::Later, None)),
                }
                continue;
            }
        };
        if leaf.merging.is_some() {
            return Ok((Step::Blocked(left), None));
        }
        let extended = records
            .update(&leaf_doc(bucket, &left), |leaf: Option<Leaf>| {
                let Some(mut leaf) = leaf.filter(|l| l.right.as_deref() == Some(id)) else {
                    return Ok((Change::Keep, Extended::Again));
                };
                if leaf.merging.is_some() {
                    return Ok((Change::Keep, Extended::Blocked));
                }
                if let Some(seal) = &leaf.sealed {
                    let sealed = Obstacle::Sealed(seal.clone(), leaf.bucket_created_ms);
                    return Ok((Change::Keep, Extended::Obstructed(sealed)));
                }
                if leaf.splitting.is_some() {
                    return Ok((Change::Keep, Extended::Obstructed(Obstacle::Split)));
                }
                leaf.high = merged.high.clone();
                leaf.right = merged.right.clone();
                // Its range was the merged leaf's until now: none of these names is here.
                for (name, entry) in merged.objects.iter() {
                    leaf.objects
                        .entry(name.clone())
                        .or_insert_with(|| entry.clone());
                }
                let held: HashSet<&str> = leaf.garbage.iter().map(|g| g.blob()).collect();
                let taken: Vec<_> = (merged.garbage.iter())
                    .filter(|g| !held.contains(g.blob()))
                    .cloned()
                    .collect();
                leaf.garbage.extend(taken);
                // Held to the same bound as a write's (merges of many leaves into one would
                // otherwise grow one list without end).
                let hurried = hurry(&mut leaf.garbage, max_held_garbage, now_ms());
                Ok((Change::Put(leaf), Extended::Done(hurried)))
            })
            .await?;
        let step = match extended {
            Extended::Done(hurried) => {
                if hurried {
                    crate::objects::sweep_soon(bucket, &Target::Leaf(left.clone()));
                }
                (Step::Done, Some(left))
            }
            Extended::Again => continue,
            Extended::Blocked => (Step::Blocked(left), None),
            Extended::Obstructed(obstacle) => (Step::Obstructed(left, obstacle), None),
        };
        return Ok(step);
    }
    Ok((Step::Later, None))
}
