//! `/v1/blobs`: upload, download (whole, ranges, conditional), HEAD and DELETE.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use larder_cluster::{BlobId, BlobKind};
use larder_proto::{header as h, BlobProperties, ByteRange, PropertiesError};
use larder_router::GetAnswer;

use crate::body::{drain_in_background, full, Body};
use crate::error::ApiError;
use crate::state::AppState;

const TTL_HEADER: &str = "x-larder-ttl";
const EXPIRES_HEADER: &str = "x-larder-expires";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `POST /v1/blobs`: stores the body on a quorum of replicas and answers with the new ID.
pub async fn upload(
    state: &Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let max = state.config.max_blob_size.as_u64();
    let (parts, body) = req.into_parts();
    let props = match upload_properties(&parts.headers, max) {
        Ok(props) => props,
        Err(err) => {
            // Refused before reading: let the client finish sending so it sees the answer.
            let timeout = state.config.limits.body_read_timeout;
            drain_in_background(body, drain_budget(max), timeout);
            return Err(err);
        }
    };
    let length = content_length(&parts.headers)?;
    let (id, size) = super::large::store_body(state, props, body, length).await?;
    let location = format!("/v1/blobs/{id}");
    let body = serde_json::json!({"id": id.to_string(), "size": size});
    let mut response = Response::new(full(body.to_string()));
    *response.status_mut() = StatusCode::CREATED;
    let headers = response.headers_mut();
    headers.insert(
        header::LOCATION,
        HeaderValue::from_str(&location).expect("base64url is a valid header"),
    );
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// Validates an upload's headers: properties, TTL and a declared length within `max`.
fn upload_properties(headers: &HeaderMap, max: u64) -> Result<BlobProperties, ApiError> {
    let mut props = BlobProperties::from_headers(headers).map_err(bad_properties)?;
    props.created_ms = now_ms();
    props.expires_ms = ttl(headers)?.map(|ttl| props.created_ms + ttl.as_millis() as u64);
    if content_length(headers)?.is_some_and(|length| length > max) {
        return Err(too_large(max));
    }
    Ok(props)
}

fn bad_properties(err: PropertiesError) -> ApiError {
    ApiError::BadRequest("BadHeader", err.to_string())
}

pub(super) fn too_large(max: u64) -> ApiError {
    ApiError::TooLarge(format!(
        "blob is larger than the limit of {max} bytes (max_blob_size)"
    ))
}

fn ttl(headers: &HeaderMap) -> Result<Option<Duration>, ApiError> {
    let Some(value) = headers.get(TTL_HEADER) else {
        return Ok(None);
    };
    let seconds: u64 = value
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|s| *s > 0)
        .ok_or_else(|| {
            ApiError::BadRequest(
                "BadHeader",
                format!("{TTL_HEADER} must be a positive number of seconds"),
            )
        })?;
    Ok(Some(Duration::from_secs(seconds)))
}

fn content_length(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    match headers.get(header::CONTENT_LENGTH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Some)
            .ok_or_else(|| {
                ApiError::BadRequest("BadHeader", "Content-Length is not a number".into())
            }),
    }
}

/// How much of a refused upload is read and dropped so the client sees the answer: bounded, so
/// that a refused huge upload does not keep a connection busy for long.
pub(super) fn drain_budget(max: u64) -> u64 {
    max.saturating_mul(2).min(64 * 1024 * 1024)
}

/// `GET`, `HEAD` and `DELETE` of `/v1/blobs/<id>`.
pub async fn by_id(
    state: &Arc<AppState>,
    id: &str,
    req: &http::request::Parts,
) -> Result<Response<Body>, ApiError> {
    let method = req.method.clone();
    if !matches!(method, Method::GET | Method::HEAD | Method::DELETE) {
        return Err(ApiError::MethodNotAllowed {
            method: method.to_string(),
            allow: "GET, HEAD, DELETE",
        });
    }
    let id: BlobId = id
        .parse()
        .map_err(|e| ApiError::BadRequest("InvalidBlobId", format!("malformed blob id: {e}")))?;
    if id.kind == BlobKind::Chunk {
        // Chunks belong to their composite blob; their IDs are never handed out.
        return Err(ApiError::NotFound(format!("no blob {id}")));
    }
    if method == Method::DELETE {
        if id.kind == BlobKind::Composite {
            super::large::delete(state, &id).await?;
        } else {
            state.router.delete_blob(&id).await?;
        }
        let mut response = Response::new(crate::body::empty());
        *response.status_mut() = StatusCode::ACCEPTED;
        return Ok(response);
    }
    download(state, &id, method, &req.headers).await
}

async fn download(
    state: &Arc<AppState>,
    id: &BlobId,
    method: Method,
    headers: &HeaderMap,
) -> Result<Response<Body>, ApiError> {
    let etag = format!("\"{id}\"");
    let not_modified = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .map(str::trim)
                .any(|tag| tag == etag || tag == "*" || tag.strip_prefix("W/") == Some(&etag))
        });
    let range = match headers.get(header::RANGE) {
        // A conditional hit answers 304 whatever the range; ranges only matter for a full answer.
        Some(v) if !not_modified => Some(
            v.to_str()
                .ok()
                .and_then(|s| ByteRange::parse(s).ok())
                .ok_or_else(|| ApiError::BadRequest("BadRange", "malformed Range header".into()))?,
        ),
        _ => None,
    };
    if id.kind == BlobKind::Composite {
        let head = method == Method::HEAD;
        return super::large::download(state, id, &etag, not_modified, range, head).await;
    }
    let storage_method = if not_modified {
        Method::HEAD
    } else {
        method.clone()
    };
    let answer = state.router.get_blob(id, storage_method, range).await?;
    let response = match answer {
        GetAnswer::NotFound => return Err(ApiError::NotFound(format!("no blob {id}"))),
        GetAnswer::Replica(response) => response,
    };
    match response.status() {
        StatusCode::OK | StatusCode::PARTIAL_CONTENT => {
            Ok(relay(response, &etag, not_modified, method == Method::HEAD))
        }
        StatusCode::GONE => Err(gone(response.headers())),
        StatusCode::RANGE_NOT_SATISFIABLE => Err(ApiError::RangeNotSatisfiable {
            content_range: response.headers().get(header::CONTENT_RANGE).cloned(),
        }),
        StatusCode::INSUFFICIENT_STORAGE => {
            Err(ApiError::OutOfSpace("storage is out of space".into()))
        }
        other => Err(ApiError::Internal(format!("storage answered {other}"))),
    }
}

pub(super) fn gone(headers: &HeaderMap) -> ApiError {
    match headers.get(h::GONE_REASON).and_then(|v| v.to_str().ok()) {
        Some("expired") => ApiError::Gone("Expired", "blob has expired".into()),
        _ => ApiError::Gone("Deleted", "blob was deleted".into()),
    }
}

/// Turns a storage node's answer into the public one: same status and body stream, public headers.
fn relay(
    storage: Response<Incoming>,
    etag: &str,
    not_modified: bool,
    head: bool,
) -> Response<Body> {
    let (parts, incoming) = storage.into_parts();
    let body: Body = if not_modified || head {
        crate::body::empty()
    } else {
        incoming.map_err(Into::into).boxed()
    };
    let mut response = Response::new(body);
    *response.status_mut() = if not_modified {
        StatusCode::NOT_MODIFIED
    } else {
        parts.status
    };
    let out = response.headers_mut();
    for name in [header::CONTENT_LENGTH, header::CONTENT_RANGE] {
        if let Some(value) = parts.headers.get(&name) {
            if !not_modified {
                out.insert(name, value.clone());
            }
        }
    }
    copy_public_headers(&parts.headers, out, etag);
    response
}

/// The public headers every answer about a blob carries, from the storage node's headers of
/// its record: content type, user metadata, ETag, Accept-Ranges, Last-Modified, expiry.
pub(super) fn copy_public_headers(stored: &HeaderMap, out: &mut HeaderMap, etag: &str) {
    if let Some(value) = stored.get(header::CONTENT_TYPE) {
        out.insert(header::CONTENT_TYPE, value.clone());
    }
    for (name, value) in stored {
        if name.as_str().starts_with(h::META_PREFIX) {
            out.append(name.clone(), value.clone());
        }
    }
    out.insert(
        header::ETAG,
        HeaderValue::from_str(etag).expect("base64url is a valid header"),
    );
    out.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Some(date) = http_date(stored, h::TIME_MS) {
        out.insert(header::LAST_MODIFIED, date);
    }
    if let Some(date) = http_date(stored, h::EXPIRES_MS) {
        out.insert(EXPIRES_HEADER, date);
    }
}

fn http_date(headers: &HeaderMap, name: &str) -> Option<HeaderValue> {
    let ms: u64 = headers.get(name)?.to_str().ok()?.parse().ok()?;
    let time = UNIX_EPOCH + Duration::from_millis(ms);
    HeaderValue::from_str(&httpdate::fmt_http_date(time)).ok()
}
