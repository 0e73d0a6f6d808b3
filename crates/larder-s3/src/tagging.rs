//! Object tags: a small set of key → value pairs kept in an object's index entry, as S3 takes
//! them (PutObjectTagging's XML, or the `x-amz-tagging` header of PutObject, CopyObject and
//! CreateMultipartUpload, URL-encoded like a query string) and answers them
//! (GetObjectTagging, and their count in GetObject's and HeadObject's `x-amz-tagging-count`).
//!
//! S3's rules, checked before anything is stored (400 `InvalidTag` otherwise): at most 10 tags,
//! keys unique, of 1 to 128 characters and not starting with `aws:`, values of at most 256,
//! both of letters, digits, white space and `+ - = . _ : / @`. And Larder's own: at most
//! `MAX_TAG_BYTES` of keys and values together, as user metadata and the standard headers are
//! bounded, since every GET and PUT in the object's key range reads and writes its entry
//! (every tag set of ASCII characters within S3's rules fits).

use std::collections::BTreeMap;

use s3s::dto::Tag;
use s3s::{s3_error, S3Result};

/// An object's tags, by key.
pub type Tags = BTreeMap<String, String>;

/// Tags one object holds at most (S3's bound).
pub const MAX_TAGS: usize = 10;
/// Characters of a tag's key at most (S3's bound).
const MAX_KEY_CHARS: usize = 128;
/// Characters of a tag's value at most (S3's bound).
const MAX_VALUE_CHARS: usize = 256;
/// Bytes of keys and values together at most (Larder's: 10 tags of S3's longest ASCII keys
/// and values take 3,840).
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
    collect(pairs)
}

/// The tags of PutObjectTagging's tag set, checked.
pub fn from_tag_set(set: &[Tag]) -> S3Result<Tags> {
    if set.len() > MAX_TAGS {
        return Err(s3_error!(
            InvalidTag,
            "Object tags cannot be greater than {MAX_TAGS}"
        ));
    }
    let mut pairs = Vec::with_capacity(set.len());
    for tag in set {
        let Some(key) = tag.key.clone() else {
            return Err(s3_error!(InvalidTag, "A tag has no key"));
        };
        pairs.push((key, tag.value.clone().unwrap_or_default()));
    }
    collect(pairs)
}

/// The tag set GetObjectTagging answers with, in key order.
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

fn collect(pairs: impl IntoIterator<Item = (String, String)>) -> S3Result<Tags> {
    let mut tags = Tags::new();
    let mut bytes = 0usize;
    for (key, value) in pairs {
        if tags.len() == MAX_TAGS {
            return Err(s3_error!(
                InvalidTag,
                "Object tags cannot be greater than {MAX_TAGS}"
            ));
        }
        check_key(&key)?;
        check_value(&value)?;
        bytes = bytes.saturating_add(key.len()).saturating_add(value.len());
        if bytes > MAX_TAG_BYTES {
            return Err(s3_error!(
                InvalidTag,
                "The tags take more than {MAX_TAG_BYTES} bytes together"
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
        let tags = from_tag_set(&[tag(Some("a"), Some("1")), tag(Some("b"), None)]).unwrap();
        assert_eq!(
            to_tag_set(&tags),
            [tag(Some("a"), Some("1")), tag(Some("b"), Some(""))]
        );
        assert_eq!(count(&tags), Some(2));
        assert_eq!(count(&Tags::new()), None);
        assert!(from_tag_set(&[tag(None, Some("1"))]).is_err());
        let many: Vec<Tag> = (0..11).map(|i| tag(Some(&format!("k{i}")), None)).collect();
        assert!(from_tag_set(&many).is_err());
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
