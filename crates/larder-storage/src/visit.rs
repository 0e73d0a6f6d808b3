//! `GET .../visit`: a page of a replica's documents in visiting order (`larder_store::visit_hash`
//! then key), live ones with their fields and removed ones as versioned tombstones, so that a
//! frontend merging the pages of several replicas lets the newest version of each key win.
//! A request's selection (`larder-select`) is evaluated here, where the documents are, on the
//! blocking pool with the scan: a live document it does not match is returned as `unmatched`,
//! without its fields (its version still takes part in the merge).
//!
//! A page's scan reads every document it returns from disk, so scans are I/O the node bounds:
//! at most [`SCANS_AT_ONCE`] run at once, on the blocking pool; a request that waits longer
//! than [`SCAN_WAIT`] for its turn answers 503 (the frontend's visit retries another replica
//! or reports the overload), and each page stops at [`PAGE_BYTES`] of fields.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use larder_proto::{ItemState, VisitItem, VisitPage, VisitQuery};
use larder_select::{Document, Selection};
use larder_store::{Store, VisitEntry, VisitFrom, VisitState};
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

/// A page entry; a live document the selection does not match loses its fields.
fn item(entry: VisitEntry, selection: Option<&Selection>) -> VisitItem {
    let key = String::from_utf8_lossy(&entry.key).into_owned();
    let state = match entry.state {
        VisitState::Removed => ItemState::Removed,
        VisitState::Live(fields) => match selection {
            Some(selection) if !selects(selection, &key, &fields) => ItemState::Unmatched,
            _ => ItemState::Live(fields),
        },
    };
    VisitItem {
        h: entry.h,
        key,
        version: entry.version,
        time_ms: entry.time_ms,
        state,
    }
}

/// Whether `selection` holds for the document `key` with these stored fields. A document whose
/// fields do not parse (never written so by a frontend) is not selected.
fn selects(selection: &Selection, key: &str, fields: &[u8]) -> bool {
    let Ok(fields) = serde_json::from_slice::<larder_select::Fields>(fields) else {
        return false;
    };
    let doc = Document {
        id: key,
        doctype: key.split(':').nth(2).unwrap_or(""),
        fields: Some(&fields),
    };
    selection.matches(&doc)
}

/// The node's visit scan slots.
pub struct VisitScans(Semaphore);

impl Default for VisitScans {
    fn default() -> Self {
        VisitScans(Semaphore::new(SCANS_AT_ONCE))
    }
}

pub async fn page(scans: &VisitScans, store: Store, query: &str) -> Result<Response<Body>> {
    let query = VisitQuery::parse(query).map_err(|_| Error::BadQuery("bad visit query"))?;
    let selection = match &query.selection {
        Some(text) => Some(Selection::parse(text).map_err(|e| Error::BadSelection(e.to_string()))?),
        None => None,
    };
    let _slot = tokio::time::timeout(SCAN_WAIT, scans.0.acquire())
        .await
        .map_err(|_| Error::Busy("too many visit scans on this node"))?
        .map_err(|_| Error::Busy("the node is shutting down"))?;
    let from = match query.after {
        Some((h, key)) => VisitFrom::After((h, Bytes::from(key))),
        None => VisitFrom::Start(query.first),
    };
    let (last, limit) = (query.last, query.limit);
    let page = blocking(move || {
        let page = store.visit_docs(&from, last, limit, PAGE_BYTES)?;
        let items = page
            .entries
            .into_iter()
            .map(|e| item(e, selection.as_ref()))
            .collect();
        Ok::<_, Error>(VisitPage {
            more: page.more,
            items,
        })
    })
    .await?;
    let mut response = Response::new(reply::body(page.encode()));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-larder-visit"),
    );
    Ok(response)
}
