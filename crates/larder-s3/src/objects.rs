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

use crate::blobs;
use crate::conditions::WriteConditions;
use crate::error::S3Error;
use crate::index_batch::{ChangeFailed, IndexChange};
use crate::records::{bucket_doc, BucketIndex, Catalog, ObjectEntry, CATALOG_DOC};
use crate::service::{now_ms, Larder};
use crate::store::{Change, Records};

/// Points `key` at `entry` if `conditions` (`If-None-Match: *`, `If-Match`) hold for what the
/// name points at now, decided at the primary (with the bucket's other pending changes:
/// `index_batch.rs`). On failure, whether the name may point at `entry` all the same: only
/// when it cannot may the caller tombstone the entry's blobs.
pub async fn link(
    s3: &Larder,
    bucket: &str,
    key: &str,
    entry: ObjectEntry,
    conditions: &WriteConditions,
) -> Result<(), ChangeFailed> {
    let change = IndexChange::Link {
        key: key.to_owned(),
        entry,
        conditions: conditions.clone(),
    };
    s3.index_batches
        .apply(&s3.records, bucket, change, unlink_after(s3))
        .await
}

/// Removes `keys` in one write (absent ones: nothing to do, as S3 answers 204 either way).
pub async fn unlink(s3: &Larder, bucket: &str, keys: &[String]) -> Result<(), S3Error> {
    let change = IndexChange::Unlink {
        keys: keys.to_vec(),
    };
    s3.index_batches
        .apply(&s3.records, bucket, change, unlink_after(s3))
        .await
        .map_err(S3Error::from)
}

/// When a blob unlinked now may be tombstoned.
fn unlink_after(s3: &Larder) -> u64 {
    now_ms().saturating_add(s3.grace.as_millis() as u64)
}

/// Tombstones, every `interval`, the blobs whose grace period is over, bucket by bucket: first
/// the blobs, then (one read-modify-write) their entries, so a crash in between only repeats a
/// tombstone. Runs until the task is aborted.
pub async fn sweep_forever(records: Arc<Records>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        if let Err(err) = sweep(&records).await {
            tracing::warn!(%err, "S3 garbage sweep failed; trying again later");
        }
    }
}

/// One pass over every bucket (see `sweep_forever`).
pub async fn sweep(records: &Records) -> Result<usize, S3Error> {
    let catalog: Catalog = records.read(CATALOG_DOC).await?.unwrap_or_default();
    let mut swept = 0;
    for bucket in catalog.buckets.keys() {
        let Some(index) = records.read::<BucketIndex>(&bucket_doc(bucket)).await? else {
            continue;
        };
        let now = now_ms();
        let due: HashSet<String> = index
            .garbage
            .iter()
            .filter(|g| g.after_ms <= now)
            .map(|g| g.blob.clone())
            .collect();
        if due.is_empty() {
            continue;
        }
        for blob in &due {
            blobs::delete(records.router(), blob).await?;
        }
        records
            .update(&bucket_doc(bucket), |index: Option<BucketIndex>| {
                let Some(mut index) = index else {
                    return Ok((Change::Keep, ()));
                };
                index.garbage.retain(|g| !due.contains(&g.blob));
                Ok((Change::Put(index), ()))
            })
            .await?;
        swept += due.len();
    }
    Ok(swept)
}
