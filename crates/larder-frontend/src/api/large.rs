//! Blobs of any size: uploads read chunk by chunk (one chunk is a simple blob; more become a
//! composite through the router's `Upload`), and composite blobs read back through the router's
//! read-ahead `ChunkStream`. Memory per request is a few chunks, whatever the blob's size.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::{Method, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Limited, StreamBody};
use hyper::body::Incoming;
use larder_cluster::BlobId;
use larder_proto::{BlobProperties, ByteRange};
use larder_router::{Composite, GetAnswer, Manifest, Missing};

use super::blobs::{content_headers, copy_public_headers, drain_budget, too_large};
use crate::body::{drain_in_background, empty, next_frame, Body};
use crate::error::ApiError;
use crate::state::AppState;

/// Largest composite record the frontend reads (a 64 GiB blob of 4 MiB chunks lists 16 Ki chunks
/// in about 440 KiB; `ChunkingConfig::validate` keeps manifests under 8 MiB).
const MAX_MANIFEST: usize = 16 * 1024 * 1024;

/// Stores an upload of any size: at most one chunk becomes a simple blob, more a composite one.
/// Returns the blob's ID and size. `length` is the request's `Content-Length`, if any.
pub async fn store_body(
    state: &Arc<AppState>,
    props: BlobProperties,
    body: Incoming,
    length: Option<u64>,
) -> Result<(BlobId, u64), ApiError> {
    let max = state.config.max_blob_size.as_u64();
    let chunk_size = state.config.chunking.chunk_size.as_u64() as usize;
    let timeout = state.config.limits.body_read_timeout;
    let mut reader = ChunkReader::new(body, chunk_size, length, max, timeout);
    let first = reader.next_chunk().await?;
    state.metrics.bytes_received.inc_by(first.len() as u64);
    if !reader.has_more().await? {
        let size = first.len() as u64;
        let id = state.router.put_blob(&props, first).await?;
        return Ok((id, size));
    }
    let mut upload = state.router.start_upload(props, &state.config.chunking)?;
    upload.push(first).await?;
    loop {
        let chunk = reader.next_chunk().await?;
        if chunk.is_empty() {
            break;
        }
        state.metrics.bytes_received.inc_by(chunk.len() as u64);
        // While earlier chunks are in flight this waits, and the client's body is not read:
        // flow control (HTTP/2 windows, TCP for HTTP/1.1) holds the client back.
        upload.push(chunk).await?;
    }
    // An upload dropped before this point (error, client gone) tombstones its chunks.
    Ok(upload.finish().await?)
}

/// Cuts a request body into chunks of exactly `chunk_size` bytes (the last may be shorter),
/// refusing more than `max` bytes in all.
struct ChunkReader {
    body: Option<Incoming>,
    leftover: Bytes,
    chunk_size: usize,
    /// Expected remaining bytes when the client sent `Content-Length`, to size buffers.
    length_hint: Option<u64>,
    max: u64,
    total: u64,
    /// The body-read timeout: how long the client may send nothing.
    stall: Duration,
}

impl ChunkReader {
    fn new(
        body: Incoming,
        chunk_size: usize,
        length: Option<u64>,
        max: u64,
        stall: Duration,
    ) -> ChunkReader {
        ChunkReader {
            body: Some(body),
            leftover: Bytes::new(),
            chunk_size,
            length_hint: length,
            max,
            total: 0,
            stall,
        }
    }

    /// The next data of the body, or `None` at its end.
    async fn next_data(&mut self) -> Result<Option<Bytes>, ApiError> {
        let Some(body) = self.body.as_mut() else {
            return Ok(None);
        };
        while let Some(frame) = next_frame(body, self.stall).await {
            let frame = frame?;
            if let Ok(data) = frame.into_data() {
                if data.is_empty() {
                    continue;
                }
                self.total += data.len() as u64;
                if self.total > self.max {
                    if let Some(body) = self.body.take() {
                        drain_in_background(body, drain_budget(self.max), self.stall);
                    }
                    return Err(too_large(self.max));
                }
                return Ok(Some(data));
            }
        }
        self.body = None;
        Ok(None)
    }

    /// Up to `chunk_size` bytes; fewer only at the end of the body, empty when nothing is left.
    async fn next_chunk(&mut self) -> Result<Bytes, ApiError> {
        // A piece that covers a whole chunk is sliced, not copied. Otherwise pieces are copied
        // into one buffer: the pool then sends the chunk upstream in frames of the configured
        // size, instead of one small frame per piece the client happened to send.
        if self.leftover.len() >= self.chunk_size {
            return Ok(self.leftover.split_to(self.chunk_size));
        }
        if self.leftover.is_empty() {
            let Some(mut piece) = self.next_data().await? else {
                return Ok(Bytes::new());
            };
            if piece.len() >= self.chunk_size {
                let chunk = piece.split_to(self.chunk_size);
                self.leftover = piece;
                return Ok(chunk);
            }
            // The whole rest of a declared body in one piece (a small upload in one DATA frame
            // or read): it is the chunk, with no buffer to allocate and copy it into.
            if self.length_hint == Some(self.total) {
                return Ok(piece);
            }
            self.leftover = piece;
        }
        let mut buf = BytesMut::with_capacity(self.buffer_capacity());
        buf.extend_from_slice(&std::mem::take(&mut self.leftover));
        while buf.len() < self.chunk_size {
            let Some(mut piece) = self.next_data().await? else {
                break;
            };
            if buf.is_empty() && piece.len() >= self.chunk_size {
                let chunk = piece.split_to(self.chunk_size);
                self.leftover = piece;
                return Ok(chunk);
            }
            let room = self.chunk_size - buf.len();
            if piece.len() > room {
                self.leftover = piece.split_off(room);
            }
            buf.extend_from_slice(&piece);
        }
        Ok(buf.freeze())
    }

    fn buffer_capacity(&self) -> usize {
        match self.length_hint {
            Some(length) => length
                .saturating_sub(self.total)
                .saturating_add(self.leftover.len() as u64)
                .min(self.chunk_size as u64) as usize,
            // Unknown length: small uploads should not cost a whole chunk; the buffer grows.
            None if self.total == 0 => 64 * 1024,
            None => self.chunk_size,
        }
    }

    /// Whether any byte follows what has been read (reads ahead into `leftover` to find out).
    async fn has_more(&mut self) -> Result<bool, ApiError> {
        if !self.leftover.is_empty() {
            return Ok(true);
        }
        match self.next_data().await? {
            Some(piece) => {
                self.leftover = piece;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// What a read of a composite blob's record found.
enum ManifestAnswer {
    Found(Manifest, BlobProperties),
    Missing(Missing),
}

async fn read_manifest(state: &Arc<AppState>, id: &BlobId) -> Result<ManifestAnswer, ApiError> {
    let found = match state.router.get_blob(id, Method::GET, None).await? {
        GetAnswer::Found(found) => found,
        GetAnswer::Missing(missing) => return Ok(ManifestAnswer::Missing(missing)),
    };
    let bytes = Limited::new(found.body, MAX_MANIFEST)
        .collect()
        .await
        .map_err(|e| ApiError::Unavailable(format!("reading a composite record: {e}")))?
        .to_bytes();
    let manifest = match Composite::decode(&bytes) {
        Ok(Composite::Chunks(manifest)) => manifest,
        // Owned by an S3 name, whose index decides when its parts go: not for this API to
        // read piecewise or to delete from under it.
        Ok(Composite::Parts(_)) => {
            return Err(ApiError::BadRequest(
                "S3ObjectBody",
                format!("blob {id} is an S3 object's list of parts: read it through the S3 API"),
            ))
        }
        Err(e) => return Err(ApiError::Internal(format!("composite blob {id}: {e}"))),
    };
    Ok(ManifestAnswer::Found(manifest, found.properties))
}

/// GET or HEAD of a composite blob: whole, a range, or conditional.
pub async fn download(
    state: &Arc<AppState>,
    id: &BlobId,
    etag: &str,
    not_modified: bool,
    range: Option<ByteRange>,
    head: bool,
) -> Result<Response<Body>, ApiError> {
    let (manifest, properties) = match read_manifest(state, id).await? {
        ManifestAnswer::Found(manifest, properties) => (manifest, properties),
        ManifestAnswer::Missing(missing) => return Err(missing.into()),
    };
    let size = manifest.size;
    let selected = match range.map(|r| r.resolve(size)) {
        None => 0..size,
        Some(Ok(selected)) => selected,
        Some(Err(_)) => return Err(Missing::RangeNotSatisfiable { size }.into()),
    };
    let mut response = if not_modified || head {
        Response::new(empty())
    } else {
        Response::new(stream_range(state, &manifest, selected.clone()).await?)
    };
    copy_public_headers(&properties, response.headers_mut(), etag);
    if not_modified {
        *response.status_mut() = StatusCode::NOT_MODIFIED;
        return Ok(response);
    }
    content_headers(&mut response, &selected, size, range.is_some());
    Ok(response)
}

/// The body of `range`: chunk reads with read-ahead. The first chunk is awaited here, so a blob
/// whose chunks cannot be read answers with an error status rather than a truncated 200; a later
/// failure can only end the body early (the client sees a short, reset transfer).
async fn stream_range(
    state: &Arc<AppState>,
    manifest: &Manifest,
    range: Range<u64>,
) -> Result<Body, ApiError> {
    let slices = manifest.slices(range);
    let mut chunks = state
        .router
        .read_chunks(slices, state.config.chunking.read_ahead);
    let first = match chunks.next().await {
        None => return Ok(empty()),
        Some(first) => first?,
    };
    let frames = futures_util::stream::once(async move { Ok(first) })
        .chain(chunks)
        .map(|chunk| chunk.map(Frame::data).map_err(Into::into));
    Ok(BodyExt::boxed(StreamBody::new(frames)))
}

/// DELETE of a composite blob: tombstone the composite (the blob is gone from then on), then
/// its chunks in the background. The manifest is read first; if it cannot be read the delete
/// fails (503) rather than orphan the chunks, and the client can retry.
pub async fn delete(state: &Arc<AppState>, id: &BlobId) -> Result<(), ApiError> {
    let chunks = match read_manifest(state, id).await? {
        ManifestAnswer::Found(manifest, _) => manifest.chunks,
        ManifestAnswer::Missing(_) => Vec::new(),
    };
    state.router.delete_blob(id).await?;
    if !chunks.is_empty() {
        let router = state.router.clone();
        tokio::spawn(async move { router.delete_chunks(chunks, "deleted composite").await });
    }
    Ok(())
}
