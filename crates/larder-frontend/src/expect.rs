//! `Expect: 100-continue` on HTTP/1: a request refused before its body was read must end its
//! connection, on every public port.
//!
//! hyper sends `100 Continue` when a handler first reads the body. A refusal decided by the
//! head alone (403, 404, 412, 413…) goes out without it, so a client that waits for 100 never
//! sends the body; RFC 9110 allows that, and botocore does it on every PutObject. hyper, told
//! the body is no longer wanted, then reads up to the body's `Content-Length` bytes from
//! whatever comes next, which is the client's *next request*: a PUT arrived as `T /bucket/key`
//! (its `PU` eaten) and failed with SignatureDoesNotMatch. A background drain (`body.rs`) eats
//! them the same way. With `Connection: close` the connection ends after the answer instead.

use http::{header, HeaderValue, Request, Response, Version};

/// An HTTP/1 request with a body and `Expect: 100-continue`: its client may be withholding the
/// body until `100 Continue`.
pub(crate) fn may_withhold_body<B>(req: &Request<B>) -> bool {
    let expects = expects_continue(req.headers());
    let has_body = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .is_none_or(|v| v.as_bytes() != b"0");
    expects && has_body && req.version() <= Version::HTTP_11
}

/// Whether the client waits for `100 Continue` before sending the body. A refusal then must
/// not drain the body (`body.rs`): it may never come, and the connection would stay open for
/// the body-read timeout.
pub(crate) fn expects_continue(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Ends the connection after `response` when its request's body may have been withheld and the
/// answer is a refusal. Every success reads the whole body first (so `100 Continue` went out
/// and the body came); a refusal may have read none of it.
pub(crate) fn close_if_refused<B>(withheld: bool, response: &mut Response<B>) {
    if withheld && !response.status().is_success() {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(version: Version, headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::put("/b/k").version(version);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn only_http1_requests_expecting_continue_with_a_body_may_withhold_it() {
        let expect = ("expect", "100-Continue");
        let v11 = Version::HTTP_11;
        assert!(may_withhold_body(&request(
            v11,
            &[expect, ("content-length", "2")]
        )));
        assert!(may_withhold_body(&request(v11, &[expect])), "chunked");
        assert!(!may_withhold_body(&request(
            v11,
            &[expect, ("content-length", "0")]
        )));
        assert!(!may_withhold_body(&request(
            v11,
            &[("content-length", "2")]
        )));
        let h2 = request(Version::HTTP_2, &[expect, ("content-length", "2")]);
        assert!(
            !may_withhold_body(&h2),
            "HTTP/2 frames bodies: nothing to misread"
        );
    }

    #[test]
    fn refusals_close_and_successes_keep_the_connection() {
        for (status, closes) in [
            (201, false),
            (204, false),
            (403, true),
            (412, true),
            (503, true),
        ] {
            let mut response = Response::builder().status(status).body(()).unwrap();
            close_if_refused(true, &mut response);
            assert_eq!(
                response.headers().contains_key(header::CONNECTION),
                closes,
                "{status}"
            );
            let mut response = Response::builder().status(status).body(()).unwrap();
            close_if_refused(false, &mut response);
            assert!(!response.headers().contains_key(header::CONNECTION));
        }
    }
}
