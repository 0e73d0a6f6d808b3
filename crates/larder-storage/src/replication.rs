//! Pull replication: for each local replica and each peer replica of the same partition, read the
//! peer's change feed after a saved cursor, fetch what is missing (tombstones included), append it
//! locally, then advance and save the cursor. Blobs are immutable and tombstones win, so applying
//! changes in any order converges; a page's changes are applied concurrently and the cursor moves
//! only once the whole page is durable here.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use http::{HeaderMap, Request, StatusCode};
use larder_cluster::{ClusterMap, PartitionId};
use larder_pool::StoragePool;
use larder_proto::{blob_path, changes_path, doc_header, header as h, ChangeEntry, ChangePage};
use larder_store::{BlobLookup, Cursor, Store};
use tokio::sync::watch;

use crate::body::Buffered;
use crate::config::ReplicationConfig;
use crate::error::Error;
use crate::horizon::Serve;
use crate::metrics::PeerLabels;
use crate::validate::{header_number, now_ms};
use crate::StorageNode;

/// Why a replication round stopped short (logged and counted, then retried with backoff).
#[derive(Debug, thiserror::Error)]
enum ReplicationError {
    #[error("{peer} did not answer within {limit:?}")]
    Timeout { peer: String, limit: Duration },
    #[error("round timed out")]
    RoundTimeout,
    #[error(transparent)]
    Pool(#[from] larder_pool::PoolError),
    #[error("{what} answered {status}")]
    Status { what: String, status: StatusCode },
    #[error("bad change page: {0}")]
    BadPage(#[from] serde_json::Error),
    #[error("peer sent a bad cursor {0:?}")]
    BadCursor(String),
    #[error("{key}: got {received} of {expected} bytes")]
    Short {
        key: String,
        received: u64,
        expected: u64,
    },
    #[error("saving cursor: {0}")]
    SaveCursor(std::io::Error),
    /// What the peer sent cannot be stored here (a time or version from the far future, bad
    /// properties): skipped and logged, never retried (it would never become right). A time or
    /// version less than `CLOCK_LAG_RETRIED_MS` ahead is not this: see `classify`.
    #[error("refused what the peer sent: {0}")]
    Refused(Error),
    /// Anything this node failed at itself (the store, the body budget): retried.
    #[error(transparent)]
    Local(Error),
}

type Result<T> = std::result::Result<T, ReplicationError>;

/// A time or version ahead of this node's clock (plus its `max_clock_skew`) by less than this
/// is most likely this node's clock lagging (an NTP step, a VM resumed), not a bad peer: it
/// becomes acceptable once the clock catches up, so the link retries it instead of skipping it.
/// Skipping would lose that change on this replica for good (the nemesis suite's clock skew
/// found replicas that never converged). Farther ahead, it is the peer's data that is wrong.
const CLOCK_LAG_RETRIED_MS: u64 = 24 * 3600 * 1000;

/// Whether an error of this node's own checks means "the peer's data is bad" (skip it) or "try
/// again later" (a full disk, a spent body budget, a broken connection, this node's clock
/// lagging).
fn classify(err: Error) -> ReplicationError {
    match err {
        Error::FromTheFuture { ahead_ms, .. } if ahead_ms < CLOCK_LAG_RETRIED_MS => {
            ReplicationError::Local(err)
        }
        Error::FromTheFuture { .. }
        | Error::BadProperties(_)
        | Error::BadHeader(_)
        | Error::BodyTooLarge { .. }
        | Error::Store(larder_store::Error::BadKey(_) | larder_store::Error::TooLarge { .. }) => {
            ReplicationError::Refused(err)
        }
        other => ReplicationError::Local(other),
    }
}

/// One (local replica, peer replica) pair and where we are in the peer's feed.
struct Link {
    partition: PartitionId,
    peer: String,
    store: Store,
    cursor: Cursor,
    cursor_file: PathBuf,
    /// When this process last wrote the cursor file (monotonic: a quarter of the retention
    /// later it is written again, whatever the wall clock does); `None`: not since it started.
    saved_at: Option<Instant>,
    /// Skipped while the partition's bulk bootstrap runs; the cursor file is read again after
    /// (the bootstrap saves the source's cursor at its end).
    paused: bool,
}

/// Starts one replication task per peer node; they stop when `stop` turns true.
pub async fn start(
    node: Arc<StorageNode>,
    map: Arc<ClusterMap>,
    pool: StoragePool,
    config: ReplicationConfig,
    dir: PathBuf,
    stop: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    if !config.enabled {
        return Vec::new();
    }
    // Cursor files are read, and some written with fsync: off the async workers.
    let planner = node.clone();
    let planned = tokio::task::spawn_blocking(move || {
        make_spares(&dir);
        links_by_peer(&planner, &map, &dir)
    })
    .await;
    let by_peer = match planned {
        Ok(by_peer) => by_peer,
        Err(err) => {
            tracing::error!(%err, "planning replication failed; replication is off");
            return Vec::new();
        }
    };
    by_peer
        .into_values()
        .map(|links| {
            let worker = Worker {
                node: node.clone(),
                pool: pool.clone(),
                config: config.clone(),
            };
            tokio::spawn(worker.run(links, stop.clone()))
        })
        .collect()
}

/// The replication links of every hosted partition, by peer node, each with its saved cursor.
/// Saves the start cursors of new peers and checks each link's position (`check_link`).
fn links_by_peer(
    node: &StorageNode,
    map: &ClusterMap,
    dir: &Path,
) -> std::collections::BTreeMap<String, Vec<Link>> {
    let mut by_peer: std::collections::BTreeMap<String, Vec<Link>> = Default::default();
    for (partition, store) in &node.partitions() {
        let Some(entry) = map.partition(*partition) else {
            continue;
        };
        for peer in entry.replicas.iter().filter(|r| {
            r.node != node.node_id && r.state == larder_cluster::ReplicaState::Bootstrapping
        }) {
            note_new_peer(
                &dir.join(format!("p{partition}-{}.cursor", peer.node)),
                store,
            );
        }
        let local_is_new = entry.replicas.iter().any(|r| {
            r.node == node.node_id && r.state == larder_cluster::ReplicaState::Bootstrapping
        });
        // A bootstrapping replica is no source for others (`DESIGN.md` 6.1).
        let sources = entry.replicas.iter().filter(|r| {
            r.node != node.node_id && r.state != larder_cluster::ReplicaState::Bootstrapping
        });
        for peer in sources {
            let cursor_file = dir.join(format!("p{partition}-{}.cursor", peer.node));
            let (cursor, saved) = load_cursor(&cursor_file, store.incarnation());
            let link = Link {
                partition: *partition,
                peer: peer.node.clone(),
                store: store.clone(),
                cursor,
                cursor_file,
                saved_at: None,
                paused: false,
            };
            if !local_is_new {
                check_link(node, &link, saved);
            }
            node.moves
                .note_position(link.partition, &link.peer, link.cursor);
            by_peer.entry(peer.node.clone()).or_default().push(link);
        }
    }
    by_peer
}

/// A peer replica still bootstrapping is new: it has dropped nothing of its feed (its tombstone
/// horizon waits for this replica's first pull), so this replica's position in that feed is
/// the start, saved now with the time. Without it, a replica holding data would meet the peer,
/// once live, with no position in its feed and count as behind it (`check_link`): it would
/// serve its new peer nothing, and writes the new replica missed would never reach it.
///
/// Saved again (with the time) at every start and map change while the peer bootstraps: we
/// have never pulled the new peer, so it knows no position of ours and drops nothing for us,
/// however long its copy takes. A time from before the copy began would make this replica,
/// restarted after the retention, take its own start position for one that went back.
fn note_new_peer(cursor_file: &Path, store: &Store) {
    refresh_start(cursor_file, store);
}

/// Saves the start cursor in `cursor_file` with the time now, unless the file holds a position
/// past the start: a fresh start position (a new peer's, or a new replica's own).
fn refresh_start(cursor_file: &Path, store: &Store) {
    let (cursor, saved) = load_cursor(cursor_file, store.incarnation());
    if saved.is_some() && cursor != Cursor::START {
        return;
    }
    if let Err(err) = save_cursor(cursor_file, Cursor::START, store.incarnation()) {
        tracing::warn!(file = %cursor_file.display(), %err, "saving a start cursor");
    }
}

/// Whether the local replica of `partition` is a fresh copy still bootstrapping: one this node
/// is rebuilding (it wiped the old data itself, `rebuild.rs`). Its pulls below a peer's dropped
/// tombstones are its first scan of that feed, not a position that went back
/// (`changes::note_peer`).
///
/// Not a replica merely bootstrapping in the map: one whose node was down while it was taken
/// off the partition and placed there again opens its old directory, which may hold puts whose
/// tombstones were dropped meanwhile. Such a replica, or a new one whose first page ends below
/// a peer's drops, is refused (409) and rebuilds itself, and the rebuild's copy is fresh.
fn is_fresh_copy(node: &StorageNode, partition: PartitionId) -> bool {
    node.rebuilds.copying(partition)
}

/// A new replica's bulk copy is done: its start positions in the feeds of the peers it did
/// not copy from are as fresh as the copy (it was new all along, and has never pulled them),
/// saved now with the time. Otherwise a copy longer than the tombstone retention, followed by
/// a restart before the first pulls, would look like a replica that was away (`check_link`).
pub(crate) fn refresh_start_positions(
    data_dir: &Path,
    partition: PartitionId,
    source: &str,
    store: &Store,
) {
    let dir = data_dir.join("replication");
    let prefix = format!("p{partition}-");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(peer) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|n| n.strip_suffix(".cursor"))
        else {
            continue;
        };
        if peer != source {
            refresh_start(&entry.path(), store);
        }
    }
}

/// A link whose position cannot be shown to a peer: the local replica holds data but has no
/// cursor for that peer (files lost, or a copy restored from before its first pull), or only
/// the start one, saved longer ago than the tombstone retention (it was away). It could be
/// behind tombstones the peer dropped without the peer being able to tell (a cursor from the
/// start looks like a new replica's), so it counts as behind that peer: it serves it nothing
/// until rebuilt. A new replica (no data yet) saves its start cursors now, with the time.
fn check_link(node: &StorageNode, link: &Link, saved: Option<Saved>) {
    let has_data = link.store.stats().durable_cursor.sequence > 0;
    let at_start = link.cursor.sequence == 0;
    let retention = node.horizons.retention_ms();
    // Saved by this process: the node has been running since, so it was not away.
    let away = saved.is_none_or(|s| !s.here && s.ms.saturating_add(retention) < now_ms());
    if has_data && at_start && away {
        // Not rebuilt for this alone: it is only a suspicion (a peer whose cursor files were
        // lost looks the same), and every replica of a partition could hold it at once. The
        // rebuild waits for a peer's 409, which proves this replica's position went back.
        tracing::error!(partition = link.partition, peer = %link.peer,
            "this replica holds data but no recent position in the peer's feed: it may be \
             behind tombstones the peer dropped; it serves that peer nothing until a peer \
             refuses its pull (then it rebuilds itself) or it is rebuilt by hand");
        node.horizons.answered(link.partition, &link.peer, true);
    } else if saved.is_none() || at_start {
        // A start position this process vouches for is saved again with the time now (see
        // `Worker::keep_start_fresh`).
        let saved = save_cursor(&link.cursor_file, link.cursor, link.store.incarnation());
        if let Err(err) = saved {
            tracing::warn!(partition = link.partition, peer = %link.peer, %err, "saving a new cursor");
        }
    }
}

/// The saved position in a peer's feed and when it was saved, or the start when there is none,
/// it is of the old physical form, or it was saved for another incarnation of the local replica
/// (the replica was rebuilt: what it had pulled is gone, so everything must be pulled again).
/// The peer's own incarnation is inside the cursor: the peer restarts a cursor of another of its
/// incarnations. A file without a time (an older build) counts as saved now.
fn load_cursor(path: &Path, local_incarnation: u64) -> (Cursor, Option<Saved>) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return (Cursor::START, None);
    };
    let mut parts = text.split_whitespace();
    let fields = (parts.next(), parts.next(), parts.next(), parts.next());
    match (fields, parts.next()) {
        ((Some(cursor), Some(local), saved, by), None)
            if local == incarnation_text(local_incarnation) =>
        {
            let ms = saved.map_or(Some(now_ms()), |t| t.parse().ok());
            let here = by == Some(process_text().as_str());
            let saved = ms.map(|ms| Saved { ms, here });
            (cursor.parse().unwrap_or(Cursor::START), saved)
        }
        _ => (Cursor::START, None),
    }
}

/// When a cursor file was saved, and whether by this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Saved {
    /// Wall-clock ms since the epoch, as the saving process's clock read then.
    ms: u64,
    /// Saved by this process: it has been running since, so this replica was not away,
    /// whatever the wall clock did meanwhile.
    here: bool,
}

/// This process's mark in the cursor files it saves (random per process). "Saved by this
/// process" was once judged by comparing the saved time with the process's start time, both
/// from the wall clock: a clock stepped back while a file was re-saved made this process's own
/// fresh start position look older than the process, and older than the tombstone retention
/// once the clock came back; the replica then took itself for one that was away and answered
/// 503 `ReplicaUnchecked` for good (the nemesis with clock jumps and moves, seed 11).
fn process_text() -> &'static String {
    static MARK: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MARK.get_or_init(|| {
        use std::hash::BuildHasher;
        // RandomState is keyed from the OS's randomness, once per process.
        let mark = std::collections::hash_map::RandomState::new()
            .hash_one((std::process::id(), std::time::SystemTime::now()));
        format!("{mark:016x}")
    })
}

/// Saves the start position in each peer's feed for a replica created now (before anything is
/// written to it), so that the replica, once it holds data, is not taken for one that lost its
/// cursors (`check_link`).
pub(crate) fn save_start_cursors(
    data_dir: &Path,
    partition: PartitionId,
    peers: &[(String, larder_cluster::ReplicaState)],
    store: &Store,
) -> std::io::Result<()> {
    for (peer, _) in peers {
        save_position(data_dir, partition, peer, Cursor::START, store)?;
    }
    Ok(())
}

/// Saves `cursor` as this replica's position in `peer`'s feed (a bulk bootstrap's end).
pub(crate) fn save_position(
    data_dir: &Path,
    partition: PartitionId,
    peer: &str,
    cursor: Cursor,
    store: &Store,
) -> std::io::Result<()> {
    let dir = data_dir.join("replication");
    larder_store::create_dir_all_durable(&dir)?;
    let path = dir.join(format!("p{partition}-{peer}.cursor"));
    save_cursor(&path, cursor, store.incarnation())
}

/// Removes the cursor files of a replica no longer hosted here.
pub(crate) fn forget_partition(data_dir: &Path, partition: PartitionId) {
    let dir = data_dir.join("replication");
    let prefix = format!("p{partition}-");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn incarnation_text(incarnation: u64) -> String {
    format!("{incarnation:016x}")
}

/// Saves a cursor durably: a crash must never move it past changes that are not applied here.
/// (Moving it back is harmless: applying a change twice is a no-op.) The file holds the peer's
/// cursor, the local replica's incarnation, when it was saved and by which process:
/// `<cursor> <local incarnation> <ms since the epoch> <process mark>` (`process_text`).
fn save_cursor(path: &Path, cursor: Cursor, local_incarnation: u64) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let text = format!(
        "{cursor} {} {} {}\n",
        incarnation_text(local_incarnation),
        now_ms(),
        process_text()
    );
    let written = std::fs::File::create(&tmp).and_then(|mut file| {
        file.write_all(text.as_bytes())?;
        file.sync_data()
    });
    match written {
        Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => {
            let _ = std::fs::remove_file(&tmp);
            write_into_spare(&tmp, &text)?;
        }
        other => other?,
    }
    std::fs::rename(&tmp, path)?;
    // The rename must be durable too: a cursor that went back after a power loss would ask
    // the peer for a position before tombstones it may have dropped since (a 409: rebuild).
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Cursor files made ahead of need in the replication directory, each already holding
/// `SPARE_LEN` bytes on disk. A cursor saved while the disk is full goes into one of them,
/// overwritten in place (which needs no new space). Above all a new peer's start position
/// (`note_new_peer`): lost to a full disk and then a crash, it made this replica suspect
/// itself of being behind that peer for good, answering 503 `ReplicaUnchecked` until rebuilt
/// by hand (the nemesis, seed 1: a full disk during a replace-node, then a power loss).
const SPARES: usize = 32;
const SPARE_LEN: usize = 160;
const SPARE_EXTENSION: &str = "spare";

/// Tops the replication directory up to `SPARES` spare cursor files (at every start of
/// replication: process start and map change). A full disk leaves it short: best effort.
fn make_spares(dir: &Path) {
    use std::io::Write;
    if larder_store::create_dir_all_durable(dir).is_err() {
        return;
    }
    let have = std::fs::read_dir(dir).map_or(0, |entries| {
        let spare =
            |e: &std::fs::DirEntry| e.path().extension().is_some_and(|x| x == SPARE_EXTENSION);
        entries.flatten().filter(spare).count()
    });
    // Names only need to differ from each other and from spares left by earlier starts.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    for n in have..SPARES {
        let path = dir.join(format!("{stamp}-{n}.{SPARE_EXTENSION}"));
        let made = std::fs::File::create(&path).and_then(|mut file| {
            file.write_all(&[b' '; SPARE_LEN])?;
            file.sync_data()
        });
        if made.is_err() {
            let _ = std::fs::remove_file(&path);
            break;
        }
    }
    let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
}

/// Writes `text` (padded with spaces, which `load_cursor` skips) into a spare cursor file
/// renamed to `tmp`, in place.
fn write_into_spare(tmp: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let full = || std::io::Error::from_raw_os_error(libc::ENOSPC);
    let dir = tmp.parent().ok_or_else(full)?;
    let spare = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == SPARE_EXTENSION))
        .ok_or_else(full)?;
    let line = text.trim_end();
    if line.len() >= SPARE_LEN {
        return Err(full());
    }
    std::fs::rename(&spare, tmp)?;
    let mut padded = line.as_bytes().to_vec();
    padded.resize(SPARE_LEN - 1, b' ');
    padded.push(b'\n');
    let mut file = std::fs::OpenOptions::new().write(true).open(tmp)?;
    file.write_all(&padded)?;
    file.sync_data()
}

/// Links of one peer whose rounds run at once (`Worker::run`).
const LINKS_AT_ONCE: usize = 4;

/// [`save_cursor`] on a blocking thread: it syncs a file and its directory, which must not
/// stall the async workers that serve reads and writes.
async fn save_cursor_off_thread(
    path: &Path,
    cursor: Cursor,
    local_incarnation: u64,
) -> std::io::Result<()> {
    let path = path.to_owned();
    crate::node::blocking(move || save_cursor(&path, cursor, local_incarnation)).await
}

struct Worker {
    node: Arc<StorageNode>,
    pool: StoragePool,
    config: ReplicationConfig,
}

impl Worker {
    async fn run(self, mut links: Vec<Link>, mut stop: watch::Receiver<bool>) {
        let mut delay = self.config.interval;
        while !*stop.borrow() {
            // A few partitions at once: after a restart every replica answers reads 503
            // `ReplicaUnchecked` until its first pull of each peer is answered, and one
            // partition after the other (each pull behind the last one's cursor fsyncs) took
            // seconds on a loaded machine (CI's dev_cluster restart test read 503s).
            let rounds: Vec<_> = links.iter_mut().map(|l| self.link_round(l)).collect();
            let failures: Vec<bool> = stream::iter(rounds)
                .buffer_unordered(LINKS_AT_ONCE)
                .collect()
                .await;
            delay = if failures.contains(&true) {
                (delay * 2).min(self.config.backoff_max)
            } else {
                self.config.interval
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// One round of one link (skipped while its partition's bootstrap copies); whether it failed.
    async fn link_round(&self, link: &mut Link) -> bool {
        if self.node.moves.copying(link.partition) {
            link.paused = true;
            return false;
        }
        if link.paused {
            link.paused = false;
            let (cursor, saved) = load_cursor(&link.cursor_file, link.store.incarnation());
            link.cursor = cursor;
            link.saved_at = saved.filter(|s| s.here).map(|_| Instant::now());
            self.node
                .moves
                .note_position(link.partition, &link.peer, cursor);
        }
        // Before the round: a round against an unreachable peer lasts its timeouts.
        self.keep_start_fresh(link).await;
        let limit = self.config.request_timeout * self.config.max_pages_per_round as u32;
        let outcome = tokio::time::timeout(limit, self.round(link)).await;
        let Err(err) = outcome.unwrap_or(Err(ReplicationError::RoundTimeout)) else {
            return false;
        };
        tracing::debug!(partition = link.partition, peer = %link.peer, %err, "replication round failed");
        self.node
            .metrics
            .replication_errors
            .get_or_create(&labels(link))
            .inc();
        true
    }

    /// Up to `max_pages_per_round` pages of the peer's feed; stops early once caught up.
    async fn round(&self, link: &mut Link) -> Result<()> {
        for _ in 0..self.config.max_pages_per_round {
            let sent = std::time::Instant::now();
            let page = self.fetch_page(link).await?;
            self.record_lag(link, &page.changes);
            if page.changes.is_empty() {
                self.keep_fresh(link, &page.next).await?;
                self.node
                    .horizons
                    .reached_head(link.partition, &link.peer, sent);
                return Ok(());
            }
            // The page reached the peer's head when the request came (`INTERNAL_API.md`).
            let at_head = covers(&page.next, &page.head);
            let mut pending = Vec::with_capacity(page.changes.len());
            for change in &page.changes {
                pending.push(self.apply_or_skip(link, change));
            }
            let applied: Vec<Result<()>> = stream::iter(pending)
                .buffer_unordered(self.config.concurrency.max(1))
                .collect()
                .await;
            applied.into_iter().collect::<Result<Vec<()>>>()?;
            let count = page.changes.len() as u64;
            self.node
                .metrics
                .replicated_records
                .get_or_create(&labels(link))
                .inc_by(count);
            let next = page
                .next
                .parse()
                .map_err(|_| ReplicationError::BadCursor(page.next.clone()))?;
            let local = link.store.incarnation();
            save_cursor_off_thread(&link.cursor_file, next, local)
                .await
                .map_err(ReplicationError::SaveCursor)?;
            link.saved_at = Some(Instant::now());
            // Only once saved: the peer reads our next request's cursor as our position in its
            // feed (its tombstone horizon), which must never be ahead of what a restart of
            // ours would resume from.
            link.cursor = next;
            self.node
                .moves
                .note_position(link.partition, &link.peer, next);
            if at_head {
                // Applied and saved: every change the peer held when we asked is here.
                self.node
                    .horizons
                    .reached_head(link.partition, &link.peer, sent);
                return Ok(());
            }
        }
        Ok(())
    }

    /// Saves the cursor of a link with nothing new when it moved (into the peer's incarnation,
    /// or past records the feed left out) or its file is older than a quarter of the retention,
    /// so an idle link's file still shows that this replica was here (`check_link`).
    async fn keep_fresh(&self, link: &mut Link, next: &str) -> Result<()> {
        let next: Cursor = next
            .parse()
            .map_err(|_| ReplicationError::BadCursor(next.to_owned()))?;
        let stale = self.stale(link);
        let moved = next != link.cursor;
        if moved || stale {
            save_cursor_off_thread(&link.cursor_file, next, link.store.incarnation())
                .await
                .map_err(ReplicationError::SaveCursor)?;
            link.cursor = next;
            link.saved_at = Some(Instant::now());
        }
        self.node
            .moves
            .note_position(link.partition, &link.peer, link.cursor);
        Ok(())
    }

    /// Whether `link`'s file was last written by this process more than a quarter of the
    /// tombstone retention ago (or not at all).
    fn stale(&self, link: &Link) -> bool {
        let quarter = Duration::from_millis(self.node.horizons.retention_ms() / 4);
        link.saved_at.is_none_or(|at| at.elapsed() > quarter)
    }

    /// Re-saves a start cursor (with the time) a quarter of the retention after the last save,
    /// whatever the round's outcome. While it is at the start this replica has never given the
    /// peer a position, so the peer has dropped nothing for it; the time only tells a restart
    /// that a process was here holding it (`check_link`). Without this, a new peer that went
    /// live while its pulls kept failing (busy, restarting) left the start saved at this
    /// process's start, and a crash a retention later flagged this replica as away from it for
    /// good (the nemesis with moves found it: reads answered 503 ReplicaUnchecked forever).
    /// A link already suspected or refused is left alone: refreshing it would hide that.
    async fn keep_start_fresh(&self, link: &mut Link) {
        if link.cursor != Cursor::START
            || self.node.horizons.may_serve(link.partition, &link.peer) == Serve::Behind
        {
            return;
        }
        if !self.stale(link) {
            return;
        }
        let incarnation = link.store.incarnation();
        match save_cursor_off_thread(&link.cursor_file, Cursor::START, incarnation).await {
            Ok(()) => link.saved_at = Some(Instant::now()),
            Err(err) => tracing::warn!(partition = link.partition, peer = %link.peer, %err,
                "saving a start cursor"),
        }
    }

    /// Applies one change; one the checks here refuse is logged, counted and passed over, so
    /// that a bad record (which would never become acceptable) cannot hold the cursor forever.
    async fn apply_or_skip(&self, link: &Link, change: &ChangeEntry) -> Result<()> {
        match self.apply(link, change).await {
            Err(ReplicationError::Refused(err)) => {
                tracing::warn!(partition = link.partition, peer = %link.peer, key = %change.key,
                    op = %change.op, %err, "skipping a change this node refuses");
                self.node
                    .metrics
                    .replication_refused
                    .get_or_create(&labels(link))
                    .inc();
                Ok(())
            }
            other => other,
        }
    }

    fn record_lag(&self, link: &Link, changes: &[ChangeEntry]) {
        let labels = labels(link);
        let oldest = changes.iter().map(|c| c.time_ms).min();
        let lag_seconds = oldest.map_or(0.0, |t| now_ms().saturating_sub(t) as f64 / 1000.0);
        self.node
            .metrics
            .replication_lag_records
            .get_or_create(&labels)
            .set(changes.len() as i64);
        self.node
            .metrics
            .replication_lag_seconds
            .get_or_create(&labels)
            .set(lag_seconds);
    }

    /// One GET to a peer, bounded by `request_timeout` until its response headers.
    async fn get(&self, peer: &str, path: String) -> Result<http::Response<hyper::body::Incoming>> {
        let request = Request::get(path)
            .body(larder_pool::empty())
            .expect("a path from larder-proto makes a valid request");
        let limit = self.config.request_timeout;
        match tokio::time::timeout(limit, self.pool.send(peer, request)).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(ReplicationError::Timeout {
                peer: peer.to_owned(),
                limit,
            }),
        }
    }

    /// A response body read whole within this node's body budget and record size limit.
    async fn read(&self, body: hyper::body::Incoming) -> Result<Buffered> {
        self.node.intake.read(body).await.map_err(classify)
    }

    async fn fetch_page(&self, link: &Link) -> Result<ChangePage> {
        let path = changes_path(
            link.partition,
            &link.cursor.to_string(),
            self.config.page_size,
        );
        // Naming ourselves makes our cursor our position in the peer's feed (its horizon).
        let mut path = format!("{path}&replica={}", self.node.node_id);
        if is_fresh_copy(&self.node, link.partition) {
            path.push_str("&fresh=1");
        }
        let response = match self.get(&link.peer, path).await {
            Ok(response) => response,
            Err(err) => {
                // No answer: the peer cannot confirm a read either (`checked_for_reads`).
                self.node.horizons.unreachable(link.partition, &link.peer);
                return Err(err);
            }
        };
        let status = response.status();
        // A page (200) or "too early" (425: the peer has not pulled from us yet) means the peer
        // checked our cursor and found it is not behind its dropped tombstones (409): this
        // replica may serve that peer from now on (`Horizons::may_serve`).
        let refused = status == StatusCode::CONFLICT;
        if refused || status == StatusCode::OK || status == StatusCode::TOO_EARLY {
            self.node
                .horizons
                .answered(link.partition, &link.peer, refused);
        }
        if refused {
            tracing::error!(partition = link.partition, peer = %link.peer, cursor = %link.cursor,
                "the peer dropped tombstones this replica never saw: rebuilding this replica");
            crate::rebuild::request(&self.node, link.partition);
        }
        if status != StatusCode::OK {
            let what = "change feed".to_owned();
            return Err(ReplicationError::Status { what, status });
        }
        let body = self.node.intake.read(response.into_body()).await;
        let body = body.map_err(ReplicationError::Local)?;
        Ok(serde_json::from_slice(&body.concat())?)
    }

    async fn apply(&self, link: &Link, change: &ChangeEntry) -> Result<()> {
        let clock = &self.node.clock;
        clock
            .check_time(h::TIME_MS, change.time_ms)
            .map_err(classify)?;
        match change.op.as_str() {
            "put-blob" => self.copy_blob(link, change).await,
            "delete-blob" => delete_locally(&link.store, &change.key, change.time_ms).await,
            "put-doc" | "remove-doc" => {
                clock.check_version(change.version).map_err(classify)?;
                self.copy_doc(link, change).await
            }
            _ => Ok(()),
        }
    }

    /// Copies the peer's current version of a document unless this replica has it or a newer
    /// one; the store's last-writer-wins check makes the result independent of order.
    async fn copy_doc(&self, link: &Link, change: &ChangeEntry) -> Result<()> {
        if crate::documents::holds_version(&link.store, &change.key, change.version) {
            return Ok(());
        }
        let path = larder_proto::doc_path(link.partition, &change.key);
        let response = self.get(&link.peer, path).await?;
        self.apply_doc(link, &change.key, response).await
    }

    /// Applies a peer's answer to `GET .../docs/<key>` here with the peer's version and time,
    /// checked like a write from a frontend. The store keeps whichever version is newest, so
    /// repeats and reordering do no harm.
    async fn apply_doc(
        &self,
        link: &Link,
        key: &str,
        response: http::Response<hyper::body::Incoming>,
    ) -> Result<()> {
        let (parts, body) = response.into_parts();
        let (store, key) = (link.store.clone(), key.to_owned());
        let written = match parts.status {
            // Compacted away at the peer, or never there: nothing to copy.
            StatusCode::NOT_FOUND => return Ok(()),
            StatusCode::OK => {
                let (version, time_ms) = self.doc_headers(&parts.headers)?;
                let body = self.read(body).await?;
                let json = body.concat();
                crate::node::put_doc(&store, &key, version, time_ms, json).await
            }
            StatusCode::GONE => {
                let (version, time_ms) = self.doc_headers(&parts.headers)?;
                crate::node::remove_doc(&store, &key, version, time_ms).await
            }
            status => {
                let what = format!("fetching document {key}");
                return Err(ReplicationError::Status { what, status });
            }
        };
        written.map(|_| ()).map_err(|e| classify(e.into()))
    }

    /// A peer's document answer carries the version and time a frontend's write would.
    fn doc_headers(&self, headers: &HeaderMap) -> Result<(u64, u64)> {
        if !headers.contains_key(doc_header::VERSION) {
            let err = Error::BadHeader(format!("no {} from the peer", doc_header::VERSION));
            return Err(ReplicationError::Refused(err));
        }
        crate::documents::write_headers(&self.node.clock, headers).map_err(classify)
    }

    /// Fetches a blob the peer has and we lack; a tombstone there becomes one here.
    async fn copy_blob(&self, link: &Link, change: &ChangeEntry) -> Result<()> {
        let lookup = link.store.get_blob(change.key.as_bytes(), now_ms());
        match lookup.map_err(|e| classify(e.into()))? {
            BlobLookup::NotFound => {}
            _ => return Ok(()), // already here, or deleted here (tombstones win)
        }
        let path = format!(
            "{}?{}",
            blob_path(link.partition, &change.key),
            larder_proto::INCLUDE_EXPIRED_QUERY
        );
        let response = self.get(&link.peer, path).await?;
        let (parts, body) = response.into_parts();
        match parts.status {
            StatusCode::OK => {}
            StatusCode::GONE => {
                let time = header_number(&parts.headers, h::TIME_MS).map_err(classify)?;
                let time = time.unwrap_or(change.time_ms);
                let time = self.node.clock.check_time(h::TIME_MS, time);
                return delete_locally(&link.store, &change.key, time.map_err(classify)?).await;
            }
            // Gone from the peer's index (compacted away): nothing left to copy.
            StatusCode::NOT_FOUND => return Ok(()),
            status => {
                let what = format!("fetching {}", change.key);
                return Err(ReplicationError::Status { what, status });
            }
        }
        let mut meta = crate::blobs::checked_meta(&self.node.clock, &parts.headers);
        meta = meta.map(|meta| larder_store::BlobMeta {
            time_ms: change.time_ms,
            ..meta
        });
        let meta = meta.map_err(classify)?;
        let body = self.read(body).await?;
        if body.len() != change.size {
            return Err(ReplicationError::Short {
                key: change.key.clone(),
                received: body.len(),
                expected: change.size,
            });
        }
        let put = crate::node::put_blob(&link.store, &change.key, meta, &body.chunks).await;
        put.map(|_| ()).map_err(|e| classify(e.into()))
    }
}

/// Whether a page's `next` cursor is at or past its `head` (both of the peer's incarnation).
fn covers(next: &str, head: &str) -> bool {
    match (next.parse::<Cursor>(), head.parse::<Cursor>()) {
        (Ok(next), Ok(head)) => {
            next.incarnation == head.incarnation && next.sequence >= head.sequence
        }
        _ => false,
    }
}

async fn delete_locally(store: &Store, key: &str, time_ms: u64) -> Result<()> {
    let deleted = crate::node::delete_blob(store, key, time_ms).await;
    deleted.map(|_| ()).map_err(|e| classify(e.into()))
}

fn labels(link: &Link) -> PeerLabels {
    PeerLabels {
        partition: link.partition.to_string(),
        peer: link.peer.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_saved_on_a_full_disk_goes_into_a_spare_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        make_spares(dir.path());
        let spares = || {
            std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == SPARE_EXTENSION))
                .count()
        };
        assert_eq!(spares(), SPARES);
        let path = dir.path().join("p1-s2.cursor");
        let text = format!(
            "{} {} {} {}\n",
            Cursor::START,
            incarnation_text(7),
            now_ms(),
            process_text()
        );
        let tmp = path.with_extension("tmp");
        write_into_spare(&tmp, &text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        assert_eq!(spares(), SPARES - 1, "one spare used");
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            SPARE_LEN as u64,
            "in place"
        );
        let (loaded, saved) = load_cursor(&path, 7);
        assert_eq!(loaded, Cursor::START);
        assert!(
            saved.is_some_and(|s| s.here),
            "with its time, by this process"
        );
        make_spares(dir.path());
        assert_eq!(spares(), SPARES, "topped up at the next start");
    }

    #[test]
    fn saved_cursors_belong_to_the_local_incarnation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p1-s2.cursor");
        assert_eq!(load_cursor(&path, 7), (Cursor::START, None), "none saved");
        let cursor = Cursor {
            incarnation: 0xabc,
            sequence: 42,
        };
        let before = now_ms();
        save_cursor(&path, cursor, 7).unwrap();
        let (loaded, saved) = load_cursor(&path, 7);
        assert_eq!(loaded, cursor);
        let saved = saved.unwrap();
        assert!(saved.ms >= before, "saved with its time");
        assert!(saved.here, "by this process");
        // The local replica was rebuilt: pull everything again.
        assert_eq!(load_cursor(&path, 8).0, Cursor::START);
        // A cursor of the old physical format (`<segment>.<offset>`) restarts too.
        std::fs::write(&path, "3.1048576").unwrap();
        assert_eq!(load_cursor(&path, 7).0, Cursor::START);
        std::fs::write(&path, "garbage 0000000000000007").unwrap();
        assert_eq!(load_cursor(&path, 7).0, Cursor::START);
        // Written by a build that saved no time: counts as saved now.
        std::fs::write(&path, "0000000000000abc.42 0000000000000007\n").unwrap();
        let (loaded, saved) = load_cursor(&path, 7);
        assert_eq!(loaded, cursor);
        assert!(saved.unwrap().ms >= before);
        assert!(!saved.unwrap().here);
        // Saved by another process, at a time its clock read: not this process's, whatever the
        // time says (a clock stepped back or forward does not make it this process's).
        std::fs::write(
            &path,
            "0000000000000abc.42 0000000000000007 5 00000000deadbeef\n",
        )
        .unwrap();
        assert_eq!(load_cursor(&path, 7).1, Some(Saved { ms: 5, here: false }));
        let mine = format!(
            "0000000000000abc.42 0000000000000007 5 {}\n",
            process_text()
        );
        std::fs::write(&path, mine).unwrap();
        assert_eq!(load_cursor(&path, 7).1, Some(Saved { ms: 5, here: true }));
    }
}
