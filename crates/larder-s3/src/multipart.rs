//! Multipart uploads. An upload is a record (`larder-s3:upload:<bucket>:<id>`) listing its
//! parts; each part is stored like a PutObject body (a blob, chunked when large, never held
//! whole). Completing writes the object's entry with the chosen parts as its pieces in order
//! (parts differ in size, so the entry lists them instead of one composite manifest). The
//! record stays, marked as completing, until the link is settled (`complete`): no crash leaks
//! the parts, and no Abort tombstones the bytes of a completed object.

use larder_router::JournalEntry;
use md5::{Digest, Md5};
use rand::distr::{Alphanumeric, SampleString};
use s3s::dto::{CompletedPart, ETag};

use crate::blobs;
use crate::conditions::WriteConditions;
use crate::error::S3Error;
use crate::held::{Held, HeldFor};
use crate::index_batch::ChangeFailed;
use crate::objects;
use crate::records::{
    bucket_doc, upload_doc, uploads_doc, BucketIndex, Completing, ObjectEntry, Piece, Upload,
    UploadList, UploadedPart, FORMAT,
};
use crate::service::{now_ms, Larder};
use crate::store::Change;
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
        .read::<BucketIndex>(&bucket_doc(bucket))
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
/// (DeleteBucket, after the bucket's index is gone).
pub async fn abort_all(s3: &Larder, bucket: &str) -> Result<(), S3Error> {
    let Some(list) = s3.records.read::<UploadList>(&uploads_doc(bucket)).await? else {
        return Ok(());
    };
    for (key, ids) in &list.uploads {
        for id in ids.keys() {
            match abort_even_completing(s3, bucket, key, id).await {
                Ok(()) | Err(S3Error::NoSuchUpload) => {}
                Err(err) => return Err(err),
            }
        }
    }
    // Entries whose upload was already finished (a failed unlist) go with the list, so that a
    // bucket made again with this name starts with none.
    s3.records
        .update(&uploads_doc(bucket), |_: Option<UploadList>| {
            Ok((Change::Remove, ()))
        })
        .await
}

/// Aborts upload `id` of a bucket whose index is gone, settling a completion first: its link
/// can no longer land (the name's bucket is gone), so the settlement gives the upload back.
async fn abort_even_completing(
    s3: &Larder,
    bucket: &str,
    key: &str,
    id: &str,
) -> Result<(), S3Error> {
    if let Some(completing) = read(s3, bucket, key, id).await?.completing {
        settle_completion(s3, bucket, id, &completing.token).await?;
    }
    abort(s3, bucket, key, id).await
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
        return Err(match is_stale(&completing) {
            true => settle_stale(s3, bucket, id, &completing).await,
            false => completion_under_way(),
        });
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

/// The parts `chosen` names, in order, checked against what was uploaded.
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
    for part in chosen {
        let number = check_part_number(part.part_number.unwrap_or(0))?;
        if out.last().is_some_and(|(last, _)| *last >= number) {
            return Err(S3Error::InvalidPartOrder);
        }
        let uploaded = upload.parts.get(&number).ok_or(S3Error::InvalidPart)?;
        let tag = part.e_tag.as_ref().map(ETag::value);
        if tag.is_some_and(|t| t != uploaded.md5) {
            return Err(S3Error::InvalidPart);
        }
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
/// The upload's record stays until the object is known to be linked. First a journal entry
/// for the completion (`held.rs`), then a token in the record (`Completing`: from then on no
/// Abort, UploadPart or other Complete changes it), then the link. Linked: the record goes and
/// the parts the object does not use are tombstoned. Refused: the token goes, and the upload
/// is as it was (the client may try again, or abort). No answer, or a crash anywhere: the
/// entry is settled (`settle_completion`), here in the background or at the next start;
/// without the entry (no journal, a frontend that never came back), by the next Complete or
/// Abort once the token is `STALE_COMPLETION` old.
pub async fn complete(
    s3: &Larder,
    finishing: &Finishing<'_>,
    chosen: &[CompletedPart],
    conditions: &WriteConditions,
) -> Result<String, S3Error> {
    let Finishing { bucket, key, id } = *finishing;
    // Checked before anything changes, so a bad request (or a condition that fails now) leaves
    // the upload as it was. The conditions are decided again when the name is linked.
    let upload = match read(s3, bucket, key, id).await {
        Err(S3Error::NoSuchUpload) => return already_completed(s3, finishing, chosen).await,
        other => other?,
    };
    if let Some(completing) = &upload.completing {
        return match is_stale(completing) {
            true => Err(settle_stale(s3, bucket, id, completing).await),
            // Another Complete links it now (or this one's earlier attempt still does).
            false => already_completed(s3, finishing, chosen)
                .await
                .map_err(|_| completion_under_way()),
        };
    }
    select(&upload, chosen)?;
    if *conditions != WriteConditions::default() {
        let current = s3.current(bucket, key).await?;
        conditions.check(current.as_ref())?;
    }
    let token = Alphanumeric.sample_string(&mut rand::rng(), TOKEN_LEN);
    let held_for = HeldFor::Completion {
        bucket: bucket.to_owned(),
        upload: id.to_owned(),
        token: token.clone(),
    };
    let journal = hold_completion(s3, &held_for).await?;
    // In a task of its own from here: a client that hangs up does not leave a token behind.
    let (s3, conditions) = (s3.clone(), conditions.clone());
    let (bucket, key, id) = (bucket.to_owned(), key.to_owned(), id.to_owned());
    let chosen = chosen.to_vec();
    let task = tokio::spawn(async move {
        let finishing = Finishing {
            bucket: &bucket,
            key: &key,
            id: &id,
        };
        let linked = mark_and_link(&s3, &finishing, &chosen, &token, &conditions).await;
        let settled = match &linked {
            Ok(_) => finish(&s3, &finishing, &token).await,
            Err(failed) if !failed.may_have_applied => revert(&s3, &finishing, &token).await,
            Err(_) => Err(S3Error::Unavailable("the link got no answer".into())),
        };
        match (settled, journal) {
            (Ok(()), Some(entry)) => Held::new(Some(entry)).linked(),
            (Ok(()), None) => {}
            (Err(err), entry) => {
                tracing::warn!(bucket, upload = id, %err, "a completion is settled later");
                Held::new(entry).unknown(&s3, held_for);
            }
        }
        linked.map_err(|failed| failed.error)
    });
    task.await
        .map_err(|e| S3Error::Internal(format!("the completion's task ended: {e}")))?
}

/// Length of a completion's token (letters and digits).
const TOKEN_LEN: usize = 16;

/// A completion token this old has no request of its frontend in flight (every operation
/// ends within its deadline, seconds): its frontend died and nothing will settle it but the
/// next Complete or Abort of the upload.
const STALE_COMPLETION: std::time::Duration = std::time::Duration::from_secs(600);

fn is_stale(completing: &Completing) -> bool {
    let age = now_ms().saturating_sub(completing.since_ms);
    age > STALE_COMPLETION.as_millis() as u64
}

fn completion_under_way() -> S3Error {
    S3Error::OperationAborted("a CompleteMultipartUpload of this upload is under way".into())
}

/// Settles a stale completion (`STALE_COMPLETION`) found by a request, which is then answered
/// with an error that tells the client to try again.
async fn settle_stale(s3: &Larder, bucket: &str, id: &str, completing: &Completing) -> S3Error {
    tracing::warn!(
        bucket,
        upload = id,
        "settling a completion its frontend left"
    );
    match settle_completion(s3, bucket, id, &completing.token).await {
        Ok(()) => S3Error::OperationAborted(
            "an earlier CompleteMultipartUpload of this upload was just settled; try again".into(),
        ),
        Err(err) => err,
    }
}

/// The journal entry of a completion, synced (`None` without a journal).
async fn hold_completion(s3: &Larder, held_for: &HeldFor) -> Result<Option<JournalEntry>, S3Error> {
    let Some(entry) = s3.router().begin_journal_entry()? else {
        return Ok(None);
    };
    let held = entry.hold_durably(&held_for.name()).await;
    held.map_err(|e| S3Error::Unavailable(format!("cannot write the upload journal: {e}")))?;
    Ok(Some(entry))
}

/// Writes `token` into the upload's record (with the parts chosen), then links the object.
async fn mark_and_link(
    s3: &Larder,
    finishing: &Finishing<'_>,
    chosen: &[CompletedPart],
    token: &str,
    conditions: &WriteConditions,
) -> Result<String, ChangeFailed> {
    let Finishing { bucket, key, id } = *finishing;
    let mut uncertain = false;
    let marked = s3
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
                let parts = select(&upload, chosen)?;
                upload.completing = Some(Completing {
                    token: token.to_owned(),
                    parts: parts.iter().map(|(n, _)| *n).collect(),
                    since_ms: now_ms(),
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
    let etag = multipart_etag(&parts);
    crate::held::crash_point("before-complete-link");
    objects::link(
        s3,
        bucket,
        key,
        object_entry(upload, parts, &etag),
        conditions,
    )
    .await?;
    crate::held::crash_point("after-complete-link");
    Ok(etag)
}

/// The object's entry: the chosen parts as its pieces, in order.
fn object_entry(upload: Upload, parts: Vec<(u32, UploadedPart)>, etag: &str) -> ObjectEntry {
    ObjectEntry {
        size: parts.iter().map(|(_, p)| p.size).sum(),
        body: parts
            .into_iter()
            .map(|(_, p)| Piece {
                blob: p.blob,
                size: p.size,
            })
            .collect(),
        etag: etag.to_owned(),
        modified_ms: now_ms(),
        content_type: upload.content_type,
        meta: upload.meta,
        // Parts are checked one by one; S3's composite checksums of parts are not kept.
        checksum: None,
    }
}

/// The object is linked: the record goes (if it still holds `token`), the parts the object
/// does not use are tombstoned, and the upload leaves the bucket's list.
async fn finish(s3: &Larder, finishing: &Finishing<'_>, token: &str) -> Result<(), S3Error> {
    let Finishing { bucket, key, id } = *finishing;
    let taken = s3
        .records
        .update(&upload_doc(bucket, id), |upload: Option<Upload>| {
            Ok(match upload.filter(|u| holds_token(u, token)) {
                Some(upload) => (Change::Remove, Some(upload)),
                None => (Change::Keep, None),
            })
        })
        .await?;
    let Some(mut upload) = taken else {
        return Ok(());
    };
    let used = upload
        .completing
        .take()
        .map(|c| c.parts)
        .unwrap_or_default();
    upload.parts.retain(|n, _| !used.contains(n));
    for part in upload.parts.into_values() {
        if let Err(err) = blobs::delete(s3.router(), &part.blob).await {
            tracing::warn!(%err, blob = part.blob, "a part the object does not use was not tombstoned");
        }
    }
    unlist(s3, bucket, key, id).await;
    Ok(())
}

/// The object was not linked: the token goes, and the upload is as it was.
async fn revert(s3: &Larder, finishing: &Finishing<'_>, token: &str) -> Result<(), S3Error> {
    s3.records
        .update(
            &upload_doc(finishing.bucket, finishing.id),
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

/// Settles the completion that wrote `token` into upload `id`'s record, if the record still
/// holds it. First a fence, a write of the record as it is; then a fence of the object's name
/// (`objects::touch`: no link based on an earlier state of its index applies after it), and a
/// read of it. Linked to one of the chosen parts: finish; otherwise: revert.
pub async fn settle_completion(
    s3: &Larder,
    bucket: &str,
    id: &str,
    token: &str,
) -> Result<(), S3Error> {
    let found = s3
        .records
        .update(&upload_doc(bucket, id), |upload: Option<Upload>| {
            Ok(match upload.filter(|u| holds_token(u, token)) {
                Some(upload) => (Change::Put(upload.clone()), Some(upload)),
                None => (Change::Keep, None),
            })
        })
        .await?;
    let Some(upload) = found else {
        return Ok(()); // never marked, or settled already
    };
    let key = upload.key.clone();
    let chosen: Vec<String> = upload
        .completing
        .iter()
        .flat_map(|c| c.parts.iter())
        .filter_map(|n| upload.parts.get(n).map(|p| p.blob.clone()))
        .collect();
    let linked = match objects::touch(s3, bucket, &key).await {
        Err(S3Error::NoSuchBucket) => false,
        Err(err) => return Err(err),
        Ok(()) => match s3.current(bucket, &key).await {
            Err(S3Error::NoSuchBucket) => false,
            other => other?.is_some_and(|e| e.body.iter().any(|p| chosen.contains(&p.blob))),
        },
    };
    let finishing = Finishing {
        bucket,
        key: &key,
        id,
    };
    match linked {
        true => finish(s3, &finishing, token).await,
        false => revert(s3, &finishing, token).await,
    }
}

/// A Complete sent again after it succeeded (an SDK retrying after a lost answer): S3 answers
/// it with the object again. The upload's record is gone, so the object named is recognised by
/// its ETag, which the parts' ETags in the request determine.
async fn already_completed(
    s3: &Larder,
    finishing: &Finishing<'_>,
    chosen: &[CompletedPart],
) -> Result<String, S3Error> {
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
            };
            Some((number, part))
        })
        .collect();
    let md5s = md5s
        .filter(|m| !m.is_empty())
        .ok_or(S3Error::NoSuchUpload)?;
    let etag = multipart_etag(&md5s);
    match s3.current(finishing.bucket, finishing.key).await? {
        Some(entry) if entry.etag == etag => Ok(etag),
        _ => Err(S3Error::NoSuchUpload),
    }
}

/// A new upload's record.
pub fn new_upload(
    key: String,
    content_type: Option<String>,
    meta: Vec<(String, String)>,
) -> Upload {
    Upload {
        v: FORMAT,
        key,
        created_ms: now_ms(),
        content_type,
        meta: meta.into_iter().collect(),
        parts: Default::default(),
        completing: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(is_stale(&token(
            STALE_COMPLETION.as_millis() as u64 + 1_000
        )));
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
        let mut upload = new_upload("k".into(), None, Vec::new());
        for (n, size) in [(1, MIN_PART_SIZE), (2, 1), (3, 1)] {
            upload.parts.insert(
                n,
                UploadedPart {
                    blob: String::new(),
                    size,
                    md5: format!("{n:032}"),
                    modified_ms: 0,
                },
            );
        }
        let part = |n: i32| CompletedPart {
            part_number: Some(n),
            e_tag: Some(ETag::Strong(format!("{n:032}"))),
            ..Default::default()
        };
        assert!(select(&upload, &[part(1), part(2)]).is_ok());
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
