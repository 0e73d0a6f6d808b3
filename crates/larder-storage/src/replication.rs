//! Pull replication: for each local replica and each peer replica of the same partition, read the
//! peer's change feed after a saved cursor, fetch what is missing (tombstones included), append it
//! locally, then advance and save the cursor. Blobs are immutable and tombstones win, so applying
//! changes in any order converges; a page's changes are applied concurrently and the cursor moves
//! only once the whole page is durable here.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

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

mod cursors;

use cursors::{at_start, load_cursor, make_spares, save_cursor, CursorFile, Saved};

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
    /// Where the next pull starts: every change before it is applied here (durably).
    cursor: Cursor,
    /// The position last saved in `file`, where a restart resumes; at or behind `cursor`. The
    /// peer is told it as this replica's position in its feed (`saved=`), its tombstone
    /// horizon, which must never be ahead of what a restart here would resume from.
    saved: Cursor,
    /// When this link last saved (or loaded) `saved`: the start keeper's writes of the same
    /// file do not count, or a link whose saved position is a start would never be due.
    saved_at: std::time::Instant,
    /// The peer said (`x-larder-saved-taken`) it takes `saved` as this replica's position. One
    /// of an earlier release takes `after`: then the cursor is saved before every pull.
    peer_takes_saved: bool,
    /// Shared with the worker's keeper of start positions (`keep_starts_fresh`). While the
    /// partition's bulk bootstrap runs the link is skipped and the file is the bootstrap's; it
    /// is read again after (the bootstrap saves the source's cursor at its end).
    file: Arc<CursorFile>,
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
    let (by_peer, new_peers) = match planned {
        Ok(planned) => planned,
        Err(err) => {
            tracing::error!(%err, "planning replication failed; replication is off");
            return Vec::new();
        }
    };
    let mut tasks: Vec<_> = by_peer
        .into_values()
        .map(|links| {
            let worker = Worker {
                node: node.clone(),
                pool: pool.clone(),
                config: config.clone(),
            };
            tokio::spawn(worker.run(links, stop.clone()))
        })
        .collect();
    if !new_peers.is_empty() {
        // A retention of 0 (tests) must not make it spin: the floor `keep_starts_fresh` ticks at.
        let every = quarter_of_retention(&node).max(Duration::from_millis(10));
        tasks.push(tokio::spawn(keep_new_peers_fresh(new_peers, every, stop)));
    }
    tasks
}

/// The start position in the feed of a peer replica still bootstrapping (`note_new_peer`).
struct NewPeerFile {
    path: PathBuf,
    store: Store,
}

/// Saves the start positions in new peers' feeds again every quarter of the retention, as
/// `keep_starts_fresh` does for links: a new peer has no link (it is no source until its copy
/// is done), and saving them only at a start or a map change left them as old as the copy. A
/// copy longer than the retention, then a restart of this node with the map that made the
/// peer live, took this replica for one away from that peer: 503 `ReplicaUnchecked` for good
/// (the nemesis, seed 1: a replace-node, then a whole-cluster power loss). Ends with
/// replication (`restart_replication` waits for it before the next map's links read the files).
async fn keep_new_peers_fresh(
    files: Vec<NewPeerFile>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let files = Arc::new(files);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            return;
        }
        let files = files.clone();
        crate::node::blocking(move || {
            for file in files.iter() {
                refresh_start(&file.path, &file.store);
            }
        })
        .await;
    }
}

/// Links of every hosted partition by peer, and the start positions of new peers.
type Planned = (
    std::collections::BTreeMap<String, Vec<Link>>,
    Vec<NewPeerFile>,
);

/// The replication links of every hosted partition, by peer node, each with its saved cursor.
/// Saves the start cursors of new peers and checks each link's position (`check_link`).
fn links_by_peer(node: &StorageNode, map: &ClusterMap, dir: &Path) -> Planned {
    let mut by_peer: std::collections::BTreeMap<String, Vec<Link>> = Default::default();
    let mut new_peers = Vec::new();
    for (partition, store) in &node.partitions() {
        let Some(entry) = map.partition(*partition) else {
            continue;
        };
        for peer in entry.replicas.iter().filter(|r| {
            r.node != node.node_id && r.state == larder_cluster::ReplicaState::Bootstrapping
        }) {
            let path = dir.join(format!("p{partition}-{}.cursor", peer.node));
            note_new_peer(&path, store);
            new_peers.push(NewPeerFile {
                path,
                store: store.clone(),
            });
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
                saved: cursor,
                saved_at: std::time::Instant::now(),
                peer_takes_saved: false,
                file: CursorFile::new(cursor_file, cursor, node.moves.copying(*partition)),
            };
            if !local_is_new {
                check_link(node, &link, saved);
            }
            node.moves
                .note_position(link.partition, &link.peer, link.cursor);
            by_peer.entry(peer.node.clone()).or_default().push(link);
        }
    }
    (by_peer, new_peers)
}

/// A peer replica still bootstrapping is new: it has dropped nothing of its feed (its tombstone
/// horizon waits for this replica's first pull), so this replica's position in that feed is
/// the start, saved now with the time. Without it, a replica holding data would meet the peer,
/// once live, with no position in its feed and count as behind it (`check_link`): it would
/// serve its new peer nothing, and writes the new replica missed would never reach it.
///
/// Saved again (with the time) at every start and map change while the peer bootstraps, and
/// every quarter of the retention between them (`keep_new_peers_fresh`): we have never pulled
/// the new peer, so it knows no position of ours and drops nothing for us,
/// however long its copy takes. A time from before the copy began would make this replica,
/// restarted after the retention, take its own start position for one that went back.
fn note_new_peer(cursor_file: &Path, store: &Store) {
    refresh_start(cursor_file, store);
}

/// Saves the start cursor in `cursor_file` with the time now, unless the file holds a position
/// past the start: a fresh start position (a new peer's, or a new replica's own).
fn refresh_start(cursor_file: &Path, store: &Store) {
    let (cursor, saved) = load_cursor(cursor_file, store.incarnation());
    if saved.is_some() && !at_start(cursor) {
        return;
    }
    if let Err(err) = save_cursor(cursor_file, cursor, store.incarnation()) {
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
    let at_start = at_start(link.cursor);
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
        // `keep_starts_fresh`).
        let saved = link.file.save(link.cursor, link.store.incarnation());
        if let Err(err) = saved {
            tracing::warn!(partition = link.partition, peer = %link.peer, %err, "saving a new cursor");
        }
    }
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

/// How often a link's file is written again while nothing else writes it, so that it shows a
/// restart that this replica was here (`check_link`).
fn quarter_of_retention(node: &StorageNode) -> Duration {
    Duration::from_millis(node.horizons.retention_ms() / 4)
}

/// What the keeper of start positions needs of one link.
struct StartKeeping {
    partition: PartitionId,
    peer: String,
    store: Store,
    file: Arc<CursorFile>,
}

impl StartKeeping {
    fn of(link: &Link) -> Self {
        StartKeeping {
            partition: link.partition,
            peer: link.peer.clone(),
            store: link.store.clone(),
            file: link.file.clone(),
        }
    }
}

/// Re-saves each start cursor of one peer's links (with the time) a quarter of the retention
/// after its last save, on its own clock: not in the rounds, which a peer that is down or slow
/// holds for whole request timeouts (10 s each, and a worker waits for all its links' rounds).
/// While a link is at the start this replica has never given the peer a position, so the peer
/// has dropped nothing for it; the time only tells a restart that a process was here holding
/// it (`check_link`). Without this, a link whose pulls kept failing (a new peer busy or
/// restarting; a peer killed, whose requests time out) left the start saved long ago, and a
/// crash a retention later flagged this replica as away from it for good: reads answered 503
/// `ReplicaUnchecked` forever (the nemesis with moves; the whole-cluster power loss test, with
/// a peer killed a few seconds before). A link already suspected or refused is left alone:
/// refreshing it would hide that. A bootstrap's file is the bootstrap's: a link whose partition
/// is copying is paused (by the keeper, the round, or at its creation) until its round reads
/// the file the bootstrap saved.
async fn keep_starts_fresh(
    node: Arc<StorageNode>,
    links: Vec<StartKeeping>,
    mut stop: watch::Receiver<bool>,
) {
    let every = quarter_of_retention(&node);
    // Ticks twice per period: a file is written again at most 1.5 periods after its last save.
    let tick = (every / 2).max(Duration::from_millis(10));
    while !*stop.borrow() {
        for link in &links {
            if node.moves.copying(link.partition) {
                // The bootstrap's until the link reads it again (`link_round`).
                link.file.pause();
                continue;
            }
            if node.horizons.may_serve(link.partition, &link.peer) == Serve::Behind {
                continue;
            }
            let (file, incarnation) = (link.file.clone(), link.store.incarnation());
            let saved = crate::node::blocking(move || file.refresh_start(every, incarnation));
            if let Err(err) = saved.await {
                tracing::warn!(partition = link.partition, peer = %link.peer, %err,
                    "saving a start cursor");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Links of one peer whose rounds run at once (`Worker::run`).
const LINKS_AT_ONCE: usize = 4;

struct Worker {
    node: Arc<StorageNode>,
    pool: StoragePool,
    config: ReplicationConfig,
}

impl Worker {
    async fn run(self, mut links: Vec<Link>, mut stop: watch::Receiver<bool>) {
        let keeper = tokio::spawn(keep_starts_fresh(
            self.node.clone(),
            links.iter().map(StartKeeping::of).collect(),
            stop.clone(),
        ));
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
        // A clean stop saves where each link got to: a restart need not pull it again.
        for link in links.iter_mut() {
            if link.saved != link.cursor && !link.file.paused() {
                if let Err(err) = self.save(link).await {
                    tracing::warn!(partition = link.partition, peer = %link.peer, %err,
                        "cannot save the replication cursor at stop");
                }
            }
        }
        let _ = keeper.await;
    }

    /// One round of one link (skipped while its partition's bootstrap copies); whether it failed.
    async fn link_round(&self, link: &mut Link) -> bool {
        if self.node.moves.copying(link.partition) {
            link.file.pause();
            return false;
        }
        if link.file.paused() {
            let cursor = link.file.resume(link.store.incarnation());
            link.cursor = cursor;
            link.saved = cursor;
            link.saved_at = std::time::Instant::now();
            self.node
                .moves
                .note_position(link.partition, &link.peer, cursor);
        }
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
            // Applied (durably): the next pull starts after it. The peer's horizon and a
            // bootstrap's or rebuild's progress move only with the saved position, once a
            // save is due (`save`).
            link.cursor = next;
            self.save_if_due(link).await?;
            if at_head {
                // Applied: every change the peer held when we asked is here.
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
        let stale = link.file.stale(quarter_of_retention(&self.node));
        let moved = next != link.cursor;
        link.cursor = next;
        if moved || stale {
            self.save(link).await?;
        } else {
            self.save_if_due(link).await?;
        }
        self.node
            .moves
            .note_position(link.partition, &link.peer, link.saved);
        Ok(())
    }

    /// Saves the link's position if it moved since its last save and that save is at least
    /// `cursor_save_every` old. Saving after every page cost a node a tenth of its
    /// `fdatasync`s under load (64 links, a round each 200 ms). Between saves a restart
    /// resumes from the saved position and applies some changes again, which changes nothing
    /// (blobs are immutable, tombstones win, documents keep the newest version).
    async fn save_if_due(&self, link: &mut Link) -> Result<()> {
        let recent = link.saved_at.elapsed() < self.config.cursor_save_every;
        if link.saved == link.cursor || (recent && link.peer_takes_saved) {
            return Ok(());
        }
        self.save(link).await
    }

    async fn save(&self, link: &mut Link) -> Result<()> {
        link.file
            .save_off_thread(link.cursor, link.store.incarnation())
            .await
            .map_err(ReplicationError::SaveCursor)?;
        link.saved = link.cursor;
        link.saved_at = std::time::Instant::now();
        // Only a saved position counts for a bootstrap or a rebuild being caught up: one that
        // ends its rebuild (no more `fresh=1` pulls) on an unsaved position, then loses power,
        // would resume from below the peer's dropped tombstones and be refused (409).
        self.node
            .moves
            .note_position(link.partition, &link.peer, link.saved);
        Ok(())
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

    async fn fetch_page(&self, link: &mut Link) -> Result<ChangePage> {
        let path = changes_path(
            link.partition,
            &link.cursor.to_string(),
            self.config.page_size,
        );
        // Naming ourselves makes our saved cursor our position in the peer's feed (its horizon).
        let mut path = format!("{path}&replica={}&saved={}", self.node.node_id, link.saved);
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
        link.peer_takes_saved = response.headers().contains_key(h::SAVED_TAKEN);
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

    /// A new peer's start position is saved again while its copy runs, with the time, and
    /// never over a position a link saved; the keeper ends with replication.
    #[tokio::test]
    async fn the_start_in_a_new_peers_feed_is_kept_fresh_while_it_copies() {
        let root = tempfile::tempdir().unwrap();
        let disk_dir = root.path().join("disk0");
        let disk = larder_store::Disk::open(&disk_dir, Default::default()).unwrap();
        let store = Store::open_on(&disk, disk_dir.join("p1"), Default::default()).unwrap();
        store.delete_blob(b"k", 1).unwrap();
        let start = root.path().join("p1-s8.cursor");
        let position = root.path().join("p1-s9.cursor");
        let old = |cursor: Cursor| {
            let incarnation = cursors::incarnation_text(store.incarnation());
            format!("{cursor} {incarnation} 5 other\n")
        };
        std::fs::write(&start, old(Cursor::START)).unwrap();
        let pulled = Cursor {
            incarnation: 0xabc,
            sequence: 7,
        };
        std::fs::write(&position, old(pulled)).unwrap();
        let files = [&start, &position].map(|path| NewPeerFile {
            path: path.to_path_buf(),
            store: store.clone(),
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let keeper = tokio::spawn(keep_new_peers_fresh(
            files.into(),
            Duration::from_millis(10),
            stop_rx,
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), keeper)
            .await
            .expect("the keeper ends with replication")
            .unwrap();
        let (cursor, saved) = load_cursor(&start, store.incarnation());
        assert_eq!(cursor, Cursor::START);
        assert!(
            saved.is_some_and(|s| s.here && s.ms > 5),
            "saved again, now"
        );
        let (cursor, saved) = load_cursor(&position, store.incarnation());
        assert_eq!(cursor, pulled, "a position past the start is left alone");
        assert_eq!(saved.map(|s| s.ms), Some(5));
    }
}
