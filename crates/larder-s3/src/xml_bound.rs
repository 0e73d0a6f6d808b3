//! The bodies s3s reads whole: the XML of most PUT and POST operations (DeleteObjects,
//! CompleteMultipartUpload, PutBucketTagging, ...). s3s 0.14.1 answers two of a client's
//! faults in them with 500 `InternalError`, where S3 answers 4xx; Larder sees them first.
//!
//! - **Too large.** s3s reads such a body through http-body-util's `Limited`, at most
//!   `xml_max_body_size` bytes, but names only its own error type `MaxMessageLengthExceeded`,
//!   and `Limited` raises another. Larder refuses the body from the length the request
//!   declares, before a byte is read and after the access check (a client without the right
//!   learns nothing from the size): [`check`].
//! - **A wrong `x-amz-content-sha256`.** s3s fails the body when its hash does not match.
//!   [`PayloadHash`] hashes the body again (at most `XML_MAX_BODY` bytes) and marks the
//!   mismatch, so the server can answer 400 `XAmzContentSHA256Mismatch`.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use s3s::{s3_error, S3Result};
use sha2::{Digest, Sha256};

use crate::metrics::OperationSlot;

/// The largest XML body Larder takes. The largest S3 sends are a DeleteObjects of 1,000 keys
/// of 1 KiB, each character escaped as at most 6 bytes, and a CompleteMultipartUpload of
/// 10,000 parts: both under 8 MiB.
pub const XML_MAX_BODY: usize = 8 << 20;

/// The body length a request declared (`Content-Length`, or an HTTP/2 stream ended with its
/// headers), if it declared one: set by the server on every request.
#[derive(Clone, Copy, Debug)]
pub struct DeclaredLength(pub Option<u64>);

/// The PUT and POST operations whose bodies s3s hands Larder as a stream, not read whole
/// (s3s's routing table, `needs_full_body` false).
const STREAMED: [&str; 7] = [
    "PutObject",
    "UploadPart",
    "CopyObject",
    "UploadPartCopy",
    "CreateMultipartUpload",
    "WriteGetObjectResponse",
    "PostObject",
];

/// Whether s3s reads the body of `operation`, sent with `method`, whole before answering.
pub fn read_whole(method: &http::Method, operation: &str) -> bool {
    (method == http::Method::PUT || method == http::Method::POST) && !STREAMED.contains(&operation)
}

/// Refuses a body s3s would read whole that is over `XML_MAX_BODY` (400
/// `MaxMessageLengthExceeded`) or of no declared length (411 `MissingContentLength`, which
/// s3s answers for such a body after reading it, and S3 before).
pub fn check(
    method: &http::Method,
    operation: &str,
    declared: Option<DeclaredLength>,
) -> S3Result<()> {
    let Some(DeclaredLength(length)) = declared else {
        return Ok(());
    };
    if !read_whole(method, operation) {
        return Ok(());
    }
    match length {
        None => Err(s3_error!(
            MissingContentLength,
            "{operation} needs a Content-Length"
        )),
        Some(n) if n > XML_MAX_BODY as u64 => Err(s3_error!(
            MaxMessageLengthExceeded,
            "The XML body of {operation} is {n} bytes; at most {XML_MAX_BODY} are taken"
        )),
        Some(_) => Ok(()),
    }
}

/// Set when a body s3s reads whole did not match its declared SHA-256.
#[derive(Clone, Default)]
pub struct Mismatch(Arc<AtomicBool>);

impl Mismatch {
    pub fn happened(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A request body that hashes itself, when it is one s3s reads whole and its request declared
/// a SHA-256 (`x-amz-content-sha256` in hex), and marks a [`Mismatch`] once it is all here.
pub struct PayloadHash<B> {
    body: B,
    /// The declared hash in lowercase hex, if the request declared one.
    expected: Option<String>,
    method: http::Method,
    /// The operation, named by the access check before s3s reads the body.
    operation: OperationSlot,
    declared: Option<u64>,
    /// `None` before the first frame and when not hashing.
    hasher: Option<Sha256>,
    started: bool,
    seen: u64,
    mismatch: Mismatch,
}

impl PayloadHash<()> {
    /// The check of `head`'s body, without the body yet ([`PayloadHash::over`] adds it).
    pub fn of_request<T>(
        head: &http::Request<T>,
        operation: OperationSlot,
        mismatch: Mismatch,
    ) -> PayloadHash<()> {
        let expected = head
            .headers()
            .get("x-amz-content-sha256")
            .and_then(|v| v.to_str().ok())
            .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(str::to_ascii_lowercase);
        PayloadHash {
            body: (),
            expected,
            method: head.method().clone(),
            operation,
            declared: None,
            hasher: None,
            started: false,
            seen: 0,
            mismatch,
        }
    }

    /// This check over `body`.
    pub fn over<B>(self, body: B) -> PayloadHash<B> {
        PayloadHash {
            body,
            expected: self.expected,
            method: self.method,
            operation: self.operation,
            declared: self.declared,
            hasher: None,
            started: false,
            seen: 0,
            mismatch: self.mismatch,
        }
    }
}

impl<B> PayloadHash<B> {
    /// The body's length as declared; the hash is compared once that many bytes are here (s3s
    /// may not poll for the end after them).
    pub fn with_declared(mut self, declared: Option<u64>) -> PayloadHash<B> {
        self.declared = declared;
        self
    }

    fn take(&mut self, data: &Bytes) {
        if !self.started {
            self.started = true;
            if self.expected.is_some() && read_whole(&self.method, self.operation.get()) {
                self.hasher = Some(Sha256::new());
            }
        }
        let Some(hasher) = &mut self.hasher else {
            return;
        };
        hasher.update(data);
        self.seen = self.seen.saturating_add(data.len() as u64);
        if Some(self.seen) == self.declared {
            self.finish();
        }
    }

    fn finish(&mut self) {
        let (Some(hasher), Some(expected)) = (self.hasher.take(), &self.expected) else {
            return;
        };
        if crate::blobs::hex(&hasher.finalize()) != *expected {
            self.mismatch.0.store(true, Ordering::Relaxed);
        }
    }
}

impl<B> Body for PayloadHash<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.take(data);
                }
            }
            Poll::Ready(None) => this.finish(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn code(method: Method, operation: &str, length: Option<u64>) -> Option<String> {
        check(&method, operation, Some(DeclaredLength(length)))
            .err()
            .map(|e| e.code().as_str().to_owned())
    }

    #[test]
    fn whole_bodies_over_the_bound_or_of_no_length_are_refused() {
        let over = Some(XML_MAX_BODY as u64 + 1);
        let at = Some(XML_MAX_BODY as u64);
        assert_eq!(
            code(Method::POST, "DeleteObjects", over).as_deref(),
            Some("MaxMessageLengthExceeded")
        );
        assert_eq!(
            code(Method::PUT, "PutBucketTagging", over).as_deref(),
            Some("MaxMessageLengthExceeded")
        );
        assert_eq!(
            code(Method::POST, "CompleteMultipartUpload", None).as_deref(),
            Some("MissingContentLength")
        );
        assert_eq!(code(Method::POST, "DeleteObjects", at), None);
        assert_eq!(code(Method::PUT, "CreateBucket", Some(0)), None);
    }

    #[test]
    fn streamed_bodies_and_bodiless_methods_are_not_bounded_here() {
        let huge = Some(5 << 30);
        assert_eq!(code(Method::PUT, "PutObject", huge), None);
        assert_eq!(code(Method::PUT, "UploadPart", None), None);
        assert_eq!(code(Method::POST, "CreateMultipartUpload", None), None);
        assert_eq!(code(Method::GET, "GetObject", huge), None);
        assert_eq!(code(Method::DELETE, "DeleteObject", None), None);
        assert!(check(&Method::POST, "DeleteObjects", None).is_ok());
    }

    fn hashed(method: Method, operation: &str, declared: &str, pieces: &[&[u8]]) -> bool {
        let head = http::Request::builder()
            .method(method)
            .header("x-amz-content-sha256", declared)
            .body(())
            .unwrap();
        let slot = OperationSlot::default();
        let mismatch = Mismatch::default();
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = pieces
            .iter()
            .map(|p| Ok(Frame::data(Bytes::copy_from_slice(p))))
            .collect();
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        let total = pieces.iter().map(|p| p.len() as u64).sum();
        let mut body = PayloadHash::of_request(&head, slot.clone(), mismatch.clone())
            .over(body)
            .with_declared(Some(total));
        slot.set(operation);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            use http_body_util::BodyExt;
            // Read only up to the declared length, as s3s's hash check does.
            let mut seen = 0;
            while seen < total {
                let frame = body.frame().await.unwrap().unwrap();
                seen += frame.into_data().unwrap().len() as u64;
            }
        });
        mismatch.happened()
    }

    #[test]
    fn a_whole_body_that_does_not_match_its_declared_hash_is_marked() {
        let xml: &[&[u8]] = &[b"<Delete><Object>", b"<Key>a</Key></Object></Delete>"];
        let right = crate::blobs::hex(&Sha256::digest(xml.concat()));
        let wrong = crate::blobs::hex(&Sha256::digest(b"other"));
        assert!(!hashed(Method::POST, "DeleteObjects", &right, xml));
        assert!(!hashed(
            Method::POST,
            "DeleteObjects",
            &right.to_uppercase(),
            xml
        ));
        assert!(hashed(Method::POST, "DeleteObjects", &wrong, xml));
        // Streamed bodies are s3s's and Larder's own to check; UNSIGNED-PAYLOAD is not a hash.
        assert!(!hashed(Method::PUT, "PutObject", &wrong, xml));
        assert!(!hashed(
            Method::POST,
            "DeleteObjects",
            "UNSIGNED-PAYLOAD",
            xml
        ));
    }
}
