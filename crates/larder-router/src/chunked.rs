//! Large blobs: chunked uploads and read-ahead downloads, built on the router's per-blob
//! operations (`put_blob_kind`, `get_blob`, `delete_blob`).
//!
//! An upload larger than the chunk size is cut into chunks as it streams in; each chunk is stored
//! as its own blob (kind chunk, on a partition of its own) with a few in flight at once. When every
//! chunk is stored, a composite blob whose record is the `Manifest` is written, and its ID is what
//! the client gets. Until then nothing is visible; an upload that fails or is abandoned tombstones
//! the chunks it stored (see `UploadState`'s `Drop`), and one cut short by a crash is cleaned up
//! at the next start from the upload journal (see `journal`).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use bytesize::ByteSize;
use futures_util::Stream;
use http::Method;
use http_body_util::BodyExt;
use larder_cluster::{BlobId, BlobKind};
use larder_proto::{BlobProperties, ByteRange};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use crate::journal::JournalEntry;
use crate::manifest::{ChunkSlice, Manifest};
use crate::{GetAnswer, Router, RouterError};

/// How large blobs are cut and streamed (the `[chunking]` section of the frontend config).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChunkingConfig {
    /// Blobs larger than this are cut into chunks of this size, each stored as its own blob.
    /// 4 MiB (Ambry's choice) keeps a chunk within one flow-control window and well under the
    /// storage node's record limit (16 MiB), while a 64 GiB blob still needs only 16 Ki chunks.
    /// It is also the unit of memory: an upload or download holds a few chunks, never the blob.
    pub chunk_size: ByteSize,
    /// Chunks of one upload being written at once. More overlaps the quorum round trips of
    /// consecutive chunks; each costs one chunk of memory while it is in flight.
    pub uploads_in_flight: usize,
    /// Chunks a download fetches ahead of the one it is sending, so the next chunk is usually
    /// there when the client wants it; each costs one chunk of memory.
    pub read_ahead: usize,
}

impl Default for ChunkingConfig {
    fn default() -> Self {
        ChunkingConfig {
            chunk_size: ByteSize::mib(4),
            uploads_in_flight: 4,
            read_ahead: 2,
        }
    }
}

impl ChunkingConfig {
    /// Checks the settings against each other and against `max_blob_size`.
    pub fn validate(&self, max_blob_size: u64) -> Result<(), String> {
        let chunk = self.chunk_size.as_u64();
        if !(4096..=16 * 1024 * 1024 - 4096).contains(&chunk) {
            return Err("chunking.chunk_size must be between 4KiB and 16MiB-4KiB (the storage node's record limit)".into());
        }
        if self.uploads_in_flight == 0 || self.read_ahead == 0 {
            return Err(
                "chunking.uploads_in_flight and chunking.read_ahead must be at least 1".into(),
            );
        }
        let manifest = Manifest::encoded_len(max_blob_size.div_ceil(chunk) as usize) as u64;
        if manifest > 8 * 1024 * 1024 {
            return Err(format!(
                "max_blob_size / chunking.chunk_size makes manifests of {manifest} bytes; keep them under 8 MiB (raise the chunk size)"
            ));
        }
        Ok(())
    }
}

/// A chunked upload in progress. Feed it chunks in order with `push`, then `finish`. Dropping it
/// before `finish` succeeded abandons it: the chunks stored so far are tombstoned.
pub struct Upload {
    router: Arc<Router>,
    props: BlobProperties,
    chunk_size: u64,
    in_flight_limit: usize,
    state: Arc<UploadState>,
    /// The journal entry is the caller's to remove once the upload is finished.
    held: bool,
    in_flight: VecDeque<JoinHandle<Result<BlobId, RouterError>>>,
    chunks: Vec<BlobId>,
    size: u64,
}

/// What the chunk tasks of one upload share. When the last reference goes (the upload and every
/// chunk task are done) and the upload was not committed, its blobs are tombstoned: every ID in
/// its journal entry when there is one (chunks whose write failed half-way included), else the
/// chunks known to be stored.
struct UploadState {
    router: Arc<Router>,
    stored: Mutex<Vec<BlobId>>,
    journal: Option<JournalEntry>,
    committed: std::sync::atomic::AtomicBool,
}

impl Drop for UploadState {
    fn drop(&mut self) {
        if self.committed.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let orphans = match &self.journal {
            Some(journal) => journal.ids(),
            None => std::mem::take(&mut *self.stored.lock()),
        };
        let journal = self.journal.take();
        if orphans.is_empty() && journal.is_none() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                chunks = orphans.len(),
                "abandoned upload outside a runtime: left to the journal or behind"
            );
            return;
        };
        let router = self.router.clone();
        runtime.spawn(async move {
            let failed = router.delete_chunks(orphans, "abandoned upload").await;
            // Kept when some deletes failed, so the next start tries again.
            if let (0, Some(journal)) = (failed, journal) {
                if let Err(err) = journal.remove().await {
                    tracing::warn!(error = %err, "cannot remove an upload journal entry");
                }
            }
        });
    }
}

impl Router {
    /// Starts a chunked upload of a blob with `props`, cut at `chunk_size`; fails only when the
    /// upload journal cannot record it.
    pub fn start_upload(
        self: &Arc<Self>,
        props: BlobProperties,
        config: &ChunkingConfig,
    ) -> Result<Upload, RouterError> {
        let journal = self.begin_journal_entry()?;
        Ok(self.start_upload_in(props, config, journal, false))
    }

    /// A new entry in the upload journal (`None`: this router keeps none).
    pub fn begin_journal_entry(&self) -> Result<Option<JournalEntry>, RouterError> {
        match &self.journal {
            Some(journal) => Ok(Some(journal.begin().map_err(|e| {
                RouterError::Unavailable(format!("cannot start an upload journal entry: {e}"))
            })?)),
            None => Ok(None),
        }
    }

    /// A chunked upload recorded in `journal`, the caller's entry (`JournalEntry::hold`): a
    /// finished upload leaves the entry to the caller, who removes it once the blob is
    /// named (a failed one is cleaned up and its entry removed, as any upload's).
    pub fn start_held_upload(
        self: &Arc<Self>,
        props: BlobProperties,
        config: &ChunkingConfig,
        journal: Option<JournalEntry>,
    ) -> Upload {
        self.start_upload_in(props, config, journal, true)
    }

    fn start_upload_in(
        self: &Arc<Self>,
        props: BlobProperties,
        config: &ChunkingConfig,
        journal: Option<JournalEntry>,
        held: bool,
    ) -> Upload {
        Upload {
            router: self.clone(),
            props,
            chunk_size: config.chunk_size.as_u64(),
            in_flight_limit: config.uploads_in_flight.max(1),
            state: Arc::new(UploadState {
                router: self.clone(),
                stored: Mutex::new(Vec::new()),
                journal,
                committed: false.into(),
            }),
            held,
            in_flight: VecDeque::new(),
            chunks: Vec::new(),
            size: 0,
        }
    }

    /// The uploads a previous run of this frontend left unfinished (it crashed mid-upload), from
    /// the journal. Call before serving: entries made after that are this run's own uploads in
    /// progress, and must never be taken for leftovers.
    pub fn unfinished_uploads(&self) -> std::io::Result<Vec<crate::journal::Leftover>> {
        match &self.journal {
            Some(journal) => journal.leftovers(),
            None => Ok(Vec::new()),
        }
    }

    /// Tombstones the blobs of `uploads` (from `unfinished_uploads`, none held for a name or
    /// reserved: their holder settles those) and
    /// forgets each entry once storage nodes have taken every delete, retrying the rest every
    /// few seconds. Runs in the background from start-up.
    pub async fn clean_up_uploads(self: Arc<Self>, uploads: Vec<crate::journal::Leftover>) {
        let mut uploads: Vec<crate::journal::Leftover> = uploads
            .into_iter()
            .filter(|u| u.held_for.is_none() && !u.reserved)
            .collect();
        while !uploads.is_empty() {
            let mut unfinished = Vec::new();
            for upload in uploads {
                let ids = upload.ids.clone();
                tracing::info!(blobs = ids.len(), entry = %upload.name(), "cleaning up an upload cut short by a crash");
                if self.delete_chunks(ids, "upload cut short by a crash").await > 0 {
                    unfinished.push(upload);
                    continue;
                }
                if let Err(err) = upload.remove().await {
                    tracing::warn!(error = %err, "cannot remove an upload journal entry");
                }
            }
            uploads = unfinished;
            if !uploads.is_empty() {
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
        }
    }

    /// Tombstones `chunks` a few at a time (deleting a composite, or cleaning up after a failed
    /// upload); returns how many deletes failed. Failures are logged: an orphaned chunk wastes
    /// space but is never visible.
    pub async fn delete_chunks(self: &Arc<Self>, chunks: Vec<BlobId>, why: &'static str) -> usize {
        use futures_util::StreamExt;
        let total = chunks.len();
        let failed = futures_util::stream::iter(chunks)
            .map(|id| {
                let router = self.clone();
                async move { router.delete_blob(&id).await.err().map(|e| (id, e)) }
            })
            .buffer_unordered(16)
            .filter_map(|r| async move { r })
            .collect::<Vec<_>>()
            .await;
        for (id, err) in &failed {
            tracing::warn!(chunk = %id, error = %err, why, "could not tombstone a chunk");
        }
        tracing::debug!(total, failed = failed.len(), why, "chunks tombstoned");
        failed.len()
    }

    /// Reads `slices` of a composite blob in order, fetching up to `read_ahead` chunks ahead.
    pub fn read_chunks(
        self: &Arc<Self>,
        slices: Vec<ChunkSlice>,
        read_ahead: usize,
    ) -> ChunkStream {
        ChunkStream {
            router: self.clone(),
            remaining: slices.into(),
            pending: VecDeque::new(),
            read_ahead: read_ahead.max(1),
            started: false,
        }
    }

    /// Fetches one chunk slice whole, retrying a failed fetch (body errors included) twice; the
    /// router's own failover picks the replicas. Its share of the download budget is taken
    /// first: a download's `first` chunk waits at most `download_budget_wait` for it (then
    /// `DownloadBudgetSpent`), a later one as long as it takes (`download_budget.rs`).
    async fn fetch_chunk(
        self: Arc<Self>,
        slice: ChunkSlice,
        first: bool,
    ) -> Result<Bytes, RouterError> {
        let len = slice.within.end - slice.within.start;
        let share = match first {
            true => self.admit_download(len).await?,
            false => self.download_share(len).await,
        };
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.fetch_chunk_once(&slice).await {
                Ok(bytes) => return Ok(share.attach(bytes, len as usize)),
                Err(ChunkError::Final(err)) => return Err(err),
                Err(ChunkError::Retry(err)) if attempts >= 3 => return Err(err),
                Err(ChunkError::Retry(err)) => {
                    tracing::warn!(chunk = %slice.id, error = %err, "chunk read failed; retrying");
                }
            }
        }
    }

    async fn fetch_chunk_once(self: &Arc<Self>, slice: &ChunkSlice) -> Result<Bytes, ChunkError> {
        let whole = slice.within.start == 0 && slice.within.end == slice.chunk_len;
        let range = (!whole).then(|| ByteRange::FromTo(slice.within.start, slice.within.end - 1));
        let unavailable =
            |what: String| RouterError::Unavailable(format!("chunk {}: {what}", slice.id));
        let found = match self.get_blob(&slice.id, Method::GET, range).await {
            Ok(GetAnswer::Found(found)) => found,
            // A missing chunk of a live composite is damage, not a passing failure.
            Ok(GetAnswer::Missing(missing)) => {
                return Err(ChunkError::Final(unavailable(format!("{missing:?}"))))
            }
            Err(err @ (RouterError::Timeout(_) | RouterError::Rejected(_))) => {
                return Err(ChunkError::Final(err))
            }
            Err(err) => return Err(ChunkError::Retry(err)),
        };
        // A body that breaks off half-way (a replica went away) is worth another try.
        let bytes = found
            .body
            .collect()
            .await
            .map_err(|e| ChunkError::Retry(unavailable(format!("body: {e}"))))?
            .to_bytes();
        let expected = slice.within.end - slice.within.start;
        if bytes.len() as u64 != expected {
            let got = bytes.len();
            return Err(ChunkError::Retry(unavailable(format!(
                "sent {got} bytes instead of {expected}"
            ))));
        }
        Ok(bytes)
    }
}

/// Why a chunk read failed, and whether trying again may help.
enum ChunkError {
    Retry(RouterError),
    Final(RouterError),
}

impl Upload {
    /// Stores the next chunk (exactly the chunk size, except for the last one). Waits while the
    /// limit of chunks in flight is reached; reports the first failed chunk.
    pub async fn push(&mut self, data: Bytes) -> Result<(), RouterError> {
        debug_assert!(data.len() as u64 <= self.chunk_size);
        while self.in_flight.len() >= self.in_flight_limit {
            self.collect_oldest().await?;
        }
        self.size += data.len() as u64;
        let router = self.router.clone();
        let state = self.state.clone();
        let props = BlobProperties {
            content_type: None,
            user_meta: Vec::new(),
            created_ms: self.props.created_ms,
            // Chunks expire with their blob, so an expired composite leaves nothing behind.
            expires_ms: self.props.expires_ms,
        };
        // A task per chunk, so that a chunk's write finishes (and is recorded for cleanup) even
        // when the upload is dropped half-way; dropping a JoinHandle does not cancel the task.
        self.in_flight.push_back(tokio::spawn(async move {
            let journal = state.journal.as_ref();
            let id = router
                .put_blob_kind(BlobKind::Chunk, &props, data, journal)
                .await?;
            state.stored.lock().push(id);
            Ok(id)
        }));
        Ok(())
    }

    /// Bytes pushed so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    async fn collect_oldest(&mut self) -> Result<(), RouterError> {
        let handle = self.in_flight.pop_front().expect("caller checked");
        let id = handle
            .await
            .map_err(|e| RouterError::Unavailable(format!("chunk upload task failed: {e}")))??;
        self.chunks.push(id);
        Ok(())
    }

    /// Waits for every chunk, then writes the composite blob. Returns its ID and the blob's size.
    pub async fn finish(mut self) -> Result<(BlobId, u64), RouterError> {
        while !self.in_flight.is_empty() {
            self.collect_oldest().await?;
        }
        let manifest = Manifest {
            chunk_size: self.chunk_size,
            size: self.size,
            chunks: std::mem::take(&mut self.chunks),
        };
        let journal = self.state.journal.as_ref();
        let id = self
            .router
            .put_blob_kind(
                BlobKind::Composite,
                &self.props,
                manifest.encode().into(),
                journal,
            )
            .await?;
        // The entry goes before the answer: a crash after it must not clean up a blob the client
        // was told about. If it cannot go, the upload fails and is cleaned up (composite too).
        // A held entry stays, for its holder to settle.
        if let Some(journal) = journal.filter(|_| !self.held) {
            journal.remove().await.map_err(|e| {
                RouterError::Unavailable(format!("cannot close the upload's journal entry: {e}"))
            })?;
        }
        self.state
            .committed
            .store(true, std::sync::atomic::Ordering::Release);
        Ok((id, self.size))
    }
}

/// The bytes of a composite blob's range, chunk by chunk, with read-ahead. Chunk fetches run as
/// tasks (so the next chunks arrive while this one is being sent) and are aborted when the
/// stream is dropped (the client went away). At most `read_ahead` chunks are fetched ahead of
/// the consumer: a slow client slows the fetching instead of filling memory.
pub struct ChunkStream {
    router: Arc<Router>,
    remaining: VecDeque<ChunkSlice>,
    pending: VecDeque<JoinHandle<Result<Bytes, RouterError>>>,
    read_ahead: usize,
    /// Whether the first chunk's fetch has been started (it alone may be refused for want of
    /// download budget).
    started: bool,
}

impl ChunkStream {
    fn top_up(&mut self) {
        while self.pending.len() < self.read_ahead {
            let Some(slice) = self.remaining.pop_front() else {
                break;
            };
            let router = self.router.clone();
            let first = !std::mem::replace(&mut self.started, true);
            self.pending
                .push_back(tokio::spawn(router.fetch_chunk(slice, first)));
        }
    }
}

impl Stream for ChunkStream {
    type Item = Result<Bytes, RouterError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.top_up();
        let Some(front) = self.pending.front_mut() else {
            return Poll::Ready(None);
        };
        let result = std::task::ready!(Pin::new(front).poll(cx));
        self.pending.pop_front();
        self.top_up();
        let item = result
            .map_err(|e| RouterError::Unavailable(format!("chunk read task failed: {e}")))
            .and_then(|r| r);
        Poll::Ready(Some(item))
    }
}

impl Drop for ChunkStream {
    fn drop(&mut self) {
        for handle in &self.pending {
            handle.abort();
        }
    }
}
