//! Removing the stubs that merges leave (`merge.rs`, step 4).
//!
//! A merged leaf's record stays as a stub because a frontend paused inside a split whose new
//! leaf was merged since would otherwise write that leaf again, with the names of before. No
//! such pause lasts for ever: a stub is removed once `[s3] merged_leaf_grace` (24 h by
//! default) has passed since its merge began, on the sweep's pass, or with its bucket.
//!
//! What finds them: a merge lists its leaf in the bucket's `MergedLeaves` record before it
//! seals it (a stub is unlinked from the moment its merge is done, so nothing else would),
//! whatever step it then stops at. The sweep finishes a listed leaf's merge first (idempotent:
//! its range is then its left neighbour's, its hint gone, its garbage handed on), removes the
//! record if it is still a stub, and takes it off the list; a listed leaf that took a name
//! instead of being sealed is only taken off. A DeleteBucket removes every listed stub after
//! the root, then the list.
//!
//! A stub removed is harmless where it was met: a hint to it (a split's last step finished
//! late) is dropped by the first read that finds it gone, as a deleted bucket's are. Stubs
//! of builds before this list are not listed, and stay.

use std::collections::HashMap;

use crate::error::S3Error;
use crate::records::{bucket_doc, leaf_doc, merged_leaves_doc};
use crate::records::{BucketIndex, Leaf, MergedLeaf, MergedLeaves};
use crate::service::now_ms;
use crate::store::{Change, Records};

use super::IndexTree;

/// Leaves one bucket's list holds (~45 bytes each): past it, merges in that bucket wait until
/// the sweep shortens it, rather than rewriting a list of megabytes at each one.
const MAX_LISTED: usize = 20_000;
/// Stubs one sweep pass removes per bucket.
const MAX_REMOVED_PER_PASS: usize = 1024;
/// Stubs a DeleteBucket removes at once.
const REMOVES_AT_ONCE: usize = 16;

impl IndexTree {
    /// Lists leaf `id` of `bucket` (made at `created_ms`) as merged, before its merge seals it.
    /// False when the list is full: the merge waits.
    pub(super) async fn list_merged(
        &self,
        records: &Records,
        (bucket, created_ms): (&str, u64),
        id: &str,
    ) -> Result<bool, S3Error> {
        let doc = merged_leaves_doc(bucket, created_ms);
        records
            .update(&doc, |list: Option<MergedLeaves>| {
                let mut list = list.unwrap_or(MergedLeaves {
                    v: crate::records::FORMAT,
                    leaves: Vec::new(),
                });
                // Listed by a merge that did not seal it (it took a name): its grace starts
                // again now, and a sweep that saw it unsealed leaves the entry (`unlist`).
                if let Some(listed) = list.leaves.iter_mut().find(|l| l.id == id) {
                    listed.at_ms = now_ms();
                    return Ok((Change::Put(list), true));
                }
                if list.leaves.len() >= MAX_LISTED {
                    return Ok((Change::Keep, false));
                }
                list.leaves.push(MergedLeaf {
                    id: id.to_owned(),
                    at_ms: now_ms(),
                });
                Ok((Change::Put(list), true))
            })
            .await
    }

    /// The sweep's pass over `bucket`: removes the stubs listed longer than the grace ago.
    /// With how many went.
    pub async fn remove_stubs(&self, records: &Records, bucket: &str) -> Result<usize, S3Error> {
        let root = records
            .read_unresolved::<BucketIndex>(&bucket_doc(bucket))
            .await?;
        let Some(root) = root.filter(BucketIndex::is_split) else {
            return Ok(0);
        };
        let doc = merged_leaves_doc(bucket, root.created_ms);
        let Some(list) = records.read::<MergedLeaves>(&doc).await? else {
            return Ok(0);
        };
        let grace = u64::try_from(self.merged_leaf_grace.as_millis()).unwrap_or(u64::MAX);
        let now = now_ms();
        let due = list
            .leaves
            .iter()
            .filter(|l| l.at_ms.saturating_add(grace) <= now)
            .take(MAX_REMOVED_PER_PASS);
        let mut done = HashMap::new();
        for listed in due {
            // Finished first, if a merger stopped half way: its range its left neighbour's.
            if !self.merge(records, bucket, &listed.id).await? {
                continue;
            }
            let doc = leaf_doc(bucket, &listed.id);
            if remove_stub(records, doc, root.created_ms).await? {
                done.insert(listed.id.clone(), listed.at_ms);
            }
        }
        let removed = done.len();
        unlist(records, &doc, &done).await?;
        self.stubs_removed.inc_by(removed as u64);
        Ok(removed)
    }
}

/// DeleteBucket, once the root of `bucket` made at `created_ms` is gone: every stub listed
/// goes, then the list.
pub(super) async fn remove_all_stubs(
    records: &Records,
    bucket: &str,
    created_ms: u64,
) -> Result<(), S3Error> {
    let doc = merged_leaves_doc(bucket, created_ms);
    let Some(list) = records.read::<MergedLeaves>(&doc).await? else {
        return Ok(());
    };
    for listed in list.leaves.chunks(REMOVES_AT_ONCE) {
        let removals = listed
            .iter()
            .map(|l| remove_stub(records, leaf_doc(bucket, &l.id), created_ms));
        let results = futures_util::future::join_all(removals).await;
        results
            .into_iter()
            .collect::<Result<Vec<bool>, S3Error>>()?;
    }
    records
        .update(&doc, |_: Option<MergedLeaves>| Ok((Change::Remove, ())))
        .await
}

/// Removes leaf `doc` if it is a finished stub of the bucket made at `created_ms`. True when it
/// is off the list's concerns (removed, gone, or never sealed: it took a name); false while
/// its garbage is not handed on yet (the next pass looks again).
async fn remove_stub(records: &Records, doc: String, created_ms: u64) -> Result<bool, S3Error> {
    records
        .update(&doc, |leaf: Option<Leaf>| match leaf {
            Some(leaf) if leaf.bucket_created_ms != created_ms => Ok((Change::Keep, true)),
            Some(leaf) if leaf.merging.is_some() && leaf.garbage.is_empty() => {
                Ok((Change::Remove, true))
            }
            Some(leaf) if leaf.merging.is_some() => Ok((Change::Keep, false)),
            _ => Ok((Change::Keep, true)),
        })
        .await
}

/// Takes `done` off the list `doc`, each entry only if it was listed when it was done (not
/// listed again since by a merge that began later); an emptied list goes.
async fn unlist(records: &Records, doc: &str, done: &HashMap<String, u64>) -> Result<(), S3Error> {
    if done.is_empty() {
        return Ok(());
    }
    records
        .update(doc, |list: Option<MergedLeaves>| {
            let Some(mut list) = list else {
                return Ok((Change::Keep, ()));
            };
            list.leaves.retain(|l| done.get(&l.id) != Some(&l.at_ms));
            match list.leaves.is_empty() {
                true => Ok((Change::Remove, ())),
                false => Ok((Change::Put(list), ())),
            }
        })
        .await
}
