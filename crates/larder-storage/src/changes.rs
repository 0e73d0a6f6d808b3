//! `GET .../changes`: a page of a replica's change feed (durable records only), which peers
//! replicate from.

use http::{Response, StatusCode};
use larder_proto::{ChangeEntry, ChangePage};
use larder_store::{Cursor, Op, Store};

use crate::error::{Error, Result};
use crate::node::blocking;
use crate::reply::{self, Body};

/// Changes per page unless the query says otherwise, and the most it may ask for.
const DEFAULT_LIMIT: usize = 1000;
const MAX_LIMIT: usize = 10_000;

pub async fn page(store: Store, query: &str) -> Result<Response<Body>> {
    let (after, limit) = parse_query(query)?;
    let head = store.stats().durable_cursor.to_string();
    let batch = blocking(move || store.changes(after, limit)).await?;
    let changes = batch.changes.into_iter().map(change_entry).collect();
    let page = ChangePage {
        changes,
        next: batch.next.to_string(),
        head,
    };
    Ok(reply::json(StatusCode::OK, &page))
}

fn parse_query(query: &str) -> Result<(Cursor, usize)> {
    let mut after = Cursor::START;
    let mut limit = DEFAULT_LIMIT;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "after" => {
                after = value
                    .parse()
                    .map_err(|_| Error::BadQuery("after is not a cursor"))?
            }
            "limit" => {
                let asked: usize = value
                    .parse()
                    .map_err(|_| Error::BadQuery("limit is not a number"))?;
                limit = asked.clamp(1, MAX_LIMIT);
            }
            _ => {}
        }
    }
    Ok((after, limit))
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
