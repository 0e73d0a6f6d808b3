//! Following the cluster map: which replicas this node serves, as the map changes without a
//! restart (`follow_map`). Every accepted new map arrives on the node's watch channel
//! (`StorageNode::map`); on each, and once at start:
//!
//! - a replica newly placed here gets its store created, is served at once (the router writes
//!   to bootstrapping replicas too) and starts its bulk bootstrap (`bootstrap.rs`);
//! - a replica no longer placed here stops being served at once; after
//!   `[redistribution] removal_grace` (requests that already hold it finish) its store is
//!   closed and its directory deleted durably: renamed to `p<P>.deleting` (directory synced:
//!   from then on no restart serves it), then removed. Leftovers, and replica directories of
//!   partitions the map does not place here, are deleted at start;
//! - replication restarts from its saved cursors with the new map's peers, and the tombstone
//!   horizons follow the new replica sets;
//! - a replica found behind its peers' dropped tombstones is replaced by an empty one that
//!   bootstraps from them (`rebuild.rs`; `Rebuilds::wake` runs a reconcile for it).
//!
//! A replica deleted in this process is created again (a node that was drained, or whose
//! replicas were rebuilt elsewhere, is given partitions back without a restart) only once its
//! disk's journal was rotated after the deletion (`Disk::rotate_journal`): until then the
//! journal may still hold frames of its old segments, which a crash's replay would write into
//! the new ones. The deletion task rotates it, then the map is reconciled again.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use larder_auth::Credentials;
use larder_cluster::{ClusterMap, PartitionId, ReplicaState};
use larder_pool::{PoolConfig, StoragePool};
use larder_store::Store;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::ReplicationConfig;
use crate::StorageNode;

/// What following the map needs besides the node.
pub struct FollowContext {
    pub replication: ReplicationConfig,
    pub pool: PoolConfig,
    pub credentials: Option<Arc<Credentials>>,
    /// The peer pool in use, shared with the server (its SIGHUP reload reaches it).
    pub peers: Arc<Mutex<StoragePool>>,
    pub stop: watch::Receiver<bool>,
}

#[derive(Default)]
struct Running {
    replication: Option<(watch::Sender<bool>, Vec<JoinHandle<()>>)>,
    bootstraps: HashMap<PartitionId, JoinHandle<()>>,
    /// Replicas no longer served, waiting for their grace period to end.
    leaving: Arc<Mutex<HashMap<PartitionId, Store>>>,
    /// Replica directories being deleted by this process: not created again until the deletion
    /// and the journal rotation after it are done (or, if they failed, before a restart).
    deleted: Arc<Mutex<HashSet<PathBuf>>>,
    /// Told when a deletion is done: a replica placed here again meanwhile is created then.
    deletion_done: Arc<tokio::sync::Notify>,
    deletions: Vec<JoinHandle<()>>,
    /// The node addresses the peer pool was made for.
    pool_nodes: Vec<(String, std::net::SocketAddr)>,
}

/// Reconciles the hosted replicas with the map at start and on every change of `rx`, until
/// `ctx.stop`; then stops replication and bootstraps and returns.
pub async fn follow_map(
    node: Arc<StorageNode>,
    mut rx: watch::Receiver<Arc<ClusterMap>>,
    ctx: FollowContext,
) {
    let mut running = Running::default();
    let mut stop = ctx.stop.clone();
    let first = rx.borrow_and_update().clone();
    delete_orphans(&node, &first);
    loop {
        let map = rx.borrow_and_update().clone();
        reconcile(&node, &map, &ctx, &mut running).await;
        let deletion_done = running.deletion_done.clone();
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { break },
            _ = node.rebuilds.wake.notified() => {}
            _ = stop.changed() => break,
            _ = deletion_done.notified() => {}
        }
        if *stop.borrow() {
            break;
        }
    }
    if let Some((stop_replication, handles)) = running.replication.take() {
        let _ = stop_replication.send(true);
        for handle in handles {
            let _ = handle.await;
        }
    }
    for (_, handle) in running.bootstraps.drain() {
        let _ = handle.await;
    }
    for handle in running.deletions.drain(..) {
        handle.abort();
    }
}

async fn reconcile(
    node: &Arc<StorageNode>,
    map: &Arc<ClusterMap>,
    ctx: &FollowContext,
    running: &mut Running,
) {
    node.horizons.update(map, &node.node_id);
    let wanted: HashMap<PartitionId, String> = map.replicas_on(&node.node_id).into_iter().collect();
    for (partition, _) in node.partitions() {
        if !wanted.contains_key(&partition) {
            retire(node, partition, running);
        }
    }
    for (partition, disk) in &wanted {
        if node.store(*partition).is_none() {
            add(node, map, *partition, disk, running).await;
        }
    }
    rebuild_replicas(node, map, &wanted, running).await;
    // Before replication starts: it must wait for the bulk copies.
    for (partition, _) in node.partitions() {
        if crate::bootstrap::pending(&node.data_dir, partition) {
            crate::bootstrap::announce(node, partition);
        }
    }
    restart_replication(node, map, ctx, running).await;
    start_bootstraps(node, ctx, running);
}

/// Replaces every replica found behind its peers' dropped tombstones by an empty one marked
/// for a bulk bootstrap (`rebuild::wipe`), with replication stopped (its links hold the old
/// store; `restart_replication` starts it again) and the partition's bootstrap task gone. A
/// wipe that fails is tried again a few seconds later.
async fn rebuild_replicas(
    node: &Arc<StorageNode>,
    map: &Arc<ClusterMap>,
    wanted: &HashMap<PartitionId, String>,
    running: &mut Running,
) {
    let partitions = node.rebuilds.to_wipe();
    if partitions.is_empty() {
        return;
    }
    if let Some((stop, handles)) = running.replication.take() {
        let _ = stop.send(true);
        for handle in handles {
            let _ = handle.await;
        }
    }
    for partition in partitions {
        let Some(disk) = wanted.get(&partition).cloned() else {
            continue; // retired meanwhile: its directory goes with it
        };
        if let Some(handle) = running.bootstraps.remove(&partition) {
            handle.abort();
            let _ = handle.await;
        }
        let (for_wipe, map) = (node.clone(), map.clone());
        let wiped =
            crate::node::blocking(move || crate::rebuild::wipe(&for_wipe, &map, partition, &disk))
                .await;
        if let Err(err) = wiped {
            tracing::error!(partition, %err, "rebuild: cannot replace the replica; retrying");
            let node = node.clone();
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                node.rebuilds.wake.notify_one();
            });
        }
    }
}

/// Serves a replica newly placed here (or one placed here again within its grace period).
async fn add(
    node: &Arc<StorageNode>,
    map: &Arc<ClusterMap>,
    partition: PartitionId,
    disk: &str,
    running: &Running,
) {
    let back = running
        .leaving
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&partition);
    if let Some(store) = back {
        tracing::info!(
            partition,
            "replica placed here again before its deletion; serving it"
        );
        node.serve_replica(partition, store);
        return;
    }
    let dir = crate::node::replica_dir(&node.data_dir, disk, partition);
    if running
        .deleted
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&dir)
    {
        tracing::warn!(partition, dir = %dir.display(),
            "replica placed here again while its old copy is being deleted: created once the \
             deletion and a journal rotation are done (if they failed: after a restart)");
        return;
    }
    let state = crate::node::replica_state(map, partition, &node.node_id);
    let (opener, map_now, disk_name) = (node.clone(), map.clone(), disk.to_owned());
    let opened = crate::node::blocking(move || {
        opener.open_replica(&map_now, partition, &disk_name, state, false)
    })
    .await;
    match opened {
        Ok(store) => {
            tracing::info!(partition, "replica placed here: serving it");
            if crate::bootstrap::pending(&node.data_dir, partition) {
                crate::bootstrap::announce(node, partition);
            }
            node.serve_replica(partition, store);
        }
        Err(err) => tracing::error!(partition, %err, "cannot open a replica placed here"),
    }
}

/// Stops serving a replica no longer placed here; deletes its data after the grace period.
fn retire(node: &Arc<StorageNode>, partition: PartitionId, running: &mut Running) {
    let Some(store) = node.unserve_replica(partition) else {
        return;
    };
    tracing::info!(
        partition,
        "replica no longer placed here: not served; deleting after the grace period"
    );
    if let Some(handle) = running.bootstraps.remove(&partition) {
        handle.abort();
    }
    node.moves.forget(partition);
    crate::rebuild::forget(node, partition);
    let dir = store_dir(node, partition, &store);
    running
        .leaving
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(partition, store);
    let (node, leaving, deleted, done) = (
        node.clone(),
        running.leaving.clone(),
        running.deleted.clone(),
        running.deletion_done.clone(),
    );
    let grace = node.moves.removal_grace();
    running.deletions.push(tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        let Some(store) = leaving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&partition)
        else {
            return; // placed here again meanwhile
        };
        let Some(dir) = dir else { return };
        deleted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(dir.clone());
        let data_dir = node.data_dir.clone();
        let doomed = dir.clone();
        let outcome = crate::node::blocking(move || {
            let disk = store.disk().clone();
            if let Err(err) = store.close() {
                tracing::warn!(partition, %err, "closing a retired replica");
            }
            drop(store);
            crate::replication::forget_partition(&data_dir, partition);
            crate::bootstrap::forget_cursor(&data_dir, partition);
            delete_replica_dir(&doomed)?;
            // No frame of the deleted replica is replayed after this: it may be created again.
            disk.rotate_journal().map_err(std::io::Error::other)
        })
        .await;
        match outcome {
            Ok(()) => {
                tracing::info!(partition, "retired replica deleted");
                deleted
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&dir);
                done.notify_one();
            }
            Err(err) => tracing::error!(partition, %err,
                "deleting a retired replica failed; it is not placed here again before a restart"),
        }
    }));
}

/// The directory of a served replica (the map may no longer name its disk).
fn store_dir(node: &StorageNode, partition: PartitionId, store: &Store) -> Option<PathBuf> {
    let dir = store.disk().root().join(format!("p{partition}"));
    dir.starts_with(&node.data_dir).then_some(dir)
}

/// Deletes a replica's directory so that no crash leaves a half-deleted replica that a restart
/// would serve: first a rename out of the replica name (synced), then the removal.
pub(crate) fn delete_replica_dir(dir: &Path) -> std::io::Result<()> {
    let doomed = dir.with_extension("deleting");
    if dir.exists() {
        std::fs::rename(dir, &doomed)?;
        sync_parent(dir)?;
    }
    if doomed.exists() {
        std::fs::remove_dir_all(&doomed)?;
        sync_parent(dir)?;
    }
    Ok(())
}

fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(parent) => std::fs::File::open(parent)?.sync_all(),
        None => Ok(()),
    }
}

/// At start: leftovers of deletions that a crash interrupted, and replica directories of
/// partitions the map does not place here (their removal was decided before the restart).
fn delete_orphans(node: &StorageNode, map: &ClusterMap) {
    let wanted: HashSet<PathBuf> = map
        .replicas_on(&node.node_id)
        .into_iter()
        .map(|(p, disk)| crate::node::replica_dir(&node.data_dir, &disk, p))
        .collect();
    let Some(me) = map.node(&node.node_id) else {
        return;
    };
    for disk in &me.disks {
        let Ok(entries) = std::fs::read_dir(node.data_dir.join(disk)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let replica = name.strip_prefix('p').is_some_and(|rest| {
                let id = rest.strip_suffix(".deleting").unwrap_or(rest);
                !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())
            });
            if !replica || !path.is_dir() || wanted.contains(&path) {
                continue;
            }
            tracing::warn!(dir = %path.display(), "deleting a replica the map no longer places here");
            let deleted = match name.ends_with(".deleting") {
                true => std::fs::remove_dir_all(&path).and_then(|()| sync_parent(&path)),
                false => delete_replica_dir(&path),
            };
            if let Err(err) = deleted {
                tracing::error!(dir = %path.display(), %err, "deleting a replica failed");
            }
        }
    }
}

/// Restarts replication with the map's peers (cursors are on disk: nothing is pulled twice).
async fn restart_replication(
    node: &Arc<StorageNode>,
    map: &Arc<ClusterMap>,
    ctx: &FollowContext,
    running: &mut Running,
) {
    if let Some((stop, handles)) = running.replication.take() {
        let _ = stop.send(true);
        for handle in handles {
            let _ = handle.await;
        }
    }
    let nodes: Vec<(String, std::net::SocketAddr)> = map
        .nodes
        .iter()
        .filter(|n| n.id != node.node_id)
        .map(|n| (n.id.clone(), n.address))
        .collect();
    if nodes != running.pool_nodes {
        match StoragePool::new(nodes.clone(), ctx.pool.clone(), ctx.credentials.clone()) {
            Ok(pool) => {
                *ctx.peers.lock().unwrap_or_else(|e| e.into_inner()) = pool;
                running.pool_nodes = nodes;
            }
            Err(err) => tracing::error!(%err, "cannot make the peer pool for the new map"),
        }
    }
    let pool = ctx.peers.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let dir = node.data_dir.join("replication");
    if let Err(err) = larder_store::create_dir_all_durable(&dir) {
        tracing::error!(%err, "cannot create the replication directory; replication is off");
        return;
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let handles = crate::replication::start(
        node.clone(),
        map.clone(),
        pool,
        ctx.replication.clone(),
        dir,
        stop_rx,
    )
    .await;
    running.replication = Some((stop_tx, handles));
}

/// Starts the bootstrap of every replica with a bulk copy pending, and the catch-up watch of
/// every replica the map calls bootstrapping, unless already running.
fn start_bootstraps(node: &Arc<StorageNode>, ctx: &FollowContext, running: &mut Running) {
    running.bootstraps.retain(|_, handle| !handle.is_finished());
    let pool = ctx.peers.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (partition, _) in node.partitions() {
        if running.bootstraps.contains_key(&partition) {
            continue;
        }
        let pending = crate::bootstrap::pending(&node.data_dir, partition);
        let bootstrapping = node.replica_state(partition) == Some(ReplicaState::Bootstrapping);
        let known = node.moves.known(partition);
        if !pending && (!bootstrapping || known) {
            continue;
        }
        if pending {
            crate::bootstrap::announce(node, partition);
        } else {
            crate::bootstrap::announce_catching_up(node, partition);
        }
        let context = crate::bootstrap::Context {
            pool: pool.clone(),
            request_timeout: ctx.replication.request_timeout,
            stop: ctx.stop.clone(),
        };
        let task = crate::bootstrap::run(node.clone(), partition, context);
        running.bootstraps.insert(partition, tokio::spawn(task));
    }
}
