//! Document records: versioned puts and removes applied last-writer-wins by the store, and reads
//! that return the version. Replication (which pulls `put-doc`/`remove-doc` entries from the
//! change feed) uses the same three requests: GET from a peer, PUT/DELETE here with the peer's
//! version, and the store's version check makes the result independent of arrival order.

use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use larder_proto::{decode_key, doc_header, header as h};
use larder_store::{DocLookup, DocOutcome, Store};

use crate::handlers::{blocking, now_ms, read_body};
use crate::reply::{error, status, store_error, Body};

pub async fn handle(
    store: Store,
    encoded_key: &str,
    req: Request<Incoming>,
    max_body: u64,
) -> Response<Body> {
    let Some(key) = decode_key(encoded_key) else {
        return error(
            StatusCode::BAD_REQUEST,
            "BadKey",
            "document key is not valid percent-encoded UTF-8",
        );
    };
    match *req.method() {
        Method::GET | Method::HEAD => get(&store, &key, req.method() == Method::GET),
        Method::PUT => put(store, key, req, max_body).await,
        Method::DELETE => remove(store, key, req.headers()).await,
        _ => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "use GET, HEAD, PUT or DELETE",
        ),
    }
}

/// Version and operation time of a write, from its headers. A write without a version is refused:
/// the version is what makes replicas converge.
fn write_headers(headers: &HeaderMap) -> Result<(u64, u64), String> {
    let number = |name: &str| -> Result<Option<u64>, String> {
        match headers.get(name) {
            None => Ok(None),
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .map(Some)
                .ok_or_else(|| format!("{name} is not a number")),
        }
    };
    let version = number(doc_header::VERSION)?
        .filter(|v| *v > 0)
        .ok_or_else(|| format!("document writes need a positive {}", doc_header::VERSION))?;
    let time_ms = number(h::TIME_MS)?.unwrap_or_else(now_ms);
    Ok((version, time_ms))
}

async fn put(store: Store, key: String, req: Request<Incoming>, max_body: u64) -> Response<Body> {
    let (version, time_ms) = match write_headers(req.headers()) {
        Ok(v) => v,
        Err(message) => return error(StatusCode::BAD_REQUEST, "BadHeader", message),
    };
    let chunks = match read_body(req.into_body(), max_body).await {
        Ok(chunks) => chunks,
        Err(response) => return response,
    };
    let json = match chunks.len() {
        1 => chunks.into_iter().next().expect("one chunk"),
        _ => chunks.concat().into(),
    };
    let outcome = blocking(move || store.put_doc(key.as_bytes(), version, time_ms, json)).await;
    write_answer(outcome, version)
}

async fn remove(store: Store, key: String, headers: &HeaderMap) -> Response<Body> {
    let (version, time_ms) = match write_headers(headers) {
        Ok(v) => v,
        Err(message) => return error(StatusCode::BAD_REQUEST, "BadHeader", message),
    };
    let outcome = blocking(move || store.remove_doc(key.as_bytes(), version, time_ms)).await;
    write_answer(outcome, version)
}

fn write_answer(outcome: larder_store::Result<DocOutcome>, version: u64) -> Response<Body> {
    let (label, current) = match outcome {
        Ok(DocOutcome::Applied) => ("applied", version),
        Ok(DocOutcome::Stale { current }) => ("stale", current),
        Err(err) => return store_error(&err),
    };
    let mut response = status(StatusCode::OK);
    let headers = response.headers_mut();
    headers.insert(doc_header::OUTCOME, HeaderValue::from_static(label));
    headers.insert(doc_header::VERSION, current.into());
    response
}

/// Answers from the in-memory index and one small read, on the async thread (like small blob
/// reads; see `handlers::serve_blob`).
fn get(store: &Store, key: &str, with_body: bool) -> Response<Body> {
    match store.get_doc(key.as_bytes()) {
        Err(err) => store_error(&err),
        Ok(DocLookup::NotFound) => error(
            StatusCode::NOT_FOUND,
            "NotFound",
            "no such document on this replica",
        ),
        Ok(DocLookup::Removed { version, time_ms }) => {
            let mut response = error(StatusCode::GONE, "Removed", "document was removed");
            let headers = response.headers_mut();
            headers.insert(
                h::GONE_REASON,
                HeaderValue::from_static(doc_header::REMOVED),
            );
            headers.insert(doc_header::VERSION, version.into());
            headers.insert(h::TIME_MS, time_ms.into());
            response
        }
        Ok(DocLookup::Found {
            version,
            time_ms,
            json,
        }) => {
            let length = json.len();
            let body = if with_body { json } else { bytes::Bytes::new() };
            let mut response = Response::new(crate::reply::body(body));
            let headers = response.headers_mut();
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            headers.insert(http::header::CONTENT_LENGTH, length.into());
            headers.insert(doc_header::VERSION, version.into());
            headers.insert(h::TIME_MS, time_ms.into());
            response
        }
    }
}

/// True when this replica already holds `version` (or a newer one) of document `key`: replication
/// can skip fetching it.
pub(crate) fn holds_version(store: &Store, key: &str, version: u64) -> bool {
    match store.get_doc(key.as_bytes()) {
        Ok(DocLookup::Found { version: v, .. } | DocLookup::Removed { version: v, .. }) => {
            v >= version
        }
        _ => false,
    }
}

/// Applies a peer's answer to `GET .../docs/<key>` here with the peer's version (replication).
/// The store keeps whichever version is newest, so repeats and reordering do no harm.
pub(crate) async fn apply_peer_answer(
    store: &Store,
    key: &str,
    response: Response<Incoming>,
) -> Result<(), String> {
    let (parts, body) = response.into_parts();
    let number =
        |name: &str| -> Option<u64> { parts.headers.get(name)?.to_str().ok()?.parse().ok() };
    let (version, time_ms) = (
        number(doc_header::VERSION),
        number(h::TIME_MS).unwrap_or_else(now_ms),
    );
    let (store, key) = (store.clone(), key.to_owned());
    let outcome = match (parts.status, version) {
        // Compacted away at the peer, or never there: nothing to copy.
        (StatusCode::NOT_FOUND, _) => return Ok(()),
        (StatusCode::OK, Some(version)) => {
            let json = http_body_util::BodyExt::collect(body)
                .await
                .map_err(|e| format!("reading document {key}: {e}"))?
                .to_bytes();
            blocking(move || store.put_doc(key.as_bytes(), version, time_ms, json)).await
        }
        (StatusCode::GONE, Some(version)) => {
            blocking(move || store.remove_doc(key.as_bytes(), version, time_ms)).await
        }
        (status, _) => return Err(format!("fetching document {key} answered {status}")),
    };
    outcome.map(|_| ()).map_err(|e| e.to_string())
}
