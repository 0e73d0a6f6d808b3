//! The replicas one storage node hosts, each in its own log store.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use larder_cluster::{ClusterMap, PartitionId};
use larder_store::{BlobMeta, DeleteOutcome, Disk, DiskOptions, DocOutcome, PutOutcome, Store};

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
    stores: HashMap<PartitionId, Store>,
    /// One journal and commit thread per disk directory, shared by every replica on it.
    disks: Vec<(String, Disk)>,
    /// Compaction passes (one at a time), what they measured, and the load they yield to.
    pub(crate) compaction: crate::compaction::Compaction,
    /// Bounds the visit scans running at once (`visit.rs`).
    pub(crate) visit_scans: crate::visit::VisitScans,
    /// The peers' positions in this node's change feeds: the tombstone horizons.
    pub(crate) horizons: crate::horizon::Horizons,
    /// The partitions this node is the primary of, with the fence of the map it was opened with
    /// (`documents::serialised`).
    pub(crate) primary_fences: HashMap<PartitionId, String>,
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
        let mut stores = HashMap::new();
        let mut disks: Vec<(String, Disk)> = Vec::new();
        for (partition, disk_name) in map.replicas_on(&config.node_id) {
            let disk = match disks.iter().find(|(name, _)| *name == disk_name) {
                Some((_, disk)) => disk.clone(),
                None => {
                    // Opening a disk replays its journal before any replica on it opens.
                    let dir = config.data_dir.join(&disk_name);
                    let disk = Disk::open(&dir, DiskOptions::default())
                        .map_err(|source| OpenError::Disk { dir, source })?;
                    disks.push((disk_name.clone(), disk.clone()));
                    disk
                }
            };
            let dir = replica_dir(&config.data_dir, &disk_name, partition);
            let store = Store::open_on(&disk, &dir, options.clone())
                .map_err(|source| OpenError::Replica { dir, source })?;
            stores.insert(partition, store);
        }
        tracing::info!(node = %config.node_id, replicas = stores.len(), "replicas open");
        let primary_fences = primary_fences(map, &config.node_id);
        let limits = &config.limits;
        Ok(StorageNode {
            node_id: config.node_id.clone(),
            metrics: StorageMetrics::new(),
            intake: Intake {
                budget: BodyBudget::new(limits.body_budget.as_u64()),
                max_body: config.store.max_record_size.as_u64(),
                idle_timeout: limits.body_read_timeout,
            },
            clock: Clock::new(limits.max_clock_skew),
            stores,
            disks,
            compaction,
            visit_scans: Default::default(),
            horizons: crate::horizon::Horizons::new(
                map,
                &config.node_id,
                config.compaction.tombstone_retention,
                config.replication.enabled,
            ),
            primary_fences,
            serialised: Default::default(),
            maps: std::sync::Arc::new(crate::map_state::MapState::new(
                tokio::sync::watch::Sender::new(std::sync::Arc::new(map.clone())),
                &config.node_id,
                &config.data_dir,
            )),
        })
    }

    /// The fence of `partition` when this node is its primary (see `ClusterMap::primary_fence`).
    pub(crate) fn primary_fence(&self, partition: PartitionId) -> Option<&str> {
        self.primary_fences.get(&partition).map(String::as_str)
    }

    pub fn store(&self, partition: PartitionId) -> Option<&Store> {
        self.stores.get(&partition)
    }

    pub fn partitions(&self) -> impl Iterator<Item = (&PartitionId, &Store)> {
        self.stores.iter()
    }

    /// The disks this node's replicas are on, by the cluster map's disk name.
    pub fn disks(&self) -> impl Iterator<Item = (&str, &Disk)> {
        self.disks.iter().map(|(name, disk)| (name.as_str(), disk))
    }

    /// Syncs and checkpoints every store (clean shutdown).
    pub fn close(&self) {
        for (partition, store) in &self.stores {
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

/// The fences of the partitions whose primary (in this node's datacenter) is `node`.
fn primary_fences(map: &ClusterMap, node: &str) -> HashMap<PartitionId, String> {
    let Some(dc) = map.datacenter_of(node) else {
        return HashMap::new();
    };
    map.replicas_on(node)
        .into_iter()
        .filter(|(p, _)| map.primary_of(*p, dc) == Some(node))
        .filter_map(|(p, _)| Some((p, map.primary_fence(p, dc)?)))
        .collect()
}

pub fn replica_dir(data_dir: &Path, disk: &str, partition: PartitionId) -> PathBuf {
    data_dir.join(disk).join(format!("p{partition}"))
}
