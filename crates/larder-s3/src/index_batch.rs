//! Links and unlinks of names in one bucket, batched: a bucket's index is one record, changed
//! by read-modify-writes at its partition primary, so concurrent PUTs into one bucket raced
//! each other (each re-read and re-wrote the whole index, most lost the race and tried again,
//! up to 64 times). Here a frontend queues the changes of each bucket and one task applies
//! whatever has queued in one read-modify-write, in arrival order, each change judged (its
//! conditions, the index bound) on the state the ones before it left. While that write is in
//! flight the next changes queue for the next one: group commit.
//!
//! Every change gets its own answer: a refused change (412, `NoSuchBucket`, the bound) leaves
//! the index as it was for the others; a write that fails (no quorum, the primary away) fails
//! every change of its batch that would have applied, as it would have alone. Frontends still
//! race each other at the primary, one batch against another, as before.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::conditions::WriteConditions;
use crate::error::S3Error;
use crate::records::{bucket_doc, BucketIndex, Garbage, ObjectEntry, MAX_INDEX_ENTRIES};
use crate::store::{Change, Records};

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
        entry: ObjectEntry,
        conditions: WriteConditions,
    },
    /// Remove `keys` (absent ones: nothing to do).
    Unlink { keys: Vec<String> },
}

struct Queued {
    change: IndexChange,
    /// When the blobs this change unlinks may go (`replaced_blob_grace` from its arrival).
    after_ms: u64,
    done: oneshot::Sender<Result<(), ChangeFailed>>,
}

/// The queues of this frontend's bucket-index changes, one per bucket with changes pending.
#[derive(Default)]
pub struct IndexBatches {
    /// Bucket → changes waiting for the next write. A bucket is present while a task writes
    /// for it; that task takes the queue whole each round and removes the entry when empty.
    queues: Mutex<HashMap<String, Vec<Queued>>>,
}

impl IndexBatches {
    /// Applies `change` to `bucket`'s index with the changes queued beside it; answers once
    /// the write that holds it is acknowledged (or why not).
    pub async fn apply(
        self: &Arc<Self>,
        records: &Arc<Records>,
        bucket: &str,
        change: IndexChange,
        after_ms: u64,
    ) -> Result<(), ChangeFailed> {
        let (done, answer) = oneshot::channel();
        let queued = Queued {
            change,
            after_ms,
            done,
        };
        let start = {
            let mut queues = self.queues.lock();
            match queues.get_mut(bucket) {
                Some(queue) => {
                    queue.push(queued);
                    false
                }
                None => {
                    queues.insert(bucket.to_owned(), vec![queued]);
                    true
                }
            }
        };
        if start {
            // A task of its own: the writer outlives any one request (a client that hangs up
            // does not strand the changes queued behind it).
            let (batches, records, bucket) = (self.clone(), records.clone(), bucket.to_owned());
            tokio::spawn(async move { batches.write_until_empty(&records, &bucket).await });
        }
        answer.await.unwrap_or_else(|_| {
            Err(ChangeFailed {
                error: S3Error::Internal("the index writer ended".into()),
                may_have_applied: true,
            })
        })
    }

    async fn write_until_empty(&self, records: &Records, bucket: &str) {
        let mut writing = Writing {
            batches: self,
            bucket,
            emptied: false,
        };
        loop {
            let batch = {
                let mut queues = self.queues.lock();
                let queue = queues
                    .get_mut(bucket)
                    .map(std::mem::take)
                    .unwrap_or_default();
                if queue.is_empty() {
                    queues.remove(bucket);
                    writing.emptied = true;
                    return;
                }
                queue
            };
            write_batch(records, bucket, batch).await;
        }
    }
}

/// The writer of a bucket's queue, while it runs. If it ends without emptying the queue (a
/// panic, the runtime shutting down), the bucket's entry goes with it: changes arriving later
/// would otherwise queue behind a writer that is gone and wait forever. Those queued already
/// are dropped with it and answer "the index writer ended".
struct Writing<'a> {
    batches: &'a IndexBatches,
    bucket: &'a str,
    /// Ended by finding the queue empty: the entry is already removed, and one present now
    /// belongs to a newer writer.
    emptied: bool,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        if !self.emptied {
            self.batches.queues.lock().remove(self.bucket);
        }
    }
}

/// One read-modify-write for `batch`, then every change's answer.
async fn write_batch(records: &Records, bucket: &str, batch: Vec<Queued>) {
    let mut outcomes: Vec<Result<(), S3Error>> = Vec::new();
    let mut uncertain = false;
    let written = records
        .update_noting(
            &bucket_doc(bucket),
            |index: Option<BucketIndex>| {
                // Run again from scratch on each attempt (a lost race re-reads the index).
                outcomes.clear();
                let Some(mut index) = index else {
                    outcomes.extend(batch.iter().map(|_| Err(S3Error::NoSuchBucket)));
                    return Ok((Change::Keep, ()));
                };
                let mut changed = false;
                for queued in &batch {
                    let outcome = apply(&mut index, bucket, &queued.change, queued.after_ms);
                    changed |= matches!(outcome, Ok(true));
                    outcomes.push(outcome.map(|_| ()));
                }
                let what = if changed {
                    Change::Put(index)
                } else {
                    Change::Keep
                };
                Ok((what, ()))
            },
            &mut uncertain,
        )
        .await;
    // The index could not even be read: every change shares the write's failure.
    outcomes.resize_with(batch.len(), || Ok(()));
    for (queued, outcome) in batch.into_iter().zip(outcomes) {
        let answer = match (&written, outcome) {
            (_, Err(refused)) => Err(ChangeFailed {
                error: refused,
                may_have_applied: false,
            }),
            (Ok(()), Ok(())) => Ok(()),
            (Err(failed), Ok(())) => Err(ChangeFailed {
                error: failed.shared(),
                may_have_applied: uncertain,
            }),
        };
        let _ = queued.done.send(answer);
    }
}

/// Applies one change to `index`; `Ok(true)` when it changed something. A refused change
/// leaves `index` as it was.
fn apply(
    index: &mut BucketIndex,
    bucket: &str,
    change: &IndexChange,
    after_ms: u64,
) -> Result<bool, S3Error> {
    let mut unlinked = Vec::new();
    match change {
        IndexChange::Link {
            key,
            entry,
            conditions,
        } => {
            conditions.check(index.objects.get(key))?;
            if !index.objects.contains_key(key) && index.objects.len() >= MAX_INDEX_ENTRIES {
                return Err(S3Error::IndexFull(format!(
                    "bucket {bucket} holds {MAX_INDEX_ENTRIES} objects, the most one index \
                     record holds until key-range splitting is built"
                )));
            }
            unlinked.extend(index.objects.insert(key.clone(), entry.clone()));
        }
        IndexChange::Unlink { keys } => {
            let removed = keys.iter().filter_map(|key| index.objects.remove(key));
            unlinked.extend(removed);
            if unlinked.is_empty() {
                return Ok(false);
            }
        }
    }
    let garbage = unlinked.into_iter().flat_map(|old| old.body);
    index.garbage.extend(garbage.map(|piece| Garbage {
        blob: piece.blob,
        after_ms,
    }));
    Ok(true)
}
