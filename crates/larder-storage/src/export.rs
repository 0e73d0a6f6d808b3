//! `GET .../partitions/<p>/export?after=<cursor>&replica=<node id>`: this replica's live records
//! and the tombstones its index still serves, in change feed order after `after`, as one
//! streamed answer of checksummed frames (larder-proto's `export.rs`). A new replica copies a
//! partition with it in one exchange (`bootstrap.rs`), resuming after a crash of either side
//! from the last position it made durable.
//!
//! Every blob's data is read through the store's verified reader: a record that fails its
//! checksum here is skipped (logged, counted), never framed, so it is never copied as valid;
//! the new replica gets that key from another peer through the change feed. The stream stops at
//! the durable head it found when it began, so it ends under any write load; the end frame
//! names where the new replica's replication of this peer goes on.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use larder_proto::{ExportFrame, FrameKind};
use larder_store::{BlobLookup, Change, Cursor, DocLookup, Op, Store};
use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::horizon::Serve;
use crate::reply::{Body, BoxError};
use crate::StorageNode;

/// Feed records read per page while exporting.
const PAGE: usize = 256;
/// Messages queued towards the connection; with h2's send buffer this bounds what one export
/// holds in memory (a few packs, or records of at most `max_record_size`).
const QUEUED_FRAMES: usize = 4;
/// Small frames are packed into one message (one DATA frame on the wire) of about this size:
/// a 1 KiB record is then not a channel message, a wake-up and an h2 frame of its own.
const PACK_BYTES: usize = 256 << 10;

pub async fn export(
    node: Arc<StorageNode>,
    partition: u32,
    store: Store,
    query: &str,
) -> Result<Response<Body>> {
    let (after, replica) = parse_query(query)?;
    // A bootstrapping replica is no source for another's bootstrap (`DESIGN.md` 6.1).
    if node.replica_state(partition) == Some(larder_cluster::ReplicaState::Bootstrapping) {
        return Err(Error::Bootstrapping { partition });
    }
    if let Some(peer) = replica {
        // The new replica's position holds this partition's tombstones until it has them.
        // An export is always a fresh copy's scan (`changes::note_peer`).
        crate::changes::note_peer(&node, partition, &store, (peer, true), (after, after))?;
        if node.horizons.may_serve(partition, peer) == Serve::Behind {
            return Err(Error::MustBeRebuilt { partition });
        }
    }
    let estimate = store.stats().bytes_on_disk;
    let (tx, rx) = mpsc::channel(QUEUED_FRAMES);
    tokio::task::spawn_blocking(move || produce(&node, partition, &store, after, &tx));
    let mut response = Response::new(ChannelBody(rx).boxed());
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        larder_proto::header::EXPORT_ESTIMATE,
        HeaderValue::from(estimate),
    );
    Ok(response)
}

fn parse_query(query: &str) -> Result<(Cursor, Option<&str>)> {
    let mut after = Cursor::START;
    let mut replica = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("after", value) => {
                after = value
                    .parse()
                    .map_err(|_| Error::BadQuery("after is not a cursor"))?
            }
            ("replica", value) => replica = Some(value),
            _ => {}
        }
    }
    Ok((after, replica))
}

/// Reads the feed after `after` up to the durable head of now and sends each record as a
/// frame, then the end frame. Runs on a blocking thread; stops when the receiver goes away.
fn produce(
    node: &StorageNode,
    partition: u32,
    store: &Store,
    after: Cursor,
    tx: &mpsc::Sender<std::result::Result<Bytes, BoxError>>,
) {
    let send = |bytes: Bytes| tx.blocking_send(Ok(bytes)).is_ok();
    let mut pack = BytesMut::from(&larder_proto::encode_stream_head(store.incarnation())[..]);
    let head = store.stats().durable_cursor;
    // Each page starts exactly where the last one stopped (not at a shared hint other readers
    // may have pushed out): the export reads the log once, not once per page.
    let mut feed = store.feed(after);
    loop {
        let batch = match feed.next_page(PAGE) {
            Ok(batch) => batch,
            Err(err) => {
                tracing::warn!(partition, %err, "export: reading the feed failed");
                let _ = tx.blocking_send(Err(Box::new(err)));
                return;
            }
        };
        let full = batch.changes.len() == PAGE;
        for change in &batch.changes {
            match frame_of(store, change) {
                Ok(Some(frame)) if frame.wire_len() >= PACK_BYTES as u64 => {
                    // A large record goes as it is, after what is packed before it.
                    if !pack.is_empty() && !send(pack.split().freeze()) {
                        return;
                    }
                    if !send(frame.encode()) {
                        return;
                    }
                }
                Ok(Some(frame)) => {
                    frame.encode_into(&mut pack);
                    if pack.len() >= PACK_BYTES && !send(pack.split().freeze()) {
                        return;
                    }
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::error!(partition, key = %String::from_utf8_lossy(&change.key), %err,
                        "export: record fails its checksum; not sent (the new replica gets it from another peer)");
                    node.metrics.export_corrupt_skipped.inc();
                }
            }
        }
        // A page that is not full reached the durable end; past the head of when the export
        // began, the change feed pull takes over.
        if !full || feed.cursor().sequence >= head.sequence {
            break;
        }
    }
    ExportFrame::end(feed.cursor().sequence).encode_into(&mut pack);
    send(pack.freeze());
}

/// The frame of one change, with its data read and verified; `None` when the record is gone
/// since the feed listed it (it is then replaced by a later record the feed will list).
fn frame_of(store: &Store, change: &Change) -> larder_store::Result<Option<ExportFrame>> {
    let mut frame = ExportFrame {
        kind: FrameKind::End,
        sequence: change.cursor.sequence,
        key: change.key.clone(),
        props: Bytes::new(),
        data: Bytes::new(),
        time_ms: change.time_ms,
        expires_ms: change.expires_ms,
        version: change.version,
    };
    match change.op {
        Op::PutBlob => {
            let now = crate::validate::now_ms();
            let record = match store.get_blob(&change.key, now)? {
                BlobLookup::Found(record) | BlobLookup::Expired(record) => record,
                _ => return Ok(None),
            };
            let pieces = store
                .read_blob(&record, 0..record.size)?
                .collect::<larder_store::Result<Vec<Bytes>>>()?;
            frame.kind = FrameKind::PutBlob;
            frame.props = record.meta.props.clone();
            frame.time_ms = record.meta.time_ms;
            frame.expires_ms = record.meta.expires_ms;
            frame.data = match pieces.len() {
                1 => pieces.into_iter().next().expect("one piece"),
                _ => pieces.concat().into(),
            };
        }
        Op::DeleteBlob => frame.kind = FrameKind::DeleteBlob,
        Op::PutDoc => match store.get_doc(&change.key)? {
            DocLookup::Found {
                version,
                time_ms,
                json,
            } if version == change.version => {
                frame.kind = FrameKind::PutDoc;
                frame.time_ms = time_ms;
                frame.data = json;
            }
            _ => return Ok(None),
        },
        Op::RemoveDoc => frame.kind = FrameKind::RemoveDoc,
    }
    Ok(Some(frame))
}

/// A response body fed by a channel: each message one DATA frame.
struct ChannelBody(mpsc::Receiver<std::result::Result<Bytes, BoxError>>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, BoxError>>> {
        self.0
            .poll_recv(cx)
            .map(|message| message.map(|result| result.map(Frame::data)))
    }
}
