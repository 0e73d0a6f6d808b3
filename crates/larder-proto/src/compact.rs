//! The compact form of blob properties on the internal hop: one header, `x-larder-props`, instead
//! of one header per property. Building, encoding and decoding a header per property (with a
//! `format!` per metadata name) cost more per request than the properties are worth; one value
//! is built once per PUT and cloned to every replica, stored by the node as it is, and sent back
//! on GET without being decoded on the node. Grammar (`INTERNAL_API.md`):
//!
//! ```text
//! props   = "1;" created ";" [expires] ";" ctype ";" *( name "=" sized ";" )
//! ctype   = "-" / sized           ; "-": no content type
//! sized   = len ":" <len bytes>   ; len: 1 to 6 decimal digits
//! ```
//!
//! Every string is length-prefixed, so any header text fits; the value never ends in white
//! space (HTTP/1.1 would trim it). Decoding reads each byte once and allocates only the strings
//! it returns.

use http::header::HeaderValue;

use crate::{BlobProperties, PropertiesError};

/// The form's version, its first two bytes.
const VERSION: &str = "1;";
/// Longest length prefix: six digits, more than any header list a node accepts.
const MAX_LEN_DIGITS: usize = 6;
/// Longest decimal u64.
const MAX_NUMBER_DIGITS: usize = 20;

impl BlobProperties {
    /// The compact header value. Fails only for properties that are not header text (they
    /// always are when they were parsed from headers).
    pub fn to_compact(&self) -> Result<HeaderValue, PropertiesError> {
        use std::fmt::Write;
        let strings: usize = self.content_type.as_ref().map_or(0, String::len)
            + self
                .user_meta
                .iter()
                .map(|(n, v)| n.len() + v.len() + 10)
                .sum::<usize>();
        let mut out = String::with_capacity(56 + strings);
        let _ = write!(out, "{VERSION}{};", self.created_ms);
        if let Some(expires) = self.expires_ms {
            let _ = write!(out, "{expires}");
        }
        out.push(';');
        match &self.content_type {
            None => out.push('-'),
            Some(ct) => {
                let _ = write!(out, "{}:{ct}", ct.len());
            }
        }
        out.push(';');
        for (name, value) in &self.user_meta {
            if !is_meta_name(name) {
                return Err(PropertiesError::Malformed("a metadata name is not a token"));
            }
            let _ = write!(out, "{name}={}:{value};", value.len());
        }
        HeaderValue::try_from(out)
            .map_err(|_| PropertiesError::NotText(crate::header::PROPS.into()))
    }

    /// Reads the compact form. Checks its structure only (the limits of `from_headers` are the
    /// caller's to apply), linear in the value's length.
    pub fn from_compact(value: &HeaderValue) -> Result<BlobProperties, PropertiesError> {
        let text = value
            .to_str()
            .map_err(|_| PropertiesError::NotText(crate::header::PROPS.into()))?;
        let mut reader = Reader(
            text.strip_prefix(VERSION)
                .ok_or(PropertiesError::Malformed("unknown version"))?,
        );
        let created_ms = reader
            .number_until(b';')?
            .ok_or(PropertiesError::Malformed("no creation time"))?;
        let expires_ms = reader.number_until(b';')?;
        let content_type = match reader.0.strip_prefix('-') {
            Some(rest) => {
                reader.0 = rest;
                None
            }
            None => Some(reader.sized()?.to_owned()),
        };
        reader.expect(b';')?;
        let mut user_meta = Vec::new();
        while !reader.0.is_empty() {
            let name = reader.until(b'=')?;
            if !is_meta_name(name) {
                return Err(PropertiesError::Malformed("a metadata name is not a token"));
            }
            let value = reader.sized()?;
            reader.expect(b';')?;
            user_meta.push((name.to_owned(), value.to_owned()));
        }
        Ok(BlobProperties {
            content_type,
            user_meta,
            created_ms,
            expires_ms,
        })
    }
}

/// What may follow `x-larder-meta-` in a header name: lower-case token characters (an empty
/// name is structurally fine here; `from_headers`' limits refuse it).
fn is_meta_name(name: &str) -> bool {
    name.bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The unread rest of a compact value (header text: ASCII, so byte offsets are char offsets).
struct Reader<'a>(&'a str);

impl<'a> Reader<'a> {
    fn expect(&mut self, byte: u8) -> Result<(), PropertiesError> {
        match self.0.as_bytes().first() {
            Some(b) if *b == byte => {
                self.0 = &self.0[1..];
                Ok(())
            }
            _ => Err(PropertiesError::Malformed("a separator is missing")),
        }
    }

    /// The text up to `end`, which is consumed too.
    fn until(&mut self, end: u8) -> Result<&'a str, PropertiesError> {
        let at = self
            .0
            .bytes()
            .position(|b| b == end)
            .ok_or(PropertiesError::Malformed("a separator is missing"))?;
        let (field, rest) = (&self.0[..at], &self.0[at + 1..]);
        self.0 = rest;
        Ok(field)
    }

    /// Decimal digits up to `end`; `None` when there are none.
    fn number_until(&mut self, end: u8) -> Result<Option<u64>, PropertiesError> {
        let digits = self.until(end)?;
        if digits.is_empty() {
            return Ok(None);
        }
        parse_digits(digits, MAX_NUMBER_DIGITS)
            .map(Some)
            .ok_or(PropertiesError::Malformed("a time is not a number"))
    }

    /// `len ":" <len bytes>`.
    fn sized(&mut self) -> Result<&'a str, PropertiesError> {
        let malformed = PropertiesError::Malformed("a length prefix is wrong");
        let digits = self.until(b':')?;
        let len = parse_digits(digits, MAX_LEN_DIGITS).ok_or(malformed.clone())? as usize;
        let field = self.0.get(..len).ok_or(malformed.clone())?;
        self.0 = self.0.get(len..).ok_or(malformed)?;
        Ok(field)
    }
}

/// 1 to `max` decimal digits as a number, `None` for anything else (no sign, no overflow).
fn parse_digits(digits: &str, max: usize) -> Option<u64> {
    if digits.is_empty() || digits.len() > max || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn value(text: &str) -> HeaderValue {
        HeaderValue::from_str(text).unwrap()
    }

    #[test]
    fn a_known_value() {
        let props = BlobProperties {
            content_type: Some("text/plain; a=b".into()),
            user_meta: vec![("owner".into(), "ada".into()), ("tag".into(), "".into())],
            created_ms: 1_700_000_000_000,
            expires_ms: Some(1_700_000_060_000),
        };
        let encoded = props.to_compact().unwrap();
        assert_eq!(
            encoded,
            "1;1700000000000;1700000060000;15:text/plain; a=b;owner=3:ada;tag=0:;"
        );
        assert_eq!(BlobProperties::from_compact(&encoded).unwrap(), props);
        let bare = BlobProperties {
            created_ms: 5,
            ..Default::default()
        };
        assert_eq!(bare.to_compact().unwrap(), "1;5;;-;");
    }

    #[test]
    fn malformed_values_are_errors() {
        for text in [
            "",
            "2;5;;-;",
            "1;;;-;",
            "1;5;;-",
            "1;5;x;-;",
            "1;-5;;-;",
            "1;5;;9:short;",
            "1;5;;1234567:x;",
            "1;5;;-;Name=1:x;",
            "1;5;;-;a=1:x",
            "1;5;;-;a=1:xy;",
            "1;18446744073709551616;;-;",
        ] {
            assert!(
                BlobProperties::from_compact(&value(text)).is_err(),
                "{text:?}"
            );
        }
    }

    fn header_text() -> impl Strategy<Value = String> {
        "[ -~\t]{0,40}"
    }

    proptest! {
        /// Whatever properties header text can carry come back unchanged.
        #[test]
        fn round_trip(
            content_type in proptest::option::of(header_text()),
            user_meta in proptest::collection::vec(("[a-z0-9!#$%&'*+.^_`|~-]{0,12}", header_text()), 0..6),
            created_ms in any::<u64>(),
            expires_ms in proptest::option::of(any::<u64>()),
        ) {
            let props = BlobProperties { content_type, user_meta, created_ms, expires_ms };
            let encoded = props.to_compact().unwrap();
            prop_assert!(!encoded.as_bytes().last().unwrap().is_ascii_whitespace());
            prop_assert_eq!(BlobProperties::from_compact(&encoded).unwrap(), props);
        }

        /// A peer's value is untrusted: any bytes give properties or an error, never a panic,
        /// and what decodes encodes back to the same properties.
        #[test]
        fn arbitrary_values_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                if let Ok(props) = BlobProperties::from_compact(&value) {
                    let again = props.to_compact().unwrap();
                    prop_assert_eq!(BlobProperties::from_compact(&again).unwrap(), props);
                }
            }
        }

        /// Every cut of a valid value short of its end is refused or decodes to valid
        /// properties, never a panic (a length prefix pointing past the end included).
        #[test]
        fn truncations_never_panic(
            content_type in proptest::option::of(header_text()),
            name in "[a-z]{1,8}",
            meta in header_text(),
            cut in any::<prop::sample::Index>(),
        ) {
            let props = BlobProperties {
                content_type,
                user_meta: vec![(name, meta)],
                created_ms: 1,
                expires_ms: None,
            };
            let encoded = props.to_compact().unwrap();
            let text = encoded.to_str().unwrap();
            let cut = cut.index(text.len());
            let _ = BlobProperties::from_compact(&value(&text[..cut]));
        }
    }
}
