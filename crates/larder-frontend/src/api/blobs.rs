//! `/v1/blobs`: upload, download (whole, ranges, conditional), HEAD and DELETE.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use larder_cluster::{BlobId, BlobKind};
use larder_proto::{header as h, BlobProperties, ByteRange, PropertiesError};
use larder_router::{FoundBlob, GetAnswer};

use crate::body::{drain_in_background, full, Body};
use crate::error::ApiError;
use crate::state::AppState;

const TTL_HEADER: &str = "x-larder-ttl";
const EXPIRES_HEADER: &str = "x-larder-expires";

/// Longest TTL an upload may ask for: 100 years (of 365.25 days). Longer ones are refused (400)
/// rather than stored as an expiry that no date format can show or that wraps around.
pub const MAX_TTL_SECONDS: u64 = 36_525 * 24 * 3600;

/// The last instant an HTTP date can show (9999-12-31T23:59:59.999Z), in ms since the epoch.
const LAST_HTTP_DATE_MS: u64 = 253_402_300_799_999;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Refuses a request without a valid presigned URL when `[auth] require_signed_blob_urls`
/// (`larder_s3::SignedUrls`): before anything is read or stored.
async fn check_signature(state: &AppState, parts: &http::request::Parts) -> Result<(), ApiError> {
    let Some(signed_urls) = &state.signed_urls else {
        return Ok(());
    };
    // HTTP/2 names the host in `:authority`, HTTP/1.1 in `Host`.
    let host = match parts.uri.authority() {
        Some(authority) => authority.as_str(),
        None => parts
            .headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or(""),
    };
    let (path, query) = (parts.uri.path(), parts.uri.query());
    // Boxed: the check's future is the largest of a blob request's, and inline every request
    // would carry it (and copy it as its future moves), signed or not.
    let check = Box::pin(signed_urls.check(&parts.method, host, path, query));
    Ok(check.await?)
}

/// `POST /v1/blobs`: stores the body on a quorum of replicas and answers with the new ID.
pub async fn upload(
    state: &Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let max = state.config.max_blob_size.as_u64();
    let (parts, body) = req.into_parts();
    let checked = match check_signature(state, &parts).await {
        Ok(()) => upload_properties(&parts.headers, max),
        Err(err) => Err(err),
    };
    let props = match checked {
        Ok(props) => props,
        Err(err) => {
            // Refused before reading: let the client finish sending so it sees the answer,
            // unless it waits for 100 Continue (it sends nothing; the connection closes).
            if !crate::expect::expects_continue(&parts.headers) {
                let timeout = state.config.limits.body_read_timeout;
                drain_in_background(body, drain_budget(max), timeout);
            }
            return Err(err);
        }
    };
    let length = content_length(&parts.headers)?;
    let (id, size) = super::large::store_body(state, props, body, length).await?;
    let id = id.to_string();
    // Written directly rather than through a JSON value: a blob ID is base64url, which needs
    // no escaping, and the answer is one allocation instead of a map and its strings.
    let mut response = Response::new(full(format!(r#"{{"id":"{id}","size":{size}}}"#)));
    *response.status_mut() = StatusCode::CREATED;
    let headers = response.headers_mut();
    headers.insert(
        header::LOCATION,
        HeaderValue::try_from(format!("/v1/blobs/{id}")).expect("base64url is a valid header"),
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
    props.expires_ms = match ttl(headers)? {
        None => None,
        Some(ttl) => Some(expiry(props.created_ms, ttl)?),
    };
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
        .filter(|s| (1..=MAX_TTL_SECONDS).contains(s))
        .ok_or_else(|| {
            ApiError::BadRequest(
                "BadHeader",
                format!(
                    "{TTL_HEADER} must be a number of seconds from 1 to {MAX_TTL_SECONDS} (100 years)"
                ),
            )
        })?;
    Ok(Some(Duration::from_secs(seconds)))
}

/// When a blob created at `created_ms` with `ttl` expires; checked, though a TTL within the
/// maximum cannot overflow before the year 584 million.
fn expiry(created_ms: u64, ttl: Duration) -> Result<u64, ApiError> {
    u64::try_from(ttl.as_millis())
        .ok()
        .and_then(|ttl_ms| created_ms.checked_add(ttl_ms))
        .ok_or_else(|| ApiError::BadRequest("BadHeader", format!("{TTL_HEADER} is too long")))
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
    check_signature(state, req).await?;
    let id: BlobId = id
        .parse()
        .map_err(|e| ApiError::BadRequest("InvalidBlobId", format!("malformed blob id: {e}")))?;
    if id.kind == BlobKind::Chunk {
        // Chunks belong to their composite blob; their IDs are never handed out.
        return Err(ApiError::NotFound(format!("no blob {id}")));
    }
    if method == Method::DELETE {
        if id.kind == BlobKind::Composite {
            Box::pin(super::large::delete(state, &id)).await?;
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
        Some(v) if !not_modified => requested_range(v),
        _ => None,
    };
    if id.kind == BlobKind::Composite {
        let head = method == Method::HEAD;
        // Boxed, as the other rare paths: a composite's future would size every GET's.
        let download = super::large::download(state, id, &etag, not_modified, range, head);
        return Box::pin(download).await;
    }
    let storage_method = if not_modified {
        Method::HEAD
    } else {
        method.clone()
    };
    match state.router.get_blob(id, storage_method, range).await? {
        GetAnswer::Found(found) => {
            let bodiless = not_modified || method == Method::HEAD;
            relay(state, *id, found, &etag, (not_modified, bodiless)).await
        }
        GetAnswer::Missing(missing) => Err(missing.into()),
    }
}

/// The range a `Range` header asks for; `None` for one this server ignores (RFC 9110 §14.2:
/// other units, several ranges, malformed), which then gets the whole blob.
pub(super) fn requested_range(value: &HeaderValue) -> Option<ByteRange> {
    ByteRange::parse(value.to_str().ok()?).ok()
}

/// The public answer for a blob a replica serves: its bytes (continued from another replica
/// if that one breaks off) and public headers; 503 if the download budget stays spent.
async fn relay(
    state: &AppState,
    id: BlobId,
    found: FoundBlob,
    etag: &str,
    (not_modified, bodiless): (bool, bool),
) -> Result<Response<Body>, ApiError> {
    let mut response = Response::new(crate::body::empty());
    copy_public_headers(&found.properties, response.headers_mut(), etag);
    if not_modified {
        *response.status_mut() = StatusCode::NOT_MODIFIED;
        return Ok(response);
    }
    content_headers(&mut response, &found.selected, found.size, found.partial);
    if bodiless {
        return Ok(response);
    }
    *response.body_mut() = state.router.blob_body(id, found).await?;
    Ok(response)
}

/// `Content-Length`, and for a range `Content-Range` with status 206.
pub(super) fn content_headers(
    response: &mut Response<Body>,
    selected: &std::ops::Range<u64>,
    size: u64,
    partial: bool,
) {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_LENGTH,
        (selected.end - selected.start).into(),
    );
    if partial {
        let value = larder_proto::content_range(selected, size);
        headers.insert(
            header::CONTENT_RANGE,
            HeaderValue::from_str(&value).expect("a content range is ASCII digits and signs"),
        );
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
    }
}

/// The public headers every answer about a blob carries, from its properties: content type,
/// user metadata, ETag, Accept-Ranges, Last-Modified, expiry.
pub(super) fn copy_public_headers(props: &BlobProperties, out: &mut HeaderMap, etag: &str) {
    if let Some(value) = props
        .content_type
        .as_deref()
        .and_then(|v| HeaderValue::from_str(v).ok())
    {
        out.insert(header::CONTENT_TYPE, value);
    }
    for (name, value) in &props.user_meta {
        let name = HeaderName::from_bytes(format!("{}{name}", h::META_PREFIX).as_bytes());
        if let (Ok(name), Ok(value)) = (name, HeaderValue::from_str(value)) {
            out.append(name, value);
        }
    }
    out.insert(
        header::ETAG,
        HeaderValue::from_str(etag).expect("base64url is a valid header"),
    );
    out.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Some(date) = http_date(props.created_ms).filter(|_| props.created_ms > 0) {
        out.insert(header::LAST_MODIFIED, date);
    }
    if let Some(date) = props.expires_ms.and_then(http_date) {
        out.insert(EXPIRES_HEADER, date);
    }
}

/// An HTTP date for `ms`; `None` past the year 9999, which the format cannot show (a storage
/// node may hold such a time: the header is then left out rather than the answer failing).
fn http_date(ms: u64) -> Option<HeaderValue> {
    if ms > LAST_HTTP_DATE_MS {
        return None;
    }
    let time = UNIX_EPOCH.checked_add(Duration::from_millis(ms))?;
    HeaderValue::try_from(httpdate::fmt_http_date(time)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_past_the_year_9999_are_left_out_not_a_panic() {
        assert!(http_date(LAST_HTTP_DATE_MS).is_some());
        assert_eq!(
            http_date(0).unwrap(),
            HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT")
        );
        for ms in [LAST_HTTP_DATE_MS + 1, 300_000_000_000_000, u64::MAX] {
            assert_eq!(http_date(ms), None, "{ms}");
        }
    }

    #[test]
    fn ttls_up_to_100_years() {
        let headers = |ttl: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(TTL_HEADER, HeaderValue::from_str(ttl).unwrap());
            headers
        };
        assert_eq!(MAX_TTL_SECONDS, 3_155_760_000);
        let max = MAX_TTL_SECONDS.to_string();
        assert_eq!(
            ttl(&headers(&max)).unwrap(),
            Some(Duration::from_secs(MAX_TTL_SECONDS))
        );
        for refused in [
            "0",
            "3155760001",
            "300000000000",
            "18446744073709551615",
            "-1",
        ] {
            assert!(ttl(&headers(refused)).is_err(), "{refused}");
        }
        assert!(expiry(u64::MAX, Duration::from_secs(1)).is_err());
    }
}
