//! The source of a CopyObject or an UploadPartCopy: the key that reads it, its conditions
//! (`x-amz-copy-source-if-*`) and, for a part, the bytes it names (`x-amz-copy-source-range`).

use std::ops::Range;

use s3s::auth::Credentials;
use s3s::dto::CopySource;

use crate::conditions::Conditions;
use crate::error::S3Error;
use crate::records::ObjectEntry;
use crate::service::Larder;

/// S3's bound on the bytes one UploadPartCopy copies (5 GiB).
pub const MAX_COPY_PART: u64 = 5 << 30;

/// The entry of the copy's source object `(bucket, key)` (as `name` reads it), once the
/// caller's key may read its bucket and `conditions` (its `x-amz-copy-source-if-*` headers)
/// hold: s3s checked only the destination.
pub async fn read(
    s3: &Larder,
    credentials: Option<&Credentials>,
    (bucket, key): (&str, &str),
    conditions: Conditions<'_>,
) -> Result<ObjectEntry, s3s::S3Error> {
    let readable = match credentials {
        Some(c) => s3
            .keys
            .get(&c.access_key)
            .await?
            .and_then(|k| k.permission(bucket)),
        None => None,
    };
    if readable.is_none() {
        return Err(s3s::s3_error!(
            AccessDenied,
            "This key may not read bucket {bucket}"
        ));
    }
    let entry = s3.entry(bucket, key).await?;
    conditions.check_copy_source(&entry)?;
    Ok(entry)
}

/// The source's bucket and key. s3s decodes the whole header before it looks for
/// `?versionId=`, so a key with an encoded `?` (`%3F`) loses its end there; the raw header is
/// read again here, split at a literal `?` first, then decoded.
pub fn name(
    parsed: &CopySource,
    raw: Option<&http::HeaderValue>,
) -> Result<(String, String), S3Error> {
    let CopySource::Bucket { bucket, key, .. } = parsed else {
        return Err(S3Error::InvalidArgument(
            "copy sources are bucket/key".into(),
        ));
    };
    let Some(raw) = raw.and_then(|r| r.to_str().ok()) else {
        return Ok((bucket.to_string(), key.to_string()));
    };
    let path = raw.split_once('?').map_or(raw, |(path, _)| path);
    let path = path.strip_prefix('/').unwrap_or(path);
    let decoded = path
        .split_once('/')
        .and_then(|(b, k)| Some((larder_proto::percent_decode(b, false)?, k)))
        .and_then(|(b, k)| Some((b, larder_proto::percent_decode(k, false)?)));
    match decoded {
        Some((b, k)) if b == **bucket && !k.is_empty() => Ok((b, k)),
        _ => Ok((bucket.to_string(), key.to_string())),
    }
}

/// The bytes an UploadPartCopy takes from a source of `size` bytes: all of it without a range,
/// else exactly `bytes=<first>-<last>` (S3 takes no other form: a suffix, an open end or
/// several ranges are 400 `InvalidArgument`), which must lie within the source
/// (`InvalidRange`). At most `MAX_COPY_PART` bytes either way.
pub fn part_range(header: Option<&str>, size: u64) -> Result<Range<u64>, S3Error> {
    let range = match header {
        None => 0..size,
        Some(text) => {
            let (first, last) = parse_range(text).ok_or_else(|| {
                S3Error::InvalidArgument(format!(
                    "The x-amz-copy-source-range value must be of the form bytes=first-last \
                     where first and last are the zero-based offsets of the first and last \
                     bytes to copy (got {:?})",
                    text.chars().take(64).collect::<String>()
                ))
            })?;
            if last >= size {
                return Err(S3Error::InvalidRange);
            }
            first..last + 1
        }
    };
    if range.end - range.start > MAX_COPY_PART {
        return Err(S3Error::InvalidArgument(format!(
            "The specified copy source is larger than the maximum allowable size for a copy \
             source: {MAX_COPY_PART}"
        )));
    }
    Ok(range)
}

/// `bytes=<first>-<last>` with `first <= last`, both plain decimal numbers.
fn parse_range(text: &str) -> Option<(u64, u64)> {
    let (first, last) = text.strip_prefix("bytes=")?.split_once('-')?;
    let number = |s: &str| {
        let digits = !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
        digits.then(|| s.parse::<u64>().ok()).flatten()
    };
    let (first, last) = (number(first)?, number(last)?);
    (first <= last).then_some((first, last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_key_keeps_its_encoded_question_mark() {
        let raw = |s: &'static str| http::HeaderValue::from_static(s);
        let parsed = CopySource::parse("bkt/%3FversionId").unwrap();
        let name = |header| name(&parsed, Some(&raw(header))).unwrap();
        assert_eq!(
            name("bkt/%3FversionId"),
            ("bkt".into(), "?versionId".into())
        );
        assert_eq!(name("/bkt/%3FversionId?versionId=null").1, "?versionId");
        let spaced = CopySource::parse("bkt/a%20b").unwrap();
        let got = super::name(&spaced, Some(&raw("bkt/a%20b"))).unwrap();
        assert_eq!(got, ("bkt".into(), "a b".into()));
        // What s3s parsed stands when the header says otherwise (it is what s3s checked).
        let got = super::name(&spaced, Some(&raw("other-bucket/a%20b"))).unwrap();
        assert_eq!(got, ("bkt".into(), "a b".into()));
    }

    #[test]
    fn only_a_closed_range_within_the_source_is_taken() {
        assert_eq!(part_range(None, 10).unwrap(), 0..10);
        assert_eq!(part_range(Some("bytes=0-9"), 10).unwrap(), 0..10);
        assert_eq!(part_range(Some("bytes=3-3"), 10).unwrap(), 3..4);
        assert!(matches!(
            part_range(Some("bytes=0-21"), 5),
            Err(S3Error::InvalidRange)
        ));
        // The forms ceph's s3-tests send and S3 refuses as InvalidArgument.
        for bad in [
            "0-2",
            "bytes=0",
            "bytes=hello-world",
            "bytes=0-bar",
            "bytes=hello-",
            "bytes=0-2,3-5",
            "bytes=-3",
            "bytes=3-",
            "bytes=5-2",
            "bytes=+1-2",
            "bytes=99999999999999999999-99999999999999999999",
        ] {
            assert!(
                matches!(part_range(Some(bad), 10), Err(S3Error::InvalidArgument(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_part_copies_at_most_five_gibibytes() {
        assert!(part_range(None, MAX_COPY_PART).is_ok());
        assert!(matches!(
            part_range(None, MAX_COPY_PART + 1),
            Err(S3Error::InvalidArgument(_))
        ));
        let too_long = format!("bytes=0-{MAX_COPY_PART}");
        assert!(part_range(Some(&too_long), u64::MAX).is_err());
    }

    proptest! {
        /// Any header text: an answer without panicking, and a range taken lies within the
        /// source and is never empty.
        #[test]
        fn any_header_is_answered_within_the_source(text in ".{0,80}", size in 0u64..u64::MAX) {
            if let Ok(range) = part_range(Some(&text), size) {
                prop_assert!(range.start < range.end && range.end <= size);
                prop_assert!(range.end - range.start <= MAX_COPY_PART);
            }
        }

        #[test]
        fn every_closed_range_within_the_source_is_taken(first in 0u64..1 << 40, len in 1u64..=MAX_COPY_PART) {
            let last = first + len - 1;
            let range = part_range(Some(&format!("bytes={first}-{last}")), last + 1).unwrap();
            prop_assert_eq!(range, first..last + 1);
        }
    }
}
