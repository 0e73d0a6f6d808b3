//! Public API errors and the one function that turns them into responses.

use http::{header, HeaderValue, Response, StatusCode};
use larder_router::{GoneReason, Missing};

use crate::body::{full, Body};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{1}")]
    BadRequest(&'static str, String),
    #[error("{0}")]
    NotFound(String),
    /// A presigned URL is required and this request's is missing or wrong.
    #[error("{1}")]
    Forbidden(&'static str, String),
    #[error("method {method} is not allowed here; use {allow}")]
    MethodNotAllowed { method: String, allow: &'static str },
    #[error("{1}")]
    Gone(&'static str, String),
    #[error("{0}")]
    TooLarge(String),
    /// The client stopped sending its request body.
    #[error("{0}")]
    BodyTimeout(String),
    #[error("range not satisfiable for a blob of {size} bytes")]
    RangeNotSatisfiable { size: u64 },
    #[error("{0}")]
    Unavailable(String),
    /// The frontend's downloads hold its whole download budget.
    #[error("{0}")]
    DownloadBudgetSpent(String),
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    OutOfSpace(String),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// Status and stable error code of every error, in one place.
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest(code, _) => (StatusCode::BAD_REQUEST, code),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "NotFound"),
            ApiError::Forbidden(code, _) => (StatusCode::FORBIDDEN, code),
            ApiError::MethodNotAllowed { .. } => {
                (StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed")
            }
            ApiError::Gone(code, _) => (StatusCode::GONE, code),
            ApiError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "TooLarge"),
            ApiError::BodyTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "BodyTimeout"),
            ApiError::RangeNotSatisfiable { .. } => {
                (StatusCode::RANGE_NOT_SATISFIABLE, "RangeNotSatisfiable")
            }
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "NotEnoughReplicas"),
            ApiError::DownloadBudgetSpent(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "DownloadBudgetSpent")
            }
            ApiError::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "Timeout"),
            ApiError::OutOfSpace(_) => (StatusCode::INSUFFICIENT_STORAGE, "OutOfSpace"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "Internal"),
        }
    }

    pub fn into_response(self) -> Response<Body> {
        let (status, code) = self.status_and_code();
        let body = serde_json::json!({"error": {"code": code, "message": self.to_string()}});
        let mut response = Response::new(full(body.to_string()));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        match self {
            ApiError::MethodNotAllowed { allow, .. } => {
                headers.insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            ApiError::RangeNotSatisfiable { size } => {
                let value = format!("bytes */{size}");
                headers.insert(
                    header::CONTENT_RANGE,
                    HeaderValue::from_str(&value).expect("digits are a valid header"),
                );
            }
            ApiError::Unavailable(_) | ApiError::DownloadBudgetSpent(_) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        response
    }
}

impl From<crate::body::ReadError> for ApiError {
    fn from(err: crate::body::ReadError) -> ApiError {
        match err {
            crate::body::ReadError::Transport(_) => {
                ApiError::BadRequest("BadBody", err.to_string())
            }
            crate::body::ReadError::Stalled(_) => ApiError::BodyTimeout(err.to_string()),
        }
    }
}

impl From<larder_router::RouterError> for ApiError {
    fn from(err: larder_router::RouterError) -> ApiError {
        use larder_router::RouterError as R;
        match err {
            R::Unavailable(message) => ApiError::Unavailable(message),
            R::DownloadBudgetSpent(message) => ApiError::DownloadBudgetSpent(message),
            R::Timeout(_) => ApiError::Timeout(err.to_string()),
            R::UnknownPartition(_) => ApiError::NotFound(format!("no such blob ({err})")),
            R::OutOfSpace(message) => ApiError::OutOfSpace(message),
            R::Rejected(message) => {
                ApiError::BadRequest("Rejected", format!("a storage node refused: {message}"))
            }
        }
    }
}

/// A blob the router could not serve, as the public API says it.
impl From<Missing> for ApiError {
    fn from(missing: Missing) -> ApiError {
        match missing {
            Missing::NotFound => ApiError::NotFound("no such blob".into()),
            Missing::Gone {
                reason: GoneReason::Expired,
                ..
            } => ApiError::Gone("Expired", "blob has expired".into()),
            Missing::Gone {
                reason: GoneReason::Deleted,
                ..
            } => ApiError::Gone("Deleted", "blob was deleted".into()),
            Missing::RangeNotSatisfiable { size } => ApiError::RangeNotSatisfiable { size },
        }
    }
}

impl From<larder_s3::SignatureError> for ApiError {
    fn from(err: larder_s3::SignatureError) -> ApiError {
        use larder_s3::SignatureError as E;
        let code = match &err {
            E::Unavailable(_) => return ApiError::Unavailable(err.to_string()),
            E::Malformed(_) => {
                return ApiError::BadRequest("AuthorizationQueryParametersError", err.to_string())
            }
            E::Missing => "SignatureRequired",
            E::Expired => "SignatureExpired",
            E::NotYetValid => "SignatureNotYetValid",
            E::UnknownKey => "InvalidAccessKeyId",
            E::Mismatch => "SignatureDoesNotMatch",
            E::Forbidden(_) => "AccessDenied",
        };
        ApiError::Forbidden(code, err.to_string())
    }
}
