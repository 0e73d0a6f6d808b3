//! Tags: a small set of key → value pairs. An object's are kept in its index entry, as S3
//! takes them (PutObjectTagging's XML, or the `x-amz-tagging` header of PutObject, CopyObject
//! and CreateMultipartUpload, URL-encoded like a query string) and answers them
//! (GetObjectTagging, and their count in GetObject's and HeadObject's `x-amz-tagging-count`).
//! A bucket's are kept in its root record (PutBucketTagging's XML, GetBucketTagging).
//!
//! S3's rules, checked before anything is stored (400 `InvalidTag` otherwise): at most 10 tags
//! on an object and 50 on a bucket, keys unique, of 1 to 128 characters and not starting with
//! `aws:`, values of at most 256, both of letters, digits, white space and `+ - = . _ : / @`.
//! And Larder's own: a bound on the bytes of keys and values together ([`Bounds::bytes`]), as
//! user metadata and the standard headers are bounded, since every GET and PUT in the object's
//! key range (every request to the bucket) reads its entry (root record); every tag set of
//! ASCII characters within S3's rules fits.

use std::collections::BTreeMap;

use s3s::dto::Tag;
use s3s::{s3_error, S3Result};

/// An object's tags, by key.
pub type Tags = BTreeMap<String, String>;

/// How many tags, and how many bytes of them, one holder takes.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Tags at most (S3's bound).
    pub tags: usize,
    /// Bytes of keys and values together at most (Larder's).
    pub bytes: usize,
    /// What holds them, for the error messages.
    holder: &'static str,
}

/// An object's: S3's 10 tags; 10 tags of S3's longest ASCII keys and values take 3,840 bytes.
pub const OBJECT: Bounds = Bounds {
    tags: MAX_TAGS,
    bytes: MAX_TAG_BYTES,
    holder: "Object",
};

/// A bucket's: S3's 50 tags; 50 of S3's longest ASCII keys and values take 19,200 bytes.
pub const BUCKET: Bounds = Bounds {
    tags: 50,
    bytes: 20 * 1024,
    holder: "Bucket",
};

/// Tags one object holds at most (S3's bound).
pub const MAX_TAGS: usize = 10;
/// Characters of a tag's key at most (S3's bound).
const MAX_KEY_CHARS: usize = 128;
/// Characters of a tag's value at most (S3's bound).
const MAX_VALUE_CHARS: usize = 256;
/// Bytes of an object's keys and values together at most (Larder's).
pub const MAX_TAG_BYTES: usize = 4096;
/// Bytes of an `x-amz-tagging` header read at most: past this it cannot hold a tag set within
/// the bounds above (each byte of a tag at most three when percent-encoded, plus separators).
const MAX_HEADER_BYTES: usize = 3 * MAX_TAG_BYTES + 2 * MAX_TAGS;

/// The tags of an `x-amz-tagging` header (`k1=v1&k2=v2`, URL-encoded), checked.
pub fn from_header(header: &str) -> S3Result<Tags> {
    if header.len() > MAX_HEADER_BYTES {
        return Err(s3_error!(
            InvalidTag,
            "x-amz-tagging is longer than any tag set allowed"
        ));
    }
    let pairs = form_urlencoded::parse(header.as_bytes())
        .filter(|(key, value)| !(key.is_empty() && value.is_empty()))
        .map(|(key, value)| (key.into_owned(), value.into_owned()));
    collect(pairs, OBJECT)
}

/// The tags of PutObjectTagging's (PutBucketTagging's) tag set, checked against `bounds`.
pub fn from_tag_set(set: &[Tag], bounds: Bounds) -> S3Result<Tags> {
    if set.len() > bounds.tags {
        return Err(too_many(bounds));
    }
    let mut pairs = Vec::with_capacity(set.len());
    for tag in set {
        let Some(key) = tag.key.clone() else {
            return Err(s3_error!(InvalidTag, "A tag has no key"));
        };
        pairs.push((key, tag.value.clone().unwrap_or_default()));
    }
    collect(pairs, bounds)
}

/// The tag set GetObjectTagging (GetBucketTagging) answers with, in key order.
pub fn to_tag_set(tags: &Tags) -> Vec<Tag> {
    tags.iter()
        .map(|(key, value)| Tag {
            key: Some(key.clone()),
            value: Some(value.clone()),
        })
        .collect()
}

/// `tags`' count as `x-amz-tagging-count` says it: none for an object without tags.
pub fn count(tags: &Tags) -> Option<i32> {
    (!tags.is_empty()).then(|| i32::try_from(tags.len()).unwrap_or(i32::MAX))
}

fn too_many(bounds: Bounds) -> s3s::S3Error {
    s3_error!(
        InvalidTag,
        "{} tags cannot be greater than {}",
        bounds.holder,
        bounds.tags
    )
}

fn collect(pairs: impl IntoIterator<Item = (String, String)>, bounds: Bounds) -> S3Result<Tags> {
    let mut tags = Tags::new();
    let mut bytes = 0usize;
    for (key, value) in pairs {
        if tags.len() == bounds.tags {
            return Err(too_many(bounds));
        }
        check_key(&key)?;
        check_value(&value)?;
        bytes = bytes.saturating_add(key.len()).saturating_add(value.len());
        if bytes > bounds.bytes {
            return Err(s3_error!(
                InvalidTag,
                "The tags take more than {} bytes together",
                bounds.bytes
            ));
        }
        if tags.insert(key, value).is_some() {
            return Err(s3_error!(
                InvalidTag,
                "Cannot provide multiple Tags with the same key"
            ));
        }
    }
    Ok(tags)
}

fn check_key(key: &str) -> S3Result<()> {
    let chars = key.chars().count();
    if chars == 0 || chars > MAX_KEY_CHARS {
        return Err(s3_error!(
            InvalidTag,
            "A tag's key must be 1 to {MAX_KEY_CHARS} characters long"
        ));
    }
    if key.to_ascii_lowercase().starts_with("aws:") {
        return Err(s3_error!(
            InvalidTag,
            "Tag keys beginning with aws: are reserved"
        ));
    }
    check_chars(key)
}

fn check_value(value: &str) -> S3Result<()> {
    if value.chars().count() > MAX_VALUE_CHARS {
        return Err(s3_error!(
            InvalidTag,
            "A tag's value must be at most {MAX_VALUE_CHARS} characters long"
        ));
    }
    check_chars(value)
}

fn check_chars(text: &str) -> S3Result<()> {
    let allowed = |c: char| c.is_alphanumeric() || c.is_whitespace() || "+-=._:/@".contains(c);
    match text.chars().all(allowed) {
        true => Ok(()),
        false => Err(s3_error!(
            InvalidTag,
            "Tags hold only letters, digits, white space and + - = . _ : / @"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(tags: &Tags) -> String {
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs(tags.iter())
            .finish()
    }

    #[test]
    fn a_header_gives_its_tags_and_bad_ones_are_refused() {
        let tags = from_header("Project=S3S&Environment=Test%20run&empty=").unwrap();
        assert_eq!(tags.len(), 3);
        assert_eq!(tags["Environment"], "Test run");
        assert_eq!(tags["empty"], "");
        assert_eq!(from_header("").unwrap(), Tags::new());
        for bad in [
            "a=1&a=2",
            "=value",
            "aws:x=1",
            "AWS:x=1",
            "k=%3Cscript%3E",
            &format!("{}=v", "k".repeat(129)),
            &format!("k={}", "v".repeat(257)),
            &(0..11)
                .map(|i| format!("k{i}=v"))
                .collect::<Vec<_>>()
                .join("&"),
            &"x".repeat(MAX_HEADER_BYTES + 1),
        ] {
            assert!(from_header(bad).is_err(), "{bad}");
        }
        // Ten tags of S3's longest keys and values fit.
        let longest: Tags = (0..10)
            .map(|i| (format!("{i}{}", "k".repeat(127)), "v".repeat(256)))
            .collect();
        assert_eq!(from_header(&header(&longest)).unwrap(), longest);
    }

    #[test]
    fn a_tag_set_needs_keys_and_counts_its_tags() {
        let tag = |k: Option<&str>, v: Option<&str>| Tag {
            key: k.map(str::to_owned),
            value: v.map(str::to_owned),
        };
        let tags =
            from_tag_set(&[tag(Some("a"), Some("1")), tag(Some("b"), None)], OBJECT).unwrap();
        assert_eq!(
            to_tag_set(&tags),
            [tag(Some("a"), Some("1")), tag(Some("b"), Some(""))]
        );
        assert_eq!(count(&tags), Some(2));
        assert_eq!(count(&Tags::new()), None);
        assert!(from_tag_set(&[tag(None, Some("1"))], OBJECT).is_err());
        let many: Vec<Tag> = (0..11).map(|i| tag(Some(&format!("k{i}")), None)).collect();
        assert!(from_tag_set(&many, OBJECT).is_err());
        assert_eq!(from_tag_set(&many, BUCKET).unwrap().len(), 11);
    }

    #[test]
    fn a_bucket_takes_fifty_tags_of_the_longest_keys_and_values() {
        let tag = |i: usize| Tag {
            key: Some(format!("{i:02}{}", "k".repeat(126))),
            value: Some("v".repeat(256)),
        };
        let fifty: Vec<Tag> = (0..50).map(tag).collect();
        let tags = from_tag_set(&fifty, BUCKET).unwrap();
        assert_eq!(to_tag_set(&tags), fifty);
        let fifty_one: Vec<Tag> = (0..51).map(tag).collect();
        assert!(from_tag_set(&fifty_one, BUCKET).is_err());
        // The byte bound holds on its own too (a non-ASCII value takes up to 4 bytes a char).
        let wide: Vec<Tag> = (0..50)
            .map(|i| Tag {
                key: Some(format!("k{i}")),
                value: Some("ж".repeat(256)),
            })
            .collect();
        assert!(from_tag_set(&wide, BUCKET).is_err());
    }

    fn allowed_text(max: usize) -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                proptest::char::range('a', 'z'),
                proptest::char::range('0', '9'),
                proptest::sample::select(vec![
                    ' ', '+', '-', '=', '.', '_', ':', '/', '@', 'é', 'ж'
                ]),
            ],
            0..max,
        )
        .prop_map(|chars| chars.into_iter().collect())
    }

    proptest! {
        /// Any tag set within the rules goes through its header and back unchanged.
        #[test]
        fn valid_tag_sets_round_trip(
            pairs in proptest::collection::btree_map(
                allowed_text(40).prop_filter("a key", |k| !k.is_empty() && !k.to_ascii_lowercase().starts_with("aws:")),
                allowed_text(60),
                0..=MAX_TAGS,
            )
        ) {
            prop_assert_eq!(from_header(&header(&pairs)).unwrap(), pairs);
        }

        /// Any header is answered (tags or a refusal) without a panic, and what it accepts is
        /// within every bound.
        #[test]
        fn any_header_is_judged_within_bounds(text in ".{0,600}") {
            if let Ok(tags) = from_header(&text) {
                prop_assert!(tags.len() <= MAX_TAGS);
                let bytes: usize = tags.iter().map(|(k, v)| k.len() + v.len()).sum();
                prop_assert!(bytes <= MAX_TAG_BYTES);
            }
        }
    }
}
