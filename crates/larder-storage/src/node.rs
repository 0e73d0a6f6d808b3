//! The replicas one storage node hosts, each in its own log store.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use larder_cluster::{ClusterMap, PartitionId, ReplicaState};
use larder_store::{BlobMeta, DeleteOutcome, Disk, DiskOptions, DocOutcome, PutOutcome, Store};
use tokio::sync::watch;

use crate::body::{BodyBudget, Intake};
use crate::config::ConfigError;
use crate::metrics::StorageMetrics;
use crate::validate::Clock;
use crate::StorageConfig;

/// A storage node's state: its id, one open store per hosted replica, and the limits every
/// request is held to.
pub struct StorageNode {
    pub node_id: String,
    pub metrics: StorageMetrics,
    /// How request bodies are read: the node-wide memory budget, per-request size and timeout.
    pub intake: Intake,
    /// How far ahead of this node's clock a stored time or version may be.
    pub clock: Clock,
    /// The bytes blob reads may hold at once (`read_budget.rs`).
    pub(crate) reads: crate::read_budget::ReadBudget,
    /// The replicas served now; `follow_map` adds and retires them as the map changes.
    stores: RwLock<HashMap<PartitionId, Store>>,
    /// One journal and commit thread per disk directory, shared by every replica on it.
    disks: Mutex<Vec<(String, Disk)>>,
    pub(crate) data_dir: PathBuf,
    store_options: larder_store::Options,
    disk_options: DiskOptions,
    /// The map this node runs. Every accepted new map is sent here; `membership::follow_map`
    /// reconciles the hosted replicas with it.
    pub(crate) map: watch::Sender<Arc<ClusterMap>>,
    /// Bulk bootstraps of new replicas and their progress (`bootstrap.rs`).
    pub(crate) moves: crate::bootstrap::Moves,
    /// Compaction passes (one at a time), what they measured, and the load they yield to.
    pub(crate) compaction: crate::compaction::Compaction,
    /// Bounds the visit scans running at once (`visit.rs`).
    pub(crate) visit_scans: crate::visit::VisitScans,
    /// The peers' positions in this node's change feeds: the tombstone horizons.
    pub(crate) horizons: crate::horizon::Horizons,
    /// Replicas being rebuilt from their peers (`rebuild.rs`).
    pub(crate) rebuilds: crate::rebuild::Rebuilds,
    /// Serialises the check-and-write of read-modify-writes per document.
    pub(crate) serialised: crate::documents::DocStripes,
    /// The cluster map this node runs now, how new ones are taken; `maps.subscribe()` follows
    /// its changes.
    pub maps: std::sync::Arc<crate::map_state::MapState>,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("node {0:?} is not in the cluster map")]
    NotInMap(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot open disk {}: {source}", dir.display())]
    Disk {
        dir: PathBuf,
        source: larder_store::Error,
    },
    #[error("cannot open replica {}: {source}", dir.display())]
    Replica {
        dir: PathBuf,
        source: larder_store::Error,
    },
    #[error(
        "cannot save the bootstrap marker or start cursors of partition {partition}: {source}"
    )]
    Marker {
        partition: PartitionId,
        source: std::io::Error,
    },
    #[error("cannot delete the unfinished rebuild of partition {partition}: {source}")]
    Rebuild {
        partition: PartitionId,
        source: std::io::Error,
    },
}

impl StorageNode {
    /// Opens (creating when new) the store of every replica the map places on this node.
    pub fn open(config: &StorageConfig, map: &ClusterMap) -> Result<StorageNode, OpenError> {
        if map.node(&config.node_id).is_none() {
            return Err(OpenError::NotInMap(config.node_id.clone()));
        }
        let compaction = crate::compaction::Compaction::new(&config.compaction);
        let mut options = config.store.to_options()?;
        options.compaction_yields_to = Some(compaction.foreground.clone());
        let limits = &config.limits;
        // One channel for the node's map: `map_state` sends every map it accepts on it, and
        // `membership::follow_map` (replicas) and the others follow it.
        let map_tx = watch::channel(Arc::new(map.clone())).0;
        let node = StorageNode {
            node_id: config.node_id.clone(),
            metrics: StorageMetrics::new(),
            intake: Intake {
                budget: BodyBudget::new(limits.body_budget.as_u64()),
                max_body: config.store.max_record_size.as_u64(),
                idle_timeout: limits.body_read_timeout,
            },
            clock: Clock::new(limits.max_clock_skew),
            reads: crate::read_budget::ReadBudget::new(
                limits.read_budget,
                limits.read_budget_wait,
                config.store.read_piece_size,
            )?,
            stores: RwLock::default(),
            disks: Mutex::default(),
            data_dir: config.data_dir.clone(),
            store_options: options,
            disk_options: config.store.disk_options(),
            map: map_tx.clone(),
            moves: crate::bootstrap::Moves::new(&config.redistribution),
            compaction,
            visit_scans: Default::default(),
            horizons: crate::horizon::Horizons::new(
                map,
                &config.node_id,
                config.compaction.tombstone_retention,
                config.replication.enabled,
                config.replication.caught_up_window,
            ),
            serialised: Default::default(),
            rebuilds: Default::default(),
            maps: std::sync::Arc::new(crate::map_state::MapState::new(
                map_tx,
                &config.node_id,
                &config.data_dir,
            )),
        };
        for (partition, disk_name) in map.replicas_on(&config.node_id) {
            let state = replica_state(map, partition, &config.node_id);
            // A rebuild that did not finish starts over: the old directory goes before
            // anything is served, and the store is created empty, marked for a bootstrap.
            let rebuilding = crate::rebuild::marked(&config.data_dir, partition);
            if rebuilding {
                let dir = replica_dir(&config.data_dir, &disk_name, partition);
                crate::rebuild::restart(&node, partition, &dir)
                    .map_err(|source| OpenError::Rebuild { partition, source })?;
            }
            let store = node.open_replica(map, partition, &disk_name, state, !rebuilding)?;
            if !rebuilding && store.stats().durable_cursor.sequence == 0 {
                node.horizons.opened_empty(partition);
            }
            node.serve_replica(partition, store);
        }
        tracing::info!(node = %config.node_id, replicas = node.stores_read().len(), "replicas open");
        Ok(node)
    }

    /// Opens (creating when new) one replica's store on `disk_name`, opening the disk first if
    /// this is its first replica. A replica created now, other than by the first start of a
    /// cluster (`at_start` with the map calling it live), is marked for a bulk bootstrap, durably
    /// before its store exists, and gets its start positions in every peer's feed saved, so
    /// that no restart can take it for a replica that lost its cursors.
    pub(crate) fn open_replica(
        &self,
        map: &ClusterMap,
        partition: PartitionId,
        disk_name: &str,
        state: Option<ReplicaState>,
        at_start: bool,
    ) -> Result<Store, OpenError> {
        let disk = self.disk(disk_name)?;
        let dir = replica_dir(&self.data_dir, disk_name, partition);
        let new = !dir.exists();
        let bootstraps = new && (!at_start || state == Some(ReplicaState::Bootstrapping));
        if bootstraps {
            crate::bootstrap::mark_pending(&self.data_dir, partition)
                .map_err(|source| OpenError::Marker { partition, source })?;
        }
        let store = Store::open_on(&disk, &dir, self.store_options.clone())
            .map_err(|source| OpenError::Replica { dir, source })?;
        if new {
            let peers = peers_of(map, partition, &self.node_id);
            crate::replication::save_start_cursors(&self.data_dir, partition, &peers, &store)
                .map_err(|source| OpenError::Marker { partition, source })?;
        }
        Ok(store)
    }

    /// The disk named `name`, opened (its journal replayed) on first use.
    fn disk(&self, name: &str) -> Result<Disk, OpenError> {
        let mut disks = self.disks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, disk)) = disks.iter().find(|(n, _)| n == name) {
            return Ok(disk.clone());
        }
        let dir = self.data_dir.join(name);
        // Opening a disk replays its journal before any replica on it opens.
        let disk = Disk::open(&dir, self.disk_options.clone())
            .map_err(|source| OpenError::Disk { dir, source })?;
        disks.push((name.to_owned(), disk.clone()));
        Ok(disk)
    }

    /// Starts serving `store` as the replica of `partition`.
    pub(crate) fn serve_replica(&self, partition: PartitionId, store: Store) {
        let mut stores = self.stores.write().unwrap_or_else(|e| e.into_inner());
        stores.insert(partition, store);
    }

    /// Stops serving the replica of `partition` (requests already holding it finish).
    pub(crate) fn unserve_replica(&self, partition: PartitionId) -> Option<Store> {
        let mut stores = self.stores.write().unwrap_or_else(|e| e.into_inner());
        stores.remove(&partition)
    }

    fn stores_read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<PartitionId, Store>> {
        // A poisoned lock only means a panic elsewhere; the map itself stays consistent.
        self.stores.read().unwrap_or_else(|e| e.into_inner())
    }

    /// This node's replica of `partition`: its state in the map the node runs now.
    pub(crate) fn replica_state(&self, partition: PartitionId) -> Option<ReplicaState> {
        replica_state(&self.map.borrow(), partition, &self.node_id)
    }

    /// The fence of `partition` when this node is its primary in the map it runs now (see
    /// `ClusterMap::primary_fence`): computed per read-modify-write, so that a map change that
    /// moves the primary (or the replica list) takes effect at once.
    pub(crate) fn primary_fence(&self, partition: PartitionId) -> Option<String> {
        let map = self.map.borrow();
        let dc = map.datacenter_of(&self.node_id)?;
        if map.primary_of(partition, dc) != Some(self.node_id.as_str()) {
            return None;
        }
        map.primary_fence(partition, dc)
    }

    pub fn store(&self, partition: PartitionId) -> Option<Store> {
        self.stores_read().get(&partition).cloned()
    }

    /// The replicas served now (a snapshot: the map may change meanwhile).
    pub fn partitions(&self) -> Vec<(PartitionId, Store)> {
        let stores = self.stores_read();
        stores.iter().map(|(p, s)| (*p, s.clone())).collect()
    }

    /// The disks this node's replicas are on, by the cluster map's disk name.
    pub fn disks(&self) -> Vec<(String, Disk)> {
        self.disks.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Syncs and checkpoints every store (clean shutdown).
    pub fn close(&self) {
        for (partition, store) in &self.partitions() {
            if let Err(err) = store.close() {
                tracing::error!(partition, %err, "closing replica failed");
            }
        }
    }
}

/// Writes a blob. A record small enough to be batched is only encoded, checksummed and copied
/// into its log's batch, here on the async thread; a larger one is written to its segment on a
/// blocking thread. Either way the task then awaits the commit round that makes it durable:
/// no thread is parked while the disk syncs.
pub(crate) async fn put_blob(
    store: &Store,
    key: &str,
    meta: BlobMeta,
    chunks: &[Bytes],
) -> larder_store::Result<PutOutcome> {
    let size = chunks.iter().map(|c| c.len() as u64).sum();
    let commit = if larder_store::is_batched(key.len(), meta.props.len(), size) {
        store.begin_put_blob(key.as_bytes(), meta, chunks)
    } else {
        let (store, key, chunks) = (store.clone(), key.to_owned(), chunks.to_vec());
        blocking(move || store.begin_put_blob(key.as_bytes(), meta, &chunks)).await
    };
    commit.await
}

/// Writes a tombstone (always batched: see [`put_blob`]).
pub(crate) async fn delete_blob(
    store: &Store,
    key: &str,
    time_ms: u64,
) -> larder_store::Result<DeleteOutcome> {
    store.begin_delete_blob(key.as_bytes(), time_ms).await
}

/// Writes a document version (batched when small: see [`put_blob`]).
pub(crate) async fn put_doc(
    store: &Store,
    key: &str,
    version: u64,
    time_ms: u64,
    json: Bytes,
) -> larder_store::Result<DocOutcome> {
    let commit = if larder_store::is_batched(key.len(), 0, json.len() as u64) {
        store.begin_put_doc(key.as_bytes(), version, time_ms, json)
    } else {
        let (store, key) = (store.clone(), key.to_owned());
        blocking(move || store.begin_put_doc(key.as_bytes(), version, time_ms, json)).await
    };
    commit.await
}

/// Writes a versioned document tombstone (always batched: see [`put_blob`]).
pub(crate) async fn remove_doc(
    store: &Store,
    key: &str,
    version: u64,
    time_ms: u64,
) -> larder_store::Result<DocOutcome> {
    store
        .begin_remove_doc(key.as_bytes(), version, time_ms)
        .await
}

/// Runs blocking store work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("store tasks do not panic")
}

/// The state of `node`'s replica of `partition` in `map` (`None`: not placed there).
pub(crate) fn replica_state(
    map: &ClusterMap,
    partition: PartitionId,
    node: &str,
) -> Option<ReplicaState> {
    let replicas = &map.partition(partition)?.replicas;
    replicas.iter().find(|r| r.node == node).map(|r| r.state)
}

/// The other replicas of `partition` in `map`, with their states.
pub(crate) fn peers_of(
    map: &ClusterMap,
    partition: PartitionId,
    node: &str,
) -> Vec<(String, ReplicaState)> {
    map.partition(partition)
        .map(|p| p.replicas.iter())
        .into_iter()
        .flatten()
        .filter(|r| r.node != node)
        .map(|r| (r.node.clone(), r.state))
        .collect()
}

pub fn replica_dir(data_dir: &Path, disk: &str, partition: PartitionId) -> PathBuf {
    data_dir.join(disk).join(format!("p{partition}"))
}
