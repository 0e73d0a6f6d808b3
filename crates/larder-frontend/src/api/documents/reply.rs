//! Responses of `/document/v1`, in Vespa's shape: always a JSON object with `pathId` and `id`,
//! plus `fields` for a found document and `message` for a failure. [`Failure::status`] is the one
//! place that maps failures to statuses.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use larder_router::DocError;

use crate::body::{full, Body};

/// Why a document request did not succeed.
#[derive(Debug)]
pub enum Failure {
    BadRequest(String),
    NotFound,
    MethodNotAllowed(String),
    ConditionNotMet(String),
    TooLarge(String),
    /// Too many requests (also what the test-only fault injector answers).
    Overloaded(String),
    Unavailable(String),
    Timeout(String),
    OutOfSpace(String),
    Internal(String),
}

impl Failure {
    /// The status Vespa uses for each failure.
    pub fn status(&self) -> StatusCode {
        match self {
            Failure::BadRequest(_) => StatusCode::BAD_REQUEST,
            Failure::NotFound => StatusCode::NOT_FOUND,
            Failure::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Failure::ConditionNotMet(_) => StatusCode::PRECONDITION_FAILED,
            Failure::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Failure::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            Failure::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Failure::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Failure::OutOfSpace(_) => StatusCode::INSUFFICIENT_STORAGE,
            Failure::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::NotFound => "document not found",
            Failure::BadRequest(m)
            | Failure::MethodNotAllowed(m)
            | Failure::ConditionNotMet(m)
            | Failure::TooLarge(m)
            | Failure::Overloaded(m)
            | Failure::Unavailable(m)
            | Failure::Timeout(m)
            | Failure::OutOfSpace(m)
            | Failure::Internal(m) => m,
        }
    }
}

impl From<DocError> for Failure {
    fn from(err: DocError) -> Failure {
        let message = err.to_string();
        match err {
            DocError::Unavailable(_) => Failure::Unavailable(message),
            DocError::Timeout => Failure::Timeout(message),
            DocError::OutOfSpace(_) => Failure::OutOfSpace(message),
            DocError::TooLarge(_) => Failure::TooLarge(message),
            DocError::Rejected(_) => Failure::BadRequest(message),
            // Nothing was applied, so never a 200. 503 with Retry-After, because the loss is
            // transient (concurrent writers whose clocks differ) and Vespa's feed clients retry
            // 503 (and 429) with backoff, whereas 409/412 would be final failures to them and 412
            // would wrongly say a test-and-set condition failed.
            DocError::Superseded { .. } => Failure::Unavailable(message),
            // The stored version is u64::MAX: no write can be ordered after it; retrying cannot
            // help, and it is the cluster's fault, not the request's.
            DocError::NoNewerVersion(_) => Failure::Internal(message),
        }
    }
}

/// The message a failure's answer carries (for a streamed answer that can no longer change
/// its status).
pub fn message_of(failure: &Failure) -> String {
    failure.message().to_owned()
}

fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("strings serialise")
}

fn json(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(full(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `200 {"pathId":…,"id":…}`, optionally with a `message`.
pub fn ok(path_id: &str, id: &str, message: Option<&str>) -> Response<Body> {
    let message = message.map_or(String::new(), |m| format!(",\"message\":{}", quoted(m)));
    json(
        StatusCode::OK,
        format!(
            "{{\"pathId\":{},\"id\":{}{message}}}",
            quoted(path_id),
            quoted(id)
        ),
    )
}

/// `200 {"pathId":…,"id":…,"fields":{…}}`; `fields` is the stored JSON object, not re-encoded.
pub fn found(path_id: &str, id: &str, fields: &[u8]) -> Response<Body> {
    let mut body = format!(
        "{{\"pathId\":{},\"id\":{},\"fields\":",
        quoted(path_id),
        quoted(id)
    )
    .into_bytes();
    body.extend_from_slice(fields);
    body.push(b'}');
    let mut response = json(StatusCode::OK, String::new());
    *response.body_mut() = full(Bytes::from(body));
    response
}

pub fn failure(path_id: &str, id: Option<&str>, failure: Failure) -> Response<Body> {
    let id = id.map_or(String::new(), |id| format!(",\"id\":{}", quoted(id)));
    let mut response = json(
        failure.status(),
        format!(
            "{{\"pathId\":{}{id},\"message\":{}}}",
            quoted(path_id),
            quoted(failure.message())
        ),
    );
    match failure {
        Failure::Overloaded(_) | Failure::Unavailable(_) => {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        Failure::MethodNotAllowed(_) => {
            response.headers_mut().insert(
                header::ALLOW,
                HeaderValue::from_static("GET, POST, PUT, DELETE"),
            );
        }
        _ => {}
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_has_vespas_status_and_a_json_object_body() {
        let cases = [
            (Failure::BadRequest("b".into()), 400),
            (Failure::NotFound, 404),
            (Failure::MethodNotAllowed("m".into()), 405),
            (Failure::ConditionNotMet("c".into()), 412),
            (Failure::TooLarge("t".into()), 413),
            (Failure::Overloaded("o".into()), 429),
            (Failure::Internal("i".into()), 500),
            (Failure::Unavailable("u".into()), 503),
            (Failure::Timeout("t".into()), 504),
            (Failure::OutOfSpace("s".into()), 507),
        ];
        for (failure, status) in cases {
            let response = super::failure("/document/v1/n/t/docid/1", Some("id:n:t::1"), failure);
            assert_eq!(response.status().as_u16(), status);
        }
        let from = |e: DocError| Failure::from(e).status().as_u16();
        assert_eq!(from(DocError::OutOfSpace("disk".into())), 507);
        assert_eq!(from(DocError::TooLarge("big".into())), 413);
        assert_eq!(from(DocError::Timeout), 504);
        assert_eq!(from(DocError::Unavailable("x".into())), 503);
        assert_eq!(from(DocError::Rejected("x".into())), 400);
        assert_eq!(from(DocError::Superseded { newest: 7 }), 503);
        let exhausted = larder_router::VersionExhausted { seen: u64::MAX };
        assert_eq!(from(DocError::NoNewerVersion(exhausted)), 500);
    }
}
