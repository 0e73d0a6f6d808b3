//! Multipart uploads. An upload is a record (`larder-s3:upload:<bucket>:<id>`) listing its
//! parts; each part is stored like a PutObject body (a blob, chunked when large, never held
//! whole). Completing writes one composite record of version 2 listing the chosen parts with
//! their sizes (`larder-router`'s `parts_manifest.rs`), and the object's entry names that
//! record: the index stays small however many parts an object has. (Entries written before
//! version 2 list the parts themselves; reads and deletes take both.) The
//! record stays, marked as completing, until the link is settled (`complete`): no crash leaks
//! the parts, and no Abort tombstones the bytes of a completed object.

use base64::Engine as _;
use larder_cluster::BlobId;
use larder_router::{JournalEntry, Part, PartChecksums};
use md5::{Digest, Md5};
use rand::distr::{Alphanumeric, SampleString};
use s3s::dto::{CompletedPart, ETag};

use crate::blobs;
use crate::checksums::ObjectChecksum;
use crate::conditions::WriteConditions;
use crate::error::S3Error;
use futures_util::StreamExt;

use crate::held::{Held, HeldFor};
use crate::index_batch::ChangeFailed;
use crate::objects;
use crate::records::{
    bucket_doc, upload_doc, uploads_doc, BucketIndex, Completing, ObjectEntry, ObjectHeaders,
    Piece, Upload, UploadList, UploadedPart, FORMAT,
};
use crate::service::{now_ms, Larder};
use crate::store::Change;
use crate::upload_checksum::UploadChecksum;
use crate::upload_list;

/// S3's bounds: part numbers 1..=10,000; every part but the last at least 5 MiB.
pub const MAX_PART_NUMBER: i32 = 10_000;
pub const MIN_PART_SIZE: u64 = 5 << 20;

/// Length of the upload IDs this server mints (letters and digits).
const UPLOAD_ID_LEN: usize = 32;

/// A new upload's ID, after its record is written.
pub async fn create(s3: &Larder, bucket: &str, upload: Upload) -> Result<String, S3Error> {
    let id = Alphanumeric.sample_string(&mut rand::rng(), UPLOAD_ID_LEN);
    let (key, created_ms) = (upload.key.clone(), upload.created_ms);
    s3.records
        .update(&upload_doc(bucket, &id), |old: Option<Upload>| match old {
            Some(_) => Err(S3Error::Internal("upload ID collision".into())),
            None => Ok((Change::Put(upload.clone()), ())),
        })
        .await?;
    // Listed after its record exists: a listed upload is one ListParts and Abort can find.
    if let Err(err) = upload_list::add(s3, bucket, &key, &id, created_ms).await {
        let _ = take(s3, bucket, &key, &id).await;
        return Err(err);
    }
    // A DeleteBucket may have removed the bucket since it was checked: then this upload goes
    // (DeleteBucket aborts what it finds listed after removing the bucket, so one of the two
    // sees the other).
    let bucket_exists = s3
        .records
        .read_unresolved::<BucketIndex>(&bucket_doc(bucket))
        .await?
        .is_some();
    if !bucket_exists {
        if take(s3, bucket, &key, &id).await.is_ok() {
            unlist(s3, bucket, &key, &id).await;
        }
        return Err(S3Error::NoSuchBucket);
    }
    Ok(id)
}

/// Aborts every upload listed for `bucket`, tombstoning their parts, and removes the list
/// (DeleteBucket, after the bucket's index is gone). One that fails does not stop the others;
/// then the list stays, and the first error is returned.
pub async fn abort_all(s3: &Larder, bucket: &str) -> Result<(), S3Error> {
    let Some(list) = s3.records.read::<UploadList>(&uploads_doc(bucket)).await? else {
        return Ok(());
    };
    let mut first_error = None;
    for (key, ids) in &list.uploads {
        for id in ids.keys() {
            match abort_for_deletion(s3, bucket, key, id).await {
                Ok(()) | Err(S3Error::NoSuchUpload) => {}
                Err(err) => {
                    tracing::warn!(%err, bucket, upload = id, "an upload of a deleted bucket");
                    first_error.get_or_insert(err);
                }
            }
        }
    }
    if let Some(err) = first_error {
        return Err(err);
    }
    // Entries whose upload was already finished (a failed unlist) go with the list, so that a
    // bucket made again with this name starts with none.
    s3.records
        .update(&uploads_doc(bucket), |_: Option<UploadList>| {
            Ok((Change::Remove, ()))
        })
        .await
}

/// Aborts upload `id` of a bucket whose index is gone. A completion under way is settled in
/// the background once its link's deadline has passed (`LINK_DEADLINE`): its link cannot land
/// in the deleted bucket, and after the deadline none is tried again in a bucket made again
/// with the name. The settlement then drops the parts.
async fn abort_for_deletion(s3: &Larder, bucket: &str, key: &str, id: &str) -> Result<(), S3Error> {
    let Some(completing) = read(s3, bucket, key, id).await?.completing else {
        return abort(s3, bucket, key, id).await;
    };
    let (s3, bucket, key, id) = (s3.clone(), bucket.to_owned(), key.to_owned(), id.to_owned());
    tokio::spawn(async move {
        let past = completing.since_ms.saturating_add(LINK_DEADLINE_MS + 1_000);
        let wait = past.saturating_sub(now_ms()).min(LINK_DEADLINE_MS + 1_000);
        tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        let completion = Completion {
            bucket: &bucket,
            id: &id,
            key: &key,
            token: &completing.token,
        };
        if let Err(err) = settle_completion(&s3, &completion, true).await {
            tracing::warn!(%err, bucket, upload = id, "a completion in a deleted bucket stays");
        }
    });
    Ok(())
}

/// The record of upload `id`, refusing IDs this server cannot have minted.
pub async fn read(s3: &Larder, bucket: &str, key: &str, id: &str) -> Result<Upload, S3Error> {
    check_id(id)?;
    match s3.records.read::<Upload>(&upload_doc(bucket, id)).await? {
        Some(upload) if upload.key == key => Ok(upload),
        _ => Err(S3Error::NoSuchUpload),
    }
}

fn check_id(id: &str) -> Result<(), S3Error> {
    let minted = id.len() == UPLOAD_ID_LEN && id.bytes().all(|b| b.is_ascii_alphanumeric());
    minted.then_some(()).ok_or(S3Error::NoSuchUpload)
}

pub fn check_part_number(number: i32) -> Result<u32, S3Error> {
    match u32::try_from(number) {
        Ok(n) if (1..=MAX_PART_NUMBER).contains(&number) => Ok(n),
        _ => Err(S3Error::InvalidArgument(format!(
            "Part number must be an integer between 1 and {MAX_PART_NUMBER}, inclusive"
        ))),
    }
}

/// Records a stored part; the blob of a part it replaces is tombstoned.
pub async fn add_part(
    s3: &Larder,
    bucket: &str,
    key: &str,
    id: &str,
    number: u32,
    part: UploadedPart,
) -> Result<(), ChangeFailed> {
    let mut uncertain = false;
    let added = s3
        .records
        .update_noting(
            &upload_doc(bucket, id),
            |upload: Option<Upload>| {
                let mut upload = upload
                    .filter(|u| u.key == key)
                    .ok_or(S3Error::NoSuchUpload)?;
                if upload.completing.is_some() {
                    return Err(completion_under_way());
                }
                let replaced = upload.parts.insert(number, part.clone());
                Ok((Change::Put(upload), replaced))
            },
            &mut uncertain,
        )
        .await;
    let replaced = added.map_err(|error| ChangeFailed {
        error,
        may_have_applied: uncertain,
    })?;
    if let Some(old) = replaced {
        let router = s3.records.router().clone();
        tokio::spawn(async move { blobs::delete(&router, &old.blob).await });
    }
    Ok(())
}

/// Removes the upload's record and returns it (`NoSuchUpload` if it is gone already).
async fn take(s3: &Larder, bucket: &str, key: &str, id: &str) -> Result<Upload, S3Error> {
    check_id(id)?;
    s3.records
        .update(&upload_doc(bucket, id), |upload: Option<Upload>| {
            let upload = upload
                .filter(|u| u.key == key)
                .ok_or(S3Error::NoSuchUpload)?;
            if upload.completing.is_some() {
                return Err(completion_under_way());
            }
            Ok((Change::Remove, upload))
        })
        .await
}

/// Tombstones `parts` in the background.
fn drop_parts(s3: &Larder, parts: Vec<UploadedPart>) {
    if parts.is_empty() {
        return;
    }
    let router = s3.records.router().clone();
    tokio::spawn(async move {
        for part in parts {
            if let Err(err) = blobs::delete(&router, &part.blob).await {
                tracing::warn!(%err, blob = part.blob, "a multipart part's blob was not tombstoned");
            }
        }
    });
}

pub async fn abort(s3: &Larder, bucket: &str, key: &str, id: &str) -> Result<(), S3Error> {
    if let Some(completing) = read(s3, bucket, key, id).await?.completing {
        if !is_stale(&completing) {
            return Err(completion_under_way());
        }
        settle_stale(s3, (bucket, key, id), &completing).await?;
    }
    let upload = take(s3, bucket, key, id).await?;
    drop_parts(s3, upload.parts.into_values().collect());
    unlist(s3, bucket, key, id).await;
    Ok(())
}

/// Removes a finished upload from the bucket's list. The upload is finished either way, so a
/// failure here is logged, not answered: the listing shows it until a retry of the same
/// request (whose answer is then NoSuchUpload) or an operator removes it.
async fn unlist(s3: &Larder, bucket: &str, key: &str, id: &str) {
    if let Err(err) = upload_list::remove(s3, bucket, key, id).await {
        tracing::warn!(%err, bucket, upload = id, "a finished upload is still listed");
    }
}

/// The parts `chosen` names, in order, checked against what was uploaded. A part number listed
/// twice in a row counts once, as its last listing: a client that sent a part again while the
/// first upload was still going lists both answers, and the part kept is the upload that
/// finished last (ceph's `test_multipart_resend_first_finishes_last`).
pub(crate) fn select(
    upload: &Upload,
    chosen: &[CompletedPart],
) -> Result<Vec<(u32, UploadedPart)>, S3Error> {
    if chosen.is_empty() {
        return Err(S3Error::MalformedXml(
            "CompleteMultipartUpload names no parts".into(),
        ));
    }
    let mut out: Vec<(u32, UploadedPart)> = Vec::with_capacity(chosen.len());
    for (i, part) in chosen.iter().enumerate() {
        let number = check_part_number(part.part_number.unwrap_or(0))?;
        let listed_again = chosen
            .get(i + 1)
            .is_some_and(|next| next.part_number == part.part_number);
        if listed_again {
            continue;
        }
        if out.last().is_some_and(|(last, _)| *last >= number) {
            return Err(S3Error::InvalidPartOrder);
        }
        let uploaded = upload.parts.get(&number).ok_or(S3Error::InvalidPart)?;
        let tag = part.e_tag.as_ref().map(ETag::value);
        if tag.is_some_and(|t| t != uploaded.md5) {
            return Err(S3Error::InvalidPart);
        }
        check_listed_checksum(upload, part, uploaded)?;
        out.push((number, uploaded.clone()));
    }
    if let Some((_, small)) = out[..out.len() - 1]
        .iter()
        .find(|(_, p)| p.size < MIN_PART_SIZE)
    {
        return Err(S3Error::EntityTooSmall(format!(
            "a part of {} bytes is not the last; parts but the last are at least {MIN_PART_SIZE} bytes",
            small.size
        )));
    }
    Ok(out)
}

/// A part's checksum listed in CompleteMultipartUpload must be the one it was uploaded with.
fn check_listed_checksum(
    upload: &Upload,
    listed: &CompletedPart,
    uploaded: &UploadedPart,
) -> Result<(), S3Error> {
    let Some(wanted) = upload.checksum else {
        return Ok(()); // S3 ignores them too
    };
    match ObjectChecksum::listed_value(listed, wanted.algorithm) {
        Some(value) if Some(value) != uploaded.checksum.as_deref() => Err(S3Error::InvalidPart),
        _ => Ok(()),
    }
}

/// The object's checksum, when its upload asked for one (`upload_checksum.rs`).
fn object_checksum(
    upload: &Upload,
    parts: &[(u32, UploadedPart)],
) -> Result<Option<ObjectChecksum>, S3Error> {
    let Some(wanted) = upload.checksum else {
        return Ok(None);
    };
    let listed: Option<Vec<(&str, u64)>> = parts
        .iter()
        .map(|(_, p)| Some((p.checksum.as_deref()?, p.size)))
        .collect();
    let listed = listed
        .ok_or_else(|| S3Error::Corrupt("a part of an upload with a checksum has none".into()))?;
    wanted.of_parts(&listed).map(Some)
}

/// The whole object's checksum a CompleteMultipartUpload sent (`x-amz-checksum-*`), if any,
/// must be the one its parts make (a COMPOSITE one with or without its `-<parts>`).
fn check_sent_checksum(
    made: Option<&ObjectChecksum>,
    sent: Option<&ObjectChecksum>,
) -> Result<(), S3Error> {
    let Some(sent) = sent else {
        return Ok(());
    };
    let Some(made) = made else {
        return Err(S3Error::InvalidRequest(
            "The upload was created without a checksum algorithm".into(),
        ));
    };
    if sent.algorithm != made.algorithm {
        return Err(S3Error::InvalidRequest(format!(
            "Checksum Type mismatch occurred, expected checksum Type: {}, actual checksum Type: {}",
            made.algorithm.name(),
            sent.algorithm.name()
        )));
    }
    let bare = made.value.split('-').next().unwrap_or_default();
    if sent.value != made.value && sent.value != bare {
        return Err(S3Error::BadChecksum(
            made.algorithm.name().to_ascii_uppercase(),
        ));
    }
    Ok(())
}

/// The ETag S3 gives a multipart object: the MD5 of the parts' MD5s, then `-<parts>`.
fn multipart_etag(parts: &[(u32, UploadedPart)]) -> String {
    let mut md5 = Md5::new();
    for (_, part) in parts {
        md5.update(unhex(&part.md5));
    }
    format!("{}-{}", blobs::hex(&md5.finalize()), parts.len())
}

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// The upload a CompleteMultipartUpload names.
pub struct Finishing<'a> {
    pub bucket: &'a str,
    pub key: &'a str,
    pub id: &'a str,
}

/// Completes an upload as its object if `conditions` hold for what the name points at;
/// returns the object's ETag.
///
/// The upload's record stays until the object is known to be linked or never to be:
///
/// 1. a journal entry for the completion (`held.rs`), synced;
/// 2. a token in the record (`Completing`): from then on no Abort, UploadPart or other
///    Complete changes it;
/// 3. the object's parts record (a composite of version 2), its ID synced into the entry
///    first: until the name points at it, a settlement tombstones it alone;
/// 4. the entry marked "link sent", synced; then the link, tried only until `LINK_DEADLINE`
///    after the token (this process's clock);
/// 5. linked: the parts the object does not use are tombstoned, then the record goes (before
///    the answer: then ListParts and Abort say NoSuchUpload). Refused: the token goes and the upload is as it was.
///
/// No answer, or a crash anywhere: the entry is settled (`settle_completion`), in the
/// background or at the next start. A token whose entry is gone for good (no journal, a
/// frontend that never came back) is settled by the next Complete or Abort of the upload once
/// it is `STALE_COMPLETION_MS` old.
pub async fn complete(
    s3: &Larder,
    finishing: &Finishing<'_>,
    chosen: &[CompletedPart],
    conditions: &WriteConditions,
    sent_checksum: Option<&ObjectChecksum>,
) -> Result<(String, Option<ObjectChecksum>), S3Error> {
    let Finishing { bucket, key, id } = *finishing;
    // Checked before anything changes, so a bad request (or a condition that fails now) leaves
    // the upload as it was. The conditions are decided again when the name is linked.
    let upload = match read(s3, bucket, key, id).await {
        Err(S3Error::NoSuchUpload) => return already_completed(s3, finishing, chosen).await,
        other => other?,
    };
    if let Some(completing) = &upload.completing {
        if is_stale(completing) {
            settle_stale(s3, (bucket, key, id), completing).await?;
        }
        // Linked by the other Complete (this one's first try, its answer lost): answered with
        // the object. Otherwise the client is asked to try again (a 503 the SDKs retry).
        return already_completed(s3, finishing, chosen)
            .await
            .map_err(|_| S3Error::Unavailable(UNDER_WAY.into()));
    }
    let parts = select(&upload, chosen)?;
    check_sent_checksum(object_checksum(&upload, &parts)?.as_ref(), sent_checksum)?;
    if *conditions != WriteConditions::default() {
        let current = s3.current(bucket, key).await?;
        conditions.check(current.as_ref())?;
    }
    let token = Alphanumeric.sample_string(&mut rand::rng(), TOKEN_LEN);
    let held_for = HeldFor::Completion {
        bucket: bucket.to_owned(),
        upload: id.to_owned(),
        key: key.to_owned(),
        token: token.clone(),
        sent: false,
    };
    let journal = hold_completion(s3, &held_for).await?;
    // In a task of its own from here: a client that hangs up does not leave a token behind.
    let (s3, conditions, chosen) = (s3.clone(), conditions.clone(), chosen.to_vec());
    let task = tokio::spawn(async move {
        let step = CompletionStep {
            s3,
            held_for,
            journal,
        };
        step.run(&chosen, &conditions).await
    });
    task.await
        .map_err(|e| S3Error::Internal(format!("the completion's task ended: {e}")))?
}

/// Length of a completion's token (letters and digits).
const TOKEN_LEN: usize = 16;

/// A Complete tries its link only this long after it wrote its token (checked by its own
/// clock at every try: `WriteConditions::not_after_ms`). After that no link of it can land,
/// so a settlement's read of the name is final.
pub(crate) const LINK_DEADLINE_MS: u64 = 60_000;

/// Another frontend settles a token this old: its link gave up long before, even with clocks
/// minutes apart.
const STALE_COMPLETION_MS: u64 = 600_000;

fn is_stale(completing: &Completing) -> bool {
    now_ms().saturating_sub(completing.since_ms) > STALE_COMPLETION_MS
}

const UNDER_WAY: &str = "a CompleteMultipartUpload of this upload is under way; try again";

fn completion_under_way() -> S3Error {
    S3Error::OperationAborted(UNDER_WAY.into())
}

/// Settles a stale completion (`STALE_COMPLETION_MS`) a request found: whether its link was
/// sent is unknown, so a name not linked gives the parts up.
async fn settle_stale(
    s3: &Larder,
    (bucket, key, id): (&str, &str, &str),
    completing: &Completing,
) -> Result<(), S3Error> {
    tracing::warn!(
        bucket,
        upload = id,
        "settling a completion its frontend left"
    );
    let completion = Completion {
        bucket,
        id,
        key,
        token: &completing.token,
    };
    // A record this completion wrote that the name does not point at stays (no journal entry
    // lists it any more): a small leak, logged.
    let body = settle_completion(s3, &completion, true).await?;
    if body.is_none_or(|body| body.is_empty()) {
        tracing::warn!(
            bucket,
            upload = id,
            "a stale completion's parts record, if it wrote one, is left behind"
        );
    }
    Ok(())
}

/// The journal entry of a completion, synced (`None` without a journal).
async fn hold_completion(s3: &Larder, held_for: &HeldFor) -> Result<Option<JournalEntry>, S3Error> {
    let Some(entry) = s3.router().begin_journal_entry()? else {
        return Ok(None);
    };
    rehold(&entry, held_for).await?;
    Ok(Some(entry))
}

/// Writes `held_for` into the entry (the last one written is what a restart settles), synced.
async fn rehold(entry: &JournalEntry, held_for: &HeldFor) -> Result<(), S3Error> {
    let held = entry.hold_durably(&held_for.name()).await;
    held.map_err(|e| S3Error::Unavailable(format!("cannot write the upload journal: {e}")))
}

/// One completion after its journal entry is written.
struct CompletionStep {
    s3: Larder,
    held_for: HeldFor,
    journal: Option<JournalEntry>,
}

impl CompletionStep {
    fn completion(&self) -> Completion<'_> {
        let HeldFor::Completion {
            bucket,
            upload,
            key,
            token,
            ..
        } = &self.held_for
        else {
            unreachable!("a completion step holds a completion");
        };
        Completion {
            bucket,
            id: upload,
            key,
            token,
        }
    }

    fn set_sent(&mut self, value: bool) {
        if let HeldFor::Completion { sent, .. } = &mut self.held_for {
            *sent = value;
        }
    }

    async fn run(
        mut self,
        chosen: &[CompletedPart],
        conditions: &WriteConditions,
    ) -> Result<(String, Option<ObjectChecksum>), S3Error> {
        let s3 = self.s3.clone();
        let s3 = &s3;
        let marked = mark(s3, &self.completion(), chosen).await;
        let (parts, upload, since_ms) = match marked {
            Ok(marked) => marked,
            Err(failed) if failed.may_have_applied => return Err(self.settle_later(failed.error)),
            Err(failed) => return Err(self.forget(failed.error)),
        };
        crate::held::crash_point("after-complete-mark");
        // The object's body: one record listing the parts (`blobs::store_parts`), its ID in
        // this completion's journal entry before it is written. A settlement tombstones the
        // record alone unless the name points at it: the parts stay the upload's until then.
        let stored = match part_list(&parts) {
            Ok(list) => {
                let listed = (list, part_checksums(&upload, &parts));
                blobs::store_parts(s3.router(), listed, self.journal.as_ref()).await
            }
            Err(err) => Err(err),
        };
        let record = match stored {
            Ok(record) => record,
            Err(err) => return Err(self.settle_later(err)),
        };
        crate::held::crash_point("after-complete-parts-record");
        // From here a settlement that finds the name not linked cannot give the upload back.
        self.set_sent(true);
        if let Some(entry) = &self.journal {
            if let Err(err) = rehold(entry, &self.held_for).await {
                self.set_sent(false);
                return Err(self.settle_later(err));
            }
        }
        let etag = multipart_etag(&parts);
        let checksum = match object_checksum(&upload, &parts) {
            Ok(checksum) => checksum,
            Err(err) => return Err(self.settle_later(err)),
        };
        let chosen_numbers: Vec<u32> = parts.iter().map(|(n, _)| *n).collect();
        let conditions = WriteConditions {
            not_after_ms: since_ms.checked_add(LINK_DEADLINE_MS),
            ..conditions.clone()
        };
        crate::held::crash_point("before-complete-link");
        let completion = self.completion();
        let entry = object_entry(upload, record, parts, (&etag, checksum.clone()));
        let linked = objects::link(s3, completion.bucket, completion.key, entry, &conditions).await;
        crate::held::crash_point("after-complete-link");
        match linked {
            Ok(()) => {
                // Before the answer: once it is in, ListParts and Abort say NoSuchUpload.
                self.finish(chosen_numbers).await;
                Ok((etag, checksum))
            }
            Err(failed) if failed.may_have_applied => Err(self.settle_later(failed.error)),
            Err(failed) => {
                // Refused: no link of this completion can land. Written down before the token
                // goes, so that a restart in between gives the upload back too.
                self.set_sent(false);
                let noted = match &self.journal {
                    Some(entry) => rehold(entry, &self.held_for).await,
                    None => Ok(()),
                };
                // The parts record goes first: once the token is gone, nothing names it.
                let dropped = match noted {
                    Ok(()) => s3
                        .router()
                        .delete_blob(&record)
                        .await
                        .map_err(S3Error::from),
                    Err(err) => Err(err),
                };
                match dropped.and(revert(s3, &self.completion()).await) {
                    Ok(()) => Err(self.forget(failed.error)),
                    Err(_) => Err(self.settle_later(failed.error)),
                }
            }
        }
    }

    /// Tombstones the unused parts and removes the record; settled later if that fails (the
    /// object is linked either way).
    async fn finish(self, used: Vec<u32>) {
        match finish(&self.s3, &self.completion(), &used).await {
            Ok(()) => {
                crate::held::crash_point("after-complete-finish");
                Held::new(self.journal).linked()
            }
            Err(err) => {
                tracing::warn!(%err, "finishing a completion: settled later");
                Held::new(self.journal).unknown(&self.s3, self.held_for);
            }
        }
    }

    fn settle_later(self, error: S3Error) -> S3Error {
        let upload = self.completion().id.to_owned();
        tracing::warn!(%error, upload, "a completion is settled later");
        Held::new(self.journal).unknown(&self.s3, self.held_for);
        error
    }

    fn forget(self, error: S3Error) -> S3Error {
        if let Some(entry) = self.journal {
            Held::new(Some(entry)).linked();
        }
        error
    }
}

/// The completion of upload `id` (of `key` into `bucket`) that wrote `token`.
pub struct Completion<'a> {
    pub bucket: &'a str,
    pub id: &'a str,
    pub key: &'a str,
    pub token: &'a str,
}

/// Writes the token into the upload's record, with the parts chosen; returns them, the
/// record, and the token's time.
async fn mark(
    s3: &Larder,
    completion: &Completion<'_>,
    chosen: &[CompletedPart],
) -> Result<(Vec<(u32, UploadedPart)>, Upload, u64), ChangeFailed> {
    let mut uncertain = false;
    let since_ms = now_ms();
    let marked = s3
        .records
        .update_noting(
            &upload_doc(completion.bucket, completion.id),
            |upload: Option<Upload>| {
                let mut upload = upload
                    .filter(|u| u.key == completion.key)
                    .ok_or(S3Error::NoSuchUpload)?;
                if upload.completing.is_some() {
                    return Err(S3Error::Unavailable(UNDER_WAY.into()));
                }
                let parts = select(&upload, chosen)?;
                upload.completing = Some(Completing {
                    token: completion.token.to_owned(),
                    parts: parts.iter().map(|(n, _)| *n).collect(),
                    since_ms,
                });
                Ok((Change::Put(upload.clone()), (parts, upload)))
            },
            &mut uncertain,
        )
        .await;
    let (parts, upload) = marked.map_err(|error| ChangeFailed {
        error,
        may_have_applied: uncertain,
    })?;
    Ok((parts, upload, since_ms))
}

/// The chosen parts, in order, as the parts record lists them.
fn part_list(parts: &[(u32, UploadedPart)]) -> Result<Vec<Part>, S3Error> {
    parts
        .iter()
        .map(|(number, p)| {
            let id: BlobId = p.blob.parse().map_err(|e| {
                S3Error::Corrupt(format!("part {number} names blob {}: {e}", p.blob))
            })?;
            Ok(Part { id, size: p.size })
        })
        .collect()
}

/// The chosen parts' checksums, for the parts record to keep (a GET of one part answers its
/// own); `None` when the upload has none (or a part lacks one, which no part of such an
/// upload does).
fn part_checksums(upload: &Upload, parts: &[(u32, UploadedPart)]) -> Option<PartChecksums> {
    let algorithm = upload.checksum?.algorithm;
    let digests: Option<Vec<Vec<u8>>> = parts
        .iter()
        .map(|(_, p)| {
            let value = p.checksum.as_deref()?;
            base64::engine::general_purpose::STANDARD.decode(value).ok()
        })
        .collect();
    Some(PartChecksums {
        algorithm: algorithm.code(),
        digests: digests?,
    })
}

/// The object's entry: one piece, the record listing the chosen parts (`record`).
fn object_entry(
    upload: Upload,
    record: BlobId,
    parts: Vec<(u32, UploadedPart)>,
    (etag, checksum): (&str, Option<ObjectChecksum>),
) -> ObjectEntry {
    let size = parts.iter().map(|(_, p)| p.size).sum();
    ObjectEntry {
        size,
        body: vec![Piece {
            blob: record.to_string(),
            size,
        }],
        etag: etag.to_owned(),
        modified_ms: now_ms(),
        content_type: upload.content_type,
        meta: upload.meta,
        checksum,
        headers: upload.headers,
        public_read: upload.public_read,
        tags: upload.tags,
        json: Default::default(),
    }
}

/// Part tombstones a finish sends at once.
const TOMBSTONES_AT_ONCE: usize = 8;

/// Ends a completion whose outcome is known: the parts not in `keep` (the object's; none when
/// the completion is given up) are tombstoned while the token still holds (so no part can be
/// added meanwhile), then the record goes and the upload leaves the bucket's list. A crash in
/// between finds the token still there and does it again.
async fn finish(s3: &Larder, completion: &Completion<'_>, keep: &[u32]) -> Result<(), S3Error> {
    let doc = upload_doc(completion.bucket, completion.id);
    match s3.records.read::<Upload>(&doc).await? {
        Some(upload) if holds_token(&upload, completion.token) => {
            let doomed = upload
                .parts
                .into_iter()
                .filter(|(n, _)| !keep.contains(n))
                .map(|(_, part)| {
                    let router = s3.router().clone();
                    async move { blobs::delete(&router, &part.blob).await }
                });
            let results: Vec<Result<(), S3Error>> = futures_util::stream::iter(doomed)
                .buffer_unordered(TOMBSTONES_AT_ONCE)
                .collect()
                .await;
            results.into_iter().collect::<Result<Vec<()>, S3Error>>()?;
            let token = completion.token;
            s3.records
                .update(&doc, |upload: Option<Upload>| {
                    Ok(match upload.filter(|u| holds_token(u, token)) {
                        Some(_) => (Change::Remove, ()),
                        None => (Change::Keep, ()),
                    })
                })
                .await?;
        }
        // Another completion's, or none: not this one's to finish.
        Some(_) => return Ok(()),
        None => {}
    }
    unlist(s3, completion.bucket, completion.key, completion.id).await;
    Ok(())
}

/// The object was not linked and no link of this completion can land: the token goes, and
/// the upload is as it was.
async fn revert(s3: &Larder, completion: &Completion<'_>) -> Result<(), S3Error> {
    let token = completion.token;
    s3.records
        .update(
            &upload_doc(completion.bucket, completion.id),
            |upload: Option<Upload>| {
                Ok(match upload.filter(|u| holds_token(u, token)) {
                    Some(mut upload) => {
                        upload.completing = None;
                        (Change::Put(upload), ())
                    }
                    None => (Change::Keep, ()),
                })
            },
        )
        .await
}

fn holds_token(upload: &Upload, token: &str) -> bool {
    upload.completing.as_ref().is_some_and(|c| c.token == token)
}

/// Settles a completion whose link's outcome is unknown (`sent`: its link may have been sent;
/// otherwise none was, or it was refused). First a fence, a write of the record as it is
/// (nothing else changes it while the token holds). If the token is still there, a fence of
/// the name (`objects::touch`: no link based on an earlier state of its index record applies
/// after it) and a read of it:
///
/// - the name points at one of the chosen parts: finish (the others are tombstoned);
/// - it does not, and no link was sent: give the upload back (the token goes);
/// - it does not, and a link may have been sent: give the parts up (all tombstoned, the
///   record removed). The link may have landed and the name been overwritten or deleted
///   since, which puts the parts on the index's garbage list: giving them back to the upload
///   would let a new Complete link blobs about to be tombstoned.
///
/// Returns the blobs the name's body is made of when it is this completion's object (empty
/// otherwise): the caller tombstones any parts record its journal entry lists that is not
/// among them. `None` when that cannot be told: the upload's record was gone already (the
/// completion finished, linked or given up; if linked, the name may have been replaced since
/// and the record be on the garbage list, which must find it to drop its parts), or the name
/// points at a parts record storage does not have. Then nothing is tombstoned (after a give-up
/// whose settlement was cut short, a parts record is left behind: a small leak, never a loss).
pub async fn settle_completion(
    s3: &Larder,
    completion: &Completion<'_>,
    sent: bool,
) -> Result<Option<Vec<String>>, S3Error> {
    let token = completion.token;
    let found = s3
        .records
        .update(
            &upload_doc(completion.bucket, completion.id),
            |upload: Option<Upload>| {
                Ok(match upload {
                    Some(u) if holds_token(&u, token) => (Change::Put(u.clone()), Some(Some(u))),
                    Some(_) => (Change::Keep, None),
                    None => (Change::Keep, Some(None)),
                })
            },
        )
        .await?;
    let upload = match found {
        Some(Some(upload)) => upload,
        // Finished, given up or aborted: only the list may still name it.
        Some(None) => {
            finish(s3, completion, &[]).await?;
            return Ok(None);
        }
        // Never marked, or given back: the upload is someone else's business, and a parts
        // record of this completion was never linked (kept anyway if the name points at it).
        None => return linked_body(s3, completion).await.map(Some),
    };
    let chosen_numbers = upload
        .completing
        .clone()
        .map(|c| c.parts)
        .unwrap_or_default();
    let chosen: Vec<&str> = chosen_numbers
        .iter()
        .filter_map(|n| upload.parts.get(n).map(|p| p.blob.as_str()))
        .collect();
    let (bucket, key) = (completion.bucket, completion.key);
    let body = match objects::touch(s3, bucket, key).await {
        Err(S3Error::NoSuchBucket) => Some(Vec::new()),
        Err(err) => return Err(err),
        Ok(()) => match s3.current(bucket, key).await {
            Err(S3Error::NoSuchBucket) | Ok(None) => Some(Vec::new()),
            Err(err) => return Err(err),
            // Through the parts record its entry names (or, from older builds, its pieces).
            Ok(Some(entry)) => blobs::body_blobs(s3.router(), &entry.body).await?,
        },
    };
    // A missing parts record may have listed the chosen parts: they are kept, as if linked.
    let linked = body
        .as_ref()
        .is_none_or(|body| body.iter().any(|blob| chosen.contains(&blob.as_str())));
    match (linked, sent) {
        (true, _) => finish(s3, completion, &chosen_numbers).await?,
        (false, false) => revert(s3, completion).await?,
        (false, true) => finish(s3, completion, &[]).await?,
    }
    Ok(body.map(|body| if linked { body } else { Vec::new() }))
}

/// The blobs the completion's name is made of now (after a fence), whatever linked it: a held
/// parts record the name points at is kept, any other tombstoned.
async fn linked_body(s3: &Larder, completion: &Completion<'_>) -> Result<Vec<String>, S3Error> {
    let (bucket, key) = (completion.bucket, completion.key);
    match objects::touch(s3, bucket, key).await {
        Err(S3Error::NoSuchBucket) => return Ok(Vec::new()),
        other => other?,
    }
    match s3.current(bucket, key).await {
        Err(S3Error::NoSuchBucket) | Ok(None) => Ok(Vec::new()),
        Err(err) => Err(err),
        Ok(Some(entry)) => Ok(entry.body.into_iter().map(|p| p.blob).collect()),
    }
}

/// A Complete sent again after it succeeded (an SDK retrying after a lost answer): S3 answers
/// it with the object again. The upload's record is gone, so the object named is recognised by
/// its ETag, which the parts' ETags in the request determine.
async fn already_completed(
    s3: &Larder,
    finishing: &Finishing<'_>,
    chosen: &[CompletedPart],
) -> Result<(String, Option<ObjectChecksum>), S3Error> {
    check_id(finishing.id)?;
    let md5s: Option<Vec<(u32, UploadedPart)>> = chosen
        .iter()
        .map(|part| {
            let md5 = part.e_tag.as_ref()?.value().to_owned();
            let number = u32::try_from(part.part_number.unwrap_or(0)).ok()?;
            let part = UploadedPart {
                blob: String::new(),
                size: 0,
                md5,
                modified_ms: 0,
                checksum: None,
            };
            Some((number, part))
        })
        .collect();
    let md5s = md5s
        .filter(|m| !m.is_empty())
        .ok_or(S3Error::NoSuchUpload)?;
    let etag = multipart_etag(&md5s);
    match s3.current(finishing.bucket, finishing.key).await? {
        Some(entry) if entry.etag == etag => Ok((etag, entry.checksum.clone())),
        _ => Err(S3Error::NoSuchUpload),
    }
}

/// A new upload's record.
pub fn new_upload(
    key: String,
    content_type: Option<String>,
    (meta, headers): (Vec<(String, String)>, ObjectHeaders),
    (public_read, tags): (Option<bool>, crate::tagging::Tags),
    checksum: Option<UploadChecksum>,
) -> Upload {
    Upload {
        v: FORMAT,
        key,
        created_ms: now_ms(),
        content_type,
        meta: meta.into_iter().collect(),
        headers,
        public_read,
        tags,
        checksum,
        parts: Default::default(),
        completing: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole-object checksum sent with Complete: taken when it is what the parts make (a
    /// COMPOSITE one with or without its `-<parts>`), refused otherwise, and refused for an
    /// upload made without an algorithm.
    #[test]
    fn a_sent_whole_checksum_must_be_the_one_the_parts_make() {
        use crate::checksums::Algorithm;
        let sum = |algorithm, value: &str| ObjectChecksum {
            algorithm,
            value: value.into(),
        };
        let made = sum(Algorithm::Crc32, "AAAAAA==-2");
        let check = |sent| check_sent_checksum(Some(&made), Some(&sent));
        assert!(check(sum(Algorithm::Crc32, "AAAAAA==-2")).is_ok());
        assert!(check(sum(Algorithm::Crc32, "AAAAAA==")).is_ok());
        assert!(matches!(
            check(sum(Algorithm::Crc32, "AAAAAQ==")),
            Err(S3Error::BadChecksum(_))
        ));
        assert!(matches!(
            check(sum(Algorithm::Crc32c, "AAAAAA==")),
            Err(S3Error::InvalidRequest(_))
        ));
        let sent = sum(Algorithm::Crc32, "AAAAAA==");
        assert!(matches!(
            check_sent_checksum(None, Some(&sent)),
            Err(S3Error::InvalidRequest(_))
        ));
        assert!(check_sent_checksum(None, None).is_ok());
    }

    #[test]
    fn a_completion_token_goes_stale_long_after_any_request_ends() {
        let token = |age_ms: u64| Completing {
            token: "t".into(),
            parts: vec![1],
            since_ms: now_ms().saturating_sub(age_ms),
        };
        assert!(!is_stale(&token(0)));
        assert!(
            !is_stale(&token(60_000)),
            "a minute: a slow request may still link"
        );
        assert!(is_stale(&token(STALE_COMPLETION_MS + 1_000)));
        let from_the_future = Completing {
            since_ms: now_ms() + 3_600_000,
            ..token(0)
        };
        assert!(
            !is_stale(&from_the_future),
            "a clock stepped back ages nothing"
        );
    }

    #[test]
    fn the_multipart_etag_is_the_md5_of_the_part_md5s() {
        // Two parts "a" and "b": md5(md5("a") ++ md5("b")) with "-2", as S3 computes it.
        let part = |md5: &str| UploadedPart {
            blob: String::new(),
            size: 1,
            md5: md5.into(),
            modified_ms: 0,
            checksum: None,
        };
        let parts = [
            (1, part("0cc175b9c0f1b6a831c399e269772661")),
            (2, part("92eb5ffee6ae2fec3ad71c777531578f")),
        ];
        let mut md5 = Md5::new();
        md5.update(unhex("0cc175b9c0f1b6a831c399e269772661"));
        md5.update(unhex("92eb5ffee6ae2fec3ad71c777531578f"));
        let expected = format!("{}-2", blobs::hex(&md5.finalize()));
        assert_eq!(multipart_etag(&parts), expected);
        assert_eq!(unhex("0cc1").as_slice(), [0x0c, 0xc1]);
    }

    #[test]
    fn parts_must_ascend_exist_match_and_be_large_enough() {
        let mut upload = new_upload(
            "k".into(),
            None,
            Default::default(),
            Default::default(),
            None,
        );
        for (n, size) in [(1, MIN_PART_SIZE), (2, 1), (3, 1)] {
            upload.parts.insert(
                n,
                UploadedPart {
                    blob: String::new(),
                    size,
                    md5: format!("{n:032}"),
                    modified_ms: 0,
                    checksum: None,
                },
            );
        }
        let part = |n: i32| CompletedPart {
            part_number: Some(n),
            e_tag: Some(ETag::Strong(format!("{n:032}"))),
            ..Default::default()
        };
        assert!(select(&upload, &[part(1), part(2)]).is_ok());
        // Listed twice in a row: the last listing counts, the first is not checked.
        let stale = CompletedPart {
            e_tag: Some(ETag::Strong(format!("{:032}", 9))),
            ..part(1)
        };
        let chosen = select(&upload, &[stale.clone(), part(1), part(2)]).unwrap();
        assert_eq!(chosen.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [1, 2]);
        assert!(matches!(
            select(&upload, &[part(1), stale]),
            Err(S3Error::InvalidPart)
        ));
        assert!(matches!(
            select(&upload, &[part(2), part(1), part(1)]),
            Err(S3Error::InvalidPartOrder)
        ));
        assert!(matches!(
            select(&upload, &[part(2), part(1)]),
            Err(S3Error::InvalidPartOrder)
        ));
        assert!(matches!(
            select(&upload, &[part(1), part(4)]),
            Err(S3Error::InvalidPart)
        ));
        assert!(matches!(
            select(&upload, &[part(2), part(3)]),
            Err(S3Error::EntityTooSmall(_))
        ));
        assert!(matches!(
            select(&upload, &[]),
            Err(S3Error::MalformedXml(_))
        ));
        let mut wrong = part(1);
        wrong.e_tag = Some(ETag::Strong("nope".into()));
        assert!(matches!(
            select(&upload, &[wrong]),
            Err(S3Error::InvalidPart)
        ));
    }
}
