//! A batch of small blob GETs in one request (`larder-proto`'s `get_batch.rs`, sent by
//! frontends while other GETs to this node are on the way). Each blob gets the answer a GET of
//! it alone would have got (the map fence, its replica, tombstones, the catching-up mark, the
//! checks of its bytes), or "ask alone" when it is larger than the batch allows or the answer
//! is full. Lookups are in memory and done here; the reads of every blob found go to one
//! blocking call, so a cold page cache stalls no async worker and the batch costs one hand-off.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use larder_proto::{GetItem, GetItemAnswer};
use larder_store::{BlobRecord, Store};

use crate::blobs::{found_headers, look_up, mark_catching_up, Lookup, INLINE_READ_MAX};
use crate::body::Intake;
use crate::error::Result;
use crate::node::blocking;
use crate::reply::{self, Body};
use crate::routes::{fence, hosted};
use crate::StorageNode;

/// Most blob bytes one answer carries inline; blobs past it are asked alone.
const ANSWER_ROOM: u64 = 1 << 20;

pub async fn handle(
    node: &Arc<StorageNode>,
    req: Request<Incoming>,
    asked: Option<u64>,
) -> Result<Response<Body>> {
    let intake = Intake {
        max_body: larder_proto::GET_BATCH_MAX_BODY as u64,
        ..node.intake.clone()
    };
    let body = intake.read(req.into_body()).await?;
    let batch = larder_proto::decode_get_batch(&body.concat())?;
    let inline_up_to = u64::from(batch.inline_up_to).min(INLINE_READ_MAX);
    // Each blob counts as a request in flight while the batch lasts, as its GET alone would.
    let _busy: Vec<_> = batch
        .items
        .iter()
        .map(|_| node.compaction.foreground.enter())
        .collect();
    let mut answers = Vec::with_capacity(batch.items.len());
    let mut to_read = Vec::new();
    let mut room = ANSWER_ROOM;
    for (at, item) in batch.items.iter().enumerate() {
        let answer = match look_up_one(node, item, asked) {
            Ok(Found::Read(store, record, vouched)) => {
                if record.size > inline_up_to || record.size > room {
                    GetItemAnswer::Alone
                } else {
                    room -= record.size;
                    to_read.push(Reading {
                        at,
                        store,
                        record,
                        vouched,
                    });
                    GetItemAnswer::Alone // replaced once read
                }
            }
            Ok(Found::Answer(response)) => in_memory(response),
            Err(err) => in_memory(reply::error_response(&err)),
        };
        answers.push(answer);
    }
    for (at, answer) in blocking(move || read_all(to_read)).await {
        answers[at] = answer;
    }
    let mut response = Response::new(reply::body(larder_proto::encode_get_answers(&answers)));
    *response.status_mut() = StatusCode::OK;
    Ok(response)
}

enum Found {
    Read(Store, BlobRecord, bool),
    Answer(Response<Body>),
}

/// What a GET of `item` alone would find, before its bytes are read.
fn look_up_one(node: &StorageNode, item: &GetItem, asked: Option<u64>) -> Result<Found> {
    fence(node, item.partition, asked)?;
    let store = hosted(node, item.partition)?;
    Ok(
        match look_up(node, item.partition, &store, &item.key, false)? {
            Lookup::Answer(response) => Found::Answer(response),
            Lookup::Found { record, vouched } => Found::Read(store, record, vouched),
        },
    )
}

/// A found blob to read, and where its answer goes.
struct Reading {
    at: usize,
    store: Store,
    record: BlobRecord,
    vouched: bool,
}

/// The answers of the blobs found (on a blocking thread: each is one or two preads, checked).
fn read_all(to_read: Vec<Reading>) -> Vec<(usize, GetItemAnswer)> {
    to_read
        .into_iter()
        .map(|reading| {
            let answer =
                read_one(&reading).unwrap_or_else(|err| in_memory(reply::error_response(&err)));
            (reading.at, answer)
        })
        .collect()
}

fn read_one(reading: &Reading) -> Result<GetItemAnswer> {
    let Reading { store, record, .. } = reading;
    let mut pieces = store
        .read_blob(record, 0..record.size)?
        .collect::<larder_store::Result<Vec<Bytes>>>()?;
    let body = match pieces.len() {
        1 => pieces.pop().expect("one piece"),
        _ => pieces.concat().into(),
    };
    let mut headers = HeaderMap::with_capacity(4);
    found_headers(&mut headers, record, record.size)?;
    if !reading.vouched {
        mark_catching_up(&mut headers);
    }
    Ok(GetItemAnswer::Answered {
        status: StatusCode::OK,
        headers,
        body,
    })
}

/// An answer built in memory (an error, a tombstone) as a batch item: its body is ready at
/// once.
fn in_memory(response: Response<Body>) -> GetItemAnswer {
    let (parts, body) = response.into_parts();
    let body = futures_util::FutureExt::now_or_never(body.collect())
        .and_then(|collected| collected.ok())
        .map_or_else(Bytes::new, |c| c.to_bytes());
    GetItemAnswer::Answered {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}
