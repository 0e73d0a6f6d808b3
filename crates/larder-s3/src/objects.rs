//! Changing what a name points at, and reclaiming the blobs no name points at any more.
//!
//! A PUT stores its blob first, then links the name in the bucket's index with one
//! read-modify-write at the partition primary; the blob the name pointed at before is written
//! into the same record's garbage list, with the time after which it may be tombstoned. So the
//! record that unlinks a blob also remembers it (a crash leaks nothing), and reads that
//! resolved the old name just before have the grace period to finish.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;

use crate::blobs;
use crate::conditions::WriteConditions;
use crate::error::S3Error;
use crate::index_batch::{Applied, ChangeFailed, IndexChange};
use crate::index_tree::{Holder, IndexTree, Target};
use crate::records::{BucketIndex, Catalog, Garbage, Leaf, ObjectEntry, CATALOG_DOC};
use crate::service::{now_ms, Larder};
use crate::store::{Change, Records};
use crate::tagging::Tags;

/// Points `key` at `entry` if `conditions` (`If-None-Match: *`, `If-Match`) hold for what the
/// name points at now, decided at the primary of the index record holding the name (with
/// that record's other pending changes: `index_batch.rs`), following the name's range through
/// splits. On failure, whether the name may point at `entry` all the same: only when it
/// cannot may the caller tombstone the entry's blobs.
pub async fn link(
    s3: &Larder,
    bucket: &str,
    key: &str,
    entry: ObjectEntry,
    conditions: &WriteConditions,
) -> Result<(), ChangeFailed> {
    change_name(s3, bucket, key, || IndexChange::Link {
        key: key.to_owned(),
        entry: Box::new(entry.clone()),
        conditions: conditions.clone(),
    })
    .await
}

/// Gives the object `key` its own canned ACL's say on anonymous reads (`public_read`, `None`:
/// as its bucket's), the entry read and changed again if the name is written meanwhile.
pub async fn set_public_read(
    s3: &Larder,
    bucket: &str,
    key: &str,
    public_read: Option<bool>,
) -> Result<(), S3Error> {
    amend(s3, (bucket, key), |entry| {
        (entry.public_read != public_read).then(|| ObjectEntry {
            public_read,
            ..entry.clone()
        })
    })
    .await
}

/// Gives the object `key` of `bucket` the tags `tags` (PutObjectTagging, DeleteObjectTagging),
/// as `set_public_read` its ACL.
pub async fn set_tags(s3: &Larder, bucket: &str, key: &str, tags: Tags) -> Result<(), S3Error> {
    amend(s3, (bucket, key), |entry| {
        (entry.tags != tags).then(|| ObjectEntry {
            tags: tags.clone(),
            ..entry.clone()
        })
    })
    .await
}

/// Replaces the entry of `key` by what `amended` makes of it (`None`: it is as wanted), if
/// nothing wrote the name meanwhile (`IndexChange::Amend`; read again and retried, four tries,
/// then 409 `OperationAborted`).
async fn amend(
    s3: &Larder,
    (bucket, key): (&str, &str),
    amended: impl Fn(&ObjectEntry) -> Option<ObjectEntry>,
) -> Result<(), S3Error> {
    let mut tries = 0;
    loop {
        tries += 1;
        let entry = s3.entry(bucket, key).await?;
        let Some(amended) = amended(&entry) else {
            return Ok(());
        };
        let change = || IndexChange::Amend {
            key: key.to_owned(),
            expected: Box::new(entry.clone()),
            amended: Box::new(amended.clone()),
        };
        match change_name(s3, bucket, key, change)
            .await
            .map_err(S3Error::from)
        {
            Err(S3Error::OperationAborted(why))
                if why == crate::index_batch::CHANGED_MEANWHILE && tries < 4 => {}
            outcome => return outcome,
        }
    }
}

/// Writes the index record holding `key` as it is (`IndexChange::Touch`).
pub async fn touch(s3: &Larder, bucket: &str, key: &str) -> Result<(), S3Error> {
    let touch = || IndexChange::Touch {
        key: key.to_owned(),
    };
    change_name(s3, bucket, key, touch)
        .await
        .map_err(S3Error::from)
}

/// Applies the change `make` builds to the record holding `key`, following the key's range
/// through splits until the change lands or is refused.
async fn change_name(
    s3: &Larder,
    bucket: &str,
    key: &str,
    make: impl Fn() -> IndexChange,
) -> Result<(), ChangeFailed> {
    let certain = |error| ChangeFailed {
        error,
        may_have_applied: false,
    };
    let deadline = deadline(s3);
    let mut target = s3
        .tree
        .route(&s3.records, bucket, key)
        .await
        .map_err(certain)?;
    loop {
        let applied = s3
            .index_batches
            .apply(&s3.records, (bucket, &target), make(), unlink_after(s3))
            .await?;
        let Applied::Elsewhere(why, _) = applied else {
            return Ok(());
        };
        target = s3
            .tree
            .reroute(&s3.records, bucket, key, (target, why), deadline)
            .await
            .map_err(certain)?;
    }
}

/// Removes `keys` (absent ones: nothing to do, as S3 answers 204 either way), one write per
/// index record they fall in.
pub async fn unlink(s3: &Larder, bucket: &str, keys: &[String]) -> Result<(), S3Error> {
    let deadline = deadline(s3);
    let mut pending: Vec<(Target, Vec<String>)> = Vec::new();
    for key in keys {
        let target = s3.tree.route(&s3.records, bucket, key).await?;
        match pending.iter_mut().find(|(t, _)| *t == target) {
            Some((_, group)) => group.push(key.clone()),
            None => pending.push((target, vec![key.clone()])),
        }
    }
    while let Some((target, group)) = pending.pop() {
        let change = IndexChange::Unlink { keys: group };
        let applied = s3
            .index_batches
            .apply(&s3.records, (bucket, &target), change, unlink_after(s3))
            .await?;
        let Applied::Elsewhere(why, rest) = applied else {
            continue;
        };
        let Some(first) = rest.first().cloned() else {
            continue;
        };
        // Waits or forgets stale hints as the first key's reason says; then each key is
        // routed on its own (the keys sent on need not share a record).
        let next = s3
            .tree
            .reroute(&s3.records, bucket, &first, (target, why), deadline)
            .await?;
        for key in rest {
            let target = match key == first {
                true => next.clone(),
                false => s3.tree.route(&s3.records, bucket, &key).await?,
            };
            match pending.iter_mut().find(|(t, _)| *t == target) {
                Some((_, group)) => group.push(key),
                None => pending.push((target, vec![key])),
            }
        }
    }
    Ok(())
}

fn deadline(s3: &Larder) -> Instant {
    Instant::now() + s3.router().config().operation_timeout
}

/// When a blob unlinked now may be tombstoned.
fn unlink_after(s3: &Larder) -> u64 {
    now_ms().saturating_add(s3.grace.as_millis() as u64)
}

/// Tombstones, every `interval`, the blobs whose grace period is over, bucket by bucket: first
/// the blobs, then (one read-modify-write) their entries, so a crash in between only repeats a
/// tombstone. Runs until the task is aborted.
/// Between full passes, `sweep_soon` wakes it for the records `hurry` made blobs due in, and
/// only those are visited.
pub async fn sweep_forever(records: Arc<Records>, tree: Arc<IndexTree>, interval: Duration) {
    let mut next_pass = Instant::now() + interval;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next_pass) => {
                if let Err(err) = sweep(&records, &tree).await {
                    tracing::warn!(%err, "S3 garbage sweep failed; trying again later");
                }
                next_pass = Instant::now() + interval;
            }
            _ = SWEEP_NOW.notified() => sweep_hurried(&records).await,
        }
    }
}

/// Wakes the sweep before its interval is over (`hurry` made blobs due).
static SWEEP_NOW: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// The records `sweep_soon` named since the sweep last looked (bucket, record). Bounded: a
/// record past the bound waits for the next full pass.
static HURRIED: std::sync::Mutex<Vec<(String, Target)>> = std::sync::Mutex::new(Vec::new());
const MAX_HURRIED: usize = 1024;

/// Blobs a sweep tombstones at once.
const SWEEP_DELETES_AT_ONCE: usize = 16;

/// Bounds an index record's list of blobs held through their grace period to `max`: past it,
/// the oldest are made due now, and the sweep is woken to tombstone them. Returns whether it
/// made any due. The list is in the order the blobs were unlinked, so the oldest come first.
pub fn hurry(garbage: &mut [Garbage], max: usize, now_ms: u64) -> bool {
    let excess = garbage.len().saturating_sub(max.max(1));
    let mut hurried = false;
    for held in &mut garbage[..excess] {
        hurried |= held.hurry_to(now_ms);
    }
    hurried
}

/// Wakes the sweep for record `target` of `bucket` (one visit soon, however many ask before
/// it starts).
pub fn sweep_soon(bucket: &str, target: &Target) {
    {
        let mut hurried = HURRIED.lock().unwrap_or_else(|e| e.into_inner());
        let place = (bucket.to_owned(), target.clone());
        if hurried.len() < MAX_HURRIED && !hurried.contains(&place) {
            hurried.push(place);
        }
    }
    SWEEP_NOW.notify_one();
}

/// Sweeps the records `sweep_soon` named; one that fails waits for the next full pass.
async fn sweep_hurried(records: &Records) {
    let hurried = std::mem::take(&mut *HURRIED.lock().unwrap_or_else(|e| e.into_inner()));
    for (bucket, target) in hurried {
        let doc = target.doc(&bucket);
        let garbage = match &target {
            Target::Root => read_garbage::<BucketIndex>(records, &doc).await,
            Target::Leaf(_) => read_garbage::<Leaf>(records, &doc).await,
        };
        let swept = match garbage {
            Ok(garbage) => sweep_record(records, &bucket, target, &garbage).await,
            Err(err) => Err(err),
        };
        if let Err(err) = swept {
            tracing::warn!(%err, bucket, "S3 garbage sweep of a record failed; the next pass tries again");
        }
    }
}

/// The garbage list of record `doc` (empty if there is none).
async fn read_garbage<H: Holder>(records: &Records, doc: &str) -> Result<Vec<Garbage>, S3Error> {
    // Its garbage only: a base, which may be most of a megabyte, is not read for it.
    let record: Option<H> = records.read_unresolved(doc).await?;
    Ok(record
        .map(|mut r| std::mem::take(r.garbage_mut()))
        .unwrap_or_default())
}

/// One pass over every index record of every bucket (see `sweep_forever`).
pub async fn sweep(records: &Records, tree: &IndexTree) -> Result<usize, S3Error> {
    let catalog: Catalog = records.read(CATALOG_DOC).await?.unwrap_or_default();
    let mut swept = 0;
    for bucket in catalog.buckets.keys() {
        for (target, garbage) in tree.garbage(records, bucket).await? {
            swept += sweep_record(records, bucket, target, &garbage).await?;
        }
        // Apart from the garbage: a bucket whose stubs cannot go now holds back no blob.
        if let Err(err) = tree.remove_stubs(records, bucket).await {
            tracing::warn!(%err, bucket, "removing merged index leaves failed; the next pass tries again");
        }
    }
    Ok(swept)
}

/// Tombstones the due blobs of record `target`'s `garbage`, then takes them off its list.
async fn sweep_record(
    records: &Records,
    bucket: &str,
    target: Target,
    garbage: &[Garbage],
) -> Result<usize, S3Error> {
    let now = now_ms();
    let due: HashSet<String> = garbage
        .iter()
        .filter(|g| g.after_ms() <= now)
        .map(|g| g.blob().to_owned())
        .collect();
    if due.is_empty() {
        return Ok(0);
    }
    let deletes = due.iter().cloned().map(|blob| {
        let router = records.router().clone();
        async move { blobs::delete(&router, &blob).await }
    });
    let results: Vec<Result<(), S3Error>> = futures_util::stream::iter(deletes)
        .buffer_unordered(SWEEP_DELETES_AT_ONCE)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>, S3Error>>()?;
    let doc = target.doc(bucket);
    match target {
        Target::Root => forget_garbage::<BucketIndex>(records, &doc, &due).await?,
        Target::Leaf(_) => forget_garbage::<Leaf>(records, &doc, &due).await?,
    }
    Ok(due.len())
}

/// Removes the tombstoned blobs `due` from the garbage list of record `doc`.
async fn forget_garbage<H: Holder>(
    records: &Records,
    doc: &str,
    due: &HashSet<String>,
) -> Result<(), S3Error> {
    records
        .update(doc, |record: Option<H>| {
            let Some(mut record) = record else {
                return Ok((Change::Keep, ()));
            };
            record.garbage_mut().retain(|g| !due.contains(g.blob()));
            Ok((Change::Put(record), ()))
        })
        .await
}

#[cfg(test)]
mod hurry_tests {
    use super::*;

    fn held(after_ms: &[u64]) -> Vec<Garbage> {
        after_ms
            .iter()
            .enumerate()
            .map(|(i, &after_ms)| Garbage::new(format!("b{i}"), after_ms))
            .collect()
    }

    #[test]
    fn past_the_bound_the_oldest_are_due_now_and_no_later_than_they_were() {
        let mut garbage = held(&[50, 500, 600, 700, 800]);
        assert!(hurry(&mut garbage, 2, 100));
        let after: Vec<u64> = garbage.iter().map(Garbage::after_ms).collect();
        // The three oldest are due (one already was), the two newest keep their grace.
        assert_eq!(after, [50, 100, 100, 700, 800]);
        // Within the bound, or nothing to hurry: nothing changes.
        assert!(!hurry(&mut garbage, 2, 100));
        assert!(!hurry(&mut garbage, 10, 100));
        let mut none = held(&[]);
        assert!(!hurry(&mut none, 0, 100));
    }
}
