//! `GET .../visit`: a page of a replica's documents in visiting order (`larder_store::visit_hash`
//! then key), live ones with their fields and removed ones as versioned tombstones, so that a
//! frontend merging the pages of several replicas lets the newest version of each key win.
//!
//! A page's scan reads every document it returns from disk, so scans are I/O the node bounds:
//! at most [`SCANS_AT_ONCE`] run at once, on the blocking pool; a request that waits longer
//! than [`SCAN_WAIT`] for its turn answers 503 (the frontend's visit retries another replica
//! or reports the overload), and each page stops at [`PAGE_BYTES`] of fields.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use larder_proto::{ItemState, VisitItem, VisitPage, VisitQuery};
use larder_store::{Store, VisitFrom, VisitState};
use tokio::sync::Semaphore;

use crate::error::{Error, Result};
use crate::node::blocking;
use crate::reply::{self, Body};

/// Visit scans running at once on a node: enough to keep a disk busy, few enough that blob and
/// document requests still get their share of it.
pub const SCANS_AT_ONCE: usize = 4;
/// Longest a visit request waits for a scan slot.
const SCAN_WAIT: Duration = Duration::from_secs(2);
/// Fields bytes after which a page stops (a page holds at least one document).
const PAGE_BYTES: u64 = 4 << 20;

/// The node's visit scan slots.
pub struct VisitScans(Semaphore);

impl Default for VisitScans {
    fn default() -> Self {
        VisitScans(Semaphore::new(SCANS_AT_ONCE))
    }
}

pub async fn page(scans: &VisitScans, store: Store, query: &str) -> Result<Response<Body>> {
    let query = VisitQuery::parse(query).map_err(|_| Error::BadQuery("bad visit query"))?;
    if query.selection.is_some() {
        return Err(Error::BadQuery(
            "this node does not evaluate selections; the frontend does",
        ));
    }
    let _slot = tokio::time::timeout(SCAN_WAIT, scans.0.acquire())
        .await
        .map_err(|_| Error::Busy("too many visit scans on this node"))?
        .map_err(|_| Error::Busy("the node is shutting down"))?;
    let from = match query.after {
        Some((h, key)) => VisitFrom::After((h, Bytes::from(key))),
        None => VisitFrom::Start(query.first),
    };
    let (last, limit) = (query.last, query.limit);
    let page = blocking(move || store.visit_docs(&from, last, limit, PAGE_BYTES)).await?;
    let items = page.entries.into_iter().map(|e| VisitItem {
        h: e.h,
        key: String::from_utf8_lossy(&e.key).into_owned(),
        version: e.version,
        time_ms: e.time_ms,
        state: match e.state {
            VisitState::Live(fields) => ItemState::Live(fields),
            VisitState::Removed => ItemState::Removed,
        },
    });
    let page = VisitPage {
        more: page.more,
        items: items.collect(),
    };
    let mut response = Response::new(reply::body(page.encode()));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-larder-visit"),
    );
    Ok(response)
}
