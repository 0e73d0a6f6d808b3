//! Links and unlinks of names in one index record (a small bucket's root, or a leaf of a split
//! one: `index_tree.rs`), batched: a record is changed by read-modify-writes at its partition
//! primary, so concurrent PUTs into one range raced each other (each re-read and re-wrote the
//! record, most lost the race and tried again, up to 64 times). Here a frontend queues the
//! changes of each record and one task applies whatever has queued in one read-modify-write,
//! in arrival order, each change judged (its conditions, the record's range) on the state the
//! ones before it left. While that write is in flight the next changes queue for the next
//! one: group commit. A record that grows past the leaf bound is split after its write, and a
//! leaf that its write left empty, or with few names for the first time, is merged into the
//! leaf on its left (`index_tree/merge.rs`).
//!
//! Every change gets its own answer: a refused change (412, `NoSuchBucket`) leaves the record
//! as it was for the others; a change whose names are no longer this record's (a split, a
//! delete under way) is answered with where to go instead; a write that fails (no quorum, the
//! primary away) fails every change of its batch that would have applied, as it would have
//! alone. Frontends still race each other at the primary, one batch against another.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::conditions::WriteConditions;
use crate::error::S3Error;
use crate::index_tree::{split_of, Holder, IndexTree, Reroute, Target};
use crate::objects::hurry;
use crate::records::{BucketIndex, Garbage, Leaf, ObjectEntry};
use crate::store::{Change, Records};

/// Names a record may hold before links of new ones are refused (its split keeps failing):
/// the bound on a record's size that every read of it pays. Generous, because the range
/// below a split point takes names while the split runs.
fn hard_bound(leaf_entries: usize) -> usize {
    leaf_entries
        .saturating_mul(4)
        .max(leaf_entries.saturating_add(256))
}

/// Why a change of a bucket's names failed, and whether it may have applied all the same.
#[derive(Debug)]
pub struct ChangeFailed {
    pub error: S3Error,
    /// The write that held it failed without saying whether it applied (sent to the primary,
    /// no answer): the name may point at the new blob. False: refused, or nothing was written.
    pub may_have_applied: bool,
}

impl From<ChangeFailed> for S3Error {
    fn from(failed: ChangeFailed) -> S3Error {
        failed.error
    }
}

/// One change of a bucket's names.
pub enum IndexChange {
    /// Point `key` at `entry` if `conditions` hold for what it points at now.
    Link {
        key: String,
        entry: Box<ObjectEntry>,
        conditions: WriteConditions,
    },
    /// Remove `keys` (absent ones: nothing to do).
    Unlink { keys: Vec<String> },
    /// Write the record holding `key` as it is: a fence after which no write based on an
    /// older state of it can apply (`held.rs`).
    Touch { key: String },
    /// Replace `key`'s entry by `amended`, the same object with another ACL or other tags
    /// (PutObjectAcl, PutObjectTagging), if the name still points at `expected` (the same
    /// entry, body and time and all: an overwrite since is never undone, else
    /// `OperationAborted`). Its blobs stay its own: an amendment of the body is refused.
    Amend {
        key: String,
        expected: Box<ObjectEntry>,
        amended: Box<ObjectEntry>,
    },
}

impl IndexChange {
    /// The names the change is about.
    fn keys(&self) -> Vec<String> {
        match self {
            IndexChange::Link { key, .. }
            | IndexChange::Touch { key }
            | IndexChange::Amend { key, .. } => vec![key.clone()],
            IndexChange::Unlink { keys } => keys.clone(),
        }
    }
}

/// What became of a change that was not refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    Done,
    /// These keys of the change are not this record's now, for this reason (the others, if
    /// any, applied).
    Elsewhere(Reroute, Vec<String>),
}

struct Queued {
    change: IndexChange,
    /// When the blobs this change unlinks may go (`replaced_blob_grace` from its arrival).
    after_ms: u64,
    done: oneshot::Sender<Result<Applied, ChangeFailed>>,
}

/// One index record of one bucket.
type Place = (String, Target);

/// The queues of this frontend's index changes, one per record with changes pending.
pub struct IndexBatches {
    /// Record → changes waiting for the next write. A record is present while a task writes
    /// for it; that task takes the queue whole each round and removes the entry when empty.
    queues: Mutex<HashMap<Place, Vec<Queued>>>,
    tree: Arc<IndexTree>,
    /// `[s3] max_held_garbage`: replaced blobs a record holds through their grace period.
    max_held_garbage: usize,
}

impl IndexBatches {
    pub fn new(tree: Arc<IndexTree>, max_held_garbage: usize) -> IndexBatches {
        IndexBatches {
            queues: Mutex::default(),
            tree,
            max_held_garbage,
        }
    }

    /// Applies `change` to record `target` of `bucket`'s index with the changes queued beside
    /// it; answers once the write that holds it is acknowledged (or why not).
    pub async fn apply(
        self: &Arc<Self>,
        records: &Arc<Records>,
        (bucket, target): (&str, &Target),
        change: IndexChange,
        after_ms: u64,
    ) -> Result<Applied, ChangeFailed> {
        let (done, answer) = oneshot::channel();
        let queued = Queued {
            change,
            after_ms,
            done,
        };
        let place: Place = (bucket.to_owned(), target.clone());
        let start = {
            let mut queues = self.queues.lock();
            match queues.get_mut(&place) {
                Some(queue) => {
                    queue.push(queued);
                    false
                }
                None => {
                    queues.insert(place.clone(), vec![queued]);
                    true
                }
            }
        };
        if start {
            // A task of its own: the writer outlives any one request (a client that hangs up
            // does not strand the changes queued behind it).
            let (batches, records) = (self.clone(), records.clone());
            tokio::spawn(async move { batches.write_until_empty(records, place).await });
        }
        answer.await.unwrap_or_else(|_| {
            Err(ChangeFailed {
                error: S3Error::Internal("the index writer ended".into()),
                may_have_applied: true,
            })
        })
    }

    async fn write_until_empty(&self, records: Arc<Records>, place: Place) {
        let mut writing = Writing {
            batches: self,
            place: &place,
            emptied: false,
        };
        let (bucket, target) = &place;
        let bounds = (
            self.tree.leaf_entries,
            self.max_held_garbage,
            self.tree.merge_entries,
        );
        loop {
            let batch = {
                let mut queues = self.queues.lock();
                let queue = queues
                    .get_mut(&place)
                    .map(std::mem::take)
                    .unwrap_or_default();
                if queue.is_empty() {
                    queues.remove(&place);
                    writing.emptied = true;
                    return;
                }
                queue
            };
            let due = match target {
                Target::Root => write_batch::<BucketIndex>(&records, &place, batch, bounds).await,
                Target::Leaf(_) => write_batch::<Leaf>(&records, &place, batch, bounds).await,
            };
            if let (Due::Merge, Target::Leaf(id)) = (due, target) {
                // After the writes before it, one at a time (`index_tree/merge_queue.rs`).
                self.tree.merge_later(&records, bucket, id);
            }
            if due == Due::Split {
                // Beside the writes, not between them: changes below the split point go on.
                let (tree, records) = (self.tree.clone(), records.clone());
                let (bucket, target) = (bucket.clone(), target.clone());
                tokio::spawn(async move {
                    if let Err(err) = tree.split(&records, &bucket, &target).await {
                        tracing::warn!(%err, bucket, ?target, "an index split failed; the next write tries again");
                    }
                });
            }
        }
    }
}

/// The writer of a bucket's queue, while it runs. If it ends without emptying the queue (a
/// panic, the runtime shutting down), the bucket's entry goes with it: changes arriving later
/// would otherwise queue behind a writer that is gone and wait forever. Those queued already
/// are dropped with it and answer "the index writer ended".
struct Writing<'a> {
    batches: &'a IndexBatches,
    place: &'a Place,
    /// Ended by finding the queue empty: the entry is already removed, and one present now
    /// belongs to a newer writer.
    emptied: bool,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        if !self.emptied {
            self.batches.queues.lock().remove(self.place);
        }
    }
}

/// What a record needs after a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Due {
    Nothing,
    /// A split (by count or by size).
    Split,
    /// A merge into the leaf on its left: the write left the leaf empty, or brought it down
    /// to few names (`[s3] index_merge_entries`).
    Merge,
}

/// One read-modify-write of the record for `batch`, then every change's answer. Returns what
/// the record is due for after it (`Nothing` when the write failed, so it could not tell).
/// `bounds`: names per record, replaced blobs held per record (`objects::hurry`), names a
/// leaf holds at most to be merged.
async fn write_batch<H: Holder>(
    records: &Records,
    (bucket, target): &Place,
    batch: Vec<Queued>,
    (bound, max_held_garbage, merge_entries): (usize, usize, usize),
) -> Due {
    let mut outcomes: Vec<Result<Applied, S3Error>> = Vec::new();
    let mut uncertain = false;
    let mut due = Due::Nothing;
    let mut hurried = false;
    let written = records
        .update_noting(
            &target.doc(bucket),
            |record: Option<H>| {
                // Run again from scratch on each attempt (a lost race re-reads the record).
                outcomes.clear();
                let Some(mut record) = record else {
                    // Every key goes elsewhere (a stale route into a deleted bucket's leaf):
                    // none may be dropped as if done.
                    let gone = |queued: &Queued| match target {
                        Target::Root => Err(S3Error::NoSuchBucket),
                        Target::Leaf(_) => {
                            Ok(Applied::Elsewhere(Reroute::Gone, queued.change.keys()))
                        }
                    };
                    outcomes.extend(batch.iter().map(gone));
                    return Ok((Change::Keep, ()));
                };
                let mut changed = false;
                let names_before = record.objects().len();
                for queued in &batch {
                    let outcome =
                        apply(&mut record, bucket, &queued.change, queued.after_ms, bound);
                    changed |= matches!(outcome, Ok((_, true)));
                    outcomes.push(outcome.map(|(applied, _)| applied));
                }
                // A merge when the write emptied the leaf, or brought it down to few names
                // (once: while its left neighbour has no room, each later delete would look
                // again for nothing; a listing that finds room merges it then).
                let names_after = record.objects().len();
                let thinned = names_after == 0 || names_before > merge_entries;
                let fewer = names_after < names_before && thinned;
                due = match (split_of(&record, bound), record.merge_due(merge_entries)) {
                    (Some(_), _) => Due::Split,
                    (None, true) if changed && fewer => Due::Merge,
                    (None, _) => Due::Nothing,
                };
                let now = crate::service::now_ms();
                hurried = changed && hurry(record.garbage_mut(), max_held_garbage, now);
                let what = if changed {
                    Change::Put(record)
                } else {
                    Change::Keep
                };
                Ok((what, ()))
            },
            &mut uncertain,
        )
        .await;
    if hurried && written.is_ok() {
        crate::objects::sweep_soon(bucket, target);
    }
    // The record could not even be read: every change shares the write's failure.
    outcomes.resize_with(batch.len(), || Ok(Applied::Done));
    for (queued, outcome) in batch.into_iter().zip(outcomes) {
        let link = !matches!(queued.change, IndexChange::Unlink { .. });
        let answer = match (&written, outcome) {
            (_, Err(refused)) => Err(ChangeFailed {
                error: refused,
                may_have_applied: false,
            }),
            (Ok(()), Ok(applied)) => Ok(applied),
            // A link or touch sent elsewhere wrote nothing here: the failed write is not its
            // answer.
            (Err(_), Ok(elsewhere @ Applied::Elsewhere(..))) if link => Ok(elsewhere),
            (Err(failed), Ok(_)) => Err(ChangeFailed {
                error: failed.shared(),
                may_have_applied: uncertain,
            }),
        };
        let _ = queued.done.send(answer);
    }
    match written {
        Ok(()) => due,
        Err(_) => Due::Nothing,
    }
}

/// Why an `Amend` was refused: the name was written since its entry was read.
pub const CHANGED_MEANWHILE: &str =
    "the object was written while its ACL or tags were being set; try again";

/// Applies one change to `record`; with whether it changed something. A refused change leaves
/// `record` as it was; keys the record does not hold now are handed back.
fn apply<H: Holder>(
    record: &mut H,
    bucket: &str,
    change: &IndexChange,
    after_ms: u64,
    bound: usize,
) -> Result<(Applied, bool), S3Error> {
    let mut unlinked = Vec::new();
    let mut elsewhere: Option<(Reroute, Vec<String>)> = None;
    // A change of one name goes elsewhere whole when this record does not hold the name.
    if let IndexChange::Link { key, .. }
    | IndexChange::Touch { key }
    | IndexChange::Amend { key, .. } = change
    {
        if let Err(why) = record.admits(key) {
            return Ok((Applied::Elsewhere(why, vec![key.clone()]), false));
        }
    }
    let linked = match change {
        IndexChange::Link {
            key,
            entry,
            conditions,
        } => {
            conditions.check(record.objects().get(key).map(Arc::as_ref))?;
            let hard_bound = hard_bound(bound);
            if !record.objects().contains_key(key) && record.objects().len() >= hard_bound {
                return Err(S3Error::IndexFull(format!(
                    "an index leaf of bucket {bucket} holds {hard_bound} names and its split \
                     has not finished; try again"
                )));
            }
            unlinked.extend(
                record
                    .objects_mut()
                    .insert(key.clone(), Arc::new((**entry).clone())),
            );
            true
        }
        IndexChange::Unlink { keys } => {
            for key in keys {
                match record.admits(key) {
                    Ok(()) => unlinked.extend(record.objects_mut().remove(key)),
                    Err(why) => elsewhere
                        .get_or_insert((why, Vec::new()))
                        .1
                        .push(key.clone()),
                }
            }
            false
        }
        IndexChange::Touch { .. } => true,
        IndexChange::Amend {
            key,
            expected,
            amended,
        } => {
            match record.objects().get(key) {
                Some(now) if **now == **expected => {}
                Some(_) => return Err(S3Error::OperationAborted(CHANGED_MEANWHILE.into())),
                None => return Err(S3Error::NoSuchKey),
            }
            if amended.body != expected.body {
                return Err(S3Error::Internal(format!(
                    "an amendment of {key} in {bucket} changed its body"
                )));
            }
            // The entry it replaces has the same body: nothing of it is garbage.
            let entry = (**amended).clone().without_json();
            record.objects_mut().insert(key.clone(), Arc::new(entry));
            true
        }
    };
    let applied = match elsewhere {
        Some((why, keys)) => Applied::Elsewhere(why, keys),
        None => Applied::Done,
    };
    if unlinked.is_empty() {
        return Ok((applied, linked));
    }
    let garbage = unlinked.into_iter().flat_map(|old| old.body.clone());
    record
        .garbage_mut()
        .extend(garbage.map(|piece| Garbage::new(piece.blob, after_ms)));
    Ok((applied, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{BucketIndex, Piece};

    fn entry(blob: &str, modified_ms: u64) -> ObjectEntry {
        ObjectEntry {
            body: vec![Piece {
                blob: blob.into(),
                size: 3,
            }],
            size: 3,
            etag: "same".into(),
            modified_ms,
            ..Default::default()
        }
    }

    fn set(expected: &ObjectEntry, public_read: Option<bool>) -> IndexChange {
        IndexChange::Amend {
            key: "k".into(),
            expected: Box::new(expected.clone()),
            amended: Box::new(ObjectEntry {
                public_read,
                ..expected.clone()
            }),
        }
    }

    #[test]
    fn an_acl_is_set_only_on_the_entry_it_was_read_from_and_frees_no_blob() {
        let mut root = BucketIndex::default();
        let first = entry("b1", 1);
        root.objects.insert("k".into(), Arc::new(first.clone()));
        let (applied, changed) = apply(&mut root, "bk", &set(&first, Some(true)), 0, 10).unwrap();
        assert!(matches!(applied, Applied::Done) && changed);
        assert_eq!(root.objects.get("k").unwrap().public_read, Some(true));
        assert!(root.garbage.is_empty(), "the same blob: nothing to reclaim");

        // Overwritten since it was read (the same bytes and ETag, another blob): refused, and
        // the newer entry stays as it is.
        let newer = entry("b2", 2);
        root.objects.insert("k".into(), Arc::new(newer.clone()));
        let refused = apply(&mut root, "bk", &set(&first, Some(false)), 0, 10);
        assert!(matches!(refused, Err(S3Error::OperationAborted(_))));
        assert_eq!(**root.objects.get("k").unwrap(), newer);

        // Another body is no amendment.
        let other_body = IndexChange::Amend {
            key: "k".into(),
            expected: Box::new(newer.clone()),
            amended: Box::new(entry("b3", 2)),
        };
        let refused = apply(&mut root, "bk", &other_body, 0, 10);
        assert!(matches!(refused, Err(S3Error::Internal(_))));
        assert_eq!(**root.objects.get("k").unwrap(), newer);

        root.objects.remove("k");
        let gone = apply(&mut root, "bk", &set(&newer, None), 0, 10);
        assert!(matches!(gone, Err(S3Error::NoSuchKey)));
    }
}
