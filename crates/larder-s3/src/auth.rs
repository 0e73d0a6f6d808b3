//! Who may do what: SigV4 secrets (s3s checks the signatures, header and presigned, with their
//! expiry) from the key ring stored in the cluster, and per-key bucket permissions. Anonymous
//! requests are refused, but for reads of a bucket made public-read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::path::S3Path;
use s3s::{s3_error, S3Result};

use crate::metrics::OperationSlot;
use crate::records::{bucket_doc, AccessKey, BucketIndex, KeyRing, Permission, KEYS_DOC};
use crate::store::Records;

/// How long a key ring read is reused: a revoked key stops working within this.
const KEY_RING_TTL: Duration = Duration::from_secs(1);

/// The key ring, read from the cluster at most once per `KEY_RING_TTL`.
pub struct Keys {
    records: Arc<Records>,
    cached: Mutex<Option<(Instant, Arc<KeyRing>)>>,
}

impl Keys {
    pub fn new(records: Arc<Records>) -> Keys {
        Keys {
            records,
            cached: Mutex::new(None),
        }
    }

    async fn ring(&self) -> S3Result<Arc<KeyRing>> {
        if let Some((at, ring)) = &*self.cached.lock() {
            if at.elapsed() < KEY_RING_TTL {
                return Ok(ring.clone());
            }
        }
        let ring: KeyRing = self
            .records
            .read(KEYS_DOC)
            .await
            .map_err(s3s::S3Error::from)?
            .unwrap_or_default();
        let ring = Arc::new(ring);
        *self.cached.lock() = Some((Instant::now(), ring.clone()));
        Ok(ring)
    }

    /// Whether `bucket` exists and was made public-read. Read from a quorum for each anonymous
    /// request (anonymous reads of public buckets are expected to be rare next to signed ones).
    pub async fn public_read(&self, bucket: &str) -> S3Result<bool> {
        let index: Option<BucketIndex> = self
            .records
            .read(&bucket_doc(bucket))
            .await
            .map_err(s3s::S3Error::from)?;
        Ok(index.is_some_and(|i| i.public_read))
    }

    /// The key named `access_key`, if it exists (and was not revoked).
    pub async fn get(&self, access_key: &str) -> S3Result<Option<AccessKey>> {
        Ok(self.ring().await?.keys.get(access_key).cloned())
    }
}

/// The key ring as s3s's authentication and access control.
#[derive(Clone)]
pub struct Gate(pub Arc<Keys>);

#[async_trait::async_trait]
impl S3Auth for Gate {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.0.get(access_key).await? {
            Some(key) => Ok(SecretKey::from(key.secret)),
            None => Err(s3_error!(
                InvalidAccessKeyId,
                "The AWS access key Id you provided does not exist in our records."
            )),
        }
    }
}

/// What an operation needs in its bucket.
fn needs(operation: &str) -> Permission {
    match operation {
        "CreateBucket" | "DeleteBucket" | "PutBucketAcl" => Permission::Owner,
        "GetObject"
        | "HeadObject"
        | "GetObjectAttributes"
        | "HeadBucket"
        | "ListObjects"
        | "ListObjectsV2"
        | "ListObjectVersions"
        | "GetBucketLocation"
        | "ListParts"
        | "ListMultipartUploads" => Permission::Read,
        _ => Permission::Write,
    }
}

#[async_trait::async_trait]
impl S3Access for Gate {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        // Every routed request passes here first: name its operation for the metrics.
        let operation = cx.s3_op().name().to_owned();
        if let Some(slot) = cx.extensions_mut().get::<OperationSlot>() {
            slot.set(&operation);
        }
        let Some(credentials) = cx.credentials() else {
            return self.check_anonymous(cx).await;
        };
        let bucket = match cx.s3_path() {
            // ListBuckets: shown only the buckets the key has a permission in.
            S3Path::Root => return Ok(()),
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => bucket.to_string(),
        };
        let key = self
            .0
            .get(&credentials.access_key)
            .await?
            .ok_or_else(|| s3_error!(InvalidAccessKeyId))?;
        let needed = needs(cx.s3_op().name());
        match key.permission(&bucket) {
            Some(granted) if granted >= needed => Ok(()),
            _ => Err(s3_error!(
                AccessDenied,
                "This key may not do {} in bucket {bucket}",
                cx.s3_op().name()
            )),
        }
    }
}

/// What anonymous requests may do in a public-read bucket.
const PUBLIC_READS: [&str; 5] = [
    "GetObject",
    "HeadObject",
    "HeadBucket",
    "ListObjects",
    "ListObjectsV2",
];

impl Gate {
    /// Anonymous requests: reads of a public-read bucket, nothing else.
    async fn check_anonymous(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let refused = || s3_error!(AccessDenied, "Anonymous access is not allowed");
        let bucket = match cx.s3_path() {
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => bucket.to_string(),
            S3Path::Root => return Err(refused()),
        };
        if PUBLIC_READS.contains(&cx.s3_op().name()) && self.0.public_read(&bucket).await? {
            return Ok(());
        }
        Err(refused())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_need_read_and_bucket_changes_need_owner() {
        assert_eq!(needs("GetObject"), Permission::Read);
        assert_eq!(needs("PutObject"), Permission::Write);
        assert_eq!(needs("DeleteObject"), Permission::Write);
        assert_eq!(needs("DeleteBucket"), Permission::Owner);
    }
}
