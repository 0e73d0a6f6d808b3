//! Blob properties and how they travel in headers (both the internal and the public API use
//! `Content-Type` and `x-larder-meta-*`).

use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use serde::{Deserialize, Serialize};

use crate::header;

/// Largest total size of user metadata (names + values), in bytes.
pub const MAX_USER_META_BYTES: usize = 8 * 1024;

/// What a blob carries besides its bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobProperties {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// User metadata: lower-case names without the `x-larder-meta-` prefix, in arrival order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_meta: Vec<(String, String)>,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: u64,
    /// Expiry time, ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PropertiesError {
    #[error("user metadata is {0} bytes, more than the limit of {MAX_USER_META_BYTES}")]
    MetaTooLarge(usize),
    #[error("header {0} is not valid UTF-8 text")]
    NotText(String),
    #[error("header {0} is not a number")]
    NotANumber(String),
    #[error("a user metadata header needs a name after {prefix}", prefix = header::META_PREFIX)]
    EmptyMetaName,
    #[error("header {name} is malformed: {0}", name = header::PROPS)]
    Malformed(&'static str),
}

impl BlobProperties {
    /// Reads content type and user metadata from request headers. Every entry costs its name and
    /// value against [`MAX_USER_META_BYTES`], and an empty name is refused: otherwise entries of
    /// `x-larder-meta-:` would cost nothing and escape the limit.
    pub fn from_headers(headers: &HeaderMap) -> Result<BlobProperties, PropertiesError> {
        BlobProperties::from_stored_headers(headers)?.within_limits()
    }

    /// Reads the properties of an internal PUT: the compact `x-larder-props` header when there
    /// is one (see `compact.rs`), else the one-header-per-property form of the public API; the
    /// limits of `from_headers` apply to both.
    pub fn from_internal_headers(headers: &HeaderMap) -> Result<BlobProperties, PropertiesError> {
        match headers.get(header::PROPS) {
            Some(value) => BlobProperties::from_compact(value)?.within_limits(),
            None => BlobProperties::from_headers(headers),
        }
    }

    /// Reads the properties of a storage node's answer: the compact header, or (from a node
    /// that predates it) one header per property. No limits, as in `from_stored_headers`.
    pub fn from_internal_answer(headers: &HeaderMap) -> Result<BlobProperties, PropertiesError> {
        match headers.get(header::PROPS) {
            Some(value) => BlobProperties::from_compact(value),
            None => BlobProperties::from_stored_headers(headers),
        }
    }

    /// These properties, if they keep to what a client may send: no empty metadata name, and
    /// metadata within [`MAX_USER_META_BYTES`].
    fn within_limits(self) -> Result<BlobProperties, PropertiesError> {
        if self.user_meta.iter().any(|(name, _)| name.is_empty()) {
            return Err(PropertiesError::EmptyMetaName);
        }
        let total: usize = self.user_meta.iter().map(|(n, v)| n.len() + v.len()).sum();
        if total > MAX_USER_META_BYTES {
            return Err(PropertiesError::MetaTooLarge(total));
        }
        Ok(self)
    }

    /// Reads the properties of a record a storage node serves. The limits of `from_headers` were
    /// applied when it was written and are not applied again, so that a record written under
    /// older rules stays readable; the headers themselves are bounded by the HTTP/2 connection's
    /// header-list limit.
    pub fn from_stored_headers(headers: &HeaderMap) -> Result<BlobProperties, PropertiesError> {
        let content_type = match headers.get(CONTENT_TYPE) {
            Some(v) => Some(text(CONTENT_TYPE.as_str(), v)?.to_owned()),
            None => None,
        };
        let mut user_meta = Vec::new();
        for (name, value) in headers {
            if let Some(short) = name.as_str().strip_prefix(header::META_PREFIX) {
                let value = text(name.as_str(), value)?;
                user_meta.push((short.to_owned(), value.to_owned()));
            }
        }
        Ok(BlobProperties {
            content_type,
            user_meta,
            created_ms: number(headers, header::TIME_MS)?.unwrap_or(0),
            expires_ms: number(headers, header::EXPIRES_MS)?,
        })
    }

    /// Writes every property as headers (the inverse of `from_headers`).
    pub fn write_headers(&self, headers: &mut HeaderMap) {
        if let Some(ct) = self
            .content_type
            .as_deref()
            .and_then(|v| HeaderValue::from_str(v).ok())
        {
            headers.insert(CONTENT_TYPE, ct);
        }
        for (name, value) in &self.user_meta {
            let name = HeaderName::from_bytes(format!("{}{name}", header::META_PREFIX).as_bytes());
            if let (Ok(name), Ok(value)) = (name, HeaderValue::from_str(value)) {
                headers.append(name, value);
            }
        }
        headers.insert(header::TIME_MS, self.created_ms.into());
        if let Some(expires) = self.expires_ms {
            headers.insert(header::EXPIRES_MS, expires.into());
        }
    }
}

fn text<'a>(name: &str, value: &'a HeaderValue) -> Result<&'a str, PropertiesError> {
    value
        .to_str()
        .map_err(|_| PropertiesError::NotText(name.to_owned()))
}

fn number(headers: &HeaderMap, name: &str) -> Result<Option<u64>, PropertiesError> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => text(name, v)?
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| PropertiesError::NotANumber(name.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_round_trip() {
        let props = BlobProperties {
            content_type: Some("image/png".into()),
            user_meta: vec![("owner".into(), "ada".into()), ("tag".into(), "x y".into())],
            created_ms: 1_700_000_000_000,
            expires_ms: Some(1_700_000_060_000),
        };
        let mut headers = HeaderMap::new();
        props.write_headers(&mut headers);
        assert_eq!(BlobProperties::from_headers(&headers).unwrap(), props);
    }

    #[test]
    fn metadata_limit() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-larder-meta-big",
            HeaderValue::from_str(&"v".repeat(9000)).unwrap(),
        );
        assert!(matches!(
            BlobProperties::from_headers(&headers),
            Err(PropertiesError::MetaTooLarge(_))
        ));
    }

    #[test]
    fn empty_names_are_refused_and_names_count() {
        let mut headers = HeaderMap::new();
        headers.append("x-larder-meta-", HeaderValue::from_static(""));
        assert_eq!(
            BlobProperties::from_headers(&headers),
            Err(PropertiesError::EmptyMetaName)
        );
        let mut headers = HeaderMap::new();
        let name = format!("x-larder-meta-{}", "n".repeat(MAX_USER_META_BYTES + 1));
        headers.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_static(""),
        );
        assert!(matches!(
            BlobProperties::from_headers(&headers),
            Err(PropertiesError::MetaTooLarge(_))
        ));
    }

    #[test]
    fn internal_puts_read_the_compact_header_with_the_public_limits() {
        let mut headers = HeaderMap::new();
        headers.insert(header::PROPS, HeaderValue::from_static("1;7;;-;a=1:b;"));
        // The compact header wins over headers of the older form.
        headers.insert(header::TIME_MS, HeaderValue::from_static("8"));
        let props = BlobProperties::from_internal_headers(&headers).unwrap();
        assert_eq!((props.created_ms, props.user_meta.len()), (7, 1));
        let refused = [
            ("1;7;;-;=1:b;".to_owned(), PropertiesError::EmptyMetaName),
            (
                format!("1;7;;-;n=8200:{};", "v".repeat(8200)),
                PropertiesError::MetaTooLarge(8201),
            ),
        ];
        for (value, error) in refused {
            let mut headers = HeaderMap::new();
            headers.insert(header::PROPS, HeaderValue::from_str(&value).unwrap());
            assert_eq!(BlobProperties::from_internal_headers(&headers), Err(error));
            // A storage node's answer is read without the limits (older records stay readable).
            assert!(BlobProperties::from_internal_answer(&headers).is_ok());
        }
        let mut older = HeaderMap::new();
        older.insert(header::TIME_MS, HeaderValue::from_static("9"));
        assert_eq!(
            BlobProperties::from_internal_headers(&older)
                .unwrap()
                .created_ms,
            9
        );
        assert_eq!(
            BlobProperties::from_internal_answer(&older)
                .unwrap()
                .created_ms,
            9
        );
    }

    fn any_header_value() -> impl Strategy<Value = HeaderValue> {
        proptest::collection::vec(any::<u8>(), 0..40).prop_filter_map("a header value", |bytes| {
            HeaderValue::from_bytes(&bytes).ok()
        })
    }

    proptest! {
        /// A peer's headers are untrusted: any values give properties or an error, never a panic,
        /// and what parses writes back to the same properties.
        #[test]
        fn arbitrary_header_values_never_panic(
            time in any_header_value(),
            expires in any_header_value(),
            content_type in any_header_value(),
            meta in proptest::collection::vec(("[a-z0-9-]{0,12}", any_header_value()), 0..6),
        ) {
            let mut headers = HeaderMap::new();
            headers.insert(header::TIME_MS, time);
            headers.insert(header::EXPIRES_MS, expires);
            headers.insert(CONTENT_TYPE, content_type);
            for (name, value) in meta {
                let name = format!("{}{name}", header::META_PREFIX);
                headers.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), value);
            }
            if let Ok(props) = BlobProperties::from_headers(&headers) {
                let mut written = HeaderMap::new();
                props.write_headers(&mut written);
                prop_assert_eq!(BlobProperties::from_headers(&written), Ok(props));
            }
            if let Ok(props) = BlobProperties::from_stored_headers(&headers) {
                let mut written = HeaderMap::new();
                props.write_headers(&mut written);
                prop_assert_eq!(BlobProperties::from_stored_headers(&written), Ok(props));
            }
        }
    }
}
