//! Multipart uploads. An upload is a record (`larder-s3:upload:<bucket>:<id>`) listing its
//! parts; each part is stored like a PutObject body (a blob, chunked when large, never held
//! whole). Completing writes the object's entry with the chosen parts as its pieces in order
//! (parts differ in size, so the entry lists them instead of one composite manifest), after
//! removing the upload record: a crash in between leaks the parts' blobs, it never lets an
//! abort tombstone the bytes of a completed object.

use md5::{Digest, Md5};
use rand::distr::{Alphanumeric, SampleString};
use s3s::dto::{CompletedPart, ETag};

use crate::blobs;
use crate::conditions::WriteConditions;
use crate::error::S3Error;
use crate::index_batch::ChangeFailed;
use crate::objects;
use crate::records::{
    bucket_doc, upload_doc, uploads_doc, BucketIndex, ObjectEntry, Piece, Upload, UploadList,
    UploadedPart, FORMAT,
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
            match abort(s3, bucket, key, id).await {
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
pub async fn complete(
    s3: &Larder,
    finishing: &Finishing<'_>,
    chosen: &[CompletedPart],
    conditions: &WriteConditions,
) -> Result<String, S3Error> {
    let Finishing { bucket, key, id } = *finishing;
    // Checked before anything changes, so a bad request (or a condition that fails now) leaves
    // the upload as it was. The conditions are decided again when the name is linked; if they
    // fail only then (a write to the name in between), the upload is gone and its parts go.
    let upload = match read(s3, bucket, key, id).await {
        Err(S3Error::NoSuchUpload) => return already_completed(s3, finishing, chosen).await,
        other => other?,
    };
    select(&upload, chosen)?;
    if *conditions != WriteConditions::default() {
        let current = s3.current(bucket, key).await?;
        conditions.check(current.as_ref())?;
    }
    let upload = take(s3, bucket, key, id).await?;
    let parts = select(&upload, chosen)?;
    let etag = multipart_etag(&parts);
    let used: std::collections::HashSet<u32> = parts.iter().map(|(n, _)| *n).collect();
    let entry = ObjectEntry {
        size: parts.iter().map(|(_, p)| p.size).sum(),
        body: parts
            .into_iter()
            .map(|(_, p)| Piece {
                blob: p.blob,
                size: p.size,
            })
            .collect(),
        etag: etag.clone(),
        modified_ms: now_ms(),
        content_type: upload.content_type.clone(),
        meta: upload.meta.clone(),
        // Parts are checked one by one; S3's composite checksums of parts are not kept.
        checksum: None,
    };
    let unused = upload
        .parts
        .into_iter()
        .filter(|(n, _)| !used.contains(n))
        .map(|(_, p)| p)
        .collect();
    drop_parts(s3, unused);
    unlist(s3, bucket, key, id).await;
    if let Err(failed) = objects::link(s3, bucket, key, entry.clone(), conditions).await {
        if failed.may_have_applied {
            // The name may point at these parts (see `Larder::drop_unlinked`).
            tracing::warn!(
                bucket,
                key,
                "completing an upload: the link got no answer; its parts are kept"
            );
            return Err(failed.error);
        }
        let parts = entry
            .body
            .into_iter()
            .map(|p| UploadedPart {
                blob: p.blob,
                size: p.size,
                md5: String::new(),
                modified_ms: 0,
            })
            .collect();
        drop_parts(s3, parts);
        return Err(failed.error);
    }
    Ok(etag)
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
