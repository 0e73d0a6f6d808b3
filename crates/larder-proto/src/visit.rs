//! Visiting a replica's documents: `GET /internal/v1/partitions/<p>/visit?<query>`, answered by
//! a page of documents in visiting order (`(h, key)`, `h` = the store's `visit_hash` of the key).
//! See `INTERNAL_API.md`, "Visiting", for the format; this module is its one encoder and decoder.
//!
//! The page is a small framing around the stored fields, which travel as they are stored (no
//! JSON re-encoding on either side):
//!
//! ```text
//! page  = head LF *( meta LF [ fields LF ] )
//! head  = {"more":<bool>,"entries":<n>}
//! meta  = {"h":"<16 hex>","key":"<id>","version":<v>,"time_ms":<t>,"state":"live"|"removed"|"unmatched","len":<bytes of fields>}
//! ```
//!
//! Decoding is linear and bounded: each line at most [`MAX_LINE`] bytes, at most [`MAX_LIMIT`]
//! entries, every length checked against what is left of the body.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::documents::{encode_key, percent_decode};

/// Most entries a page may hold (and a request may ask for).
pub const MAX_LIMIT: usize = 1024;
/// Longest head or meta line: a key is at most 1 KiB, six bytes per byte when JSON-escaped.
pub const MAX_LINE: usize = 8 * 1024;

const PARTITIONS: &str = "/internal/v1/partitions/";

/// What a visit request asks a replica for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisitQuery {
    /// The first `h` of the range (inclusive), used when `after` is absent.
    pub first: u64,
    /// The last `h` of the range (inclusive).
    pub last: u64,
    /// Only documents strictly after this position.
    pub after: Option<(u64, String)>,
    /// Most entries (1..=[`MAX_LIMIT`]).
    pub limit: usize,
    /// A document selection, evaluated by the replica: documents it does not match are
    /// returned as `unmatched` (no fields), so a merge still lets their version win.
    pub selection: Option<String>,
}

/// Why a visit query or page could not be read.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum VisitError {
    #[error("bad visit query: {0}")]
    Query(&'static str),
    #[error("bad visit page: {0}")]
    Page(&'static str),
}

impl VisitQuery {
    /// The request path with its query.
    pub fn path(&self, partition: u32) -> String {
        let mut path = format!(
            "{PARTITIONS}{partition}/visit?first={:016x}&last={:016x}&limit={}",
            self.first, self.last, self.limit
        );
        if let Some((h, key)) = &self.after {
            path.push_str(&format!("&after={h:016x}{}", encode_key(key)));
        }
        if let Some(selection) = &self.selection {
            path.push_str("&selection=");
            path.push_str(&encode_key(selection));
        }
        path
    }

    /// Parses the query part of a visit request.
    pub fn parse(query: &str) -> Result<VisitQuery, VisitError> {
        let mut parsed = VisitQuery {
            first: 0,
            last: u64::MAX,
            after: None,
            limit: MAX_LIMIT,
            selection: None,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "first" => parsed.first = hex(value).ok_or(VisitError::Query("first"))?,
                "last" => parsed.last = hex(value).ok_or(VisitError::Query("last"))?,
                "limit" => {
                    let limit: usize = value.parse().map_err(|_| VisitError::Query("limit"))?;
                    parsed.limit = limit.clamp(1, MAX_LIMIT);
                }
                "after" => {
                    let bad = VisitError::Query("after");
                    let (h, key) = (value.get(..16).ok_or(bad.clone())?, &value[16..]);
                    let key = percent_decode(key, false).ok_or(bad.clone())?;
                    parsed.after = Some((hex(h).ok_or(bad)?, key));
                }
                "selection" => {
                    let text =
                        percent_decode(value, false).ok_or(VisitError::Query("selection"))?;
                    parsed.selection = Some(text);
                }
                _ => {}
            }
        }
        Ok(parsed)
    }
}

fn hex(text: &str) -> Option<u64> {
    (text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(text, 16).ok())
        .flatten()
}

/// A document's state in a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemState {
    /// Live, with its fields (a JSON object, as stored).
    Live(Bytes),
    /// Removed by a versioned tombstone.
    Removed,
    /// Live, but the request's selection does not match it.
    Unmatched,
}

/// One document of a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisitItem {
    pub h: u64,
    pub key: String,
    pub version: u64,
    pub time_ms: u64,
    pub state: ItemState,
}

/// A page: its entries in visiting order, and whether the range may hold more after them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VisitPage {
    pub more: bool,
    pub items: Vec<VisitItem>,
}

#[derive(Serialize, Deserialize)]
struct Head {
    more: bool,
    entries: usize,
}

#[derive(Serialize, Deserialize)]
struct Meta {
    h: String,
    key: String,
    version: u64,
    time_ms: u64,
    state: String,
    len: usize,
}

impl VisitPage {
    /// The page's wire form.
    pub fn encode(&self) -> Vec<u8> {
        let fields: usize = self
            .items
            .iter()
            .map(|i| match &i.state {
                ItemState::Live(f) => f.len() + 1,
                _ => 0,
            })
            .sum();
        let mut out = Vec::with_capacity(fields + 128 * (self.items.len() + 1));
        let head = Head {
            more: self.more,
            entries: self.items.len(),
        };
        line(&mut out, &head);
        for item in &self.items {
            let (state, fields) = match &item.state {
                ItemState::Live(f) => ("live", Some(f)),
                ItemState::Removed => ("removed", None),
                ItemState::Unmatched => ("unmatched", None),
            };
            let meta = Meta {
                h: format!("{:016x}", item.h),
                key: item.key.clone(),
                version: item.version,
                time_ms: item.time_ms,
                state: state.into(),
                len: fields.map_or(0, |f| f.len()),
            };
            line(&mut out, &meta);
            if let Some(fields) = fields {
                out.extend_from_slice(fields);
                out.push(b'\n');
            }
        }
        out
    }

    /// Reads a page's wire form (see the module docs for its bounds).
    pub fn decode(body: &Bytes) -> Result<VisitPage, VisitError> {
        let mut at = 0;
        let head: Head = read_line(body, &mut at)?;
        if head.entries > MAX_LIMIT {
            return Err(VisitError::Page("too many entries"));
        }
        let mut page = VisitPage {
            more: head.more,
            items: Vec::with_capacity(head.entries),
        };
        for _ in 0..head.entries {
            let meta: Meta = read_line(body, &mut at)?;
            let h = hex(&meta.h).ok_or(VisitError::Page("bad h"))?;
            let state = match meta.state.as_str() {
                "live" => {
                    let end = at
                        .checked_add(meta.len)
                        .filter(|end| *end < body.len() && body[*end] == b'\n')
                        .ok_or(VisitError::Page("fields overrun the page"))?;
                    let fields = body.slice(at..end);
                    at = end + 1;
                    ItemState::Live(fields)
                }
                "removed" => ItemState::Removed,
                "unmatched" => ItemState::Unmatched,
                _ => return Err(VisitError::Page("bad state")),
            };
            page.items.push(VisitItem {
                h,
                key: meta.key,
                version: meta.version,
                time_ms: meta.time_ms,
                state,
            });
        }
        if at != body.len() {
            return Err(VisitError::Page("bytes after the last entry"));
        }
        Ok(page)
    }
}

fn line(out: &mut Vec<u8>, value: &impl Serialize) {
    serde_json::to_writer(&mut *out, value).expect("visit lines serialise");
    out.push(b'\n');
}

fn read_line<T: for<'a> Deserialize<'a>>(body: &[u8], at: &mut usize) -> Result<T, VisitError> {
    let rest = &body[*at..];
    let window = &rest[..rest.len().min(MAX_LINE + 1)];
    let end = window
        .iter()
        .position(|b| *b == b'\n')
        .ok_or(VisitError::Page("line missing or too long"))?;
    let value = serde_json::from_slice(&window[..end]).map_err(|_| VisitError::Page("bad line"))?;
    *at += end + 1;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn item() -> impl Strategy<Value = VisitItem> {
        let state = prop_oneof![
            "\\{[a-z\\n\"]{0,20}\\}".prop_map(|f| ItemState::Live(Bytes::from(f))),
            Just(ItemState::Removed),
            Just(ItemState::Unmatched),
        ];
        (any::<u64>(), ".{1,30}", any::<u64>(), any::<u64>(), state).prop_map(
            |(h, key, version, time_ms, state)| VisitItem {
                h,
                key,
                version,
                time_ms,
                state,
            },
        )
    }

    proptest! {
        #[test]
        fn pages_round_trip(more: bool, items in proptest::collection::vec(item(), 0..20)) {
            let page = VisitPage { more, items };
            let decoded = VisitPage::decode(&Bytes::from(page.encode()));
            prop_assert_eq!(decoded, Ok(page));
        }

        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = VisitPage::decode(&Bytes::from(bytes));
        }

        #[test]
        fn queries_round_trip(first: u64, last: u64, after in proptest::option::of((any::<u64>(), ".{0,30}")),
                              limit in 1..=MAX_LIMIT, selection in proptest::option::of(".{0,30}")) {
            let query = VisitQuery { first, last, after, limit, selection };
            let path = query.path(3);
            let (_, q) = path.split_once('?').unwrap();
            prop_assert_eq!(VisitQuery::parse(q), Ok(query));
        }
    }

    #[test]
    fn truncated_pages_fail() {
        let page = VisitPage {
            more: true,
            items: vec![VisitItem {
                h: 1,
                key: "id:n:t::1".into(),
                version: 2,
                time_ms: 3,
                state: ItemState::Live(Bytes::from_static(b"{\"a\":1}")),
            }],
        };
        let bytes = page.encode();
        for cut in 0..bytes.len() {
            assert!(VisitPage::decode(&Bytes::copy_from_slice(&bytes[..cut])).is_err());
        }
    }
}
