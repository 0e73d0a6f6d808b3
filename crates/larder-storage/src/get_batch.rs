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
use crate::error::Result;
use crate::node::blocking;
use crate::reply::{self, Body};
use crate::routes::{fence, hosted};
use crate::StorageNode;

pub async fn handle(
    node: &Arc<StorageNode>,
    req: Request<Incoming>,
    asked: Option<u64>,
) -> Result<Response<Body>> {
    let intake = node.intake.bounded(larder_proto::GET_BATCH_MAX_BODY);
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
    let mut room = Room(larder_proto::GET_BATCH_MAX_ANSWERED);
    for (at, item) in batch.items.iter().enumerate() {
        let answer = match look_up_one(node, item, asked) {
            Ok(Found::Read(store, record, vouched)) => {
                if record.size <= inline_up_to && record.size <= room.0 as u64 {
                    to_read.push(Reading {
                        at,
                        store,
                        record,
                        vouched,
                    });
                }
                GetItemAnswer::Alone // replaced once read, if it fits
            }
            Ok(Found::Answer(response)) => room.fit(in_memory(response)),
            Err(err) => room.fit(in_memory(reply::error_response(&err))),
        };
        answers.push(answer);
    }
    let sizes = to_read.iter().map(|reading| reading.record.size);
    let in_place = reads_in_place(to_read.len(), sizes.sum());
    let encode = move || {
        for reading in to_read {
            let answer =
                read_one(&reading).unwrap_or_else(|err| in_memory(reply::error_response(&err)));
            answers[reading.at] = room.fit(answer);
        }
        larder_proto::encode_get_answers(&answers)
    };
    let encoded = match in_place {
        true => encode(),
        false => blocking(encode).await,
    };
    let mut response = Response::new(reply::body(encoded));
    *response.status_mut() = StatusCode::OK;
    Ok(response)
}

/// At most this many reads of a batch are done in place: as many as the GETs alone that a
/// frontend lets wait before it sends them as a batch (32), each of which would have read in
/// place, so a cold page cache stalls a worker no longer than those GETs would have.
const READS_IN_PLACE: usize = 32;

/// Whether a batch's `count` reads of `bytes` in all (and its answer's encoding) are done on
/// the async worker: when they are few and come to no more than a GET alone reads in place
/// (`INLINE_READ_MAX`; nearly always from the page cache, and a hand-off to the blocking pool
/// costs more than such reads: two thread wake-ups per batch). Otherwise off the worker.
fn reads_in_place(count: usize, bytes: u64) -> bool {
    count <= READS_IN_PLACE && bytes <= INLINE_READ_MAX
}

/// What is left of an answer's [`larder_proto::GET_BATCH_MAX_ANSWERED`] bytes.
struct Room(usize);

impl Room {
    /// `answer` if it is encodable and fits (and takes its room), otherwise "ask alone".
    fn fit(&mut self, answer: GetItemAnswer) -> GetItemAnswer {
        let len = answer.encoded_len();
        if !answer.encodable() || len > self.0 {
            return GetItemAnswer::Alone;
        }
        self.0 -= len;
        answer
    }
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

/// A found blob to read (on a blocking thread: one or two preads, checked), and where its
/// answer goes.
struct Reading {
    at: usize,
    store: Store,
    record: BlobRecord,
    vouched: bool,
}

fn read_one(reading: &Reading) -> Result<GetItemAnswer> {
    let Reading { store, record, .. } = reading;
    // An empty blob has no bytes to read, as a GET of it alone reads none.
    let mut pieces = match record.size {
        0 => Vec::new(),
        size => store
            .read_blob(record, 0..size)?
            .collect::<larder_store::Result<Vec<Bytes>>>()?,
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_few_small_reads_are_done_in_place() {
        assert!(reads_in_place(0, 0));
        assert!(reads_in_place(18, 18 * 1024));
        assert!(reads_in_place(READS_IN_PLACE, INLINE_READ_MAX));
        // Many tiny blobs: each read may be a disk read, so not on the worker.
        assert!(!reads_in_place(READS_IN_PLACE + 1, 1024));
        assert!(!reads_in_place(2, INLINE_READ_MAX + 1));
    }
}
