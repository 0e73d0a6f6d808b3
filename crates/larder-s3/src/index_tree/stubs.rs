//! Removing the stubs that merges leave (`merge.rs`, step 4).
//!
//! A merged leaf's record stays as a stub because a frontend paused inside a split whose new
//! leaf was merged since would otherwise write that leaf again, with the names of before. No
//! such pause lasts for ever: a stub is removed once `[s3] merged_leaf_grace` (24 h by
//! default) has passed since its merge began, on the sweep's pass, or with its bucket.
//!
//! What finds them: a merge lists its leaf in the bucket's `MergedLeaves` record before it
//! seals it (a stub is unlinked from the moment its merge is done, so nothing else would),
//! whatever step it then stops at, and marks the entry finished after its last step. The
//! sweep removes the records of finished entries past the grace and takes them off the list;
//! an unfinished one past the grace has its merge finished (its merger may be gone: the
//! entry is marked finished then, and removed at the next pass), or, if its leaf was never
//! sealed (it took names, or the seal failed), is taken off. An entry is taken off only if it
//! was not listed again since (a later merge of the same leaf moves its time on). A merge
//! whose seal fails takes its own entry off. A DeleteBucket removes every listed leaf after
//! the root, then the list.
//!
//! A stub removed is harmless where it was met: a hint to it (a split's last step finished
//! late) is dropped by the first read that finds it gone, as a deleted bucket's are. Stubs
//! of builds before this list are listed only if a merge meets them again.

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
/// Entries past their grace one sweep pass looks at per bucket.
const MAX_DUE_PER_PASS: usize = 1024;
/// Stubs a DeleteBucket removes at once.
const REMOVES_AT_ONCE: usize = 16;
/// Times a DeleteBucket tries to remove its stubs (after it nothing finds them).
const DELETE_TRIES: usize = 3;

/// What the sweep made of one entry past its grace.
enum Outcome {
    /// Its stub removed: off the list.
    Removed,
    /// Nothing to remove (never sealed, or gone): off the list.
    Unlist,
    /// Its merge not finished yet: looked at again next pass.
    Keep,
}

impl IndexTree {
    /// Lists leaf `id` of `bucket` (made at `created_ms`) as merged, before its merge seals it:
    /// the time it is listed at, or `None` when the list is full (the merge waits).
    pub(super) async fn list_merged(
        &self,
        records: &Records,
        (bucket, created_ms): (&str, u64),
        id: &str,
    ) -> Result<Option<u64>, S3Error> {
        let doc = merged_leaves_doc(bucket, created_ms);
        let listed = records
            .update(&doc, |list: Option<MergedLeaves>| {
                let mut list = list.unwrap_or(MergedLeaves {
                    v: crate::records::FORMAT,
                    leaves: Vec::new(),
                });
                // Listed by a merge that did not seal it (it took names) and not yet taken
                // off: listed again, at a later time, so that a sweep that saw it unsealed
                // leaves this entry (`unlist`), and its grace starts now.
                if let Some(listed) = list.leaves.iter_mut().find(|l| l.id == id) {
                    listed.at_ms = now_ms().max(listed.at_ms.saturating_add(1));
                    listed.finished = false;
                    let at_ms = listed.at_ms;
                    return Ok((Change::Put(list), Some(at_ms)));
                }
                if list.leaves.len() >= MAX_LISTED {
                    return Ok((Change::Keep, None));
                }
                let at_ms = now_ms();
                list.leaves.push(MergedLeaf {
                    id: id.to_owned(),
                    at_ms,
                    finished: false,
                });
                Ok((Change::Put(list), Some(at_ms)))
            })
            .await?;
        if listed.is_none() {
            tracing::info!(bucket, leaf = id, "an index merge waits: the bucket's list of merged leaves is full until their grace is over");
        }
        Ok(listed)
    }

    /// The sweep's pass over `bucket`: removes the stubs whose merges finished longer than the
    /// grace ago. With how many went.
    pub async fn remove_stubs(&self, records: &Records, bucket: &str) -> Result<usize, S3Error> {
        let root = records
            .read_unresolved::<BucketIndex>(&bucket_doc(bucket))
            .await?;
        let Some(root) = root.filter(BucketIndex::is_split) else {
            return Ok(0);
        };
        let incarnation = (bucket, root.created_ms);
        let doc = merged_leaves_doc(bucket, root.created_ms);
        let Some(list) = records.read::<MergedLeaves>(&doc).await? else {
            return Ok(0);
        };
        let grace = u64::try_from(self.merged_leaf_grace.as_millis()).unwrap_or(u64::MAX);
        let now = now_ms();
        let due = (list.leaves.iter())
            .filter(|l| l.at_ms.saturating_add(grace) <= now)
            .take(MAX_DUE_PER_PASS);
        let (mut done, mut removed) = (HashMap::new(), 0);
        for listed in due {
            match self.settle_listed(records, incarnation, listed).await {
                Ok(Outcome::Removed) => {
                    removed += 1;
                    done.insert(listed.id.clone(), listed.at_ms);
                }
                Ok(Outcome::Unlist) => {
                    done.insert(listed.id.clone(), listed.at_ms);
                }
                Ok(Outcome::Keep) => {}
                Err(err) => {
                    tracing::debug!(%err, bucket, leaf = listed.id, "a merged leaf stays until the next sweep");
                }
            }
        }
        unlist(records, &doc, &done).await?;
        if removed > 0 {
            tracing::info!(
                bucket,
                removed,
                "removed merged index leaves past their grace"
            );
        }
        self.stubs_removed.inc_by(removed);
        Ok(removed as usize)
    }

    /// One entry of the list past its grace (see `Outcome`).
    async fn settle_listed(
        &self,
        records: &Records,
        (bucket, created_ms): (&str, u64),
        listed: &MergedLeaf,
    ) -> Result<Outcome, S3Error> {
        let doc = leaf_doc(bucket, &listed.id);
        if listed.finished {
            let removed = records
                .update(&doc, |leaf: Option<Leaf>| match leaf {
                    // A finished merge's seal never lifts: this is its stub.
                    Some(leaf)
                        if leaf.bucket_created_ms == created_ms && leaf.merging.is_some() =>
                    {
                        Ok((Change::Remove, Some(leaf.garbage)))
                    }
                    _ => Ok((Change::Keep, None)),
                })
                .await?;
            let Some(garbage) = removed else {
                return Ok(Outcome::Unlist);
            };
            tombstone_left(records, &garbage).await;
            return Ok(Outcome::Removed);
        }
        // Its merger may be gone: finished here (which marks the entry), removed next pass.
        self.merge(records, bucket, &listed.id).await?;
        let leaf = records.read_unresolved::<Leaf>(&doc).await?;
        Ok(match leaf {
            Some(leaf) if leaf.bucket_created_ms == created_ms && leaf.merging.is_some() => {
                Outcome::Keep
            }
            _ => Outcome::Unlist,
        })
    }
}

/// Marks leaf `id`'s entry finished, after its merge's last step. An entry not there is added
/// (its grace from now): its merge began before lists, or a racing merger whose seal failed
/// took it off just before this one's seal held.
pub(super) async fn mark_finished(
    records: &Records,
    (bucket, created_ms): (&str, u64),
    id: &str,
) -> Result<(), S3Error> {
    let doc = merged_leaves_doc(bucket, created_ms);
    records
        .update(&doc, |list: Option<MergedLeaves>| {
            let mut list = list.unwrap_or(MergedLeaves {
                v: crate::records::FORMAT,
                leaves: Vec::new(),
            });
            let full = list.leaves.len() >= MAX_LISTED;
            match list.leaves.iter_mut().find(|l| l.id == id) {
                Some(listed) if listed.finished => Ok((Change::Keep, ())),
                Some(listed) => {
                    listed.finished = true;
                    Ok((Change::Put(list), ()))
                }
                None if full => Ok((Change::Keep, ())),
                None => {
                    list.leaves.push(MergedLeaf {
                        id: id.to_owned(),
                        at_ms: now_ms(),
                        finished: true,
                    });
                    Ok((Change::Put(list), ()))
                }
            }
        })
        .await
}

/// Takes the entry of leaf `id` listed at `at_ms` off its list (its seal failed).
pub(super) async fn unlist_one(
    records: &Records,
    (bucket, created_ms): (&str, u64),
    (id, at_ms): (&str, u64),
) -> Result<(), S3Error> {
    let doc = merged_leaves_doc(bucket, created_ms);
    unlist(records, &doc, &HashMap::from([(id.to_owned(), at_ms)])).await
}

/// DeleteBucket, once the root of `bucket` made at `created_ms` is gone: every leaf listed
/// goes (whatever step its merge got to: nothing reads the bucket's leaves any more), then
/// the list.
pub(super) async fn remove_all_stubs(
    records: &Records,
    bucket: &str,
    created_ms: u64,
) -> Result<(), S3Error> {
    let mut tries = 0;
    loop {
        tries += 1;
        match remove_listed(records, bucket, created_ms).await {
            Err(err) if tries < DELETE_TRIES => {
                tracing::debug!(%err, bucket, "removing a deleted bucket's merged leaves: trying again");
            }
            outcome => return outcome,
        }
    }
}

async fn remove_listed(records: &Records, bucket: &str, created_ms: u64) -> Result<(), S3Error> {
    let doc = merged_leaves_doc(bucket, created_ms);
    let Some(list) = records.read::<MergedLeaves>(&doc).await? else {
        return Ok(());
    };
    for listed in list.leaves.chunks(REMOVES_AT_ONCE) {
        let removals = listed
            .iter()
            .map(|l| remove_leaf(records, leaf_doc(bucket, &l.id), created_ms));
        let results = futures_util::future::join_all(removals).await;
        results.into_iter().collect::<Result<Vec<()>, S3Error>>()?;
    }
    records
        .update(&doc, |_: Option<MergedLeaves>| Ok((Change::Remove, ())))
        .await
}

/// Removes leaf `doc` if it belongs to the bucket made at `created_ms`.
async fn remove_leaf(records: &Records, doc: String, created_ms: u64) -> Result<(), S3Error> {
    let removed = records
        .update(&doc, |leaf: Option<Leaf>| match leaf {
            Some(leaf) if leaf.bucket_created_ms == created_ms => {
                Ok((Change::Remove, leaf.garbage))
            }
            _ => Ok((Change::Keep, Vec::new())),
        })
        .await?;
    tombstone_left(records, &removed).await;
    Ok(())
}

/// Tombstones what a removed stub still held on its garbage list. A finished merge handed
/// that list to the left leaf and cleared it, but a stub written since gives its base up
/// there when `[s3] index_delta_bytes` no longer calls for one (a stub may hold names, and so
/// a base), and nothing sweeps an unlinked leaf: the base would leak. A failure is logged:
/// the record is gone, and nothing would find that blob again either way.
async fn tombstone_left(records: &Records, garbage: &[crate::records::Garbage]) {
    if garbage.is_empty() {
        return;
    }
    let mut done = std::collections::HashSet::new();
    if let Err(err) = super::tombstone(records, garbage, &mut done).await {
        tracing::warn!(%err, blobs = garbage.len(), "blobs a removed index stub held stay");
    }
}

/// Takes `done` off the list `doc`, each entry only if it is still listed at the time it had
/// when it was done (not listed again since by a later merge); an emptied list goes.
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
