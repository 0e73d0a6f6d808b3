//! Bulk bootstrap of a replica newly placed on this node (`DESIGN.md` 6.1, "bootstrapping"):
//! one streamed export per partition from a live peer (`export.rs` serves it), handed to an
//! applier thread (`bootstrap_apply.rs`) that verifies every frame before its record is
//! appended, and appends records in bulk batches that each become durable in one commit round
//! (`Store::begin_bulk`) before the bootstrap cursor (a position in the source's feed) moves. A crash of either side resumes from that cursor. Then the ordinary change-feed pull
//! from every peer (`replication.rs`) brings the replica to the peers' positions taken when the
//! bulk copy ended: from then on it is "caught up" (`GET .../replica`), which is what the map
//! authority waits for before it makes the replica live.
//!
//! Files: `<data_dir>/bootstrap/p<P>.cursor` exists while the bulk copy of partition P is not
//! finished: `pending`, or `<source node> <cursor> <local incarnation> <bytes> <records>`
//! (temp file, synced, renamed, directory synced). It is written before the replica's store is
//! created and deleted (durably) once the source's replication cursor was saved at the end.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Request, StatusCode};
use http_body_util::BodyExt;
use larder_cluster::{ClusterMap, PartitionId, ReplicaState};
use larder_pool::StoragePool;
use larder_store::{Cursor, Store};
use tokio::sync::{watch, Semaphore};

use crate::config::RedistributionConfig;
use crate::error::Error;
use crate::StorageNode;

/// Why one attempt of a bulk copy stopped (logged; retried from the saved cursor).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CopyError {
    #[error("no live peer to copy from")]
    NoSource,
    #[error(transparent)]
    Pool(#[from] larder_pool::PoolError),
    #[error("{0} did not answer in time")]
    Timeout(String),
    #[error("export answered {0}")]
    Status(StatusCode),
    #[error("export stream: {0}")]
    Stream(String),
    #[error(transparent)]
    Frame(#[from] larder_proto::ExportError),
    #[error("the export ended without its end frame")]
    Truncated,
    #[error("appending: {0}")]
    Local(Error),
    #[error("saving the bootstrap cursor: {0}")]
    Save(#[from] std::io::Error),
    #[error("the replica is no longer placed here")]
    Gone,
    #[error("the applier thread: {0}")]
    Applier(String),
}

/// Where one partition's bootstrap is.
#[derive(Clone, Debug, Default)]
struct Progress {
    /// Still copying (or waiting for a slot): replication of this partition waits.
    copying: bool,
    bytes_done: u64,
    records_done: u64,
    /// The source's size when the copy (re)started, an estimate of the total.
    bytes_estimate: u64,
    started: Option<Instant>,
    /// Bytes copied by this process (for the rate).
    bytes_this_run: u64,
    /// Each live peer's position when the bulk copy ended; caught up once replication covers
    /// every one of them.
    targets: Option<Vec<(String, Cursor)>>,
}

/// The node's bootstraps: progress per partition, the concurrency slots and the shared rate.
pub struct Moves {
    pub(crate) config: RedistributionConfig,
    slots: Semaphore,
    progress: Mutex<HashMap<PartitionId, Progress>>,
    /// Replication's position in each peer's feed, per partition (for "caught up").
    positions: Mutex<HashMap<(PartitionId, String), Cursor>>,
    limiter: Mutex<RateLimiter>,
}

impl Moves {
    pub fn new(config: &RedistributionConfig) -> Moves {
        Moves {
            config: config.clone(),
            slots: Semaphore::new(config.concurrent_bootstraps.max(1)),
            progress: Mutex::default(),
            positions: Mutex::default(),
            limiter: Mutex::new(RateLimiter::new(
                config.rate_mb_per_s.saturating_mul(1_000_000),
            )),
        }
    }

    pub fn removal_grace(&self) -> Duration {
        self.config.removal_grace
    }

    fn progress(&self) -> std::sync::MutexGuard<'_, HashMap<PartitionId, Progress>> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the bulk copy of `partition` is still to finish: its replication waits, so the
    /// change feed does not fetch blob by blob what the export is streaming.
    pub fn copying(&self, partition: PartitionId) -> bool {
        self.progress().get(&partition).is_some_and(|p| p.copying)
    }

    /// Whether this process knows anything of `partition`'s bootstrap.
    pub fn known(&self, partition: PartitionId) -> bool {
        self.progress().contains_key(&partition)
    }

    /// Replication saved `cursor` as its position in `peer`'s feed of `partition`.
    pub fn note_position(&self, partition: PartitionId, peer: &str, cursor: Cursor) {
        let mut positions = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        positions.insert((partition, peer.to_owned()), cursor);
    }

    /// `saved`, the bootstrap cursor of `partition`, was saved, `bytes` more than the last time
    /// (`bootstrap_apply.rs`).
    pub(crate) fn note_durable(&self, partition: PartitionId, saved: &Saved, bytes: u64) {
        let mut progress = self.progress();
        let p = progress.entry(partition).or_default();
        p.bytes_done = saved.bytes;
        p.records_done = saved.records;
        p.bytes_this_run = p.bytes_this_run.saturating_add(bytes);
    }

    /// Forgets a partition no longer hosted here.
    pub fn forget(&self, partition: PartitionId) {
        self.progress().remove(&partition);
        let mut positions = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        positions.retain(|(p, _), _| *p != partition);
    }

    /// Caught up: the bulk copy is done and replication covers every live peer's position
    /// taken when it ended (`DESIGN.md` 6.1); writes since reach this replica directly.
    pub(crate) fn caught_up(&self, partition: PartitionId) -> bool {
        let progress = self.progress();
        let Some(targets) = progress.get(&partition).and_then(|p| p.targets.clone()) else {
            return false;
        };
        drop(progress);
        let positions = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        targets.iter().all(|(peer, target)| {
            positions.get(&(partition, peer.clone())).is_some_and(|at| {
                at.incarnation == target.incarnation && at.sequence >= target.sequence
            })
        })
    }

    /// `GET .../replica`: the replica's state and bootstrap progress.
    pub fn status(&self, partition: PartitionId, state: Option<ReplicaState>) -> serde_json::Value {
        let progress = self.progress().get(&partition).cloned().unwrap_or_default();
        let name = match state {
            Some(ReplicaState::Live) => "live",
            Some(ReplicaState::Leaving) => "leaving",
            _ if !progress.copying && self.caught_up(partition) => "caught_up",
            _ => "bootstrapping",
        };
        let left = match progress.copying {
            true => progress.bytes_estimate.saturating_sub(progress.bytes_done),
            false => 0,
        };
        serde_json::json!({
            "state": name,
            "copying": progress.copying,
            "bytes_done": progress.bytes_done,
            "bytes_left": left,
            "records_done": progress.records_done,
            "seconds_left": seconds_left(&progress, left),
        })
    }

    /// Estimated seconds left over every bootstrap copying now (for the metric).
    pub fn seconds_left_total(&self) -> f64 {
        self.progress()
            .values()
            .filter(|p| p.copying)
            .map(|p| seconds_left(p, p.bytes_estimate.saturating_sub(p.bytes_done)).unwrap_or(0.0))
            .sum()
    }
}

fn seconds_left(progress: &Progress, left: u64) -> Option<f64> {
    let elapsed = progress.started?.elapsed().as_secs_f64();
    let rate = progress.bytes_this_run as f64 / elapsed.max(0.001);
    (rate > 0.0).then(|| left as f64 / rate)
}

/// A byte-rate limit shared by the node's bootstraps (0: none).
struct RateLimiter {
    bytes_per_sec: u64,
    /// When the bytes granted so far may all have gone at the rate.
    free_at: Instant,
}

impl RateLimiter {
    fn new(bytes_per_sec: u64) -> RateLimiter {
        RateLimiter {
            bytes_per_sec,
            free_at: Instant::now(),
        }
    }

    /// How long the caller must wait before it spends `bytes`.
    fn take(&mut self, bytes: u64) -> Duration {
        if self.bytes_per_sec == 0 {
            return Duration::ZERO;
        }
        let now = Instant::now();
        let start = self.free_at.max(now);
        let cost = Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec as f64);
        self.free_at = start + cost;
        start.saturating_duration_since(now)
    }
}

fn cursor_file(data_dir: &Path, partition: PartitionId) -> PathBuf {
    data_dir
        .join("bootstrap")
        .join(format!("p{partition}.cursor"))
}

/// Marks `partition` for a bulk bootstrap, durably, before its replica's store is created.
pub fn mark_pending(data_dir: &Path, partition: PartitionId) -> std::io::Result<()> {
    write_durably(&cursor_file(data_dir, partition), "pending\n")
}

/// Removes the bootstrap cursor of a replica no longer hosted here.
pub fn forget_cursor(data_dir: &Path, partition: PartitionId) {
    let _ = std::fs::remove_file(cursor_file(data_dir, partition));
}

/// Whether `partition` has a bulk copy to finish.
pub fn pending(data_dir: &Path, partition: PartitionId) -> bool {
    cursor_file(data_dir, partition).exists()
}

pub(crate) fn write_durably(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().expect("cursor files live in a directory");
    larder_store::create_dir_all_durable(dir)?;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_data()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// The saved state of a bulk copy.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Saved {
    pub source: Option<String>,
    pub cursor: Cursor,
    pub bytes: u64,
    pub records: u64,
}

/// Reads the cursor file; a cursor saved for another incarnation of the local replica (it was
/// recreated) or unreadable text starts from the beginning.
fn load(path: &Path, local_incarnation: u64) -> Saved {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Saved::default();
    };
    let fields: Vec<&str> = text.split_whitespace().collect();
    match fields[..] {
        [source, cursor, local, bytes, records] if local == format!("{local_incarnation:016x}") => {
            Saved {
                source: Some(source.to_owned()),
                cursor: cursor.parse().unwrap_or(Cursor::START),
                bytes: bytes.parse().unwrap_or(0),
                records: records.parse().unwrap_or(0),
            }
        }
        _ => Saved::default(),
    }
}

pub(crate) fn save(path: &Path, saved: &Saved, local_incarnation: u64) -> std::io::Result<()> {
    let text = format!(
        "{} {} {local_incarnation:016x} {} {}\n",
        saved.source.as_deref().unwrap_or("-"),
        saved.cursor,
        saved.bytes,
        saved.records
    );
    write_durably(path, &text)
}

/// Marks a partition's bulk copy as running (called before replication starts, so that it
/// waits for it).
pub fn announce(node: &StorageNode, partition: PartitionId) {
    let mut progress = node.moves.progress();
    progress.entry(partition).or_default().copying = true;
}

/// Marks a bootstrapping partition whose bulk copy finished before this process started as
/// catching up: its targets are taken again now.
pub fn announce_catching_up(node: &StorageNode, partition: PartitionId) {
    node.moves.progress().entry(partition).or_default();
}

/// What a bootstrap task needs besides the node.
#[derive(Clone)]
pub struct Context {
    pub pool: StoragePool,
    pub request_timeout: Duration,
    pub stop: watch::Receiver<bool>,
}

/// Copies `partition` if its bulk copy is pending, then takes the peers' positions for "caught
/// up". Retries with backoff until done, the node stops or the replica leaves.
pub async fn run(node: Arc<StorageNode>, partition: PartitionId, ctx: Context) {
    let path = cursor_file(&node.data_dir, partition);
    if path.exists() {
        let Ok(_slot) = node.moves.slots.acquire().await else {
            return;
        };
        node.metrics.bootstraps_in_progress.inc();
        let copied = copy_until_done(&node, partition, &path, &ctx).await;
        node.metrics.bootstraps_in_progress.dec();
        if !copied {
            return;
        }
    }
    take_targets(&node, partition, &ctx).await;
    if node.rebuilds.copying(partition) {
        crate::rebuild::finish_when_caught_up(&node, partition, ctx.stop.clone()).await;
    }
}

async fn copy_until_done(
    node: &Arc<StorageNode>,
    partition: PartitionId,
    path: &Path,
    ctx: &Context,
) -> bool {
    let mut failures = 0u32;
    let mut stop = ctx.stop.clone();
    loop {
        if *stop.borrow() {
            return false;
        }
        match copy_once(node, partition, path, ctx, failures).await {
            Ok(()) => return true,
            Err(CopyError::Gone) => return false,
            Err(err) => {
                failures = failures.saturating_add(1);
                tracing::warn!(partition, %err, failures, "bootstrap: copy stopped; resuming from the saved cursor");
                let delay = Duration::from_millis(200u64 << failures.min(5));
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop.changed() => {}
                }
            }
        }
    }
}

/// The peer to copy from: the one the saved cursor is in (a resumed copy goes on where it
/// was), unless it failed repeatedly; otherwise the live peers in the map's order, turn by turn.
fn choose_source(
    map: &ClusterMap,
    node: &str,
    partition: PartitionId,
    saved: &Saved,
    failures: u32,
) -> Option<String> {
    let live: Vec<String> = crate::node::peers_of(map, partition, node)
        .into_iter()
        .filter(|(_, state)| *state == ReplicaState::Live)
        .map(|(peer, _)| peer)
        .collect();
    if let Some(source) = &saved.source {
        if failures < 8 && live.contains(source) {
            return Some(source.clone());
        }
    }
    let turn = usize::try_from(failures / 8).unwrap_or(0);
    live.get(turn % live.len().max(1)).cloned()
}

async fn copy_once(
    node: &Arc<StorageNode>,
    partition: PartitionId,
    path: &Path,
    ctx: &Context,
    failures: u32,
) -> Result<(), CopyError> {
    let store = node.store(partition).ok_or(CopyError::Gone)?;
    let local = store.incarnation();
    let mut saved = load(path, local);
    let map = node.map.borrow().clone();
    let source = choose_source(&map, &node.node_id, partition, &saved, failures)
        .ok_or(CopyError::NoSource)?;
    if saved.source.as_deref() != Some(source.as_str()) {
        // Another peer's feed: its positions are not ours to resume from.
        saved.cursor = Cursor::START;
        saved.source = Some(source.clone());
    }
    let path_and_query =
        larder_proto::export_path(partition, &saved.cursor.to_string(), &node.node_id);
    let request = Request::get(path_and_query)
        .body(larder_pool::empty())
        .expect("a path from larder-proto makes a valid request");
    let response = tokio::time::timeout(ctx.request_timeout, ctx.pool.send(&source, request))
        .await
        .map_err(|_| CopyError::Timeout(source.clone()))??;
    if response.status() != StatusCode::OK {
        return Err(CopyError::Status(response.status()));
    }
    let estimate =
        crate::validate::header_number(response.headers(), larder_proto::header::EXPORT_ESTIMATE)
            .ok()
            .flatten()
            .unwrap_or(0);
    {
        let mut progress = node.moves.progress();
        let p = progress.entry(partition).or_default();
        p.copying = true;
        p.bytes_done = saved.bytes;
        p.records_done = saved.records;
        p.bytes_estimate = estimate.max(saved.bytes);
        p.started.get_or_insert_with(Instant::now);
    }
    tracing::info!(partition, %source, after = %saved.cursor, "bootstrap: copying");
    let applier = crate::bootstrap_apply::Applier {
        node: node.clone(),
        partition,
        store: store.clone(),
        path: path.to_owned(),
        saved,
        unsaved_bytes: 0,
    };
    let (tx, done) = crate::bootstrap_apply::start(applier, QUEUED_CHUNKS)
        .map_err(|e| CopyError::Applier(e.to_string()))?;
    let pumped = pump(response.into_body(), tx, ctx, &source).await;
    // Always wait for the thread (it saves what is durable when the stream stops), so a retry
    // never runs two appliers of one partition.
    let applied = done
        .await
        .map_err(|_| CopyError::Applier("it ended without an answer".into()))?;
    pumped?;
    let saved = applied?;
    finish(node, partition, &store, &source, &saved, path)
}

/// Body chunks queued towards the applier thread (each at most the pool's frame size): with the
/// h2 stream window this bounds what one copy holds in memory.
const QUEUED_CHUNKS: usize = 8;

/// Forwards the export body to the applier thread until the body ends or the thread stops
/// taking it (it read the end frame, or failed: its answer says which).
async fn pump(
    mut body: hyper::body::Incoming,
    tx: tokio::sync::mpsc::Sender<bytes::Bytes>,
    ctx: &Context,
    source: &str,
) -> Result<(), CopyError> {
    loop {
        let frame = tokio::select! {
            frame = tokio::time::timeout(ctx.request_timeout, body.frame()) => frame,
            _ = tx.closed() => return Ok(()),
        };
        let frame = frame.map_err(|_| CopyError::Timeout(source.to_owned()))?;
        let Some(frame) = frame else {
            return Ok(()); // the thread tells whether the end frame came
        };
        let frame = frame.map_err(|e| CopyError::Stream(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if tx.send(data).await.is_err() {
            return Ok(());
        }
    }
}

/// Waits for the rate limit, then while the node is busy with foreground requests (as
/// compaction does), for at most nine times what the batch took to wait for the rate. Runs on
/// the applier thread (`bootstrap_apply.rs`), which keeps throttled batches small, so these
/// waits space the copy evenly rather than in bursts of a whole batch.
pub(crate) fn throttle_blocking(node: &StorageNode, bytes: u64) {
    let wait = {
        let mut limiter = node.moves.limiter.lock().unwrap_or_else(|e| e.into_inner());
        limiter.take(bytes)
    };
    if !wait.is_zero() {
        std::thread::sleep(wait);
    }
    if node.moves.config.rate_mb_per_s == 0 {
        return; // unthrottled: as fast as the disk goes
    }
    let foreground = &node.compaction.foreground;
    let deadline = Instant::now() + (wait * 9).max(Duration::from_millis(50));
    while foreground.is_busy() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The bulk copy is complete: the source's replication cursor becomes its end (the change
/// feed goes on from there), then the bootstrap file goes (durably).
fn finish(
    node: &StorageNode,
    partition: PartitionId,
    store: &Store,
    source: &str,
    saved: &Saved,
    path: &Path,
) -> Result<(), CopyError> {
    crate::replication::save_position(&node.data_dir, partition, source, saved.cursor, store)?;
    crate::replication::refresh_start_positions(&node.data_dir, partition, source, store);
    node.moves.note_position(partition, source, saved.cursor);
    std::fs::remove_file(path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    let mut progress = node.moves.progress();
    let p = progress.entry(partition).or_default();
    p.copying = false;
    tracing::info!(
        partition,
        source,
        records = saved.records,
        bytes = saved.bytes,
        "bootstrap: bulk copy done"
    );
    Ok(())
}

/// Takes every live peer's durable head now (the positions "caught up" must cover), retrying
/// peers that do not answer until all did or the node stops.
async fn take_targets(node: &Arc<StorageNode>, partition: PartitionId, ctx: &Context) {
    let mut stop = ctx.stop.clone();
    loop {
        let map = node.map.borrow().clone();
        let mut targets = Vec::new();
        let mut missing = false;
        for (peer, state) in crate::node::peers_of(&map, partition, &node.node_id) {
            if state != ReplicaState::Live {
                continue;
            }
            match head_of(&ctx.pool, &peer, partition, ctx.request_timeout).await {
                Some(head) => targets.push((peer, head)),
                None => missing = true,
            }
        }
        if !missing {
            node.moves.progress().entry(partition).or_default().targets = Some(targets);
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() || node.store(partition).is_none() {
            return;
        }
    }
}

/// A peer's durable head in its feed of `partition` (a one-change page names it). The request
/// does not name this replica: it reads, it does not move the peer's horizon.
async fn head_of(
    pool: &StoragePool,
    peer: &str,
    partition: PartitionId,
    limit: Duration,
) -> Option<Cursor> {
    let path = larder_proto::changes_path(partition, &Cursor::START.to_string(), 1);
    let request = Request::get(path).body(larder_pool::empty()).ok()?;
    let response = tokio::time::timeout(limit, pool.send(peer, request))
        .await
        .ok()?
        .ok()?;
    if response.status() != StatusCode::OK {
        return None;
    }
    let body = tokio::time::timeout(limit, response.into_body().collect())
        .await
        .ok()?
        .ok()?;
    let page: larder_proto::ChangePage = serde_json::from_slice(&body.to_bytes()).ok()?;
    page.head.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_file_belongs_to_the_local_incarnation() {
        let dir = tempfile::tempdir().unwrap();
        mark_pending(dir.path(), 3).unwrap();
        let path = cursor_file(dir.path(), 3);
        assert!(pending(dir.path(), 3));
        assert_eq!(load(&path, 7), Saved::default(), "pending: from the start");
        let saved = Saved {
            source: Some("s2".into()),
            cursor: Cursor {
                incarnation: 0xab,
                sequence: 99,
            },
            bytes: 1000,
            records: 10,
        };
        save(&path, &saved, 7).unwrap();
        assert_eq!(load(&path, 7), saved);
        assert_eq!(
            load(&path, 8),
            Saved::default(),
            "the replica was recreated"
        );
    }

    #[test]
    fn the_rate_limit_spaces_batches() {
        let mut limiter = RateLimiter::new(1_000_000);
        assert_eq!(limiter.take(500_000), Duration::ZERO);
        let wait = limiter.take(500_000);
        assert!(wait > Duration::from_millis(400), "{wait:?}");
        assert_eq!(RateLimiter::new(0).take(u64::MAX), Duration::ZERO);
    }
}
