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

use crate::acl;
use crate::metrics::OperationSlot;
use crate::records::{bucket_doc, AccessKey, BucketIndex, KeyRing, Permission, KEYS_DOC};
use crate::service::Larder;
use crate::store::Records;
use crate::xml_bound::DeclaredLength;

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

    /// Whether `bucket` was made public-read; `None` if there is no such bucket. Read from a
    /// quorum for each anonymous request (anonymous reads are expected to be rare next to
    /// signed ones).
    pub async fn public_read(&self, bucket: &str) -> S3Result<Option<bool>> {
        let index: Option<BucketIndex> = self
            .records
            .read(&bucket_doc(bucket))
            .await
            .map_err(s3s::S3Error::from)?;
        Ok(index.map(|i| i.public_read))
    }

    /// The key named `access_key`, if it exists (and was not revoked).
    pub async fn get(&self, access_key: &str) -> S3Result<Option<AccessKey>> {
        Ok(self.ring().await?.keys.get(access_key).cloned())
    }
}

/// The key ring (with the objects' ACLs, for anonymous reads) as s3s's authentication and
/// access control.
#[derive(Clone)]
pub struct Gate(pub Larder);

/// Put in an anonymous GetObject's or HeadObject's extensions by the gate: whether its bucket
/// is public-read. The operation checks the entry it reads against it, so an object replaced
/// by a private one after the gate looked is not served.
#[derive(Clone, Copy, Debug)]
pub struct AnonymousRead {
    pub bucket_public: bool,
}

#[async_trait::async_trait]
impl S3Auth for Gate {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.0.keys.get(access_key).await? {
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
        "CreateBucket"
        | "DeleteBucket"
        | "PutBucketAcl"
        | "PutBucketTagging"
        | "DeleteBucketTagging" => Permission::Owner,
        "GetObject"
        | "HeadObject"
        | "GetObjectAttributes"
        | "GetObjectAcl"
        | "GetObjectTagging"
        | "GetBucketAcl"
        | "GetBucketTagging"
        | "HeadBucket"
        | "ListObjects"
        | "ListObjectsV2"
        | "ListObjectVersions"
        | "GetBucketLocation"
        | "GetBucketVersioning"
        | "GetObjectLockConfiguration"
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
        match cx.credentials() {
            None => self.check_anonymous(cx).await?,
            Some(_) => self.check_key(cx).await?,
        }
        let declared = cx.extensions_mut().get::<DeclaredLength>().copied();
        crate::xml_bound::check(cx.method(), &operation, declared)
    }
}

impl Gate {
    /// A signed request: its key's permission in the bucket.
    async fn check_key(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let Some(credentials) = cx.credentials() else {
            return Err(s3_error!(AccessDenied));
        };
        let bucket = match cx.s3_path() {
            // ListBuckets: shown only the buckets the key has a permission in.
            S3Path::Root => return Ok(()),
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => bucket.to_string(),
        };
        let key = self
            .0
            .keys
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

/// What anonymous requests may do in a public-read bucket besides reading objects.
const PUBLIC_READS: [&str; 3] = ["HeadBucket", "ListObjects", "ListObjectsV2"];

impl Gate {
    /// Anonymous requests: never CreateBucket; of a bucket that does not exist, 404
    /// `NoSuchBucket` (as S3); reads
    /// of an object its ACL (or, without one, its bucket's) makes public-read; listings of a
    /// public-read bucket; nothing else.
    async fn check_anonymous(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let refused = || s3_error!(AccessDenied, "Anonymous access is not allowed");
        let (bucket, key) = match cx.s3_path() {
            S3Path::Bucket { bucket } => (bucket.to_string(), None),
            S3Path::Object { bucket, key } => (bucket.to_string(), Some(key.to_string())),
            S3Path::Root => return Err(refused()),
        };
        let operation = cx.s3_op().name();
        if operation == "CreateBucket" {
            return Err(refused());
        }
        let Some(bucket_public) = self.0.keys.public_read(&bucket).await? else {
            return Err(s3_error!(NoSuchBucket));
        };
        if let (Some(key), "GetObject" | "HeadObject") = (key, operation) {
            let readable = match self.0.current(&bucket, &key).await? {
                Some(entry) => acl::readable_anonymously(&entry, bucket_public),
                None => bucket_public, // then NoSuchKey, as a public bucket lists its names
            };
            if !readable {
                return Err(refused());
            }
            cx.extensions_mut().insert(AnonymousRead { bucket_public });
            return Ok(());
        }
        if PUBLIC_READS.contains(&operation) && bucket_public {
            return Ok(());
        }
        Err(refused())
    }
}

/// For an anonymous read the gate let through (`AnonymousRead`): refused if the entry the
/// operation read is not readable anonymously after all. Signed requests pass.
pub fn check_anonymous_entry(
    extensions: &http::Extensions,
    entry: &crate::records::ObjectEntry,
) -> S3Result<()> {
    match extensions.get::<AnonymousRead>() {
        Some(read) if !acl::readable_anonymously(entry, read.bucket_public) => {
            Err(s3_error!(AccessDenied, "Anonymous access is not allowed"))
        }
        _ => Ok(()),
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
        assert_eq!(needs("GetBucketTagging"), Permission::Read);
        assert_eq!(needs("PutBucketTagging"), Permission::Owner);
        assert_eq!(needs("DeleteBucketTagging"), Permission::Owner);
    }
}
