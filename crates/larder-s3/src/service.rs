//! The S3 operations, on Larder's records and blobs. s3s does the protocol (routing, XML,
//! SigV4, errors as S3's XML); this is the storage side.

use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use larder_cluster::BlobId;
use larder_proto::BlobProperties;
use larder_router::Router;
use s3s::checksum::ChecksumHasher;
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, TrailingHeaders, S3};

use crate::acl;
use crate::attributes;
use crate::blobs::{self, BlobLimits, Stored};
use crate::checksums::{ObjectChecksum, Requested};
use crate::conditions::{Conditions, WriteConditions};
use crate::copy_source;
use crate::error::S3Error;
use crate::held::{self, Held};
use crate::index_batch::ChangeFailed;
use crate::index_tree::IndexTree;
use crate::list::{self, After};
use crate::multipart;
use crate::object_headers;
use crate::objects;
use crate::pager::Resume;
use crate::records::{
    bucket_doc, uploads_doc, BucketIndex, Catalog, ObjectEntry, Piece, UploadList, UploadedPart,
    CATALOG_DOC, FORMAT,
};
use crate::stall::Stalled;
use crate::store::{Change, Records};
use crate::upload_checksum::UploadChecksum;
use crate::upload_list;

/// Sets an output's `checksum_*` fields from an `ObjectChecksum` (one of them is set).
macro_rules! set_checksum {
    ($output:expr, $checksum:expr) => {{
        let dto = $checksum.to_dto();
        $output.checksum_crc32 = dto.checksum_crc32;
        $output.checksum_crc32c = dto.checksum_crc32c;
        $output.checksum_crc64nvme = dto.checksum_crc64nvme;
        $output.checksum_sha1 = dto.checksum_sha1;
        $output.checksum_sha256 = dto.checksum_sha256;
    }};
}

/// A copy's `x-amz-copy-source-if-*` headers as `Conditions` (CopyObject, UploadPartCopy).
macro_rules! copy_source_conditions {
    ($input:expr) => {
        Conditions {
            if_match: $input.copy_source_if_match.as_ref(),
            if_none_match: $input.copy_source_if_none_match.as_ref(),
            if_modified_since: $input.copy_source_if_modified_since.as_ref(),
            if_unmodified_since: $input.copy_source_if_unmodified_since.as_ref(),
        }
    };
}

/// Whether a request gives any `x-amz-grant-*` header of an object's (`acl.rs`).
macro_rules! object_grants {
    ($input:expr) => {
        $input.grant_full_control.is_some()
            || $input.grant_read.is_some()
            || $input.grant_read_acp.is_some()
            || $input.grant_write_acp.is_some()
    };
}

/// Longest object name, in bytes (S3's).
pub const MAX_KEY_BYTES: usize = 1024;

/// Larder's S3 service (cheap to clone: its parts are shared).
#[derive(Clone)]
pub struct Larder {
    pub(crate) records: Arc<Records>,
    pub(crate) keys: Arc<crate::auth::Keys>,
    pub(crate) limits: BlobLimits,
    /// How long a replaced blob stays readable (reads that resolved its name may be under way).
    pub(crate) grace: Duration,
    /// This frontend's pending changes of bucket indexes, written in batches.
    pub(crate) index_batches: Arc<crate::index_batch::IndexBatches>,
    /// Where each bucket's names are (`index_tree.rs`).
    pub(crate) tree: Arc<IndexTree>,
    /// Small bodies read, kept by blob ID (`body_cache.rs`).
    pub(crate) bodies: Arc<crate::body_cache::BodyCache>,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn timestamp(ms: u64) -> Timestamp {
    Timestamp::from(UNIX_EPOCH + Duration::from_millis(ms))
}

fn etag(entry: &ObjectEntry) -> ETag {
    ETag::Strong(entry.etag.clone())
}

impl Larder {
    /// Links `name` to `entry` and settles the body's journal entry, in a task of its own: a
    /// client that hangs up mid-way does not stop it half-way (a link in flight and an entry
    /// nobody settles until the next start).
    async fn link_and_settle(
        &self,
        (bucket, key): (String, String),
        entry: ObjectEntry,
        conditions: WriteConditions,
        body: (BlobId, Held),
    ) -> Result<(), S3Error> {
        let s3 = self.clone();
        let task = tokio::spawn(async move {
            let linked = objects::link(&s3, &bucket, &key, entry, &conditions).await;
            if linked.is_ok() {
                held::crash_point("after-link");
            }
            let name = held::HeldFor::Object { bucket, key };
            s3.settle_link(body, name, &linked);
            linked.map_err(S3Error::from)
        });
        task.await
            .map_err(|e| S3Error::Internal(format!("the link task ended: {e}")))?
    }

    /// Settles the body `id`, held under `held`, after its name's link: linked, refused (the
    /// body goes), or unknown (`held.rs` finds out; a name pointing at a tombstoned blob would
    /// answer 503 for good: the nemesis found it, seed 13).
    fn settle_link(
        &self,
        (id, held): (BlobId, Held),
        name: held::HeldFor,
        linked: &Result<(), ChangeFailed>,
    ) {
        match linked {
            Ok(()) => held.linked(),
            Err(failed) if failed.may_have_applied => held.unknown(self, name),
            Err(_) => held.unlinked(self.router(), Some(id)),
        }
    }

    pub(crate) fn router(&self) -> &Arc<Router> {
        self.records.router()
    }

    /// The bucket's root record, from a quorum (`NoSuchBucket` if there is none).
    async fn index(&self, bucket: &str) -> Result<BucketIndex, S3Error> {
        self.tree.root(&self.records, bucket).await
    }

    /// Replaces the bucket's tags, in its root record at the record's primary (as
    /// PutBucketAcl sets `public_read`); nothing is written when they are the same.
    async fn set_bucket_tags(&self, bucket: &str, tags: crate::tagging::Tags) -> S3Result<()> {
        self.records
            .update(&bucket_doc(bucket), |index: Option<BucketIndex>| {
                let mut index = index.ok_or(S3Error::NoSuchBucket)?;
                if index.tags == tags {
                    return Ok((Change::Keep, ()));
                }
                index.tags = tags.clone();
                Ok((Change::Put(index), ()))
            })
            .await?;
        Ok(())
    }

    /// What `key` names now, from a quorum.
    pub(crate) async fn current(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<Option<ObjectEntry>, S3Error> {
        self.tree.entry(&self.records, bucket, key).await
    }

    pub(crate) async fn entry(&self, bucket: &str, key: &str) -> Result<ObjectEntry, S3Error> {
        self.current(bucket, key).await?.ok_or(S3Error::NoSuchKey)
    }

    /// A page of a listing that resumes from a marker (ListObjects v1, ListObjectVersions).
    /// A marker that reads as a common prefix resumes after every name under it; a page that
    /// ends early on a run of empty leaves names where to go on (`pager.rs`).
    async fn marker_page(
        &self,
        bucket: &str,
        (prefix, delimiter): (&str, Option<&str>),
        marker: Option<&str>,
        max_keys: usize,
    ) -> Result<list::Page, S3Error> {
        let after = marker.map(|m| list::marker(m, prefix, delimiter));
        let query = list::Query {
            prefix,
            delimiter,
            after: after.as_ref(),
            max_keys,
        };
        let limit = Some((list::MAX_LEAVES_PER_PAGE, Resume::Name));
        self.tree.page(&self.records, bucket, &query, limit).await
    }

    /// Removes an unsplit bucket's root if it holds no names; `false` if it split meanwhile.
    async fn delete_small_bucket(&self, bucket: &str, root: BucketIndex) -> Result<bool, S3Error> {
        if !root.objects.is_empty() || root.splitting.is_some() {
            return Err(S3Error::BucketNotEmpty);
        }
        // Replaced blobs still waiting for their grace period go now: after the bucket's
        // record is gone nothing would find them. (Tombstoning one twice is harmless.)
        for garbage in &root.garbage {
            blobs::delete(self.router(), garbage.blob()).await?;
        }
        self.records
            .update(&bucket_doc(bucket), |index: Option<BucketIndex>| {
                let index = index.ok_or(S3Error::NoSuchBucket)?;
                if index.is_split() {
                    return Ok((Change::Keep, false));
                }
                if !index.objects.is_empty() || index.splitting.is_some() {
                    return Err(S3Error::BucketNotEmpty);
                }
                Ok((Change::Remove, true))
            })
            .await
    }

    /// Checks a stored body against the digests its request sent (`Content-MD5`, an
    /// `x-amz-checksum-*`) and returns the additional checksum to keep. A body that fails a
    /// check is dropped: nothing names it.
    fn check_digests(
        &self,
        stored: &mut Stored,
        digests: &Digests<'_>,
    ) -> Result<Option<ObjectChecksum>, S3Error> {
        let checked = blobs::check_content_md5(digests.content_md5, &stored.md5).and_then(|()| {
            match (digests.requested, stored.checksum.take()) {
                (Some(requested), Some(hasher)) => {
                    requested.verify(hasher, digests.trailers).map(Some)
                }
                _ => Ok(None),
            }
        });
        if checked.is_err() {
            let held = std::mem::replace(&mut stored.held, Held::new(None));
            held.unlinked(self.router(), Some(stored.id));
        }
        checked
    }

    /// Records `stored` as part `number` of `upload` (bucket, key, upload ID), in a task of its
    /// own as a link is (`link_and_settle`): a client that hangs up does not leave the part's
    /// journal entry unsettled.
    async fn add_stored_part(
        &self,
        (bucket, key, upload): (String, String, String),
        number: u32,
        (name, checksum): (held::HeldFor, Option<String>),
        stored: Stored,
    ) -> Result<(), S3Error> {
        let part = UploadedPart {
            blob: stored.id.to_string(),
            size: stored.size,
            md5: stored.md5,
            modified_ms: now_ms(),
            checksum,
        };
        held::crash_point("before-add-part");
        let s3 = self.clone();
        let body = (stored.id, stored.held);
        let task = tokio::spawn(async move {
            let added = multipart::add_part(&s3, &bucket, &key, &upload, number, part).await;
            s3.settle_link(body, name, &added);
            added.map_err(S3Error::from)
        });
        task.await
            .map_err(|e| S3Error::Internal(format!("the part's task ended: {e}")))?
    }

    /// The bytes `range` of `source` stored as a new blob, held under `journal_name` until the
    /// name (or part) they are for is settled (CopyObject, UploadPartCopy).
    async fn copy_bytes(
        &self,
        source: &ObjectEntry,
        range: std::ops::Range<u64>,
        (content_type, hasher): (Option<String>, Option<ChecksumHasher>),
        journal_name: &str,
    ) -> Result<Stored, S3Error> {
        let reading = (&self.bodies, self.limits.chunking.read_ahead);
        let body = blobs::open_pieces(self.router(), reading, &source.body, range).await?;
        let props = BlobProperties {
            content_type,
            created_ms: now_ms(),
            ..Default::default()
        };
        let limits = &self.limits;
        blobs::store(
            self.router(),
            limits,
            props,
            body,
            hasher,
            Some(journal_name),
        )
        .await
    }

    /// The journal name a part's body is held under until the part is recorded.
    fn part_name(bucket: &str, key: &str, upload: &str, number: u32) -> held::HeldFor {
        held::HeldFor::Part {
            bucket: bucket.to_owned(),
            upload: upload.to_owned(),
            number,
            key: Some(key.to_owned()),
        }
    }

    /// Adds or removes `bucket` in the catalog ListBuckets reads.
    async fn catalog(&self, bucket: &str, created_ms: Option<u64>) -> Result<(), S3Error> {
        self.records
            .update(CATALOG_DOC, |catalog: Option<Catalog>| {
                let mut catalog = catalog.unwrap_or(Catalog {
                    v: FORMAT,
                    ..Default::default()
                });
                let changed = match created_ms {
                    Some(ms) => catalog.buckets.insert(bucket.to_owned(), ms).is_none(),
                    None => catalog.buckets.remove(bucket).is_some(),
                };
                Ok((
                    if changed {
                        Change::Put(catalog)
                    } else {
                        Change::Keep
                    },
                    (),
                ))
            })
            .await
    }
}

fn check_key(key: &str) -> Result<(), S3Error> {
    if key.is_empty() {
        return Err(S3Error::InvalidArgument(
            "object names are not empty".into(),
        ));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(S3Error::KeyTooLong);
    }
    Ok(())
}

/// What a request sent to check its body by.
struct Digests<'a> {
    content_md5: Option<&'a str>,
    requested: Option<&'a Requested>,
    trailers: Option<&'a TrailingHeaders>,
}

/// The stored checksum of `entry`, when the client asked for it (`x-amz-checksum-mode`).
fn asked_checksum<'e>(
    mode: Option<&ChecksumMode>,
    entry: &'e ObjectEntry,
) -> Option<&'e ObjectChecksum> {
    let asked = mode.is_some_and(|m| m.as_str().eq_ignore_ascii_case(ChecksumMode::ENABLED));
    entry.checksum.as_ref().filter(|_| asked)
}

/// What a GetObject or HeadObject answers with: the bytes it asks for, whether that is a
/// part of the object (206), and the checksum of those bytes when one is kept (the object's,
/// or a multipart object's part's).
struct Selected {
    range: std::ops::Range<u64>,
    partial: bool,
    part_checksum: Option<ObjectChecksum>,
}

/// What a GetObject or HeadObject asks for: a `Range`, or a `partNumber` (a multipart object's
/// pieces are its parts; any other object is one part), or all of it. Both at once is S3's 400.
async fn selected_or_part(
    router: &Arc<Router>,
    range: &Option<Range>,
    part: Option<i32>,
    entry: &ObjectEntry,
) -> Result<Selected, S3Error> {
    match (range, part) {
        (Some(_), Some(_)) => Err(S3Error::InvalidRequest(
            "Cannot specify both Range header and partNumber query parameter".into(),
        )),
        (None, Some(n)) => {
            let (range, part_checksum) = part_range(router, entry, n).await?;
            Ok(Selected {
                range,
                partial: true,
                part_checksum,
            })
        }
        (range, None) => Ok(Selected {
            range: selected(range.as_ref(), entry.size)?,
            partial: range.is_some(),
            part_checksum: None,
        }),
    }
}

/// The bytes of part `n` and its checksum: from the parts record a multipart object's entry
/// names (one read; a record of version 3 keeps each part's checksum), or from the entry's own
/// pieces (a single PUT's one part; multipart entries of older builds).
async fn part_range(
    router: &Arc<Router>,
    entry: &ObjectEntry,
    n: i32,
) -> Result<(std::ops::Range<u64>, Option<ObjectChecksum>), S3Error> {
    if parts_count(entry).is_some() {
        if let Some(parts) = blobs::parts_of(router, &entry.body).await? {
            let number = usize::try_from(n).map_err(|_| S3Error::InvalidPart)?;
            let range = parts.part_range(number).ok_or(S3Error::InvalidPart)?;
            return Ok((range, ObjectChecksum::of_part(&parts, number)));
        }
    }
    Ok((piece_range(entry, n)?, None))
}

/// The checksum to answer a GetObject or HeadObject with, and its type: the object's for the
/// whole of it, a part's (with its object's type, as S3 answers) for a `partNumber`; none for
/// a range, whose bytes neither covers, or when the client did not ask.
fn answered_checksum(
    mode: Option<&ChecksumMode>,
    entry: &ObjectEntry,
    selected: Selected,
) -> Option<(ObjectChecksum, ChecksumType)> {
    let whole = asked_checksum(mode, entry)?;
    let kind = whole.checksum_type();
    match (selected.partial, selected.part_checksum) {
        (false, _) => Some((whole.clone(), kind)),
        (true, Some(part)) => Some((part, kind)),
        (true, None) => None,
    }
}

fn piece_range(entry: &ObjectEntry, n: i32) -> Result<std::ops::Range<u64>, S3Error> {
    if entry.body.is_empty() && n == 1 {
        return Ok(0..0); // an empty object is one empty part
    }
    let index = usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .filter(|i| *i < entry.body.len())
        .ok_or(S3Error::InvalidPart)?; // 400, as ceph's s3-tests expect
    let start = entry.body[..index]
        .iter()
        .fold(0u64, |sum, p| sum.saturating_add(p.size));
    Ok(start..start.saturating_add(entry.body[index].size))
}

/// How many parts a multipart upload made the object of (S3 answers it for a `partNumber`):
/// the count its ETag ends with (`<md5 of the parts' md5s>-<parts>`).
fn parts_count(entry: &ObjectEntry) -> Option<i32> {
    let (_, count) = entry.etag.rsplit_once('-')?;
    count.parse().ok()
}

/// The `Content-Range` and status of an answer with the bytes `range` of `size`.
fn partial_answer(
    range: &std::ops::Range<u64>,
    size: u64,
    partial: bool,
) -> (Option<String>, http::StatusCode) {
    if !partial {
        return (None, http::StatusCode::OK);
    }
    let last = range.end.saturating_sub(1);
    let content_range = format!("bytes {}-{last}/{size}", range.start);
    (Some(content_range), http::StatusCode::PARTIAL_CONTENT)
}

/// The bytes a GET asks for, of an object of `size`.
fn selected(range: Option<&Range>, size: u64) -> Result<std::ops::Range<u64>, S3Error> {
    match range {
        None => Ok(0..size),
        Some(range) => range.check(size).map_err(|_| S3Error::InvalidRange),
    }
}

#[async_trait::async_trait]
impl S3 for Larder {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let input = req.input;
        let grants = object_grants!(input) || input.grant_write.is_some();
        let public_read = acl::bucket_public(input.acl.as_ref(), grants)?.unwrap_or(false);
        let bucket = input.bucket;
        let created_ms = now_ms();
        self.records
            .update(&bucket_doc(&bucket), |index: Option<BucketIndex>| {
                if index.is_some() {
                    return Err(S3Error::BucketExists);
                }
                let index = BucketIndex {
                    v: FORMAT,
                    created_ms,
                    public_read,
                    ..Default::default()
                };
                Ok((Change::Put(index), ()))
            })
            .await?;
        self.catalog(&bucket, Some(created_ms)).await?;
        let output = CreateBucketOutput {
            location: Some(format!("/{bucket}")),
        };
        Ok(S3Response::new(output))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.index(&req.input.bucket).await?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    /// Every bucket is in the one region: S3's answer for us-east-1, no constraint.
    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.index(&req.input.bucket).await?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }

    /// Larder keeps no versions: every bucket is one that was never versioned, which S3
    /// answers with no `Status` (clients such as warp, rclone and Terraform ask).
    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        self.index(&req.input.bucket).await?;
        Ok(S3Response::new(GetBucketVersioningOutput::default()))
    }

    /// No bucket has Object Lock: S3's answer for such a bucket, 404
    /// `ObjectLockConfigurationNotFoundError` (not 501: a client asking whether a bucket
    /// locks objects gets its answer).
    async fn get_object_lock_configuration(
        &self,
        req: S3Request<GetObjectLockConfigurationInput>,
    ) -> S3Result<S3Response<GetObjectLockConfigurationOutput>> {
        self.index(&req.input.bucket).await?;
        Err(s3s::s3_error!(
            ObjectLockConfigurationNotFoundError,
            "Object Lock configuration does not exist for this bucket"
        ))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let bucket = req.input.bucket;
        // A small bucket is one record; a split one is decided at its root (`index_tree.rs`).
        // A root that splits between the read and the write is read again.
        let mut deleted = false;
        for _ in 0..3 {
            let root = self.index(&bucket).await?;
            if root.is_split() {
                self.tree
                    .delete_split_bucket(&self.records, &bucket)
                    .await?;
                deleted = true;
            } else {
                deleted = self.delete_small_bucket(&bucket, root).await?;
            }
            if deleted {
                break;
            }
        }
        if !deleted {
            let message = "the bucket's index kept changing shape; try again";
            return Err(S3Error::OperationAborted(message.into()).into());
        }
        // Uploads in progress do not keep a bucket (AWS deletes it and them): they are aborted,
        // their parts tombstoned, once the bucket is gone, so that an upload created while
        // this ran is found too (it checks the bucket again after listing itself).
        // The bucket is gone either way: a failure here is logged, and what stays listed is
        // aborted by the next DeleteBucket of this name.
        if let Err(err) = multipart::abort_all(self, &bucket).await {
            tracing::warn!(%err, bucket, "uploads of a deleted bucket were not all aborted");
        }
        self.catalog(&bucket, None).await?;
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    /// Only the canned ACLs `public-read` and `private`: whether anonymous requests may read.
    async fn put_bucket_acl(
        &self,
        req: S3Request<PutBucketAclInput>,
    ) -> S3Result<S3Response<PutBucketAclOutput>> {
        let input = req.input;
        let grants = [
            &input.grant_full_control,
            &input.grant_read,
            &input.grant_read_acp,
            &input.grant_write,
            &input.grant_write_acp,
        ];
        let public = match input.acl.as_ref().map(BucketCannedACL::as_str) {
            _ if input.access_control_policy.is_some() || grants.iter().any(|g| g.is_some()) => {
                None
            }
            Some(BucketCannedACL::PUBLIC_READ) => Some(true),
            Some(BucketCannedACL::PRIVATE) => Some(false),
            _ => None,
        };
        let Some(public) = public else {
            return Err(s3s::s3_error!(
                NotImplemented,
                "Larder takes the canned ACLs public-read and private only"
            ));
        };
        self.records
            .update(&bucket_doc(&input.bucket), |index: Option<BucketIndex>| {
                let mut index = index.ok_or(S3Error::NoSuchBucket)?;
                if index.public_read == public {
                    return Ok((Change::Keep, ()));
                }
                index.public_read = public;
                Ok((Change::Put(index), ()))
            })
            .await?;
        Ok(S3Response::new(PutBucketAclOutput::default()))
    }

    async fn get_bucket_acl(
        &self,
        req: S3Request<GetBucketAclInput>,
    ) -> S3Result<S3Response<GetBucketAclOutput>> {
        let index = self.index(&req.input.bucket).await?;
        let output = GetBucketAclOutput {
            grants: Some(acl::grants(&owner(), index.public_read)),
            owner: Some(owner()),
        };
        Ok(S3Response::new(output))
    }

    /// The bucket's tags; 404 `NoSuchTagSet` when it has none, as S3 answers.
    async fn get_bucket_tagging(
        &self,
        req: S3Request<GetBucketTaggingInput>,
    ) -> S3Result<S3Response<GetBucketTaggingOutput>> {
        let index = self.index(&req.input.bucket).await?;
        if index.tags.is_empty() {
            return Err(s3s::s3_error!(NoSuchTagSet, "The TagSet does not exist"));
        }
        let output = GetBucketTaggingOutput {
            tag_set: crate::tagging::to_tag_set(&index.tags),
        };
        Ok(S3Response::new(output))
    }

    /// Replaces the bucket's tags with the tag set sent, checked whole first (`tagging.rs`).
    async fn put_bucket_tagging(
        &self,
        req: S3Request<PutBucketTaggingInput>,
    ) -> S3Result<S3Response<PutBucketTaggingOutput>> {
        let input = req.input;
        let tags = crate::tagging::from_tag_set(&input.tagging.tag_set, crate::tagging::BUCKET)?;
        self.set_bucket_tags(&input.bucket, tags).await?;
        Ok(S3Response::new(PutBucketTaggingOutput::default()))
    }

    /// Takes every tag off the bucket (204).
    async fn delete_bucket_tagging(
        &self,
        req: S3Request<DeleteBucketTaggingInput>,
    ) -> S3Result<S3Response<DeleteBucketTaggingOutput>> {
        self.set_bucket_tags(&req.input.bucket, Default::default())
            .await?;
        let output = DeleteBucketTaggingOutput::default();
        Ok(S3Response::with_status(
            output,
            http::StatusCode::NO_CONTENT,
        ))
    }

    async fn get_object_acl(
        &self,
        req: S3Request<GetObjectAclInput>,
    ) -> S3Result<S3Response<GetObjectAclOutput>> {
        let input = req.input;
        let index = self.index(&input.bucket).await?;
        let entry = self.entry(&input.bucket, &input.key).await?;
        let public = acl::readable_anonymously(&entry, index.public_read);
        let output = GetObjectAclOutput {
            grants: Some(acl::grants(&owner(), public)),
            owner: Some(owner()),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    /// A canned ACL for one object, as PutObject's `x-amz-acl` takes (`acl.rs`): `public-read`
    /// or `private` (or a `bucket-owner-*` one, which leaves it to its bucket). A version ID
    /// other than `null` names no version here (404 `NoSuchVersion`).
    async fn put_object_acl(
        &self,
        req: S3Request<PutObjectAclInput>,
    ) -> S3Result<S3Response<PutObjectAclOutput>> {
        let input = req.input;
        one_version(input.version_id.as_deref())?;
        let grants_given = input.access_control_policy.is_some()
            || input.grant_full_control.is_some()
            || input.grant_read.is_some()
            || input.grant_read_acp.is_some()
            || input.grant_write.is_some()
            || input.grant_write_acp.is_some();
        if input.acl.is_none() && !grants_given {
            return Err(s3s::s3_error!(
                MissingSecurityHeader,
                "PutObjectAcl needs a canned ACL (x-amz-acl)"
            ));
        }
        let public = acl::object_public(input.acl.as_ref(), grants_given)?;
        crate::objects::set_public_read(self, &input.bucket, &input.key, public).await?;
        Ok(S3Response::new(PutObjectAclOutput::default()))
    }

    /// The object's tags (`tagging.rs`); a version ID other than `null` names no version here.
    async fn get_object_tagging(
        &self,
        req: S3Request<GetObjectTaggingInput>,
    ) -> S3Result<S3Response<GetObjectTaggingOutput>> {
        let input = req.input;
        one_version(input.version_id.as_deref())?;
        let entry = self.entry(&input.bucket, &input.key).await?;
        let output = GetObjectTaggingOutput {
            tag_set: crate::tagging::to_tag_set(&entry.tags),
            version_id: None,
        };
        Ok(S3Response::new(output))
    }

    /// Replaces the object's tags with the tag set sent (checked whole first: `tagging.rs`),
    /// in place, as PutObjectAcl sets its ACL: the object's bytes, ETag and time stay.
    async fn put_object_tagging(
        &self,
        req: S3Request<PutObjectTaggingInput>,
    ) -> S3Result<S3Response<PutObjectTaggingOutput>> {
        let input = req.input;
        one_version(input.version_id.as_deref())?;
        let tags = crate::tagging::from_tag_set(&input.tagging.tag_set, crate::tagging::OBJECT)?;
        crate::objects::set_tags(self, &input.bucket, &input.key, tags).await?;
        Ok(S3Response::new(PutObjectTaggingOutput::default()))
    }

    /// Takes every tag off the object (204).
    async fn delete_object_tagging(
        &self,
        req: S3Request<DeleteObjectTaggingInput>,
    ) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
        let input = req.input;
        one_version(input.version_id.as_deref())?;
        crate::objects::set_tags(self, &input.bucket, &input.key, Default::default()).await?;
        let output = DeleteObjectTaggingOutput::default();
        Ok(S3Response::with_status(
            output,
            http::StatusCode::NO_CONTENT,
        ))
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let input = req.input;
        let max = match input.max_buckets {
            None => usize::MAX,
            Some(n @ 1..=MAX_BUCKETS_PER_PAGE) => n as usize,
            Some(_) => {
                return Err(S3Error::InvalidArgument(format!(
                    "max-buckets must be between 1 and {MAX_BUCKETS_PER_PAGE}"
                ))
                .into())
            }
        };
        let catalog: Catalog = self.records.read(CATALOG_DOC).await?.unwrap_or_default();
        let key = match &req.credentials {
            Some(c) => self.keys.get(&c.access_key).await?,
            None => None,
        };
        let prefix = input.prefix.as_deref().unwrap_or_default();
        // The token is the last name of the page before (names sort; any string resumes).
        let after = input
            .continuation_token
            .as_deref()
            .filter(|t| !t.is_empty());
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut visible = catalog
            .buckets
            .range::<str, _>((start, Bound::Unbounded))
            .filter(|(name, _)| name.starts_with(prefix))
            .filter(|(name, _)| key.as_ref().is_some_and(|k| k.permission(name).is_some()));
        let buckets: Vec<Bucket> = visible
            .by_ref()
            .take(max)
            .map(|(name, created)| Bucket {
                name: Some(name.clone()),
                creation_date: Some(timestamp(*created)),
                bucket_region: None,
            })
            .collect();
        let more = visible.next().is_some();
        let next = buckets.last().and_then(|b| b.name.clone()).filter(|_| more);
        let output = ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(owner()),
            continuation_token: next,
            prefix: input.prefix,
        };
        Ok(S3Response::new(output))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let input = req.input;
        check_key(&input.key)?;
        let meta = lower_case(input.metadata.clone());
        object_headers::check_metadata(&meta)?;
        let headers = object_headers::stored(&given_headers!(input))?;
        let public_read = acl::object_public(input.acl.as_ref(), object_grants!(input))?;
        let tags = given_tags(input.tagging.as_deref())?;
        let conditions =
            WriteConditions::new(input.if_match.as_ref(), input.if_none_match.as_ref())?;
        let requested = Requested::from_headers(&req.headers)?;
        // Refused before the body is stored when the answer is already known (and decided
        // again at the primary when the name is linked). Without conditions only the bucket
        // can refuse, and where its index is cached (`route`) nothing is read: reading the
        // name's record first was a seventh of the frontend's CPU per PUT of a name whose
        // record other PUTs keep changing (`benchmarks/s3-get-name`, OP=put).
        if conditions.is_unconditional() {
            self.tree
                .route(&self.records, &input.bucket, &input.key)
                .await?;
        } else {
            let current = self.current(&input.bucket, &input.key).await?;
            conditions.check(current.as_ref())?;
        }
        let props = BlobProperties {
            content_type: input.content_type.clone(),
            user_meta: Vec::new(),
            created_ms: now_ms(),
            expires_ms: None,
        };
        let body = input
            .body
            .ok_or_else(|| S3Error::InvalidArgument("PutObject needs a body".into()))?;
        let hasher = requested.as_ref().map(Requested::hasher);
        let name = held::HeldFor::Object {
            bucket: input.bucket.clone(),
            key: input.key.clone(),
        }
        .name();
        let stored = blobs::store(
            self.router(),
            &self.limits,
            props,
            body,
            hasher,
            Some(&name),
        );
        let mut stored = stored
            .await
            .map_err(|err| body_error(&req.extensions, err))?;
        let digests = Digests {
            content_md5: sent_content_md5(&req.headers, input.content_md5.as_deref()),
            requested: requested.as_ref(),
            trailers: req.trailing_headers.as_ref(),
        };
        let checksum = self.check_digests(&mut stored, &digests)?;
        let entry = ObjectEntry {
            body: vec![Piece {
                blob: stored.id.to_string(),
                size: stored.size,
            }],
            size: stored.size,
            etag: stored.md5,
            modified_ms: now_ms(),
            content_type: input.content_type,
            meta: meta.into_iter().collect(),
            checksum: checksum.clone(),
            headers,
            public_read,
            tags,
            json: Default::default(),
        };
        let tag = entry.etag.clone();
        let size = entry.size;
        held::crash_point("before-link");
        let name = (input.bucket.clone(), input.key.clone());
        self.link_and_settle(name, entry, conditions, (stored.id, stored.held))
            .await?;
        let mut output = PutObjectOutput {
            e_tag: Some(ETag::Strong(tag)),
            size: i64::try_from(size).ok(),
            ..Default::default()
        };
        if let Some(checksum) = checksum {
            set_checksum!(output, checksum);
            output.checksum_type = Some(checksum.checksum_type());
        }
        Ok(S3Response::new(output))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let mut input = req.input;
        object_headers::check_overrides(req.credentials.is_none(), any_override!(input))?;
        let entry = self.entry(&input.bucket, &input.key).await?;
        crate::auth::check_anonymous_entry(&req.extensions, &entry)?;
        let conditions = Conditions {
            if_match: input.if_match.as_ref(),
            if_none_match: input.if_none_match.as_ref(),
            if_modified_since: input.if_modified_since.as_ref(),
            if_unmodified_since: input.if_unmodified_since.as_ref(),
        };
        conditions.check(&entry)?;
        let selected =
            selected_or_part(self.router(), &input.range, input.part_number, &entry).await?;
        let (range, partial) = (selected.range.clone(), selected.partial);
        let read_ahead = self.limits.chunking.read_ahead;
        let reading = (&self.bodies, read_ahead);
        let body = blobs::open_pieces(self.router(), reading, &entry.body, range.clone()).await?;
        let (content_range, status) = partial_answer(&range, entry.size, partial);
        let mut output = GetObjectOutput {
            body: Some(body),
            accept_ranges: Some("bytes".into()),
            content_length: i64::try_from(range.end - range.start).ok(),
            content_range,
            parts_count: input.part_number.and(parts_count(&entry)),
            content_type: entry.content_type.clone(),
            e_tag: Some(etag(&entry)),
            last_modified: Some(timestamp(entry.modified_ms)),
            metadata: Some(entry.meta.clone().into_iter().collect()),
            tag_count: crate::tagging::count(&entry.tags),
            ..Default::default()
        };
        object_headers::answer_headers!(output, &entry.headers, input);
        let answered = answered_checksum(input.checksum_mode.as_ref(), &entry, selected);
        if let Some((checksum, kind)) = answered {
            set_checksum!(output, checksum);
            output.checksum_type = Some(kind);
        }
        Ok(S3Response::with_status(output, status))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let mut input = req.input;
        object_headers::check_overrides(req.credentials.is_none(), any_override!(input))?;
        let entry = self.entry(&input.bucket, &input.key).await?;
        crate::auth::check_anonymous_entry(&req.extensions, &entry)?;
        let conditions = Conditions {
            if_match: input.if_match.as_ref(),
            if_none_match: input.if_none_match.as_ref(),
            if_modified_since: input.if_modified_since.as_ref(),
            if_unmodified_since: input.if_unmodified_since.as_ref(),
        };
        conditions.check(&entry)?;
        let selected =
            selected_or_part(self.router(), &input.range, input.part_number, &entry).await?;
        let (range, partial) = (selected.range.clone(), selected.partial);
        let (content_range, status) = partial_answer(&range, entry.size, partial);
        let mut output = HeadObjectOutput {
            accept_ranges: Some("bytes".into()),
            content_length: i64::try_from(range.end - range.start).ok(),
            content_range,
            parts_count: input.part_number.and(parts_count(&entry)),
            content_type: entry.content_type.clone(),
            e_tag: Some(etag(&entry)),
            last_modified: Some(timestamp(entry.modified_ms)),
            metadata: Some(entry.meta.clone().into_iter().collect()),
            ..Default::default()
        };
        object_headers::answer_headers!(output, &entry.headers, input);
        let answered = answered_checksum(input.checksum_mode.as_ref(), &entry, selected);
        if let Some((checksum, kind)) = answered {
            set_checksum!(output, checksum);
            output.checksum_type = Some(kind);
        }
        let mut answer = S3Response::with_status(output, status);
        // As GetObject answers it (s3s's HeadObject output has no field for it).
        if let Some(count) = crate::tagging::count(&entry.tags) {
            answer.headers.insert("x-amz-tagging-count", count.into());
        }
        Ok(answer)
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        let entry = self.entry(&req.input.bucket, &req.input.key).await?;
        let mut output = attributes::answer(self.router(), &req.input, &entry).await?;
        output.last_modified = Some(timestamp(entry.modified_ms));
        Ok(S3Response::new(output))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let input = req.input;
        check_key(&input.key)?;
        objects::unlink(self, &input.bucket, std::slice::from_ref(&input.key)).await?;
        Ok(S3Response::with_status(
            DeleteObjectOutput::default(),
            http::StatusCode::NO_CONTENT,
        ))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let input = req.input;
        // An empty token is no token (S3 lists from the start and echoes it).
        let token = input.continuation_token.as_ref().filter(|t| !t.is_empty());
        let after = match (token, &input.start_after) {
            (Some(token), _) => Some(After::parse(token)?),
            (None, Some(key)) => Some(After::Key(key.clone())),
            (None, None) => None,
        };
        let max_keys = max_keys(input.max_keys)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let query = list::Query {
            prefix: &prefix,
            delimiter: input.delimiter.as_deref(),
            after: after.as_ref(),
            max_keys,
        };
        // A run of empty leaves ends a page early: v2's token says where to go on.
        let limit = Some((list::MAX_LEAVES_PER_PAGE, Resume::Token));
        let page = self
            .tree
            .page(&self.records, &input.bucket, &query, limit)
            .await?;
        let url = url_encoded(input.encoding_type.as_ref());
        let contents = contents(&page, url, input.fetch_owner == Some(true));
        let prefixes = common_prefixes(&page, url);
        let count = contents.len() + prefixes.len();
        let output = ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: Some(encode(url, prefix)),
            delimiter: shown_delimiter(input.delimiter, url),
            max_keys: Some(max_keys as i32),
            key_count: Some(count as i32),
            is_truncated: Some(page.next.is_some()),
            continuation_token: input.continuation_token,
            next_continuation_token: page.next.map(|n| n.token()),
            start_after: input.start_after.map(|s| encode(url, s)),
            encoding_type: input.encoding_type,
            contents: Some(contents),
            common_prefixes: Some(prefixes),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let input = req.input;
        check_key(&input.key)?;
        self.index(&input.bucket).await?;
        let meta = lower_case(input.metadata.clone());
        object_headers::check_metadata(&meta)?;
        let headers = object_headers::stored(&given_headers!(input))?;
        let public_read = acl::object_public(input.acl.as_ref(), object_grants!(input))?;
        let tags = given_tags(input.tagging.as_deref())?;
        let checksum = UploadChecksum::requested(
            input.checksum_algorithm.as_ref().map(|a| a.as_str()),
            input.checksum_type.as_ref().map(|t| t.as_str()),
        )?;
        let upload = multipart::new_upload(
            input.key.clone(),
            input.content_type,
            (meta, headers),
            (public_read, tags),
            checksum,
        );
        let id = multipart::create(self, &input.bucket, upload).await?;
        let output = CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(id),
            checksum_algorithm: checksum.map(|c| c.algorithm.dto()),
            checksum_type: checksum.map(|c| ChecksumType::from(c.combine.name().to_owned())),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let input = req.input;
        let number = multipart::check_part_number(input.part_number)?;
        let requested = Requested::from_headers(&req.headers)?;
        // Refused before the body is stored when the upload is unknown.
        let upload = multipart::read(self, &input.bucket, &input.key, &input.upload_id).await?;
        let requested = Requested::for_part(requested, upload.checksum)?;
        let props = BlobProperties {
            created_ms: now_ms(),
            ..Default::default()
        };
        let body = input
            .body
            .ok_or_else(|| S3Error::InvalidArgument("UploadPart needs a body".into()))?;
        let hasher = requested.as_ref().map(Requested::hasher);
        let name = Self::part_name(&input.bucket, &input.key, &input.upload_id, number);
        let journal_name = name.name();
        let stored = blobs::store(
            self.router(),
            &self.limits,
            props,
            body,
            hasher,
            Some(&journal_name),
        );
        let mut stored = stored
            .await
            .map_err(|err| body_error(&req.extensions, err))?;
        let digests = Digests {
            content_md5: sent_content_md5(&req.headers, input.content_md5.as_deref()),
            requested: requested.as_ref(),
            trailers: req.trailing_headers.as_ref(),
        };
        let checksum = self.check_digests(&mut stored, &digests)?;
        let md5 = stored.md5.clone();
        let upload = (input.bucket, input.key, input.upload_id);
        let kept = checksum.as_ref().map(|c| c.value.clone());
        self.add_stored_part(upload, number, (name, kept), stored)
            .await?;
        let mut output = UploadPartOutput {
            e_tag: Some(ETag::Strong(md5)),
            ..Default::default()
        };
        if let Some(checksum) = checksum {
            set_checksum!(output, checksum);
        }
        Ok(S3Response::new(output))
    }

    /// A part copied from (a range of) another object: its bytes are read and stored as a new
    /// blob, like an UploadPart's body, so the part owns them whatever becomes of the source.
    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let input = req.input;
        let number = multipart::check_part_number(input.part_number)?;
        let upload = multipart::read(self, &input.bucket, &input.key, &input.upload_id).await?;
        let conditions = copy_source_conditions!(input);
        let credentials = req.credentials.as_ref();
        let (bucket, key) =
            copy_source::name(&input.copy_source, req.headers.get("x-amz-copy-source"))?;
        let source = copy_source::read(self, credentials, (&bucket, &key), conditions).await?;
        let range = copy_source::part_range(input.copy_source_range.as_deref(), source.size)?;
        let name = Self::part_name(&input.bucket, &input.key, &input.upload_id, number);
        // A part of an upload with a checksum gets its own, computed from the copied bytes.
        let requested = Requested::for_part(None, upload.checksum)?;
        let hasher = requested.as_ref().map(Requested::hasher);
        let journal_name = name.name();
        let stored = self.copy_bytes(&source, range, (None, hasher), &journal_name);
        let mut stored = stored.await?;
        let checksum = match (&requested, stored.checksum.take()) {
            (Some(requested), Some(hasher)) => Some(requested.verify(hasher, None)?.value),
            _ => None,
        };
        let md5 = stored.md5.clone();
        let upload = (input.bucket, input.key, input.upload_id);
        self.add_stored_part(upload, number, (name, checksum), stored)
            .await?;
        let output = UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(ETag::Strong(md5)),
                last_modified: Some(timestamp(now_ms())),
                ..Default::default()
            }),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let input = req.input;
        let sent = ObjectChecksum::sent_whole(&input);
        let parts = input
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default();
        let conditions =
            WriteConditions::new(input.if_match.as_ref(), input.if_none_match.as_ref())?;
        let upload = multipart::Finishing {
            bucket: &input.bucket,
            key: &input.key,
            id: &input.upload_id,
        };
        let done = multipart::complete(self, &upload, &parts, &conditions, sent.as_ref());
        let (etag, checksum) = done.await?;
        let mut output = CompleteMultipartUploadOutput {
            location: Some(format!("/{}/{}", input.bucket, input.key)),
            bucket: Some(input.bucket),
            key: Some(input.key),
            e_tag: Some(ETag::Strong(etag)),
            ..Default::default()
        };
        if let Some(checksum) = checksum {
            set_checksum!(output, checksum);
            output.checksum_type = Some(checksum.checksum_type());
        }
        Ok(S3Response::new(output))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let input = req.input;
        multipart::abort(self, &input.bucket, &input.key, &input.upload_id).await?;
        Ok(S3Response::with_status(
            AbortMultipartUploadOutput::default(),
            http::StatusCode::NO_CONTENT,
        ))
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let input = req.input;
        let upload = multipart::read(self, &input.bucket, &input.key, &input.upload_id).await?;
        let after = u32::try_from(input.part_number_marker.unwrap_or(0)).unwrap_or(0);
        let max = input.max_parts.map_or(1000, |m| m.clamp(1, 1000)) as usize;
        let mut parts: Vec<Part> = upload
            .parts
            .range(after.saturating_add(1)..)
            .take(max + 1)
            .map(|(n, p)| {
                let mut part = Part {
                    part_number: Some(*n as i32),
                    e_tag: Some(ETag::Strong(p.md5.clone())),
                    size: i64::try_from(p.size).ok(),
                    last_modified: Some(timestamp(p.modified_ms)),
                    ..Default::default()
                };
                let kept = upload.checksum.zip(p.checksum.clone());
                if let Some((wanted, value)) = kept {
                    let algorithm = wanted.algorithm;
                    set_checksum!(part, ObjectChecksum { algorithm, value });
                }
                part
            })
            .collect();
        let truncated = parts.len() > max;
        parts.truncate(max);
        let output = ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            is_truncated: Some(truncated),
            next_part_number_marker: parts.last().and_then(|p| p.part_number),
            max_parts: Some(max as i32),
            parts: Some(parts),
            checksum_algorithm: upload.checksum.map(|c| c.algorithm.dto()),
            checksum_type: upload
                .checksum
                .map(|c| ChecksumType::from(c.combine.name().to_owned())),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }
    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let input = req.input;
        let max = input.max_uploads.map_or(1000, |m| m.clamp(1, 1000)) as usize;
        self.index(&input.bucket).await?;
        let list: UploadList = self
            .records
            .read(&uploads_doc(&input.bucket))
            .await?
            .unwrap_or_default();
        let prefix = input.prefix.clone().unwrap_or_default();
        let markers = upload_list::Markers {
            key: input.key_marker.as_deref(),
            id: input.upload_id_marker.as_deref(),
        };
        let delimiter = input.delimiter.as_deref();
        let page = upload_list::page(&list, &prefix, delimiter, &markers, max);
        let url = url_encoded(input.encoding_type.as_ref());
        let uploads = page
            .uploads
            .iter()
            .map(|(key, id, created)| MultipartUpload {
                key: Some(encode(url, (*key).to_owned())),
                upload_id: Some((*id).to_owned()),
                initiated: Some(timestamp(*created)),
                storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                ..Default::default()
            })
            .collect();
        let prefixes = page
            .prefixes
            .iter()
            .map(|p| CommonPrefix {
                prefix: Some(encode(url, p.clone())),
            })
            .collect();
        let (next_key, next_id) = page.next.clone().unzip();
        let output = ListMultipartUploadsOutput {
            bucket: Some(input.bucket),
            prefix: Some(encode(url, prefix)),
            delimiter: input.delimiter.map(|d| encode(url, d)),
            key_marker: input.key_marker.map(|k| encode(url, k)),
            upload_id_marker: input.upload_id_marker,
            next_key_marker: next_key.map(|k| encode(url, k)),
            next_upload_id_marker: next_id.filter(|i| !i.is_empty()),
            max_uploads: Some(max as i32),
            is_truncated: Some(page.next.is_some()),
            encoding_type: input.encoding_type,
            uploads: Some(uploads),
            common_prefixes: Some(prefixes),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let input = req.input;
        let keys: Vec<String> = input.delete.objects.into_iter().map(|o| o.key).collect();
        if keys.is_empty() || keys.len() > list::MAX_KEYS {
            let message = format!("DeleteObjects takes 1 to {} keys", list::MAX_KEYS);
            return Err(S3Error::MalformedXml(message).into());
        }
        for key in &keys {
            check_key(key)?;
        }
        objects::unlink(self, &input.bucket, &keys).await?;
        let quiet = input.delete.quiet.unwrap_or(false);
        let deleted = (!quiet).then(|| {
            keys.into_iter()
                .map(|key| DeletedObject {
                    key: Some(key),
                    ..Default::default()
                })
                .collect()
        });
        let output = DeleteObjectsOutput {
            deleted,
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let input = req.input;
        let max_keys = max_keys(input.max_keys)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let marker = input.marker.as_deref();
        let delimiter = input.delimiter.as_deref();
        let page = self
            .marker_page(&input.bucket, (&prefix, delimiter), marker, max_keys)
            .await?;
        let url = url_encoded(input.encoding_type.as_ref());
        let next_marker = page.next.as_ref().map(|n| encode(url, n.name().to_owned()));
        let output = ListObjectsOutput {
            name: Some(input.bucket),
            // Version 1 answers the prefix as given, even with encoding-type=url (as S3 does;
            // clients decode only the delimiter, markers, keys and common prefixes there).
            prefix: Some(prefix),
            delimiter: shown_delimiter(input.delimiter, url),
            // Always there, empty without a marker, as in S3's answer.
            marker: Some(encode(url, input.marker.unwrap_or_default())),
            max_keys: Some(max_keys as i32),
            is_truncated: Some(page.next.is_some()),
            next_marker,
            encoding_type: input.encoding_type,
            contents: Some(contents(&page, url, true)),
            common_prefixes: Some(common_prefixes(&page, url)),
            request_charged: None,
        };
        Ok(S3Response::new(output))
    }

    /// Buckets are never versioned: each object is its one version, `null` (as S3 lists an
    /// unversioned bucket), so tools that clean up through this listing work.
    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let input = req.input;
        let max_keys = max_keys(input.max_keys)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let marker = input.key_marker.as_deref();
        let delimiter = input.delimiter.as_deref();
        let page = self
            .marker_page(&input.bucket, (&prefix, delimiter), marker, max_keys)
            .await?;
        let url = url_encoded(input.encoding_type.as_ref());
        let versions = page
            .objects
            .iter()
            .map(|(name, entry)| ObjectVersion {
                key: Some(encode(url, name.clone())),
                version_id: Some("null".into()),
                is_latest: Some(true),
                size: i64::try_from(entry.size).ok(),
                e_tag: Some(etag(entry)),
                last_modified: Some(timestamp(entry.modified_ms)),
                storage_class: Some(ObjectVersionStorageClass::from_static(
                    ObjectVersionStorageClass::STANDARD,
                )),
                ..Default::default()
            })
            .collect();
        let next_key_marker = page.next.as_ref().map(|n| encode(url, n.name().to_owned()));
        let output = ListObjectVersionsOutput {
            name: Some(input.bucket),
            prefix: Some(encode(url, prefix)),
            delimiter: shown_delimiter(input.delimiter, url),
            key_marker: input.key_marker.map(|m| encode(url, m)),
            version_id_marker: input.version_id_marker,
            max_keys: Some(max_keys as i32),
            is_truncated: Some(page.next.is_some()),
            next_version_id_marker: next_key_marker.as_ref().map(|_| "null".to_owned()),
            next_key_marker,
            encoding_type: input.encoding_type,
            versions: Some(versions),
            common_prefixes: Some(common_prefixes(&page, url)),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let input = req.input;
        check_key(&input.key)?;
        // As S3: the copy's ACL is the request's, never the source's.
        let public_read = acl::object_public(input.acl.as_ref(), object_grants!(input))?;
        let conditions = copy_source_conditions!(input);
        let credentials = req.credentials.as_ref();
        let (bucket, key) =
            copy_source::name(&input.copy_source, req.headers.get("x-amz-copy-source"))?;
        let replace = input
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        if !replace && bucket == input.bucket && key == input.key {
            return Err(S3Error::InvalidRequest(
                "This copy request is illegal because it is trying to copy an object to itself \
                 without changing the object's metadata"
                    .into(),
            )
            .into());
        }
        let replace_tags = match input.tagging_directive.as_ref().map(|d| d.as_str()) {
            None | Some(TaggingDirective::COPY) => false,
            Some(TaggingDirective::REPLACE) => true,
            Some(other) => {
                return Err(S3Error::InvalidArgument(format!(
                    "Unknown tagging directive {other:?}: COPY or REPLACE"
                ))
                .into())
            }
        };
        let given = match replace_tags {
            true => Some(given_tags(input.tagging.as_deref())?),
            false => None,
        };
        let source = copy_source::read(self, credentials, (&bucket, &key), conditions).await?;
        self.index(&input.bucket).await?;
        let tags = given.unwrap_or_else(|| source.tags.clone());
        let (content_type, meta, headers) = match replace {
            true => {
                let meta = lower_case(input.metadata.clone());
                object_headers::check_metadata(&meta)?;
                let headers = object_headers::stored(&given_headers!(input))?;
                (input.content_type, meta.into_iter().collect(), headers)
            }
            false => (
                source.content_type.clone(),
                source.meta.clone(),
                source.headers.clone(),
            ),
        };
        let journal_name = held::HeldFor::Object {
            bucket: input.bucket.clone(),
            key: input.key.clone(),
        }
        .name();
        let whole = 0..source.size;
        let stored = self
            .copy_bytes(&source, whole, (content_type.clone(), None), &journal_name)
            .await?;
        let entry = ObjectEntry {
            body: vec![Piece {
                blob: stored.id.to_string(),
                size: stored.size,
            }],
            size: stored.size,
            etag: stored.md5.clone(),
            modified_ms: now_ms(),
            content_type,
            meta,
            // The same bytes: the source's checksum holds.
            checksum: source.checksum.clone(),
            headers,
            public_read,
            tags,
            json: Default::default(),
        };
        let modified = entry.modified_ms;
        let unconditional = WriteConditions::default();
        let name = (input.bucket.clone(), input.key.clone());
        self.link_and_settle(name, entry, unconditional, (stored.id, stored.held))
            .await?;
        let output = CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(ETag::Strong(stored.md5)),
                last_modified: Some(timestamp(modified)),
                ..Default::default()
            }),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }
}

/// The `Content-MD5` a request sent: s3s takes an empty header for none, S3 for a digest that
/// is not one (`InvalidDigest`), so an empty header is kept here as sent.
fn sent_content_md5<'a>(headers: &http::HeaderMap, parsed: Option<&'a str>) -> Option<&'a str> {
    match parsed {
        None if headers.contains_key("content-md5") => Some(""),
        parsed => parsed,
    }
}

/// A body that failed because the client stopped sending is S3's RequestTimeout.
fn body_error(extensions: &http::Extensions, err: S3Error) -> S3Error {
    match extensions.get::<Stalled>().is_some_and(Stalled::happened) {
        true => S3Error::RequestTimeout(format!(
            "no request body bytes arrived within the body-read timeout ({err})"
        )),
        false => err,
    }
}

fn max_keys(asked: Option<i32>) -> Result<usize, S3Error> {
    match asked {
        Some(n) if n < 0 => Err(S3Error::InvalidArgument("max-keys is not negative".into())),
        Some(n) => Ok((n as usize).min(list::MAX_KEYS)),
        None => Ok(list::MAX_KEYS),
    }
}

/// Whether a listing asked for `encoding-type=url` (the aws cli does): names, prefixes and
/// markers are then percent-encoded in the answer, and the client decodes them.
fn url_encoded(encoding: Option<&EncodingType>) -> bool {
    encoding.is_some_and(|e| e.as_str() == EncodingType::URL)
}

fn encode(url: bool, text: String) -> String {
    match url {
        true => list::url_encode(&text),
        false => text,
    }
}

/// A delimiter as a listing answers it: an empty one is left out, as S3 does.
fn shown_delimiter(delimiter: Option<String>, url: bool) -> Option<String> {
    delimiter.filter(|d| !d.is_empty()).map(|d| encode(url, d))
}

/// The one owner every object has (access is by key grants, not per-object owners).
fn owner() -> Owner {
    Owner {
        display_name: Some("larder".into()),
        id: Some("larder".into()),
    }
}

/// The listed objects; with `owners` (ListObjects v1 always, v2 with `fetch-owner=true`)
/// each with its owner.
fn contents(page: &list::Page, url: bool, owners: bool) -> Vec<Object> {
    page.objects
        .iter()
        .map(|(name, entry)| Object {
            key: Some(encode(url, name.clone())),
            owner: owners.then(owner),
            size: i64::try_from(entry.size).ok(),
            e_tag: Some(etag(entry)),
            last_modified: Some(timestamp(entry.modified_ms)),
            storage_class: Some(ObjectStorageClass::from_static(
                ObjectStorageClass::STANDARD,
            )),
            ..Default::default()
        })
        .collect()
}

fn common_prefixes(page: &list::Page, url: bool) -> Vec<CommonPrefix> {
    page.prefixes
        .iter()
        .map(|p| CommonPrefix {
            prefix: Some(encode(url, p.clone())),
        })
        .collect()
}

/// ListBuckets' largest page (S3's).
const MAX_BUCKETS_PER_PAGE: i32 = 10_000;

/// The standard headers of an input that has them (PutObject, CopyObject,
/// CreateMultipartUpload), for `object_headers::stored`.
macro_rules! given_headers {
    ($input:ident) => {
        object_headers::Given {
            cache_control: $input.cache_control.as_deref(),
            content_disposition: $input.content_disposition.as_deref(),
            content_encoding: $input.content_encoding.as_deref(),
            content_language: $input.content_language.as_deref(),
            expires: $input.expires.as_ref(),
        }
    };
}
use given_headers;

/// Whether a read (GetObject, HeadObject) asks for a `response-*` override.
macro_rules! any_override {
    ($input:ident) => {
        $input.response_cache_control.is_some()
            || $input.response_content_disposition.is_some()
            || $input.response_content_encoding.is_some()
            || $input.response_content_language.is_some()
            || $input.response_content_type.is_some()
            || $input.response_expires.is_some()
    };
}
use any_override;

/// A version ID other than `null`: 404 `NoSuchVersion` (Larder keeps one version of an
/// object).
fn one_version(version_id: Option<&str>) -> S3Result<()> {
    match version_id.is_some_and(|v| v != "null") {
        true => Err(s3s::s3_error!(
            NoSuchVersion,
            "Larder keeps one version of an object"
        )),
        false => Ok(()),
    }
}

/// The tags of an `x-amz-tagging` header, if one was sent (`tagging.rs`).
fn given_tags(header: Option<&str>) -> S3Result<crate::tagging::Tags> {
    header.map_or(Ok(Default::default()), crate::tagging::from_header)
}

/// `x-amz-meta-*` names as S3 returns them: lower-case.
fn lower_case(meta: Option<Metadata>) -> Vec<(String, String)> {
    meta.unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect()
}
