//! "Rebuilt, never rejoined", done by the node itself (`ARCHITECTURE.md`, Replication): a
//! replica that learns it is behind tombstones a peer dropped (the peer answered its pull 409,
//! or it holds data with no recent position in a peer's feed, `replication::check_link`) is
//! replaced by a fresh copy from its peers, through the bootstrap path a new replica takes.
//!
//! From the moment it is known, the replica answers every data request 503
//! (`ReplicaRebuilding`): reads go to the other replicas, so it never answers "found" for a
//! blob whose tombstone it missed; writes are refused too, and the frontend reaches its quorum
//! on the others, which this replica copies from (nothing is lost: what they acknowledged is
//! in their feeds). Then, with replication stopped and no compaction pass running (`wipe`):
//!
//! 1. `<data_dir>/bootstrap/p<P>.rebuild` is written (synced, renamed, directory synced);
//! 2. the old store is closed and the disk's journal rotated, so no journal frame names its
//!    segments (`larder-store/FORMAT.md`, "Disk journal");
//! 3. its directory is deleted durably (renamed to `p<P>.deleting`, synced, removed: the disk
//!    space comes back before the copy starts), with its replication and bootstrap cursors;
//! 4. an empty store is created for the partition, marked for a bulk bootstrap (as a new
//!    replica is), and served to the bootstrap and replication only;
//! 5. once the bulk copy is done and replication has reached every live peer's head taken at
//!    its end ("caught up", `bootstrap.rs`), the marker is deleted (directory synced) and the
//!    replica serves again.
//!
//! A crash anywhere before step 5 leaves the marker: the next start deletes whatever the
//! partition's directory holds (the stale replica or a half-made copy) before serving
//! anything, and the rebuild starts over (`StorageNode::open`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use larder_cluster::{ClusterMap, PartitionId};
use tokio::sync::{watch, Notify};

use crate::StorageNode;

/// Where a partition's rebuild is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The old data is still there: `wipe` replaces it.
    Wipe,
    /// The empty store is bootstrapping from the peers.
    Copying,
}

/// One partition's rebuild.
#[derive(Clone, Copy, Debug)]
struct Rebuild {
    phase: Phase,
    /// When it was decided, in seconds since the Unix epoch (kept in the marker: a restart
    /// goes on with the same rebuild).
    since: u64,
}

/// A rebuild as `GET /internal/v1/health` and `larder cluster status` show it.
pub struct RebuildStatus {
    pub partition: PartitionId,
    /// `replacing` (the old data is still there) or `copying` (the fresh copy bootstraps).
    pub phase: &'static str,
    /// When the rebuild was decided (seconds since the Unix epoch).
    pub since: u64,
}

/// The node's rebuilds. A partition is in it from the moment it is known to be behind until
/// its fresh copy caught up.
#[derive(Default)]
pub struct Rebuilds {
    partitions: Mutex<HashMap<PartitionId, Rebuild>>,
    /// How many partitions are in `partitions`: the request path reads only this while none is.
    count: AtomicUsize,
    /// Wakes `membership::follow_map` to wipe a replica.
    pub(crate) wake: Notify,
}

impl Rebuilds {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PartitionId, Rebuild>> {
        // A poisoned lock only means a panic elsewhere; the phases stay meaningful.
        self.partitions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `partition` is being rebuilt: it serves no data request. One atomic load while
    /// nothing is.
    pub fn active(&self, partition: PartitionId) -> bool {
        self.count.load(Ordering::Acquire) > 0 && self.lock().contains_key(&partition)
    }

    /// Whether the replica of `partition` is a rebuild's fresh copy still bootstrapping.
    pub fn copying(&self, partition: PartitionId) -> bool {
        self.count.load(Ordering::Acquire) > 0
            && self
                .lock()
                .get(&partition)
                .is_some_and(|r| r.phase == Phase::Copying)
    }

    /// Partitions whose old data is still to be replaced.
    pub(crate) fn to_wipe(&self) -> Vec<PartitionId> {
        let partitions = self.lock();
        let mut wipe: Vec<PartitionId> = partitions
            .iter()
            .filter(|(_, rebuild)| rebuild.phase == Phase::Wipe)
            .map(|(p, _)| *p)
            .collect();
        wipe.sort_unstable();
        wipe
    }

    /// Starts a rebuild of `partition` (phase `Wipe`) now; `None` when one is already under
    /// way, else when it started.
    fn begin(&self, partition: PartitionId) -> Option<u64> {
        let mut partitions = self.lock();
        if partitions.contains_key(&partition) {
            return None;
        }
        let since = unix_now();
        let phase = Phase::Wipe;
        partitions.insert(partition, Rebuild { phase, since });
        self.count.fetch_add(1, Ordering::AcqRel);
        Some(since)
    }

    /// Notes `partition` in `phase` (a rebuild decided at `since` when it is not known yet);
    /// true when it was not being rebuilt before.
    fn set(&self, partition: PartitionId, phase: Phase, since: u64) -> bool {
        let mut partitions = self.lock();
        match partitions.get_mut(&partition) {
            Some(rebuild) => {
                rebuild.phase = phase;
                false
            }
            None => {
                partitions.insert(partition, Rebuild { phase, since });
                self.count.fetch_add(1, Ordering::AcqRel);
                true
            }
        }
    }

    /// When the rebuild of `partition` was decided, if one is under way.
    fn since(&self, partition: PartitionId) -> Option<u64> {
        self.lock().get(&partition).map(|r| r.since)
    }

    fn remove(&self, partition: PartitionId) -> bool {
        let mut partitions = self.lock();
        let removed = partitions.remove(&partition).is_some();
        if removed {
            self.count.fetch_sub(1, Ordering::AcqRel);
        }
        removed
    }

    /// The rebuilds under way, by partition.
    pub fn status(&self) -> Vec<RebuildStatus> {
        let partitions = self.lock();
        let mut status: Vec<RebuildStatus> = partitions
            .iter()
            .map(|(p, rebuild)| RebuildStatus {
                partition: *p,
                phase: match rebuild.phase {
                    Phase::Wipe => "replacing",
                    Phase::Copying => "copying",
                },
                since: rebuild.since,
            })
            .collect();
        status.sort_unstable_by_key(|s| s.partition);
        status
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn marker(data_dir: &Path, partition: PartitionId) -> PathBuf {
    data_dir
        .join("bootstrap")
        .join(format!("p{partition}.rebuild"))
}

/// The marker's text: the rebuild's start, so that a restart shows the same `since`.
fn marker_text(since: u64) -> String {
    format!("rebuild {since}\n")
}

/// When the rebuild in the marker was decided (now for a marker without it, or unreadable).
fn marked_since(data_dir: &Path, partition: PartitionId) -> u64 {
    let text = std::fs::read_to_string(marker(data_dir, partition)).unwrap_or_default();
    let mut fields = text.split_whitespace();
    match (fields.next(), fields.next().map(str::parse::<u64>)) {
        (Some("rebuild"), Some(Ok(since))) => since,
        _ => unix_now(),
    }
}

/// Whether a rebuild of `partition` was decided and has not finished (read at start).
pub(crate) fn marked(data_dir: &Path, partition: PartitionId) -> bool {
    marker(data_dir, partition).exists()
}

/// The local replica of `partition` is behind tombstones a peer dropped: from now on it serves
/// no data request, and `follow_map` replaces it (`wipe`). Idempotent.
pub(crate) fn request(node: &StorageNode, partition: PartitionId) {
    if node.store(partition).is_none() {
        return; // no longer hosted here
    }
    // Once per rebuild, however many peers refuse it (the workers of several peers call this).
    let Some(since) = node.rebuilds.begin(partition) else {
        return;
    };
    node.metrics.rebuilds.inc();
    node.metrics.replicas_rebuilding.inc();
    tracing::warn!(
        partition,
        "rebuilding this replica from its peers: it serves no request until it has caught up"
    );
    // Saved now where possible: a crash from here on rebuilds at the next start instead of
    // serving the stale replica until a peer refuses it again. (`wipe` saves it again, and
    // deletes nothing without it.)
    if let Err(err) =
        crate::bootstrap::write_durably(&marker(&node.data_dir, partition), &marker_text(since))
    {
        tracing::error!(partition, %err, "cannot save the rebuild marker; retrying before the wipe");
    }
    node.rebuilds.wake.notify_one();
}

/// At start, for a partition with a rebuild marker: nothing of its old directory is served.
/// Deletes it (a stale replica or a half-made copy) with its cursors, before the store is
/// opened (and created empty, marked for a bulk bootstrap, by `open_replica`).
pub(crate) fn restart(
    node: &StorageNode,
    partition: PartitionId,
    dir: &Path,
) -> std::io::Result<()> {
    tracing::warn!(partition, dir = %dir.display(),
        "a rebuild of this replica did not finish: starting it over");
    let since = marked_since(&node.data_dir, partition);
    clear(&node.data_dir, partition, dir)?;
    if node.rebuilds.set(partition, Phase::Copying, since) {
        node.metrics.replicas_rebuilding.inc();
    }
    Ok(())
}

/// Deletes the replica directory durably, then the cursors that belonged to it.
fn clear(data_dir: &Path, partition: PartitionId, dir: &Path) -> std::io::Result<()> {
    crate::membership::delete_replica_dir(dir)?;
    crate::replication::forget_partition(data_dir, partition);
    crate::bootstrap::forget_cursor(data_dir, partition);
    Ok(())
}

/// Replaces the replica of `partition` by an empty store marked for a bulk bootstrap. The
/// caller stopped replication and this partition's bootstrap; runs on a blocking thread.
pub(crate) fn wipe(
    node: &StorageNode,
    map: &ClusterMap,
    partition: PartitionId,
    disk_name: &str,
) -> Result<(), String> {
    let since = node.rebuilds.since(partition).unwrap_or_else(unix_now);
    let text = marker_text(since);
    let marked = crate::bootstrap::write_durably(&marker(&node.data_dir, partition), &text);
    marked.map_err(|e| format!("saving the rebuild marker: {e}"))?;
    // No compaction pass may hold the old store (it would write into its directory) while it
    // goes; the next pass sees the new one.
    let _no_pass = node.compaction.hold_passes();
    let dir = crate::node::replica_dir(&node.data_dir, disk_name, partition);
    if let Some(old) = node.store(partition) {
        if let Err(err) = old.close() {
            tracing::warn!(partition, %err, "closing the replica to rebuild");
        }
        // Requests still holding it read on; it accepts no write any more, so after this no
        // journal frame names its segments and a new store may take its path.
        let rotated = old.disk().rotate_journal();
        rotated.map_err(|e| format!("rotating the disk journal: {e}"))?;
    }
    clear(&node.data_dir, partition, &dir)
        .map_err(|e| format!("deleting {}: {e}", dir.display()))?;
    node.moves.forget(partition);
    node.horizons.reset(partition);
    let state = crate::node::replica_state(map, partition, &node.node_id);
    let store = node
        .open_replica(map, partition, disk_name, state, false)
        .map_err(|e| e.to_string())?;
    node.serve_replica(partition, store);
    node.rebuilds.set(partition, Phase::Copying, since);
    tracing::info!(
        partition,
        "rebuild: old replica deleted; copying from the peers"
    );
    Ok(())
}

/// After the bulk copy of a rebuilt replica: waits until it has caught up with its peers,
/// then deletes the marker and serves it again. Returns early when the node stops or the
/// replica leaves (the marker stays: the next start rebuilds).
pub(crate) async fn finish_when_caught_up(
    node: &Arc<StorageNode>,
    partition: PartitionId,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if *stop.borrow() || node.store(partition).is_none() || !node.rebuilds.copying(partition) {
            return;
        }
        if node.moves.caught_up(partition) {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.changed() => {}
        }
    }
    let path = marker(&node.data_dir, partition);
    let removed = crate::node::blocking(move || {
        std::fs::remove_file(&path)?;
        match path.parent() {
            Some(dir) => std::fs::File::open(dir)?.sync_all(),
            None => Ok(()),
        }
    })
    .await;
    if let Err(err) = removed {
        // Serving again without the marker gone would let a restart wipe a replica that is
        // complete, which is harmless: it is copied again.
        tracing::warn!(partition, %err, "deleting the rebuild marker");
    }
    if node.rebuilds.remove(partition) {
        node.metrics.replicas_rebuilding.dec();
    }
    tracing::info!(
        partition,
        "rebuild done: the replica caught up with its peers and serves again"
    );
}

/// The replica of `partition` is no longer placed here: its rebuild, if any, ends with it.
pub(crate) fn forget(node: &StorageNode, partition: PartitionId) {
    if node.rebuilds.remove(partition) {
        node.metrics.replicas_rebuilding.dec();
        let _ = std::fs::remove_file(marker(&node.data_dir, partition));
    }
}
