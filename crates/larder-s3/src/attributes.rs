//! GetObjectAttributes: an object's ETag, checksum, size, storage class and, for a multipart
//! object, its parts (paged by `x-amz-max-parts` and `x-amz-part-number-marker`), without its
//! body. Only the attributes asked for are answered.

use std::sync::Arc;

use larder_router::Router;
use s3s::dto::{
    ETag, GetObjectAttributesInput, GetObjectAttributesOutput, GetObjectAttributesParts,
    ObjectAttributes, ObjectPart, StorageClass,
};

use crate::blobs;
use crate::checksums::ObjectChecksum;
use crate::error::S3Error;
use crate::records::ObjectEntry;

/// S3's default and largest page of parts.
const MAX_PARTS: usize = 1_000;

/// The answer for `entry`, the current entry of the input's name.
pub async fn answer(
    router: &Arc<Router>,
    input: &GetObjectAttributesInput,
    entry: &ObjectEntry,
) -> Result<GetObjectAttributesOutput, S3Error> {
    // One header of comma-separated names, as SDKs send it, or one header per name.
    let asked = |name: &str| {
        let mut names = input
            .object_attributes
            .iter()
            .flat_map(|a| a.as_str().split(','));
        names.any(|n| n.trim().eq_ignore_ascii_case(name))
    };
    let mut output = GetObjectAttributesOutput::default();
    if asked(ObjectAttributes::ETAG) {
        output.e_tag = Some(ETag::Strong(entry.etag.clone()));
    }
    if asked(ObjectAttributes::CHECKSUM) {
        output.checksum = entry.checksum.as_ref().map(|c| c.to_dto());
    }
    if asked(ObjectAttributes::OBJECT_SIZE) {
        output.object_size = i64::try_from(entry.size).ok();
    }
    if asked(ObjectAttributes::STORAGE_CLASS) {
        output.storage_class = Some(StorageClass::from_static(StorageClass::STANDARD));
    }
    if asked(ObjectAttributes::OBJECT_PARTS) {
        if let Some(parts) = parts(router, entry).await? {
            output.object_parts = Some(page(&parts, input.part_number_marker, input.max_parts)?);
        }
    }
    Ok(output)
}

/// The sizes of a multipart object's parts, in order, with each one's checksum when its parts
/// record keeps them (version 3); `None` for an object of one PUT (S3 answers no parts for
/// it). The parts are those of the object's parts record, or its entry's own pieces (entries
/// written before parts records).
async fn parts(
    router: &Arc<Router>,
    entry: &ObjectEntry,
) -> Result<Option<Vec<(u64, Option<ObjectChecksum>)>>, S3Error> {
    let multipart = entry
        .etag
        .rsplit_once('-')
        .is_some_and(|(_, count)| count.parse::<u32>().is_ok());
    if !multipart {
        return Ok(None);
    }
    let parts = match blobs::parts_of(router, &entry.body).await? {
        Some(record) => (record.parts.iter().enumerate())
            .map(|(i, p)| (p.size, ObjectChecksum::of_part(&record, i + 1)))
            .collect(),
        None => entry.body.iter().map(|p| (p.size, None)).collect(),
    };
    Ok(Some(parts))
}

/// The page of parts after part number `marker` (0 when absent), of at most `max` parts.
fn page(
    sizes: &[(u64, Option<ObjectChecksum>)],
    marker: Option<i32>,
    max: Option<i32>,
) -> Result<GetObjectAttributesParts, S3Error> {
    let marker = marker.unwrap_or(0);
    let after = usize::try_from(marker)
        .map_err(|_| S3Error::InvalidArgument("part-number-marker must not be negative".into()))?;
    let max_parts = match max {
        None => MAX_PARTS,
        Some(n) => usize::try_from(n)
            .map_err(|_| S3Error::InvalidArgument("max-parts must not be negative".into()))?
            .min(MAX_PARTS),
    };
    let end = after.saturating_add(max_parts).min(sizes.len());
    let start = after.min(end);
    let parts: Vec<ObjectPart> = (start..end)
        .map(|i| {
            let (size, checksum) = &sizes[i];
            let dto = checksum
                .as_ref()
                .map(ObjectChecksum::to_dto)
                .unwrap_or_default();
            ObjectPart {
                part_number: i32::try_from(i + 1).ok(),
                size: i64::try_from(*size).ok(),
                checksum_crc32: dto.checksum_crc32,
                checksum_crc32c: dto.checksum_crc32c,
                checksum_crc64nvme: dto.checksum_crc64nvme,
                checksum_sha1: dto.checksum_sha1,
                checksum_sha256: dto.checksum_sha256,
            }
        })
        .collect();
    let truncated = end < sizes.len();
    Ok(GetObjectAttributesParts {
        is_truncated: Some(truncated),
        max_parts: i32::try_from(max_parts).ok(),
        next_part_number_marker: i32::try_from(end).ok(),
        part_number_marker: Some(marker),
        parts: Some(parts),
        total_parts_count: i32::try_from(sizes.len()).ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(page: &GetObjectAttributesParts) -> Vec<i32> {
        let parts = page.parts.as_ref().unwrap();
        parts.iter().map(|p| p.part_number.unwrap()).collect()
    }

    #[test]
    fn parts_are_paged_after_the_marker() {
        let sizes = [5, 5, 5, 5, 5, 3].map(|size| (size, None));
        let first = page(&sizes, None, None).unwrap();
        assert_eq!(numbers(&first), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(first.is_truncated, Some(false));
        assert_eq!(first.total_parts_count, Some(6));
        let one = page(&sizes, Some(3), Some(1)).unwrap();
        assert_eq!(numbers(&one), vec![4]);
        assert_eq!(one.is_truncated, Some(true));
        assert_eq!(one.next_part_number_marker, Some(4));
        let rest = page(&sizes, Some(4), Some(10)).unwrap();
        assert_eq!(numbers(&rest), vec![5, 6]);
        assert_eq!(rest.is_truncated, Some(false));
        assert_eq!(rest.parts.unwrap()[1].size, Some(3));
        let past = page(&sizes, Some(i32::MAX), Some(i32::MAX)).unwrap();
        assert!(numbers(&past).is_empty());
        assert!(page(&sizes, Some(-1), None).is_err());
        assert!(page(&sizes, None, Some(-1)).is_err());
    }
}
