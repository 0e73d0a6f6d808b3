//! How a storage node keeps blob properties in the store's opaque `props` bytes: the compact
//! form of the internal API (`x-larder-props`, see larder-proto's `compact.rs`), byte for byte
//! as it travels, so a PUT stores what it received and a GET sends what it read, without
//! decoding it. Records written before that hold versioned JSON (`{"v":1,"p":{...}}`), told
//! apart by its first byte (`{`; the compact form starts with its version digit); they are
//! converted when read. An unknown version is reported, never guessed at.

use bytes::Bytes;
use http::HeaderValue;
use larder_proto::BlobProperties;
use serde::Deserialize;

use crate::error::Error;

/// The JSON version of records written before the compact form.
const JSON_VERSION: u32 = 1;

#[derive(Deserialize)]
struct Stored {
    v: u32,
    p: BlobProperties,
}

/// The bytes to store for a PUT's compact header value (already decoded and checked).
pub fn from_header(value: &HeaderValue) -> Bytes {
    Bytes::copy_from_slice(value.as_bytes())
}

/// The bytes to store for properties that came in another form.
pub fn encode(props: &BlobProperties) -> Result<Bytes, Error> {
    Ok(from_header(&props.to_compact()?))
}

/// The `x-larder-props` value of a stored record. A compact record is checked for being header
/// text of a known version, not decoded: the PUT that stored it decoded it, and the store's
/// checksum covers it since.
pub fn to_header(stored: &Bytes) -> Result<HeaderValue, Error> {
    if stored.first() == Some(&b'{') {
        return decode_json(stored)?
            .to_compact()
            .map_err(|e| Error::CorruptProperties(e.to_string()));
    }
    if !stored.starts_with(b"1;") {
        return Err(Error::CorruptProperties(
            "an unknown encoding or version".into(),
        ));
    }
    HeaderValue::from_maybe_shared(stored.clone())
        .map_err(|_| Error::CorruptProperties("not header text".into()))
}

fn decode_json(bytes: &[u8]) -> Result<BlobProperties, Error> {
    let stored: Stored =
        serde_json::from_slice(bytes).map_err(|e| Error::CorruptProperties(e.to_string()))?;
    if stored.v != JSON_VERSION {
        return Err(Error::CorruptProperties(format!(
            "version {} is not supported",
            stored.v
        )));
    }
    Ok(stored.p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props() -> BlobProperties {
        BlobProperties {
            content_type: Some("image/png".into()),
            user_meta: vec![("owner".into(), "ada".into())],
            created_ms: 1_700_000_000_000,
            expires_ms: None,
        }
    }

    #[test]
    fn compact_records_are_served_as_stored() {
        let stored = encode(&props()).unwrap();
        let header = to_header(&stored).unwrap();
        assert_eq!(header.as_bytes(), &stored[..]);
        assert_eq!(BlobProperties::from_compact(&header).unwrap(), props());
    }

    #[test]
    fn json_records_of_earlier_releases_are_converted() {
        let json = serde_json::json!({"v": 1, "p": props()}).to_string();
        let header = to_header(&Bytes::from(json)).unwrap();
        assert_eq!(BlobProperties::from_compact(&header).unwrap(), props());
        let future = Bytes::from_static(br#"{"v":2,"p":{"created_ms":1}}"#);
        assert!(matches!(
            to_header(&future),
            Err(Error::CorruptProperties(_))
        ));
    }

    #[test]
    fn unknown_or_broken_records_are_corrupt() {
        for stored in [&b"2;1;;-;"[..], b"", b"1;1;;-;\n", b"garbage"] {
            assert!(
                matches!(
                    to_header(&Bytes::copy_from_slice(stored)),
                    Err(Error::CorruptProperties(_))
                ),
                "{stored:?}"
            );
        }
    }
}
