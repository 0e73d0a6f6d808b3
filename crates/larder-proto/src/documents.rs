//! Document records on the internal API: `/internal/v1/partitions/<p>/docs/<key>`, where the key
//! (a document ID such as `id:music:song::a b`) travels percent-encoded in one path segment, and
//! the version and operation time travel in headers.

/// Header names of document operations.
pub mod header {
    /// The write's version (a hybrid logical clock timestamp minted by a frontend), decimal. On
    /// answers: the version the replica holds after the operation.
    pub const VERSION: &str = "x-larder-doc-version";
    /// Outcome of a document write: `applied` (now the newest) or `stale` (the replica already
    /// held this or a newer version; nothing was written).
    pub const OUTCOME: &str = "x-larder-doc";
    /// On a 410: the document was removed by a versioned tombstone.
    pub const REMOVED: &str = "removed";
    /// On a serialised write (the write of a read-modify-write): the primary the frontend
    /// believes in, `larder_cluster::ClusterMap::primary_fence`. A node that does not compute
    /// the same fence from its map answers 421.
    pub const PRIMARY: &str = "x-larder-doc-primary";
    /// On a serialised write: the version the frontend read. The primary applies the write only
    /// if it holds no newer version (else 409 with the version it holds).
    pub const EXPECT: &str = "x-larder-doc-expect";
    /// On a GET: the version the reader already holds in full. A replica holding exactly that
    /// version (live or removed) answers `304` with its version and time and no body.
    pub const KNOWN: &str = "x-larder-doc-known";
}

const PARTITIONS: &str = "/internal/v1/partitions/";

/// Path of the document `key` on `partition`.
pub fn doc_path(partition: u32, key: &str) -> String {
    format!("{PARTITIONS}{partition}/docs/{}", encode_key(key))
}

/// Percent-encodes every byte except RFC 3986 unreserved characters and `:`, so that any
/// document ID fits in one path segment.
pub fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for byte in key.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~:".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The inverse of [`encode_key`] (and of any other percent-encoding); `None` for a malformed
/// escape or bytes that are not UTF-8.
pub fn decode_key(encoded: &str) -> Option<String> {
    percent_decode(encoded, false)
}

/// Decodes `%XX` escapes (and, when `plus_is_space`, `+` as a space, the way HTML forms and
/// Java's `URLEncoder` encode it). `None` for a malformed escape or non-UTF-8 result.
pub fn percent_decode(text: &str, plus_is_space: bool) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            other => {
                out.push(other);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_fit_one_segment() {
        let key = "id:music:song::a b/c?d%e+f";
        let encoded = encode_key(key);
        assert!(!encoded.contains('/') && !encoded.contains('?'));
        assert_eq!(decode_key(&encoded).as_deref(), Some(key));
        assert_eq!(
            doc_path(3, "id:n:t::x y"),
            "/internal/v1/partitions/3/docs/id:n:t::x%20y"
        );
        assert_eq!(percent_decode("a+b%2B", true).as_deref(), Some("a b+"));
        assert_eq!(percent_decode("a%2", false), None);
        assert_eq!(percent_decode("%FF", false), None);
    }

    proptest! {
        #[test]
        fn encode_round_trips(key in ".{0,40}") {
            prop_assert_eq!(decode_key(&encode_key(&key)), Some(key));
        }
    }
}
