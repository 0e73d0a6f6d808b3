//! The internal API's handlers: one function per operation, each a thin shell over the store.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use larder_proto::{
    header as h, BlobProperties, ByteRange, ChangeEntry, ChangePage, InternalPath, RangeError,
};
use larder_store::{BlobLookup, BlobRecord, Cursor, DeleteOutcome, Op, PutOutcome, Store};

use crate::reply::{self, error, status, store_error, Body};
use crate::{props, StorageNode};

/// Reads up to this size are done on the async thread (see `serve_blob`).
const INLINE_READ_MAX: u64 = 64 * 1024;

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs blocking store work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("store tasks do not panic")
}

pub async fn handle(
    node: Arc<StorageNode>,
    req: Request<Incoming>,
    max_body: u64,
) -> Response<Body> {
    let head = req.method() == Method::HEAD;
    let response = route(node, req, max_body).await;
    if head {
        without_body(response)
    } else {
        response
    }
}

/// hyper's HTTP/2 server sends whatever body a HEAD response has, and a DATA frame on a HEAD
/// response is a protocol error for the client: every HEAD answer goes out with headers only.
pub fn without_body(response: Response<Body>) -> Response<Body> {
    let (parts, _) = response.into_parts();
    Response::from_parts(parts, reply::body(Bytes::new()))
}

async fn route(node: Arc<StorageNode>, req: Request<Incoming>, max_body: u64) -> Response<Body> {
    let path = req.uri().path().to_owned();
    match larder_proto::parse_path(&path) {
        Some(InternalPath::Health) => health(&node),
        Some(InternalPath::Metrics) => {
            let mut response = reply::body_response(node.metrics.encode(&node));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            response
        }
        Some(InternalPath::Blob { partition, key }) => {
            let Some(store) = node.store(partition).cloned() else {
                return not_hosted(&node, partition);
            };
            let key = key.to_owned();
            match *req.method() {
                Method::PUT => put_blob(store, key, req, max_body).await,
                Method::GET => get_blob(store, key, req, true).await,
                Method::HEAD => get_blob(store, key, req, false).await,
                Method::DELETE => delete_blob(store, key, req).await,
                _ => error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    "use PUT, GET, HEAD or DELETE",
                ),
            }
        }
        Some(InternalPath::Doc { partition, key }) => match node.store(partition).cloned() {
            Some(store) => crate::documents::handle(store, key, req, max_body).await,
            None => not_hosted(&node, partition),
        },
        Some(InternalPath::Changes { partition }) => match node.store(partition).cloned() {
            Some(store) => changes(store, req.uri().query().unwrap_or("")).await,
            None => not_hosted(&node, partition),
        },
        None => error(
            StatusCode::NOT_FOUND,
            "NoSuchPath",
            format!("no internal API at {path}"),
        ),
    }
}

fn not_hosted(node: &StorageNode, partition: u32) -> Response<Body> {
    let message = format!(
        "node {} hosts no replica of partition {partition}",
        node.node_id
    );
    error(StatusCode::NOT_FOUND, "PartitionNotHere", message)
}

fn health(node: &StorageNode) -> Response<Body> {
    let partitions: serde_json::Map<String, serde_json::Value> = node
        .partitions()
        .map(|(p, store)| {
            let s = store.stats();
            let value = serde_json::json!({"live_keys": s.live_keys, "bytes_on_disk": s.bytes_on_disk,
                "corrupt_records_found": s.corrupt_records_found, "durable_cursor": s.durable_cursor.to_string()});
            (p.to_string(), value)
        })
        .collect();
    reply::json(
        StatusCode::OK,
        &serde_json::json!({"node": node.node_id, "partitions": partitions}),
    )
}

async fn put_blob(
    store: Store,
    key: String,
    req: Request<Incoming>,
    max_body: u64,
) -> Response<Body> {
    let props = match BlobProperties::from_headers(req.headers()) {
        Ok(props) => props,
        Err(err) => return error(StatusCode::BAD_REQUEST, "BadProperties", err),
    };
    let expected_crc = req
        .headers()
        .get(h::BODY_CRC32C)
        .map(|v| v.to_str().ok().and_then(|s| s.parse::<u32>().ok()));
    let chunks = match read_body(req.into_body(), max_body).await {
        Ok(chunks) => chunks,
        Err(response) => return response,
    };
    if let Some(expected) = expected_crc {
        let actual = chunks
            .iter()
            .fold(0, |crc, c| crc32c::crc32c_append(crc, c));
        if expected != Some(actual) {
            return error(
                StatusCode::BAD_REQUEST,
                "ChecksumMismatch",
                "body does not match x-larder-body-crc32c",
            );
        }
    }
    let meta = larder_store::BlobMeta {
        props: props::encode(&props),
        time_ms: if props.created_ms > 0 {
            props.created_ms
        } else {
            now_ms()
        },
        expires_ms: props.expires_ms,
    };
    match blocking(move || store.put_blob(key.as_bytes(), meta, &chunks)).await {
        Ok(PutOutcome::Stored) => put_answer(StatusCode::CREATED, "stored"),
        Ok(PutOutcome::AlreadyExists) => put_answer(StatusCode::OK, "exists"),
        Ok(PutOutcome::Deleted) => gone("deleted", None),
        Err(err) => store_error(&err),
    }
}

fn put_answer(code: StatusCode, outcome: &'static str) -> Response<Body> {
    let mut response = status(code);
    response
        .headers_mut()
        .insert(h::PUT_OUTCOME, HeaderValue::from_static(outcome));
    response
}

/// Collects a request body as the chunks that arrived (no copy into one buffer), at most `max` bytes.
pub(crate) async fn read_body(body: Incoming, max: u64) -> Result<Vec<Bytes>, Response<Body>> {
    let mut body = Limited::new(body, max as usize);
    let mut chunks = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => chunks.extend(frame.into_data().ok()),
            Err(err) if err.is::<http_body_util::LengthLimitError>() => {
                return Err(error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "TooLarge",
                    format!("body exceeds {max} bytes"),
                ));
            }
            Err(err) => return Err(error(StatusCode::BAD_REQUEST, "BodyError", err)),
        }
    }
    Ok(chunks)
}

fn gone(reason: &'static str, time_ms: Option<u64>) -> Response<Body> {
    let mut response = error(StatusCode::GONE, "Gone", format!("blob is {reason}"));
    response
        .headers_mut()
        .insert(h::GONE_REASON, HeaderValue::from_static(reason));
    if let Some(time) = time_ms {
        response.headers_mut().insert(h::TIME_MS, time.into());
    }
    response
}

async fn get_blob(
    store: Store,
    key: String,
    req: Request<Incoming>,
    with_body: bool,
) -> Response<Body> {
    let include_expired = req.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|p| p == larder_proto::INCLUDE_EXPIRED_QUERY)
    });
    let range = match req
        .headers()
        .get(header::RANGE)
        .map(|v| v.to_str().unwrap_or(""))
    {
        None => None,
        Some(text) => match ByteRange::parse(text) {
            Ok(range) => Some(range),
            Err(err) => return error(StatusCode::BAD_REQUEST, "BadRange", err),
        },
    };
    // A lookup only reads the in-memory index: no need to leave the async thread for it.
    match store.get_blob(key.as_bytes(), now_ms()) {
        Err(err) => store_error(&err),
        Ok(BlobLookup::NotFound) => error(
            StatusCode::NOT_FOUND,
            "NotFound",
            "no such blob on this replica",
        ),
        Ok(BlobLookup::Deleted { time_ms }) => gone("deleted", Some(time_ms)),
        Ok(BlobLookup::Expired(record)) if !include_expired => {
            gone("expired", record.meta.expires_ms)
        }
        Ok(BlobLookup::Found(record)) | Ok(BlobLookup::Expired(record)) => {
            serve_blob(store, record, range, with_body).await
        }
    }
}

/// Answers with a blob's bytes. The range is read and verified before the status is sent, so a
/// corrupt record answers 500 (and the router asks another replica) instead of a torn body.
async fn serve_blob(
    store: Store,
    record: BlobRecord,
    range: Option<ByteRange>,
    with_body: bool,
) -> Response<Body> {
    let props = match props::decode(&record.meta.props) {
        Ok(props) => props,
        Err(err) => return error(StatusCode::INTERNAL_SERVER_ERROR, "Corrupt", err),
    };
    let size = record.size;
    let selected = match range.map(|r| r.resolve(size)) {
        None => 0..size,
        Some(Ok(selected)) => selected,
        Some(Err(err @ RangeError::Unsatisfiable { .. })) => {
            let mut response = error(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "RangeNotSatisfiable",
                &err,
            );
            let value = err
                .content_range()
                .expect("unsatisfiable ranges know the size");
            response.headers_mut().insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&value).expect("ascii"),
            );
            response.headers_mut().insert(h::BLOB_SIZE, size.into());
            return response;
        }
        Some(Err(err)) => return error(StatusCode::BAD_REQUEST, "BadRange", err),
    };
    let chunks = if with_body && !selected.is_empty() {
        let range = selected.clone();
        let read = move || {
            store
                .read_blob(&record, range)?
                .collect::<Result<Vec<Bytes>, _>>()
        };
        // Small reads are one or two preads, nearly always from the page cache: done in place
        // they measured 15-17k GET/s against 11-13k through the blocking pool (two thread
        // wake-ups per request). A cold-cache read stalls one worker for one disk read.
        let read = if selected.end - selected.start <= INLINE_READ_MAX {
            read()
        } else {
            blocking(read).await
        };
        match read {
            Ok(chunks) => chunks,
            Err(err) => return store_error(&err),
        }
    } else {
        Vec::new()
    };
    let mut response = Response::new(crate::server::chunks_body(chunks));
    if range.is_some() {
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        let value = larder_proto::content_range(&selected, size);
        response.headers_mut().insert(
            header::CONTENT_RANGE,
            HeaderValue::from_str(&value).expect("ascii"),
        );
    }
    let headers = response.headers_mut();
    props.write_headers(headers);
    headers.insert(
        header::CONTENT_LENGTH,
        (selected.end - selected.start).into(),
    );
    headers.insert(h::BLOB_SIZE, size.into());
    response
}

async fn delete_blob(store: Store, key: String, req: Request<Incoming>) -> Response<Body> {
    let time_ms = req
        .headers()
        .get(h::TIME_MS)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or_else(now_ms);
    match blocking(move || store.delete_blob(key.as_bytes(), time_ms)).await {
        Ok(DeleteOutcome::Deleted) | Ok(DeleteOutcome::AlreadyDeleted) => {
            status(StatusCode::ACCEPTED)
        }
        Err(err) => store_error(&err),
    }
}

async fn changes(store: Store, query: &str) -> Response<Body> {
    let mut after = Cursor::START;
    let mut limit = 1000usize;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let parsed = match name {
            "after" => value
                .parse()
                .map(|c| after = c)
                .map_err(|_| "after is not a cursor"),
            "limit" => value
                .parse()
                .map(|l: usize| limit = l.clamp(1, 10_000))
                .map_err(|_| "limit is not a number"),
            _ => Ok(()),
        };
        if let Err(message) = parsed {
            return error(StatusCode::BAD_REQUEST, "BadQuery", message);
        }
    }
    let head = store.stats().durable_cursor.to_string();
    match blocking(move || store.changes(after, limit)).await {
        Ok(batch) => {
            let changes = batch.changes.into_iter().map(change_entry).collect();
            reply::json(
                StatusCode::OK,
                &ChangePage {
                    changes,
                    next: batch.next.to_string(),
                    head,
                },
            )
        }
        Err(err) => store_error(&err),
    }
}

fn change_entry(change: larder_store::Change) -> ChangeEntry {
    let op = match change.op {
        Op::PutBlob => "put-blob",
        Op::DeleteBlob => "delete-blob",
        Op::PutDoc => "put-doc",
        Op::RemoveDoc => "remove-doc",
    };
    ChangeEntry {
        cursor: change.cursor.to_string(),
        op: op.into(),
        key: String::from_utf8_lossy(&change.key).into_owned(),
        time_ms: change.time_ms,
        version: change.version,
        size: change.size,
        expires_ms: change.expires_ms,
    }
}
