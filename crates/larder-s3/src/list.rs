//! ListObjectsV2 over a bucket index in name order: prefix, delimiter (common prefixes),
//! start-after, continuation tokens and max-keys. The work is a range scan from where the
//! listing starts, bounded by the page size (plus the keys a common prefix folds away).

use std::ops::Bound;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use crate::error::S3Error;
use crate::records::{ObjectEntry, Objects};

/// S3's largest page (and its default).
pub const MAX_KEYS: usize = 1000;

/// Index leaves a listing page reads past its first before it ends early, truncated (a run of
/// leaves emptied by deletes costs one record read each; leaves never merge). `pager.rs`.
pub const MAX_LEAVES_PER_PAGE: usize = 64;

/// Longest continuation token accepted: a 1 KiB key, its kind byte and the version, in base64.
const MAX_TOKEN: usize = 2048;

/// Where a listing resumes: after this key, after every key under this common prefix, or at
/// this key (a page that ended on a run of empty index leaves, `index_tree.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum After {
    Key(String),
    Prefix(String),
    At(String),
}

impl After {
    pub fn name(&self) -> &str {
        match self {
            After::Key(k) | After::Prefix(k) | After::At(k) => k,
        }
    }
}

/// What a listing asks for.
#[derive(Clone, Copy, Debug)]
pub struct Query<'a> {
    pub prefix: &'a str,
    /// An empty delimiter is none.
    pub delimiter: Option<&'a str>,
    pub after: Option<&'a After>,
    pub max_keys: usize,
}

impl Query<'_> {
    /// Where the listing's first leaf is: at its first name, or past every name under a
    /// common prefix it resumes after (a prefix over many leaves is not walked again).
    pub fn start_key(&self) -> String {
        match self.after {
            Some(After::Prefix(p)) if p.as_str() >= self.prefix => {
                past_prefix(p).unwrap_or_else(|| p.clone())
            }
            Some(after) if after.name() >= self.prefix => after.name().to_owned(),
            _ => self.prefix.to_owned(),
        }
    }
}

/// The first string after every string that starts with `p` (its last character that can be
/// incremented, incremented; code point order is UTF-8's byte order); `None` if there is none.
fn past_prefix(p: &str) -> Option<String> {
    let mut chars: Vec<char> = p.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match u32::from(last) {
            0xD7FF => Some('\u{E000}'), // no chars in the surrogate range
            c => c.checked_add(1).and_then(char::from_u32),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// The delimiter, if `name` reads as one of the query's common prefixes: the prefix, then
/// anything without the delimiter, then the delimiter. A key can never read so (it would be
/// folded into that very prefix), but a key equal to the query's prefix can end with the
/// delimiter and is not one.
pub fn common_prefix_marker<'q>(name: &str, query: &Query<'q>) -> Option<&'q str> {
    let d = query.delimiter.filter(|d| !d.is_empty())?;
    let rest = name.strip_prefix(query.prefix)?;
    let last = rest.len().checked_sub(d.len())?;
    (!rest.is_empty() && rest.find(d) == Some(last)).then_some(d)
}

/// How a ListObjects v1 marker (or a ListObjectVersions key marker) is read: after every
/// name under it if it reads as a common prefix of the query, after the name otherwise.
pub fn marker(m: &str, prefix: &str, delimiter: Option<&str>) -> After {
    let query = Query {
        prefix,
        delimiter,
        after: None,
        max_keys: 0,
    };
    match common_prefix_marker(m, &query) {
        Some(_) => After::Prefix(m.to_owned()),
        None => After::Key(m.to_owned()),
    }
}

/// One page of a listing.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Page {
    pub objects: Vec<(String, Arc<ObjectEntry>)>,
    pub prefixes: Vec<String>,
    /// Where the next page starts, when the listing was cut at `max_keys`.
    pub next: Option<After>,
    /// The page stopped at `max_keys` with names left after it.
    pub cut: bool,
}

impl Page {
    pub fn len(&self) -> usize {
        self.objects.len() + self.prefixes.len()
    }

    /// Where a page ending here resumes: after its last key or common prefix.
    pub fn last(&self) -> Option<After> {
        match (self.prefixes.last(), self.objects.last()) {
            (Some(p), Some((k, _))) if p > k => Some(After::Prefix(p.clone())),
            (Some(p), None) => Some(After::Prefix(p.clone())),
            (_, Some((k, _))) => Some(After::Key(k.clone())),
            (None, None) => None,
        }
    }

    /// Adds the entries of the page that follows this one.
    pub fn append(&mut self, later: Page) {
        self.objects.extend(later.objects);
        self.prefixes.extend(later.prefixes);
    }
}

/// The page of `objects` under the query's prefix after `after`, at most `max_keys` entries
/// (keys and common prefixes together).
pub fn page(objects: &Objects, query: &Query<'_>, after: Option<&After>, max_keys: usize) -> Page {
    let prefix = query.prefix;
    let start = match after {
        Some(After::At(k)) if k.as_str() >= prefix => Bound::Included(k.as_str()),
        Some(After::Key(k) | After::Prefix(k)) if k.as_str() >= prefix => {
            Bound::Excluded(k.as_str())
        }
        _ => Bound::Included(prefix),
    };
    let mut page = Page::default();
    let delimiter = query.delimiter.filter(|d| !d.is_empty());
    for (name, entry) in objects.range::<_, str>((start, Bound::Unbounded)) {
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
        if page.len() == max_keys {
            page.cut = true;
            page.next = page.last();
            return page;
        }
        match folded {
            Some(common) => page.prefixes.push(common),
            None => page.objects.push((name.clone(), entry.clone())),
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
            After::At(k) => (b'a', k),
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
            b'a' => Ok(After::At(name)),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn index(names: &[&str]) -> Objects {
        names
            .iter()
            .map(|n| (n.to_string(), Arc::<ObjectEntry>::default()))
            .collect()
    }

    /// Everything a listing returns, following continuations, with pages of `max`.
    fn all(objects: &Objects, prefix: &str, delimiter: Option<&str>, max: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let query = Query {
                prefix,
                delimiter,
                after: None,
                max_keys: max,
            };
            let page = page(objects, &query, after.as_ref(), max);
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
        let query = Query {
            prefix: "",
            delimiter: Some("/"),
            after: None,
            max_keys: 1000,
        };
        let page = page(&objects, &query, None, 1000);
        let keys: Vec<&str> = page.objects.iter().map(|(k, _)| k.as_str()).collect();
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
        fn tokens_round_trip(name in ".{0,32}", kind in 0u8..3) {
            let after = match kind { 0 => After::Prefix(name), 1 => After::Key(name), _ => After::At(name) };
            prop_assert_eq!(After::parse(&after.token()).unwrap(), after);
        }
    }
}
