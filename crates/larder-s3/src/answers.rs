//! Where s3s's answers differ from S3's, mended after s3s wrote them: every answer names its
//! request (`x-amz-request-id`, and `<RequestId>` in an error's XML, as S3's do and as SDKs
//! log), and GetObjectAttributes gives its ETag unquoted (S3 does; s3s quotes every ETag).
//! Only small XML bodies are read back: an error's, or a page of attributes.

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use rand::RngCore;

use crate::server::S3Body;

/// Largest body read back to be mended (an error is a few hundred bytes; a page of 1,000
/// parts' attributes about 100 KiB).
const MAX_MENDED_BODY: usize = 1 << 20;

/// A fresh request ID: 16 hex digits, random (no clock or counter to learn from).
pub fn request_id() -> String {
    format!("{:016X}", rand::rng().next_u64())
}

/// `response`, mended for the request `id`; `attributes`: the request was a
/// GetObjectAttributes.
pub async fn mend(
    mut response: http::Response<S3Body>,
    attributes: bool,
    id: String,
) -> http::Response<S3Body> {
    if let Ok(value) = http::HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-amz-request-id", value);
    }
    let is_xml = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/xml"));
    let status = response.status();
    let attributes = attributes && status.is_success();
    if !is_xml || !(status.is_client_error() || status.is_server_error() || attributes) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let xml = match read_back(body).await {
        Some(xml) => xml,
        None => {
            tracing::warn!("an S3 answer could not be read back to be mended");
            parts.status = http::StatusCode::INTERNAL_SERVER_ERROR;
            parts.headers.remove(http::header::CONTENT_LENGTH);
            return http::Response::from_parts(parts, empty());
        }
    };
    let mended = match attributes {
        true => unquote_etag(&xml),
        false => with_request_id(&xml, &id),
    };
    parts.headers.remove(http::header::CONTENT_LENGTH);
    let body = s3s::Body::from(mended).boxed();
    http::Response::from_parts(parts, body)
}

/// The whole of `body`, if it ends within `MAX_MENDED_BODY` bytes.
async fn read_back(mut body: S3Body) -> Option<Bytes> {
    let mut xml = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.ok()?.into_data() else {
            continue; // trailers: an XML answer has none
        };
        if xml.len().saturating_add(data.len()) > MAX_MENDED_BODY {
            return None;
        }
        xml.extend_from_slice(&data);
    }
    Some(xml.freeze())
}

fn empty() -> S3Body {
    s3s::Body::empty().boxed()
}

/// An error's XML with `<RequestId>` added before `</Error>`, unless it has one, or no
/// `</Error>`, or is not UTF-8 (then as it was).
fn with_request_id(xml: &[u8], id: &str) -> Bytes {
    let Ok(text) = std::str::from_utf8(xml) else {
        return Bytes::copy_from_slice(xml);
    };
    match text.rfind("</Error>") {
        Some(at) if !text.contains("<RequestId>") => {
            let mut out = String::with_capacity(text.len() + id.len() + 24);
            out.push_str(&text[..at]);
            out.push_str("<RequestId>");
            out.push_str(id);
            out.push_str("</RequestId>");
            out.push_str(&text[at..]);
            Bytes::from(out)
        }
        _ => Bytes::copy_from_slice(xml),
    }
}

/// The XML with the quotes (escaped or not) around the first `<ETag>`'s value taken off (as
/// it was if it is not UTF-8 or has no quoted `<ETag>`).
fn unquote_etag(xml: &[u8]) -> Bytes {
    let Ok(text) = std::str::from_utf8(xml) else {
        return Bytes::copy_from_slice(xml);
    };
    let Some(open) = text.find("<ETag>").map(|i| i + "<ETag>".len()) else {
        return Bytes::copy_from_slice(xml);
    };
    let Some(close) = text[open..].find("</ETag>").map(|i| open + i) else {
        return Bytes::copy_from_slice(xml);
    };
    let value = &text[open..close];
    let bare = ["&quot;", "\""].iter().find_map(|q| {
        value
            .strip_prefix(q)
            .and_then(|v| v.strip_suffix(q))
            .filter(|v| !v.is_empty())
    });
    match bare {
        Some(bare) => Bytes::from(format!("{}{bare}{}", &text[..open], &text[close..])),
        None => Bytes::copy_from_slice(xml),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_names_its_request() {
        let xml = b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code></Error>";
        let mended = with_request_id(xml, "ABC");
        assert_eq!(
            &mended[..],
            b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><RequestId>ABC</RequestId></Error>"
        );
        assert_eq!(&with_request_id(&mended, "DEF")[..], &mended[..]);
        assert_eq!(&with_request_id(b"<a/>", "X")[..], b"<a/>");
    }

    #[test]
    fn the_attributes_etag_loses_its_quotes() {
        let escaped = b"<R><ETag>&quot;abc&quot;</ETag><ObjectSize>3</ObjectSize></R>";
        assert_eq!(
            &unquote_etag(escaped)[..],
            b"<R><ETag>abc</ETag><ObjectSize>3</ObjectSize></R>"
        );
        assert_eq!(
            &unquote_etag(b"<ETag>\"a-2\"</ETag>")[..],
            b"<ETag>a-2</ETag>"
        );
        for unchanged in [
            &b"<ETag>abc</ETag>"[..],
            b"<ETag>",
            b"<R/>",
            b"<ETag>\"\"</ETag>",
        ] {
            assert_eq!(&unquote_etag(unchanged)[..], unchanged);
        }
    }

    proptest::proptest! {
        /// Any body (an answer s3s wrote, or anything): mended without a panic, and only ever
        /// by the one addition or removal each makes.
        #[test]
        fn any_body_is_mended_or_left(
            pieces in proptest::collection::vec(proptest::prop_oneof![
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8),
                proptest::sample::select(vec![
                    b"<Error>".to_vec(), b"</Error>".to_vec(), b"<ETag>".to_vec(),
                    b"</ETag>".to_vec(), b"&quot;".to_vec(), b"\"".to_vec(),
                    b"<RequestId>".to_vec(),
                ]),
            ], 0..40)
        ) {
            let body = pieces.concat();
            let with_id = with_request_id(&body, "ID");
            proptest::prop_assert!(with_id.len() == body.len() || with_id.len() == body.len() + "<RequestId>ID</RequestId>".len());
            let unquoted = unquote_etag(&body);
            proptest::prop_assert!(unquoted.len() <= body.len());
        }
    }

    #[test]
    fn request_ids_differ() {
        let (a, b) = (request_id(), request_id());
        assert_eq!(a.len(), 16);
        assert_ne!(a, b);
    }
}
