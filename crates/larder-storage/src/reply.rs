//! Building responses, and the one place that maps errors to statuses and stable codes.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;

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
pub fn error(
    code: StatusCode,
    stable_code: &str,
    message: impl std::fmt::Display,
) -> Response<Body> {
    json(
        code,
        &serde_json::json!({"error": {"code": stable_code, "message": message.to_string()}}),
    )
}

/// Maps every store error to its status and stable code.
pub fn store_error(err: &larder_store::Error) -> Response<Body> {
    use larder_store::Error as E;
    match err {
        E::Corrupt { .. } => error(StatusCode::INTERNAL_SERVER_ERROR, "Corrupt", err),
        E::OutOfSpace => error(StatusCode::INSUFFICIENT_STORAGE, "OutOfSpace", err),
        E::BadKey(_) => error(StatusCode::BAD_REQUEST, "BadKey", err),
        E::TooLarge { .. } => error(StatusCode::PAYLOAD_TOO_LARGE, "TooLarge", err),
        E::UnsupportedVersion { .. } => {
            error(StatusCode::INTERNAL_SERVER_ERROR, "UnsupportedFormat", err)
        }
        E::Unavailable(_) => error(StatusCode::SERVICE_UNAVAILABLE, "StoreUnavailable", err),
        E::Io(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "IoError", err),
    }
}
