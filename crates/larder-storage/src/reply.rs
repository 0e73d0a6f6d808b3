//! Building responses, and the one place that maps errors to statuses and stable codes.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body::{Frame, SizeHint};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use larder_proto::RangeError;

use crate::error::Error;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;

/// Seconds a client told 503 by the body budget waits before asking this node again.
const BUDGET_RETRY_AFTER_SECS: u32 = 1;

pub fn body(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

pub fn body_response(text: String) -> Response<Body> {
    Response::new(body(text))
}

pub fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(body(Bytes::new()));
    *response.status_mut() = code;
    response
}

pub fn json(code: StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    let mut response = Response::new(body(
        serde_json::to_vec(value).expect("JSON values serialise"),
    ));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `{"error":{"code":…,"message":…}}` with the given status.
fn coded(code: StatusCode, stable_code: &str, message: impl std::fmt::Display) -> Response<Body> {
    json(
        code,
        &serde_json::json!({"error": {"code": stable_code, "message": message.to_string()}}),
    )
}

/// Maps every error to its status, stable code and the headers that go with them.
pub fn error_response(err: &Error) -> Response<Body> {
    let (code, stable) = error_status(err);
    let mut response = coded(code, stable, err);
    let headers = response.headers_mut();
    match err {
        Error::ReadBudgetSpent => {
            headers.insert(header::RETRY_AFTER, BUDGET_RETRY_AFTER_SECS.into());
            let spent = HeaderValue::from_static("1");
            headers.insert(larder_proto::header::READ_BUDGET_SPENT, spent);
        }
        Error::BodyBudgetSpent { .. }
        | Error::Busy(_)
        | Error::Bootstrapping { .. }
        | Error::Rebuilding { .. }
        // Checked once its first replication round is answered: frontends ask again
        // (`larder-router`'s `Reask`).
        | Error::Unchecked { .. } => {
            headers.insert(header::RETRY_AFTER, BUDGET_RETRY_AFTER_SECS.into());
        }
        Error::BadRange(err @ RangeError::Unsatisfiable { size }) => {
            if let Some(value) = err.content_range() {
                let value = HeaderValue::from_str(&value).expect("a content range is ascii");
                headers.insert(header::CONTENT_RANGE, value);
            }
            headers.insert(larder_proto::header::BLOB_SIZE, (*size).into());
        }
        Error::NewerVersion { current } => {
            headers.insert(larder_proto::doc_header::VERSION, (*current).into());
        }
        _ => {}
    }
    response
}

/// An error's status and stable code (also a batched PUT's per-blob answer, `put_batch.rs`).
pub fn error_status(err: &Error) -> (StatusCode, &'static str) {
    use StatusCode as S;
    match err {
        Error::NoSuchPath(_) => (S::NOT_FOUND, "NoSuchPath"),
        Error::NotHosted { .. } => (S::NOT_FOUND, "PartitionNotHere"),
        Error::Misdirected { .. } => (S::MISDIRECTED_REQUEST, "MapMoved"),
        Error::Map(larder_cluster::MapError::Syntax(_) | larder_cluster::MapError::Invalid(_)) => {
            (S::BAD_REQUEST, "InvalidMap")
        }
        Error::Map(_) => (S::CONFLICT, "MapRevisionConflict"),
        Error::MethodNotAllowed(_) => (S::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
        Error::BadQuery(_) => (S::BAD_REQUEST, "BadQuery"),
        Error::BadKey(_) => (S::BAD_REQUEST, "BadKey"),
        Error::BadSelection(_) => (S::BAD_REQUEST, "BadSelection"),
        Error::BadHeader(_) => (S::BAD_REQUEST, "BadHeader"),
        Error::BadProperties(_) => (S::BAD_REQUEST, "BadProperties"),
        Error::FromTheFuture { .. } => (S::BAD_REQUEST, "FromTheFuture"),
        Error::ChecksumMismatch => (S::BAD_REQUEST, "ChecksumMismatch"),
        Error::BadBatch(_) => (S::BAD_REQUEST, "BadBatch"),
        Error::BodyTooLarge { .. } => (S::PAYLOAD_TOO_LARGE, "TooLarge"),
        Error::BodyTimeout(_) => (S::REQUEST_TIMEOUT, "BodyTimeout"),
        Error::Body(_) => (S::BAD_REQUEST, "BodyError"),
        Error::BodyBudgetSpent { .. } => (S::SERVICE_UNAVAILABLE, "BodyBudgetSpent"),
        Error::BadRange(RangeError::Unsatisfiable { .. }) => {
            (S::RANGE_NOT_SATISFIABLE, "RangeNotSatisfiable")
        }
        Error::BadRange(_) => (S::BAD_REQUEST, "BadRange"),
        Error::NotFound(_) => (S::NOT_FOUND, "NotFound"),
        Error::Busy(_) => (S::SERVICE_UNAVAILABLE, "Busy"),
        Error::ReadBudgetSpent => (S::SERVICE_UNAVAILABLE, "ReadBudgetSpent"),
        Error::NotPrimary(_) => (S::MISDIRECTED_REQUEST, "NotPrimary"),
        Error::NewerVersion { .. } => (S::CONFLICT, "NewerVersion"),
        Error::CorruptProperties(_) => (S::INTERNAL_SERVER_ERROR, "Corrupt"),
        Error::BehindDroppedTombstones { .. } => (S::CONFLICT, "ReplicaMustBeRebuilt"),
        Error::NotCheckedYet { .. } => (S::TOO_EARLY, "ReplicaNotCheckedYet"),
        Error::MustBeRebuilt { .. } => (S::SERVICE_UNAVAILABLE, "ThisReplicaMustBeRebuilt"),
        Error::Bootstrapping { .. } => (S::SERVICE_UNAVAILABLE, "ReplicaBootstrapping"),
        Error::Rebuilding { .. } => (S::SERVICE_UNAVAILABLE, "ReplicaRebuilding"),
        Error::Unchecked { .. } => (S::SERVICE_UNAVAILABLE, "ReplicaUnchecked"),
        Error::MapRefused(_) => (S::BAD_REQUEST, "MapRefused"),
        Error::Store(err) => store_status(err),
    }
}

fn store_status(err: &larder_store::Error) -> (StatusCode, &'static str) {
    use larder_store::Error as E;
    match err {
        E::Corrupt { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "Corrupt"),
        E::OutOfSpace => (StatusCode::INSUFFICIENT_STORAGE, "OutOfSpace"),
        E::BadKey(_) => (StatusCode::BAD_REQUEST, "BadKey"),
        E::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "TooLarge"),
        E::UnsupportedVersion { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "UnsupportedFormat"),
        E::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "StoreUnavailable"),
        E::Io(_) => (StatusCode::INTERNAL_SERVER_ERROR, "IoError"),
    }
}

/// `410` for a deleted or expired blob or a removed document: an expected outcome, not an error.
pub fn gone(
    stable_code: &'static str,
    message: impl std::fmt::Display,
    reason: &'static str,
) -> Response<Body> {
    let mut response = coded(StatusCode::GONE, stable_code, message);
    response.headers_mut().insert(
        larder_proto::header::GONE_REASON,
        HeaderValue::from_static(reason),
    );
    response
}

/// A response body made of already-verified chunks, sent as they are (no concatenation).
pub fn chunks_body(chunks: Vec<Bytes>) -> Body {
    ChunksBody(chunks.into()).boxed()
}

struct ChunksBody(VecDeque<Bytes>);

impl http_body::Body for ChunksBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.0.pop_front().map(|chunk| Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.iter().map(|c| c.len() as u64).sum())
    }
}
