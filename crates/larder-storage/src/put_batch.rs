//! A batch of small blob PUTs in one request (`larder-proto`'s `batch.rs`, sent by frontends
//! while other PUTs to this node are on the way). Each blob goes through what a PUT of it alone
//! goes through (the map fence, its replica, its properties, its checksum) and gets the status
//! that PUT would have got. Every write is begun before any is awaited, so the batch shares its
//! disks' commit rounds; the answer comes once every blob is durable or refused.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::join_all;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use larder_proto::{header as h, ItemAnswer, PutItem};
use larder_store::PutOutcome;

use crate::blobs::checked_meta;
use crate::error::{Error, Result};
use crate::reply::{self, Body};
use crate::routes::{fence, hosted};
use crate::StorageNode;

pub async fn handle(
    node: &Arc<StorageNode>,
    req: Request<Incoming>,
    asked: Option<u64>,
) -> Result<Response<Body>> {
    // Read as a PUT's body is, bounded by the batch's limit rather than a record's; the
    // budget's share is held until every blob is written.
    let intake = node.intake.bounded(larder_proto::BATCH_MAX_BODY);
    let body = intake.read(req.into_body()).await?;
    let items = larder_proto::decode_put_batch(&body.concat())?;
    let answers = join_all(items.iter().map(|item| put_one(node, item, asked))).await;
    let mut response = Response::new(reply::body(larder_proto::encode_answers(&answers)));
    *response.status_mut() = StatusCode::OK;
    Ok(response)
}

async fn put_one(node: &StorageNode, item: &PutItem, asked: Option<u64>) -> ItemAnswer {
    // Each blob counts as a request in flight, as its PUT alone would: compaction gives way
    // to the number of writes, not of requests.
    let _busy = node.compaction.foreground.enter();
    let outcome = async {
        fence(node, item.partition, asked)?;
        let store = hosted(node, item.partition)?;
        let meta = checked_meta(&node.clock, &props_header(&item.props)?)?;
        if crc32c::crc32c(&item.data) != item.crc32c {
            return Err(Error::ChecksumMismatch);
        }
        let data = std::slice::from_ref(&item.data);
        Ok(crate::node::put_blob(&store, &item.key, meta, data).await?)
    };
    match outcome.await {
        Ok(PutOutcome::Stored) => answer(StatusCode::CREATED, ""),
        Ok(PutOutcome::AlreadyExists) => answer(StatusCode::OK, "exists"),
        Ok(PutOutcome::Deleted) => answer(StatusCode::GONE, "deleted"),
        Err(err) => {
            let (status, code) = reply::error_status(&err);
            answer(status, &format!("{code}: {err}"))
        }
    }
}

/// The item's properties as the one header a PUT alone carries them in, for the same parser.
fn props_header(props: &Bytes) -> Result<HeaderMap> {
    let value = HeaderValue::from_maybe_shared(props.clone())
        .map_err(|_| Error::BadHeader(format!("{} is not header text", h::PROPS)))?;
    let mut headers = HeaderMap::with_capacity(1);
    headers.insert(h::PROPS, value);
    Ok(headers)
}

fn answer(status: StatusCode, message: &str) -> ItemAnswer {
    ItemAnswer {
        status,
        message: message.to_owned(),
    }
}
