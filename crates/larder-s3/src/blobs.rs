//! Object bodies as Larder blobs, through the router's paths the frontend's `/v1/blobs` uses:
//! a body within one chunk is one simple blob, a longer one a chunked upload (`Upload`: a few
//! chunks in flight, a composite manifest at the end, chunks tombstoned if it fails). Nothing is
//! held whole: a few chunks per request at most. Reads of a composite go through the manifest
//! and the router's read-ahead `ChunkStream`.

use std::ops::Range;
use std::sync::Arc;

use crate::etag_lanes::EtagHasher;
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt, TryStreamExt};
use http::Method;
use http_body_util::{BodyExt, Limited};
use larder_cluster::{BlobId, BlobKind};
use larder_proto::{BlobProperties, ByteRange};
use larder_router::{
    ChunkingConfig, Composite, GetAnswer, JournalEntry, Manifest, Part, PartChecksums,
    PartsManifest, Router,
};
use s3s::checksum::ChecksumHasher;
use s3s::dto::StreamingBlob;

use crate::body_cache::BodyCache;
use crate::error::S3Error;
use crate::held::Held;
use crate::records::Piece;

/// Largest composite record read (as the frontend's `api/large.rs`).
const MAX_MANIFEST: usize = 16 << 20;

/// How object bodies are cut and bounded.
#[derive(Clone, Debug)]
pub struct BlobLimits {
    pub chunking: ChunkingConfig,
    pub max_object_size: u64,
    /// A request body from which nothing arrives for this long fails (the frontend's
    /// `limits.body_read_timeout`).
    pub body_read_timeout: std::time::Duration,
}

/// A stored body.
pub struct Stored {
    pub id: BlobId,
    /// The journal entry it is held under until its name is settled (`held.rs`).
    pub held: Held,
    pub size: u64,
    /// Hex MD5 of the bytes (the ETag of a single PUT).
    pub md5: String,
    /// The additional checksum asked for, computed over the bytes (`checksums.rs`).
    pub checksum: Option<ChecksumHasher>,
}

/// Stores `body` as a blob, chunked when it is longer than one chunk, hashing it with
/// `checksum` too when given. With `held_for`, under a journal entry held for that name
/// (`held.rs`), which the caller settles.
pub async fn store(
    router: &Arc<Router>,
    limits: &BlobLimits,
    props: BlobProperties,
    body: StreamingBlob,
    checksum: Option<ChecksumHasher>,
    held_for: Option<&str>,
) -> Result<Stored, S3Error> {
    let chunk_size = limits.chunking.chunk_size.as_u64() as usize;
    let mut reader = Chunks::new(body, chunk_size, limits.max_object_size, checksum);
    let first = reader.next_chunk().await?;
    let more = reader.has_more().await?;
    let mut props = props;
    let journal = match held_for {
        Some(name) => hold(router, name, !more, &mut props).await?,
        None => None,
    };
    if !more {
        let size = first.len() as u64;
        let put = router.put_blob_kind(BlobKind::Simple, &props, first, journal.as_ref());
        let id = match put.await {
            Ok(id) => id,
            Err(err) => {
                // Its write may have reached some replicas: as if never named.
                Held::new(journal).unlinked(router, None);
                return Err(err.into());
            }
        };
        let md5 = match reader.etag.finish().await {
            Ok(md5) => hex(&md5),
            Err(lost) => {
                Held::new(journal).unlinked(router, Some(id));
                return Err(S3Error::Internal(lost.to_string()));
            }
        };
        return Ok(Stored {
            id,
            held: Held::new(journal),
            size,
            md5,
            checksum: reader.checksum,
        });
    }
    let mut upload = match held_for {
        Some(_) => router.start_held_upload(props, &limits.chunking, journal.clone()),
        None => router.start_upload(props, &limits.chunking)?,
    };
    upload.push(first).await?;
    loop {
        let chunk = reader.next_chunk().await?;
        if chunk.is_empty() {
            break;
        }
        upload.push(chunk).await?;
    }
    let md5 = reader.etag.finish().await;
    let md5 = hex(&md5.map_err(|lost| S3Error::Internal(lost.to_string()))?);
    // An upload dropped before this point (error, client gone) tombstones its chunks.
    let (id, size) = upload.finish().await?;
    Ok(Stored {
        id,
        held: Held::new(journal),
        size,
        md5,
        checksum: reader.checksum,
    })
}

/// A journal entry held for `name`, when the router keeps a journal. For a body of one blob
/// (`simple`), a reserved entry when the router has one ready: its ID is on disk already, so
/// nothing is written now, and the body carries the name instead (`held::HELD_META`), which
/// is how a crash's leftover finds what it was held for (`held::settle_leftovers`).
async fn hold(
    router: &Arc<Router>,
    name: &str,
    simple: bool,
    props: &mut BlobProperties,
) -> Result<Option<JournalEntry>, S3Error> {
    let begun = match simple {
        true => router.begin_simple_journal_entry()?,
        false => router.begin_journal_entry()?,
    };
    let Some(entry) = begun else {
        return Ok(None);
    };
    if entry.reserved().is_some() {
        props.user_meta.push(crate::held::held_meta(name));
        return Ok(Some(entry));
    }
    entry
        .hold(name)
        .await
        .map_err(|e| S3Error::Unavailable(format!("cannot write the upload journal: {e}")))?;
    Ok(Some(entry))
}

/// Cuts a body stream into chunks of `chunk_size` (the last may be shorter), hashing it.
struct Chunks {
    body: StreamingBlob,
    leftover: Bytes,
    chunk_size: usize,
    max: u64,
    total: u64,
    /// The body's MD5 (its ETag), in SIMD lanes once it is large (`etag_lanes.rs`).
    etag: EtagHasher,
    checksum: Option<ChecksumHasher>,
}

impl Chunks {
    fn new(
        body: StreamingBlob,
        chunk_size: usize,
        max: u64,
        checksum: Option<ChecksumHasher>,
    ) -> Chunks {
        Chunks {
            body,
            leftover: Bytes::new(),
            chunk_size,
            max,
            total: 0,
            etag: EtagHasher::default(),
            checksum,
        }
    }

    async fn next_data(&mut self) -> Result<Option<Bytes>, S3Error> {
        while let Some(piece) = self.body.next().await {
            let piece = piece.map_err(body_failure)?;
            if piece.is_empty() {
                continue;
            }
            self.total = self.total.saturating_add(piece.len() as u64);
            if self.total > self.max {
                return Err(S3Error::TooLarge(format!(
                    "objects are at most {} bytes",
                    self.max
                )));
            }
            self.etag.update(&piece).await;
            if let Some(checksum) = &mut self.checksum {
                checksum.update(&piece);
            }
            return Ok(Some(piece));
        }
        Ok(None)
    }

    async fn next_chunk(&mut self) -> Result<Bytes, S3Error> {
        // The pieces are kept and copied once into a chunk of their exact size: a buffer grown
        // piece by piece was copied again at every doubling (6 % of a frontend's CPU under
        // 4 MiB PUTs).
        let mut parts = Vec::new();
        let mut len = 0;
        let mut pending = std::mem::take(&mut self.leftover);
        loop {
            if pending.is_empty() {
                match self.next_data().await? {
                    Some(piece) => pending = piece,
                    None => break,
                }
            }
            let room = self.chunk_size - len;
            if len == 0 && pending.len() >= room {
                // A piece that covers the whole chunk is sliced, not copied.
                let chunk = pending.split_to(room);
                self.leftover = pending;
                return Ok(chunk);
            }
            if pending.len() >= room {
                parts.push(pending.split_to(room));
                self.leftover = pending;
                return Ok(concat(parts, self.chunk_size));
            }
            len += pending.len();
            parts.push(std::mem::take(&mut pending));
        }
        Ok(concat(parts, len))
    }

    async fn has_more(&mut self) -> Result<bool, S3Error> {
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

/// `parts` (of `len` bytes together) as one buffer: the part itself when there is one.
fn concat(mut parts: Vec<Bytes>, len: usize) -> Bytes {
    if parts.len() == 1 {
        return parts.pop().unwrap_or_default();
    }
    let mut buf = BytesMut::with_capacity(len);
    parts.iter().for_each(|part| buf.extend_from_slice(part));
    buf.freeze()
}

/// The error for a request body that failed as it streamed. s3s checks a signed payload's
/// SHA-256 as it goes and fails the body with an error type of its own that it does not
/// export, so its message is the only way to tell (tested end to end, `s3_edge.rs`).
fn body_failure(err: Box<dyn std::error::Error + Send + Sync>) -> S3Error {
    match err.to_string().as_str() {
        "UploadStreamError: Sha256Mismatch" => S3Error::Sha256Mismatch,
        message => S3Error::InvalidArgument(format!("body: {message}")),
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes `range` of blob `id` (of `size` bytes), as a stream. The first piece is awaited
/// here, so an unreadable blob is an error status rather than a cut-short body.
pub async fn open(
    router: &Arc<Router>,
    read_ahead: usize,
    id: &str,
    range: Range<u64>,
) -> Result<StreamingBlob, S3Error> {
    if range.is_empty() {
        return Ok(StreamingBlob::wrap(futures_util::stream::empty::<
            Result<Bytes, std::io::Error>,
        >()));
    }
    let id = parse_id(id)?;
    if id.kind == BlobKind::Composite {
        let composite = read_composite(router, &id).await?.ok_or_else(|| {
            S3Error::Unavailable(format!(
                "composite blob {id} is missing; the name may have just been replaced"
            ))
        })?;
        return match composite {
            Composite::Chunks(manifest) => Ok(open_chunks(router, read_ahead, &manifest, range)),
            Composite::Parts(parts) => open_parts(router, read_ahead, &parts, range).await,
        };
    }
    open_simple(router, &id, range).await
}

/// The bytes `range` of a version-1 composite, through the router's read-ahead.
fn open_chunks(
    router: &Arc<Router>,
    read_ahead: usize,
    manifest: &Manifest,
    range: Range<u64>,
) -> StreamingBlob {
    let chunks = router.read_chunks(manifest.slices(range), read_ahead);
    wrap(chunks.map(|c| c.map_err(std::io::Error::other)))
}

/// The bytes `range` (not empty) of a simple blob.
async fn open_simple(
    router: &Arc<Router>,
    id: &BlobId,
    range: Range<u64>,
) -> Result<StreamingBlob, S3Error> {
    let last = range.end - 1;
    let found = match router
        .get_blob(id, Method::GET, Some(ByteRange::FromTo(range.start, last)))
        .await?
    {
        GetAnswer::Found(found) => found,
        GetAnswer::Missing(missing) => {
            return Err(S3Error::Unavailable(format!(
                "the blob of this name is missing ({missing:?}); it may have just been replaced"
            )))
        }
    };
    // Continued from another replica if this one breaks off (`larder-router/src/resume.rs`).
    let data = router.blob_body(*id, found).await?.into_data_stream();
    Ok(wrap(data.map(|d| d.map_err(std::io::Error::other))))
}

/// The bytes `range` of an object made of `pieces` (in order), as one stream: each piece's part
/// of the range is opened when the one before it has been sent. A small simple blob is read
/// whole once and then served from `bodies` (`body_cache.rs`).
pub async fn open_pieces(
    router: &Arc<Router>,
    (bodies, read_ahead): (&Arc<BodyCache>, usize),
    pieces: &[Piece],
    range: Range<u64>,
) -> Result<StreamingBlob, S3Error> {
    let router = router.clone();
    let bodies = bodies.clone();
    open_plan(plan(pieces, range), move |slice| {
        let router = router.clone();
        let bodies = bodies.clone();
        async move {
            let Slice { blob, within, size } = slice;
            if bodies.keeps(size) && !within.is_empty() {
                open_kept(&router, (&bodies, read_ahead), (&blob, size), within).await
            } else {
                open(&router, read_ahead, &blob, within).await
            }
        }
    })
    .await
}

/// The bytes `range` (not empty) of a blob of `size` bytes that `bodies` keeps: from there, or
/// read whole, kept, then served. A composite is opened as usual.
async fn open_kept(
    router: &Arc<Router>,
    (bodies, read_ahead): (&BodyCache, usize),
    (blob, size): (&str, u64),
    range: Range<u64>,
) -> Result<StreamingBlob, S3Error> {
    let id = parse_id(blob)?;
    if id.kind != BlobKind::Simple {
        return open(router, read_ahead, blob, range).await;
    }
    let (body, read) = match bodies.get(&id) {
        Some(body) => (body, false),
        None => {
            let limit = usize::try_from(size)
                .unwrap_or(usize::MAX)
                .saturating_add(1);
            let missing = "the blob of this name is missing; it may have just been replaced";
            let body = fetch_whole(router, &id, limit)
                .await?
                .ok_or_else(|| S3Error::Unavailable(missing.into()))?;
            // Copied: the bytes as received may be a view of a much larger receive buffer,
            // which the cache's budget would not count.
            (Bytes::copy_from_slice(&body), true)
        }
    };
    if body.len() as u64 != size {
        return Err(S3Error::Corrupt(format!(
            "blob {id} holds {} bytes, its name says {size}",
            body.len()
        )));
    }
    if read {
        bodies.insert(id, body.clone());
    }
    // `keeps` bounds `size`, so these fit a usize.
    let within = body.slice(range.start as usize..range.end as usize);
    Ok(wrap(futures_util::stream::once(async move {
        Ok::<_, std::io::Error>(within)
    })))
}

/// The bytes `range` of the parts a version-2 record lists, as `open_pieces` but through
/// `open_part`: a part is never itself such a record (one level of nesting).
async fn open_parts(
    router: &Arc<Router>,
    read_ahead: usize,
    parts: &PartsManifest,
    range: Range<u64>,
) -> Result<StreamingBlob, S3Error> {
    let plan: Vec<Slice> = parts
        .slices(range)
        .into_iter()
        .map(|(part, within)| Slice {
            blob: part.id.to_string(),
            within,
            size: part.size,
        })
        .collect();
    let router = router.clone();
    open_plan(plan, move |slice| {
        let router = router.clone();
        async move { open_part(&router, read_ahead, &slice.blob, slice.within).await }
    })
    .await
}

/// The bytes `within` a blob of `size` bytes that a read takes.
#[derive(Default)]
struct Slice {
    blob: String,
    within: Range<u64>,
    size: u64,
}

/// Which bytes of which piece a read of `range` takes, in order.
fn plan(pieces: &[Piece], range: Range<u64>) -> Vec<Slice> {
    let mut plan = Vec::new();
    let mut start = 0u64;
    for piece in pieces {
        let end = start.saturating_add(piece.size);
        let (from, to) = (range.start.max(start), range.end.min(end));
        if from < to {
            plan.push(Slice {
                blob: piece.blob.clone(),
                within: from - start..to - start,
                size: piece.size,
            });
        }
        start = end;
    }
    plan
}

/// One stream of the pieces of `plan`, each opened (by `open`) when the one before it has
/// been sent. A plan of one piece (or none) is opened here, so that an unreadable body is an
/// error status rather than a cut-short answer.
async fn open_plan<F, Fut>(mut plan: Vec<Slice>, open: F) -> Result<StreamingBlob, S3Error>
where
    F: Fn(Slice) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<StreamingBlob, S3Error>> + Send + 'static,
{
    if plan.len() <= 1 {
        return open(plan.pop().unwrap_or_default()).await;
    }
    let streams = futures_util::stream::iter(plan).then(open);
    let data = streams
        .map(|opened| opened.map_err(s3s::StdError::from))
        .try_flatten()
        .map_err(std::io::Error::other);
    Ok(wrap(data))
}

/// s3s wants a `Sync` stream; ours are `Send` only, and are polled by one task at a time.
fn wrap<S>(stream: S) -> StreamingBlob
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    let stream = sync_wrapper::SyncStream::new(stream);
    StreamingBlob::wrap(stream)
}

/// A part a version-2 record lists: a simple blob or a version-1 composite, never another
/// version-2 record (a record that says so is corrupt: nesting stops at one level).
async fn open_part(
    router: &Arc<Router>,
    read_ahead: usize,
    id: &str,
    range: Range<u64>,
) -> Result<StreamingBlob, S3Error> {
    let id = parse_id(id)?;
    if id.kind != BlobKind::Composite {
        return open_simple(router, &id, range).await;
    }
    match read_composite(router, &id).await? {
        Some(Composite::Chunks(manifest)) => Ok(open_chunks(router, read_ahead, &manifest, range)),
        Some(Composite::Parts(_)) => Err(nested(&id)),
        None => Err(S3Error::Unavailable(format!(
            "part {id} of a multipart object is missing"
        ))),
    }
}

fn nested(id: &BlobId) -> S3Error {
    S3Error::Corrupt(format!("part {id} is itself a list of parts"))
}

pub(crate) fn parse_id(id: &str) -> Result<BlobId, S3Error> {
    id.parse()
        .map_err(|e| S3Error::Corrupt(format!("blob id {id}: {e}")))
}

/// A composite blob's record, either form; `None` when the blob is missing (deleted, or never
/// stored).
async fn read_composite(router: &Arc<Router>, id: &BlobId) -> Result<Option<Composite>, S3Error> {
    let Some(bytes) = fetch_whole(router, id, MAX_MANIFEST).await? else {
        return Ok(None);
    };
    Composite::decode(&bytes)
        .map(Some)
        .map_err(|e| S3Error::Corrupt(format!("composite blob {id}: {e}")))
}

/// All of blob `id`, if it is no longer than `limit` bytes (else an error); `None` when the
/// blob is missing (deleted, or never stored).
pub(crate) async fn fetch_whole(
    router: &Arc<Router>,
    id: &BlobId,
    limit: usize,
) -> Result<Option<Bytes>, S3Error> {
    let found = match router.get_blob(id, Method::GET, None).await? {
        GetAnswer::Found(found) => found,
        GetAnswer::Missing(_) => return Ok(None),
    };
    let bytes = Limited::new(found.body, limit)
        .collect()
        .await
        .map_err(|e| S3Error::Unavailable(format!("reading blob {id}: {e}")))?
        .to_bytes();
    Ok(Some(bytes))
}

/// What a body's one piece is, as far as parts go.
enum PartsRecord {
    /// Not a version-2 record: a single PUT's body, or an entry of an older build that lists
    /// its parts itself.
    NotOne,
    /// A composite the name points at that storage no longer has: its parts are unknown.
    Missing(BlobId),
    Found(PartsManifest),
}

async fn parts_record(router: &Arc<Router>, pieces: &[Piece]) -> Result<PartsRecord, S3Error> {
    let [piece] = pieces else {
        return Ok(PartsRecord::NotOne);
    };
    let id = parse_id(&piece.blob)?;
    if id.kind != BlobKind::Composite {
        return Ok(PartsRecord::NotOne);
    }
    Ok(match read_composite(router, &id).await? {
        Some(Composite::Parts(parts)) => PartsRecord::Found(parts),
        Some(Composite::Chunks(_)) => PartsRecord::NotOne,
        None => PartsRecord::Missing(id),
    })
}

/// The parts of a multipart object whose entry names one version-2 record: that record's
/// parts; `None` for any other body (a single PUT's, or an entry that lists its parts itself,
/// as entries written before version 2 do). A record that is missing is an error (503): the
/// object's parts cannot be told.
pub async fn parts_of(
    router: &Arc<Router>,
    pieces: &[Piece],
) -> Result<Option<PartsManifest>, S3Error> {
    match parts_record(router, pieces).await? {
        PartsRecord::Found(parts) => Ok(Some(parts)),
        PartsRecord::NotOne => Ok(None),
        PartsRecord::Missing(id) => Err(S3Error::Unavailable(format!(
            "the parts record {id} of this object is missing"
        ))),
    }
}

/// Every blob an object's body is made of, as far as its name's owner decides: its pieces and,
/// for a version-2 record, the parts it lists (not their chunks, which go with them). What a
/// settlement checks a held blob against. `None` when the name points at a parts record that
/// storage no longer has: what it listed is unknown, so a settlement must keep what it holds
/// (and not wait for the record forever).
pub async fn body_blobs(
    router: &Arc<Router>,
    pieces: &[Piece],
) -> Result<Option<Vec<String>>, S3Error> {
    let mut blobs: Vec<String> = pieces.iter().map(|p| p.blob.clone()).collect();
    match parts_record(router, pieces).await? {
        PartsRecord::Found(parts) => blobs.extend(parts.parts.iter().map(|p| p.id.to_string())),
        PartsRecord::NotOne => {}
        PartsRecord::Missing(id) => {
            tracing::error!(%id, "a name points at a parts record storage does not have");
            return Ok(None);
        }
    }
    Ok(Some(blobs))
}

/// Stores the version-2 record listing `parts` (in order), its ID recorded in `journal` before
/// it is written (so that a settlement tombstones the record alone if no name points at it).
pub async fn store_parts(
    router: &Arc<Router>,
    (parts, checksums): (Vec<Part>, Option<PartChecksums>),
    journal: Option<&JournalEntry>,
) -> Result<BlobId, S3Error> {
    let manifest = PartsManifest::new(parts).ok_or_else(|| {
        S3Error::Internal("a multipart object's parts do not make a record".into())
    })?;
    let manifest = match checksums {
        None => manifest,
        Some(checksums) => manifest
            .with_checksums(checksums)
            .ok_or_else(|| S3Error::Internal("the parts' checksums do not make a record".into()))?,
    };
    let props = BlobProperties {
        created_ms: crate::service::now_ms(),
        ..Default::default()
    };
    let bytes = Bytes::from(manifest.encode());
    let put = router.put_blob_kind(BlobKind::Composite, &props, bytes, journal);
    Ok(put.await?)
}

/// Tombstones blob `id`: a version-1 composite's record first, then its chunks; a version-2
/// record's parts first (each as a blob of its own), then the record, so that a delete cut
/// short is done again in full by the next try, which still finds the record.
pub async fn delete(router: &Arc<Router>, id: &str) -> Result<(), S3Error> {
    let id = parse_id(id)?;
    if id.kind != BlobKind::Composite {
        return Ok(router.delete_blob(&id).await?);
    }
    match read_composite(router, &id).await? {
        Some(Composite::Parts(parts)) => {
            let ids: Vec<BlobId> = parts.parts.iter().map(|part| part.id).collect();
            let results: Vec<Result<(), S3Error>> = futures_util::stream::iter(ids)
                .map(|id| {
                    let router = router.clone();
                    async move { delete_part(&router, &id).await }
                })
                .buffer_unordered(PART_DELETES_AT_ONCE)
                .collect()
                .await;
            results.into_iter().collect::<Result<Vec<()>, S3Error>>()?;
            Ok(router.delete_blob(&id).await?)
        }
        Some(Composite::Chunks(manifest)) => delete_chunked(router, &id, manifest).await,
        // Already gone: its chunks went with it (or never were).
        None => Ok(router.delete_blob(&id).await?),
    }
}

/// Parts of a version-2 record tombstoned at once (10,000 one after another would hold up the
/// sweep of every bucket behind one object).
const PART_DELETES_AT_ONCE: usize = 16;

/// A part of a version-2 record: a simple blob, or a version-1 composite with its chunks.
async fn delete_part(router: &Arc<Router>, id: &BlobId) -> Result<(), S3Error> {
    if id.kind != BlobKind::Composite {
        return Ok(router.delete_blob(id).await?);
    }
    match read_composite(router, id).await? {
        Some(Composite::Chunks(manifest)) => delete_chunked(router, id, manifest).await,
        Some(Composite::Parts(_)) => Err(nested(id)),
        None => Ok(router.delete_blob(id).await?),
    }
}

async fn delete_chunked(
    router: &Arc<Router>,
    id: &BlobId,
    manifest: Manifest,
) -> Result<(), S3Error> {
    router.delete_blob(id).await?;
    if !manifest.chunks.is_empty() {
        router
            .delete_chunks(manifest.chunks, "S3 object replaced")
            .await;
    }
    Ok(())
}

/// Checks a stored body's MD5 (hex) against the request's `Content-MD5` (base64), if sent.
pub fn check_content_md5(sent: Option<&str>, md5_hex: &str) -> Result<(), S3Error> {
    use base64::Engine as _;
    let Some(sent) = sent else {
        return Ok(());
    };
    let digest = base64::engine::general_purpose::STANDARD
        .decode(sent.trim())
        .ok()
        .filter(|d| d.len() == 16)
        .ok_or(S3Error::InvalidDigest)?;
    match hex(&digest) == md5_hex {
        true => Ok(()),
        false => Err(S3Error::BadDigest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use md5::{Digest, Md5};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// A body in pieces of any size comes out as whole chunks (the last shorter) with the
        /// same bytes, and its MD5 (inline or in lanes) is the body's.
        #[test]
        fn a_body_is_cut_into_whole_chunks_and_hashed(
            sizes in prop::collection::vec(0usize..50_000, 0..40),
            chunk_size in 1usize..100_000,
        ) {
            let body: Vec<u8> = (0..sizes.iter().sum::<usize>()).map(|i| (i % 253) as u8).collect();
            let mut at = 0;
            let pieces: Vec<Result<Bytes, std::io::Error>> = sizes.iter().map(|&n| {
                at += n;
                Ok(Bytes::copy_from_slice(&body[at - n..at]))
            }).collect();
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let (chunks, md5) = runtime.block_on(async {
                let stream = StreamingBlob::wrap(futures_util::stream::iter(pieces));
                let mut reader = Chunks::new(stream, chunk_size, u64::MAX, None);
                let mut chunks = Vec::new();
                loop {
                    let chunk = reader.next_chunk().await.unwrap();
                    if chunk.is_empty() {
                        break;
                    }
                    chunks.push(chunk);
                }
                (chunks, reader.etag.finish().await.unwrap())
            });
            let last = chunks.len().saturating_sub(1);
            for (i, chunk) in chunks.iter().enumerate() {
                prop_assert!(chunk.len() == chunk_size || (i == last && chunk.len() < chunk_size));
            }
            prop_assert_eq!(chunks.concat(), body.clone());
            prop_assert_eq!(md5, <[u8; 16]>::from(Md5::digest(&body)));
        }
    }
}
