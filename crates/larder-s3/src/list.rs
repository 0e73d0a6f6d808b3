//! ListObjectsV2 over a bucket index in name order: prefix, delimiter (common prefixes),
//! start-after, continuation tokens and max-keys. The work is a range scan from where the
//! listing starts, bounded by the page size (plus the keys a common prefix folds away).

use std::collections::BTreeMap;
use std::ops::Bound;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use crate::error::S3Error;
use crate::records::ObjectEntry;

/// S3's largest page (and its default).
pub const MAX_KEYS: usize = 1000;

/// Longest continuation token accepted: a 1 KiB key, its kind byte and the version, in base64.
const MAX_TOKEN: usize = 2048;

/// Where a listing resumes: after this key, or after every key under this common prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum After {
    Key(String),
    Prefix(String),
}

/// One page of a listing.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Page<'a> {
    pub objects: Vec<(&'a str, &'a ObjectEntry)>,
    pub prefixes: Vec<String>,
    /// Where the next page starts, when the listing was cut at `max_keys`.
    pub next: Option<After>,
}

/// The page of `objects` under `prefix` after `after`, at most `max_keys` entries (keys and
/// common prefixes together).
pub fn page<'a>(
    objects: &'a BTreeMap<String, ObjectEntry>,
    prefix: &str,
    delimiter: Option<&str>,
    after: Option<&After>,
    max_keys: usize,
) -> Page<'a> {
    let start = match after {
        Some(After::Key(k) | After::Prefix(k)) if k.as_str() >= prefix => {
            Bound::Excluded(k.as_str())
        }
        _ => Bound::Included(prefix),
    };
    let mut page = Page::default();
    let delimiter = delimiter.filter(|d| !d.is_empty());
    for (name, entry) in objects.range::<str, _>((start, Bound::Unbounded)) {
        if !name.starts_with(prefix) {
            break;
        }
        if let Some(After::Prefix(p)) = after {
            if name.starts_with(p.as_str()) {
                continue;
            }
        }
        let folded = delimiter.and_then(|d| {
            let rest = &name[prefix.len()..];
            rest.find(d)
                .map(|at| name[..prefix.len() + at + d.len()].to_owned())
        });
        if let Some(common) = &folded {
            if page.prefixes.last() == Some(common) {
                continue;
            }
        }
        if page.objects.len() + page.prefixes.len() == max_keys {
            page.next = Some(match (page.prefixes.last(), page.objects.last()) {
                (Some(p), Some((k, _))) if p.as_str() > *k => After::Prefix(p.clone()),
                (Some(p), None) => After::Prefix(p.clone()),
                (_, Some((k, _))) => After::Key((*k).to_owned()),
                (None, None) => return page,
            });
            return page;
        }
        match folded {
            Some(common) => page.prefixes.push(common),
            None => page.objects.push((name.as_str(), entry)),
        }
    }
    page
}

/// Percent-encodes every byte of `text` but unreserved characters and `/`, as S3 does for
/// `encoding-type=url`.
pub fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

impl After {
    /// The opaque continuation token: base64url of a version byte, a kind byte and the name.
    pub fn token(&self) -> String {
        let (kind, name) = match self {
            After::Key(k) => (b'k', k),
            After::Prefix(p) => (b'p', p),
        };
        let mut raw = vec![1u8, kind];
        raw.extend_from_slice(name.as_bytes());
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// Parses a token this code made; anything else is InvalidArgument.
    pub fn parse(token: &str) -> Result<After, S3Error> {
        let bad =
            || S3Error::InvalidArgument("The continuation token provided is incorrect".into());
        if token.len() > MAX_TOKEN {
            return Err(bad());
        }
        let raw = URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
        let [1, kind, name @ ..] = raw.as_slice() else {
            return Err(bad());
        };
        let name = String::from_utf8(name.to_vec()).map_err(|_| bad())?;
        match kind {
            b'k' => Ok(After::Key(name)),
            b'p' => Ok(After::Prefix(name)),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry() -> ObjectEntry {
        ObjectEntry {
            body: Vec::new(),
            size: 0,
            etag: "\"\"".into(),
            modified_ms: 0,
            content_type: None,
            meta: BTreeMap::new(),
            checksum: None,
        }
    }

    fn index(names: &[&str]) -> BTreeMap<String, ObjectEntry> {
        names.iter().map(|n| (n.to_string(), entry())).collect()
    }

    /// Everything a listing returns, following continuations, with pages of `max`.
    fn all(
        objects: &BTreeMap<String, ObjectEntry>,
        prefix: &str,
        delimiter: Option<&str>,
        max: usize,
    ) -> Vec<String> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let page = page(objects, prefix, delimiter, after.as_ref(), max);
            let mut items: Vec<String> = page.objects.iter().map(|(k, _)| k.to_string()).collect();
            items.extend(page.prefixes.iter().cloned());
            items.sort();
            out.extend(items);
            match page.next {
                Some(next) => after = Some(After::parse(&next.token()).unwrap()),
                None => return out,
            }
        }
    }

    #[test]
    fn a_delimiter_folds_names_into_common_prefixes() {
        let objects = index(&["a/1", "a/2", "b", "c/x/y", "d"]);
        let page = page(&objects, "", Some("/"), None, 1000);
        let keys: Vec<&str> = page.objects.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["b", "d"]);
        assert_eq!(page.prefixes, ["a/", "c/"]);
        assert_eq!(page.next, None);
    }

    #[test]
    fn url_encoding_keeps_slashes_and_escapes_the_rest() {
        assert_eq!(url_encode("a b/ü+%.txt"), "a%20b/%C3%BC%2B%25.txt");
    }

    #[test]
    fn a_prefix_starts_the_scan_where_it_begins() {
        let objects = index(&["a", "photos/1", "photos/2", "z"]);
        assert_eq!(all(&objects, "photos/", None, 1), ["photos/1", "photos/2"]);
    }

    proptest! {
        // Paging never loses or repeats an entry, whatever the page size: the same as one page.
        #[test]
        fn pages_add_up_to_the_whole_listing(
            names in proptest::collection::btree_set("[ab/]{1,6}", 0..40),
            prefix in "[ab/]{0,2}",
            slash in any::<bool>(),
            max in 1usize..5,
        ) {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let objects = index(&names);
            let delimiter = slash.then_some("/");
            prop_assert_eq!(
                all(&objects, &prefix, delimiter, max),
                all(&objects, &prefix, delimiter, usize::MAX)
            );
        }

        // Tokens come from clients: any string parses or is refused, never panics.
        #[test]
        fn any_token_parses_or_is_refused(token in ".{0,64}") {
            let _ = After::parse(&token);
        }

        #[test]
        fn tokens_round_trip(name in ".{0,32}", prefix in any::<bool>()) {
            let after = if prefix { After::Prefix(name) } else { After::Key(name) };
            prop_assert_eq!(After::parse(&after.token()).unwrap(), after);
        }
    }
}
