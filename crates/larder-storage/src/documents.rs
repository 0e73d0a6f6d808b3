//! Document records: versioned puts and removes applied last-writer-wins by the store, and reads
//! that return the version. Replication (which pulls `put-doc`/`remove-doc` entries from the
//! change feed) uses the same three requests: GET from a peer, PUT/DELETE here with the peer's
//! version, and the store's version check makes the result independent of arrival order.

use std::hash::{Hash, Hasher};

use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use larder_proto::{decode_key, doc_header, header as h};
use larder_store::{DocLookup, DocOutcome, Store};

use crate::error::{Error, Result};
use crate::reply::{self, status, Body};
use crate::validate::{header_number, now_ms, Clock};
use crate::StorageNode;

pub async fn handle(
    node: &StorageNode,
    store: Store,
    partition: u32,
    encoded_key: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let key = decode_key(encoded_key).ok_or(Error::BadKey(
        "document key is not valid percent-encoded UTF-8",
    ))?;
    let serialised = Serialised::of(node, partition, req.headers())?;
    match *req.method() {
        Method::GET | Method::HEAD => {
            let known = header_number(req.headers(), doc_header::KNOWN)?;
            if let Some(unchanged) = unchanged(&store, &key, known)? {
                return Ok(unchanged);
            }
            get(&store, &key, req.method() == Method::GET)
        }
        Method::PUT => put(node, store, key, serialised, req).await,
        Method::DELETE => remove(node, store, key, serialised, req.headers()).await,
        _ => Err(Error::MethodNotAllowed("GET, HEAD, PUT or DELETE")),
    }
}

/// The write of a read-modify-write (an update or a conditional write), sent to the partition's
/// primary with the fence of the frontend's map and the version the frontend read. The primary
/// applies it only if it holds nothing newer than that version, under a per-document lock, so two
/// read-modify-writes of one document based on the same read cannot both be applied: the second
/// gets a 409 and reads again. This check is the partition's one serialisation point (DESIGN
/// 6.1); the frontend writes the other replicas after the primary applied.
struct Serialised {
    expect: u64,
}

impl Serialised {
    /// None for a plain write; a 421 unless this node is the primary at the frontend's map.
    fn of(node: &StorageNode, partition: u32, headers: &HeaderMap) -> Result<Option<Serialised>> {
        let Some(fence) = headers.get(doc_header::PRIMARY) else {
            return Ok(None);
        };
        let ours = node.primary_fence(partition);
        if ours.as_deref().map(str::as_bytes) != Some(fence.as_bytes()) {
            return Err(Error::NotPrimary(format!(
                "node {} is not the primary of partition {partition} at the map the request \
                 names (this node's fence: {})",
                node.node_id,
                ours.as_deref().unwrap_or("none: not the primary")
            )));
        }
        let expect = header_number(headers, doc_header::EXPECT)?.ok_or_else(|| {
            Error::BadHeader(format!("a serialised write needs {}", doc_header::EXPECT))
        })?;
        Ok(Some(Serialised { expect }))
    }

    /// Holds the document's lock and checks that this replica holds nothing newer than the
    /// version the write was based on; the caller writes before dropping the guard.
    async fn check<'a>(
        &self,
        node: &'a StorageNode,
        store: &Store,
        key: &str,
    ) -> Result<tokio::sync::MutexGuard<'a, ()>> {
        let guard = node.serialised.lock(key).await;
        // The version from the index alone: the body is not read from disk to compare it.
        let current = store
            .doc_version(key.as_bytes())?
            .map_or(0, |(version, _)| version);
        if current > self.expect {
            return Err(Error::NewerVersion { current });
        }
        Ok(guard)
    }
}

/// Per-document locks for serialised writes, striped: a fixed amount of memory whatever the
/// number of documents; two documents sharing a stripe only wait for each other's check-and-write.
pub(crate) struct DocStripes(Vec<tokio::sync::Mutex<()>>);

impl Default for DocStripes {
    fn default() -> Self {
        DocStripes((0..256).map(|_| tokio::sync::Mutex::new(())).collect())
    }
}

impl DocStripes {
    async fn lock(&self, key: &str) -> tokio::sync::MutexGuard<'_, ()> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut hasher);
        let stripe = (hasher.finish() % self.0.len() as u64) as usize;
        self.0[stripe].lock().await
    }
}

/// Version and operation time of a write, from its headers, checked against this node's clock.
/// A write without a version is refused: the version is what makes replicas converge.
pub(crate) fn write_headers(clock: &Clock, headers: &HeaderMap) -> Result<(u64, u64)> {
    let version = header_number(headers, doc_header::VERSION)?
        .filter(|v| *v > 0)
        .ok_or_else(|| {
            Error::BadHeader(format!(
                "document writes need a positive {}",
                doc_header::VERSION
            ))
        })?;
    let version = clock.check_version(version)?;
    let time_ms = match header_number(headers, h::TIME_MS)? {
        Some(time) => clock.check_time(h::TIME_MS, time)?,
        None => now_ms(),
    };
    Ok((version, time_ms))
}

async fn put(
    node: &StorageNode,
    store: Store,
    key: String,
    serialised: Option<Serialised>,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let (version, time_ms) = write_headers(&node.clock, req.headers())?;
    let body = node.intake.read(req.into_body()).await?;
    let json = body.concat();
    let _serialised = match &serialised {
        Some(s) => Some(s.check(node, &store, &key).await?),
        None => None,
    };
    // `body` (its share of the budget) is held until the write is done.
    let outcome = crate::node::put_doc(&store, &key, version, time_ms, json).await;
    drop(body);
    write_answer(outcome?, version)
}

async fn remove(
    node: &StorageNode,
    store: Store,
    key: String,
    serialised: Option<Serialised>,
    headers: &HeaderMap,
) -> Result<Response<Body>> {
    let (version, time_ms) = write_headers(&node.clock, headers)?;
    let _serialised = match &serialised {
        Some(s) => Some(s.check(node, &store, &key).await?),
        None => None,
    };
    let outcome = crate::node::remove_doc(&store, &key, version, time_ms).await;
    write_answer(outcome?, version)
}

fn write_answer(outcome: DocOutcome, version: u64) -> Result<Response<Body>> {
    let (label, current) = match outcome {
        DocOutcome::Applied => ("applied", version),
        DocOutcome::Stale { current } => ("stale", current),
    };
    let mut response = status(StatusCode::OK);
    let headers = response.headers_mut();
    headers.insert(doc_header::OUTCOME, HeaderValue::from_static(label));
    headers.insert(doc_header::VERSION, current.into());
    Ok(response)
}

/// Answers from the in-memory index and one small read, on the async thread (like small blob
/// reads; see `blobs::read`).
fn get(store: &Store, key: &str, with_body: bool) -> Result<Response<Body>> {
    match store.get_doc(key.as_bytes())? {
        DocLookup::NotFound => Err(Error::NotFound("no such document on this replica")),
        DocLookup::Removed { version, time_ms } => {
            let mut response = reply::gone("Removed", "document was removed", doc_header::REMOVED);
            let headers = response.headers_mut();
            headers.insert(doc_header::VERSION, version.into());
            headers.insert(h::TIME_MS, time_ms.into());
            Ok(response)
        }
        DocLookup::Found {
            version,
            time_ms,
            json,
        } => {
            let length = json.len();
            let body = if with_body { json } else { bytes::Bytes::new() };
            let mut response = Response::new(reply::body(body));
            let headers = response.headers_mut();
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            headers.insert(http::header::CONTENT_LENGTH, length.into());
            headers.insert(doc_header::VERSION, version.into());
            headers.insert(h::TIME_MS, time_ms.into());
            Ok(response)
        }
    }
}

/// A `304` when this replica holds exactly version `known` of `key` (live or removed): the
/// reader has it in full, so the record is not read from disk nor sent.
fn unchanged(store: &Store, key: &str, known: Option<u64>) -> Result<Option<Response<Body>>> {
    let Some(known) = known else {
        return Ok(None);
    };
    let Some((version, time_ms)) = store.doc_version(key.as_bytes())? else {
        return Ok(None);
    };
    if version != known {
        return Ok(None);
    }
    let mut response = Response::new(reply::body(bytes::Bytes::new()));
    *response.status_mut() = http::StatusCode::NOT_MODIFIED;
    let headers = response.headers_mut();
    headers.insert(doc_header::VERSION, version.into());
    headers.insert(h::TIME_MS, time_ms.into());
    Ok(Some(response))
}

/// True when this replica already holds `version` (or a newer one) of document `key`: replication
/// can skip fetching it.
pub(crate) fn holds_version(store: &Store, key: &str, version: u64) -> bool {
    // The index alone: the document's body is not read from disk to compare versions.
    matches!(store.doc_version(key.as_bytes()), Ok(Some((v, _))) if v >= version)
}
