//! The replicas one storage node hosts, each in its own log store.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use larder_cluster::{ClusterMap, PartitionId};
use larder_store::Store;

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
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("node {0:?} is not in the cluster map")]
    NotInMap(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
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
        let options = config.store.to_options()?;
        let mut stores = HashMap::new();
        for (partition, disk) in map.replicas_on(&config.node_id) {
            let dir = replica_dir(&config.data_dir, &disk, partition);
            let store = Store::open(&dir, options.clone())
                .map_err(|source| OpenError::Replica { dir, source })?;
            stores.insert(partition, store);
        }
        tracing::info!(node = %config.node_id, replicas = stores.len(), "replicas open");
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
        })
    }

    pub fn store(&self, partition: PartitionId) -> Option<&Store> {
        self.stores.get(&partition)
    }

    pub fn partitions(&self) -> impl Iterator<Item = (&PartitionId, &Store)> {
        self.stores.iter()
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

/// Runs blocking store work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("store tasks do not panic")
}

pub fn replica_dir(data_dir: &Path, disk: &str, partition: PartitionId) -> PathBuf {
    data_dir.join(disk).join(format!("p{partition}"))
}
