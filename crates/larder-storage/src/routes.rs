//! The internal API's routing: which operation a request names, and the node-level answers
//! (health, metrics). Every error of every operation becomes a response here, in one place.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use larder_proto::InternalPath;
use larder_store::Store;

use crate::error::{Error, Result};
use crate::reply::{self, Body};
use crate::{blobs, changes, documents, visit, StorageNode};

pub async fn handle(node: Arc<StorageNode>, req: Request<Incoming>) -> Response<Body> {
    let head = req.method() == Method::HEAD;
    // The fence (INTERNAL_API.md, "Map revisions"): a frontend names the revision it routes by.
    let asked = larder_proto::map_revision(req.headers());
    if asked.is_some_and(|asked| asked > node.maps.revision()) {
        node.maps.saw_newer();
    }
    let mut response = route(node.clone(), req, asked)
        .await
        .unwrap_or_else(|err| reply::error_response(&err));
    response.headers_mut().insert(
        larder_proto::header_name::MAP_REVISION,
        node.maps.revision_header(),
    );
    if head {
        without_body(response)
    } else {
        response
    }
}

/// hyper's HTTP/2 server sends whatever body a HEAD response has, and a DATA frame on a HEAD
/// response is a protocol error for the client: every HEAD answer goes out with headers only.
fn without_body(response: Response<Body>) -> Response<Body> {
    let (parts, _) = response.into_parts();
    Response::from_parts(parts, reply::body(Bytes::new()))
}

async fn route(
    node: Arc<StorageNode>,
    req: Request<Incoming>,
    asked: Option<u64>,
) -> Result<Response<Body>> {
    let path = req.uri().path();
    let parsed = larder_proto::parse_path(path);
    if let Some(partition) = parsed.as_ref().and_then(InternalPath::partition) {
        fence(&node, partition, asked)?;
    }
    match parsed {
        Some(InternalPath::Map) => crate::map_routes::handle(&node, req).await,
        Some(InternalPath::Health) => Ok(health(&node)),
        Some(InternalPath::PutBatch) => match *req.method() {
            Method::POST => crate::put_batch::handle(&node, req, asked).await,
            _ => Err(Error::MethodNotAllowed("POST")),
        },
        Some(InternalPath::GetBatch) => match *req.method() {
            Method::POST => crate::get_batch::handle(&node, req, asked).await,
            _ => Err(Error::MethodNotAllowed("POST")),
        },
        Some(InternalPath::Metrics) => Ok(metrics(&node)),
        Some(InternalPath::Compaction) => match *req.method() {
            Method::POST => crate::compaction::compact_now(node, req.uri().query()).await,
            Method::GET => Ok(crate::compaction::status(&node)),
            _ => Err(Error::MethodNotAllowed("GET or POST")),
        },
        Some(InternalPath::Export { partition }) => {
            let store = hosted(&node, partition)?;
            let query = req.uri().query().unwrap_or("").to_owned();
            crate::export::export(node, partition, store, &query).await
        }
        Some(InternalPath::Replica { partition }) => {
            hosted_even_rebuilding(&node, partition)?;
            let state = node.replica_state(partition);
            let mut status = node.moves.status(partition, state);
            status["rebuilding"] = node.rebuilds.active(partition).into();
            Ok(reply::json(StatusCode::OK, &status))
        }
        Some(InternalPath::Blob { partition, key }) => {
            let _busy = node.compaction.foreground.enter();
            let store = hosted(&node, partition)?;
            match *req.method() {
                Method::PUT => blobs::put(&node, store, key.to_owned(), req).await,
                // Reads borrow the key from the request: no copy of it per GET.
                Method::GET => blobs::get(&node, partition, store, key, &req, true).await,
                Method::HEAD => blobs::get(&node, partition, store, key, &req, false).await,
                Method::DELETE => blobs::delete(&node, store, key.to_owned(), req).await,
                _ => Err(Error::MethodNotAllowed("PUT, GET, HEAD or DELETE")),
            }
        }
        Some(InternalPath::Doc { partition, key }) => {
            let _busy = node.compaction.foreground.enter();
            let store = hosted(&node, partition)?;
            let key = key.to_owned();
            documents::handle(&node, store, partition, &key, req).await
        }
        Some(InternalPath::Changes { partition }) => {
            let store = hosted(&node, partition)?;
            changes::page(&node, partition, store, req.uri().query().unwrap_or("")).await
        }
        Some(InternalPath::Visit { partition }) => {
            let store = hosted(&node, partition)?;
            match *req.method() {
                Method::GET => {
                    visit::page(&node.visit_scans, store, req.uri().query().unwrap_or("")).await
                }
                _ => Err(Error::MethodNotAllowed("GET")),
            }
        }
        None => Err(Error::NoSuchPath(path.to_owned())),
    }
}

/// Refuses (421) a request routed by an older map than this node's when, at this node's map,
/// the node holds no replica of the partition any more: the sender fetches the newer map and
/// asks the right nodes. One atomic load when the revisions agree.
pub(crate) fn fence(node: &StorageNode, partition: u32, asked: Option<u64>) -> Result<()> {
    let Some(asked) = asked else { return Ok(()) };
    if asked >= node.maps.revision() {
        return Ok(());
    }
    let map = node.maps.current();
    let holds = map
        .partition(partition)
        .is_some_and(|p| p.replicas.iter().any(|r| r.node == node.node_id));
    if holds {
        return Ok(());
    }
    Err(Error::Misdirected {
        node: node.node_id.clone(),
        partition,
        revision: map.revision,
        asked,
    })
}

/// The replica of `partition` for a data request: not while it is being rebuilt.
pub(crate) fn hosted(node: &StorageNode, partition: u32) -> Result<Store> {
    let store = hosted_even_rebuilding(node, partition)?;
    if node.rebuilds.active(partition) {
        return Err(Error::Rebuilding { partition });
    }
    Ok(store)
}

fn hosted_even_rebuilding(node: &StorageNode, partition: u32) -> Result<Store> {
    node.store(partition).ok_or_else(|| Error::NotHosted {
        node: node.node_id.clone(),
        partition,
    })
}

fn metrics(node: &StorageNode) -> Response<Body> {
    let held = i64::try_from(node.reads.used()).unwrap_or(i64::MAX);
    node.metrics.read_budget_held_bytes.set(held);
    let mut response = reply::body_response(node.metrics.encode(
        node.partitions().iter().map(|(p, s)| (p, s)),
        &node.compaction,
        node.moves.seconds_left_total(),
    ));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

fn health(node: &StorageNode) -> Response<Body> {
    let partitions: serde_json::Map<String, serde_json::Value> = node
        .partitions()
        .iter()
        .map(|(p, store)| {
            let s = store.stats();
            let value = serde_json::json!({"live_keys": s.live_keys, "bytes_on_disk": s.bytes_on_disk,
                "corrupt_records_found": s.corrupt_records_found, "durable_cursor": s.durable_cursor.to_string()});
            (p.to_string(), value)
        })
        .collect();
    reply::json(
        StatusCode::OK,
        &serde_json::json!({"node": node.node_id, "partitions": partitions,
            "disks": disks(node), "rebuilding": rebuilding(node)}),
    )
}

/// Each disk by its map name, with why it refuses writes (null while it takes them).
fn disks(node: &StorageNode) -> serde_json::Value {
    let disks = node.disks().into_iter().map(|(name, disk)| {
        let value = serde_json::json!({"refusing_writes": disk.refusing_writes()});
        (name, value)
    });
    serde_json::Value::Object(disks.collect())
}

/// The replicas being rebuilt, with their bulk copy's progress once it started.
fn rebuilding(node: &StorageNode) -> serde_json::Value {
    let rebuilds = node.rebuilds.status().into_iter().map(|r| {
        let copy = match node.moves.known(r.partition) {
            true => node.moves.status(r.partition, None),
            false => serde_json::Value::Null,
        };
        let value = serde_json::json!({"phase": r.phase, "since": r.since,
            "bytes_done": copy["bytes_done"], "bytes_left": copy["bytes_left"]});
        (r.partition.to_string(), value)
    });
    serde_json::Value::Object(rebuilds.collect())
}
