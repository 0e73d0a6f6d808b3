//! The replicas one storage node hosts, each in its own log store.

use std::collections::HashMap;
use std::path::Path;

use larder_cluster::{ClusterMap, PartitionId};
use larder_store::Store;

use crate::metrics::StorageMetrics;
use crate::StorageConfig;

/// A storage node's state: its id and one open store per hosted replica.
pub struct StorageNode {
    pub node_id: String,
    pub metrics: StorageMetrics,
    stores: HashMap<PartitionId, Store>,
}

impl StorageNode {
    /// Opens (creating when new) the store of every replica the map places on this node.
    pub fn open(config: &StorageConfig, map: &ClusterMap) -> Result<StorageNode, String> {
        if map.node(&config.node_id).is_none() {
            return Err(format!(
                "node {:?} is not in the cluster map",
                config.node_id
            ));
        }
        let options = config.store.to_options()?;
        let mut stores = HashMap::new();
        for (partition, disk) in map.replicas_on(&config.node_id) {
            let dir = replica_dir(&config.data_dir, &disk, partition);
            let store = Store::open(&dir, options.clone())
                .map_err(|e| format!("cannot open replica {}: {e}", dir.display()))?;
            stores.insert(partition, store);
        }
        tracing::info!(node = %config.node_id, replicas = stores.len(), "replicas open");
        Ok(StorageNode {
            node_id: config.node_id.clone(),
            metrics: StorageMetrics::new(),
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

pub fn replica_dir(data_dir: &Path, disk: &str, partition: PartitionId) -> std::path::PathBuf {
    data_dir.join(disk).join(format!("p{partition}"))
}
