//! Blob operations of the internal API: PUT (checksummed, durable), GET/HEAD (whole or a range,
//! verified before the status is sent) and DELETE (a timestamped tombstone).

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use larder_proto::{header as h, header_name as hn, BlobProperties, ByteRange};
use larder_store::{BlobLookup, BlobMeta, BlobRecord, DeleteOutcome, PutOutcome, Store};

use crate::error::{Error, Result};
use crate::node::blocking;
use crate::read_budget::ReadBudget;
use crate::reply::{self, status, Body};
use crate::validate::{header_number, now_ms, Clock};
use crate::{props, StorageNode};

/// Reads up to this size are done on the async thread (see `serve`).
pub(crate) const INLINE_READ_MAX: u64 = 64 * 1024;

pub async fn put(
    node: &StorageNode,
    store: Store,
    key: String,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let meta = checked_meta(&node.clock, req.headers())?;
    let expected_crc = req
        .headers()
        .get(h::BODY_CRC32C)
        .map(|v| v.to_str().ok().and_then(|s| s.parse::<u32>().ok()));
    // Held until the record is written: the budget counts the bytes as long as they are here.
    let body = node.intake.read(req.into_body()).await?;
    if let Some(expected) = expected_crc {
        let actual = body
            .chunks
            .iter()
            .fold(0, |crc, c| crc32c::crc32c_append(crc, c));
        if expected != Some(actual) {
            return Err(Error::ChecksumMismatch);
        }
    }
    let outcome = crate::node::put_blob(&store, &key, meta, &body.chunks).await?;
    Ok(match outcome {
        PutOutcome::Stored => put_answer(StatusCode::CREATED, "stored"),
        PutOutcome::AlreadyExists => put_answer(StatusCode::OK, "exists"),
        PutOutcome::Deleted => gone("deleted", None),
    })
}

/// A blob's properties as the request sends them (the public API's own parser, so nothing is
/// stored here that the public API would refuse), with its times checked against the clock.
/// The compact header is stored as it came (it was just decoded and checked); properties in one
/// header each (from a frontend of an earlier release) are converted to it.
pub(crate) fn checked_meta(clock: &Clock, headers: &HeaderMap) -> Result<BlobMeta> {
    let props = BlobProperties::from_internal_headers(headers)?;
    let time_ms = match props.created_ms {
        0 => now_ms(),
        created => clock.check_time(h::TIME_MS, created)?,
    };
    let stored = match headers.get(h::PROPS) {
        Some(value) => props::from_header(value),
        None => props::encode(&props)?,
    };
    Ok(BlobMeta {
        props: stored,
        time_ms,
        expires_ms: clock.check_expiry(props.expires_ms)?,
    })
}

fn put_answer(code: StatusCode, outcome: &'static str) -> Response<Body> {
    let mut response = status(code);
    response
        .headers_mut()
        .insert(h::PUT_OUTCOME, HeaderValue::from_static(outcome));
    response
}

fn gone(reason: &'static str, time_ms: Option<u64>) -> Response<Body> {
    let mut response = reply::gone("Gone", format!("blob is {reason}"), reason);
    if let Some(time) = time_ms {
        response.headers_mut().insert(h::TIME_MS, time.into());
    }
    response
}

pub async fn get(
    node: &StorageNode,
    partition: larder_cluster::PartitionId,
    store: Store,
    key: &str,
    req: &Request<Incoming>,
    with_body: bool,
) -> Result<Response<Body>> {
    let include_expired = req.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|p| p == larder_proto::INCLUDE_EXPIRED_QUERY)
    });
    let range = match req.headers().get(header::RANGE) {
        None => None,
        Some(value) => {
            let text = value.to_str().unwrap_or("");
            Some(ByteRange::parse(text).map_err(Error::BadRange)?)
        }
    };
    let (record, vouched) = match look_up(node, partition, &store, key, include_expired)? {
        Lookup::Answer(response) => return Ok(response),
        Lookup::Found { record, vouched } => (record, vouched),
    };
    let reads = with_body.then_some(&node.reads);
    let served = serve(store, record, range, reads).await;
    if matches!(served, Err(Error::ReadBudgetSpent)) {
        node.metrics.read_budget_refusals.inc();
    }
    let mut response = served?;
    if !vouched {
        mark_catching_up(response.headers_mut());
    }
    Ok(response)
}

/// What a GET's lookup of a key found: the answer already (gone), or a record to serve.
pub(crate) enum Lookup {
    Answer(Response<Body>),
    Found {
        record: BlobRecord,
        /// The replica vouches for having applied its local peers' tombstones (otherwise
        /// the answer says it is catching up).
        vouched: bool,
    },
}

/// Looks `key` up for a GET (the in-memory index only: no need to leave the async thread).
pub(crate) fn look_up(
    node: &StorageNode,
    partition: larder_cluster::PartitionId,
    store: &Store,
    key: &str,
    include_expired: bool,
) -> Result<Lookup> {
    // Before the lookup: a replica that vouches has applied every change its local peers
    // held a caught-up window ago, so the lookup below sees their tombstones.
    let vouched = node.horizons.vouches(partition);
    match store.get_blob(key.as_bytes(), now_ms())? {
        BlobLookup::NotFound => Err(Error::NotFound("no such blob on this replica")),
        BlobLookup::Deleted { time_ms } => Ok(Lookup::Answer(gone("deleted", Some(time_ms)))),
        BlobLookup::Expired(record) if !include_expired => {
            Ok(Lookup::Answer(gone("expired", record.meta.expires_ms)))
        }
        BlobLookup::Found(record) | BlobLookup::Expired(record) => {
            // Only off the common path (a replica that vouches checked itself long ago).
            if !vouched && !node.horizons.checked_for_reads(partition) {
                return Err(Error::Unchecked { partition });
            }
            Ok(Lookup::Found { record, vouched })
        }
    }
}

pub(crate) fn mark_catching_up(headers: &mut HeaderMap) {
    headers.insert(hn::CATCHING_UP, HeaderValue::from_static("1"));
}

/// The headers of a found blob's answer: its properties, its size and the length sent.
pub(crate) fn found_headers(headers: &mut HeaderMap, record: &BlobRecord, sent: u64) -> Result<()> {
    headers.insert(hn::PROPS, props::to_header(&record.meta.props)?);
    headers.insert(header::CONTENT_LENGTH, sent.into());
    headers.insert(hn::BLOB_SIZE, record.size.into());
    Ok(())
}

/// Answers with a blob's bytes (with `reads`, the node's read budget; without, a HEAD). The
/// range's first piece is read and verified before the status is sent, so damage there
/// answers 500 (and the router asks another replica); a range of more than one piece streams
/// the rest (`streamed.rs`).
async fn serve(
    store: Store,
    record: BlobRecord,
    range: Option<ByteRange>,
    reads: Option<&ReadBudget>,
) -> Result<Response<Body>> {
    let size = record.size;
    let selected = match range {
        None => 0..size,
        Some(range) => range.resolve(size).map_err(Error::BadRange)?,
    };
    let mut headers = HeaderMap::new();
    found_headers(&mut headers, &record, selected.end - selected.start)?;
    let body = match reads {
        Some(reads) if !selected.is_empty() => read(store, record, selected.clone(), reads).await?,
        _ => reply::chunks_body(Vec::new()),
    };
    let mut response = Response::new(body);
    *response.headers_mut() = headers;
    if range.is_some() {
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        let value = larder_proto::content_range(&selected, size);
        response.headers_mut().insert(
            header::CONTENT_RANGE,
            HeaderValue::from_str(&value).expect("a content range is ascii"),
        );
    }
    Ok(response)
}

async fn read(
    store: Store,
    record: BlobRecord,
    selected: std::ops::Range<u64>,
    reads: &ReadBudget,
) -> Result<Body> {
    let len = selected.end - selected.start;
    if len <= INLINE_READ_MAX {
        // One or two preads, nearly always from the page cache: done in place they measured
        // 15-17k GET/s against 11-13k through the blocking pool (two thread wake-ups per
        // request). A cold-cache read stalls one worker for one disk read.
        let chunks = store
            .read_blob(&record, selected)?
            .collect::<larder_store::Result<Vec<Bytes>>>()?;
        return Ok(reply::chunks_body(chunks));
    }
    // The share goes into the blocking read, and on with its piece: counted while either
    // lasts, even if this request is dropped meanwhile.
    let held = reads.take(reads.share(len)).await?;
    let first = move || -> larder_store::Result<(Option<Bytes>, larder_store::BlobReader)> {
        let mut reader = store.read_blob(&record, selected)?;
        let first = reader.next().transpose()?.map(|piece| held.attach(piece));
        Ok((first, reader))
    };
    match blocking(first).await? {
        (Some(first), reader) => Ok(Body::new(crate::streamed::Streamed::new(
            first,
            reader,
            len,
            reads.clone(),
        ))),
        (None, _) => Err(Error::Store(larder_store::Error::Io(
            std::io::Error::other("the store read nothing of a range it holds"),
        ))),
    }
}

pub async fn delete(
    node: &StorageNode,
    store: Store,
    key: String,
    req: Request<Incoming>,
) -> Result<Response<Body>> {
    let time_ms = match header_number(req.headers(), h::TIME_MS)? {
        Some(time) => node.clock.check_time(h::TIME_MS, time)?,
        None => now_ms(),
    };
    match crate::node::delete_blob(&store, &key, time_ms).await? {
        DeleteOutcome::Deleted | DeleteOutcome::AlreadyDeleted => Ok(status(StatusCode::ACCEPTED)),
    }
}
