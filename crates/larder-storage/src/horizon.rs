//! What this node knows of its peers' positions in its own change feeds, and from it each
//! partition's tombstone horizon (`DESIGN.md` 6.1, `larder-store/FORMAT.md` "Dropping
//! tombstones").
//!
//! A peer replica pulling `GET .../changes?after=<cursor>&replica=<its node id>` has applied,
//! durably, every change up to that cursor (a replication cursor moves only once its page is
//! durable there). Kept in memory per partition and peer, from the last pull: after a restart
//! every position is unknown until that peer pulls again, and an unknown position means no
//! horizon (nothing is dropped). A position in another incarnation of the local replica (the
//! peer pulled from an older one, or starts from the beginning) counts as 0.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use larder_cluster::{ClusterMap, PartitionId};
use larder_store::Cursor;

struct Peer {
    node: String,
    /// The sequence (in the local replica's current incarnation) it last pulled after.
    seq: Option<u64>,
}

pub struct Horizons {
    retention: Duration,
    partitions: HashMap<PartitionId, Mutex<Vec<Peer>>>,
}

impl Horizons {
    /// Every other current replica, from the cluster map, of each partition `node_id` hosts.
    pub fn new(map: &ClusterMap, node_id: &str, retention: Duration) -> Horizons {
        let partitions = map
            .replicas_on(node_id)
            .into_iter()
            .filter_map(|(partition, _)| {
                let replicas = &map.partition(partition)?.replicas;
                let peers = replicas
                    .iter()
                    .filter(|r| r.node != node_id)
                    .map(|r| Peer {
                        node: r.node.clone(),
                        seq: None,
                    })
                    .collect();
                Some((partition, Mutex::new(peers)))
            })
            .collect();
        Horizons {
            retention,
            partitions,
        }
    }

    /// How old a tombstone must be before it may be dropped (`[compaction] tombstone_retention`).
    pub fn retention_ms(&self) -> u64 {
        u64::try_from(self.retention.as_millis()).unwrap_or(u64::MAX)
    }

    fn peers(&self, partition: PartitionId) -> Option<std::sync::MutexGuard<'_, Vec<Peer>>> {
        let peers = self.partitions.get(&partition)?;
        // A poisoned lock only means a panic elsewhere; positions stay meaningful.
        Some(
            peers
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    /// Notes that `peer` pulled the local replica (of incarnation `incarnation`) after `after`.
    /// Returns false when `peer` is not a current replica of the partition (nothing noted).
    pub fn pulled(
        &self,
        partition: PartitionId,
        peer: &str,
        after: Cursor,
        incarnation: u64,
    ) -> bool {
        let Some(mut peers) = self.peers(partition) else {
            return false;
        };
        let Some(p) = peers.iter_mut().find(|p| p.node == peer) else {
            return false;
        };
        p.seq = Some(if after.incarnation == incarnation {
            after.sequence
        } else {
            0
        });
        true
    }

    /// The largest sequence every other current replica has replicated past: tombstones up to
    /// it may be dropped (once old enough). `None` while any peer's position is unknown. A
    /// partition with no other replica has nothing to wait for.
    pub fn horizon(&self, partition: PartitionId) -> Option<u64> {
        let peers = self.peers(partition)?;
        peers
            .iter()
            .try_fold(u64::MAX, |min, p| p.seq.map(|s| min.min(s)))
    }

    /// Whether `peer` has shown (by pulling) that it is at or past `seq` of the local replica.
    pub fn has_passed(&self, partition: PartitionId, peer: &str, seq: u64) -> bool {
        self.peers(partition).is_some_and(|peers| {
            peers
                .iter()
                .any(|p| p.node == peer && p.seq.is_some_and(|s| s >= seq))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> ClusterMap {
        let node = |id: &str, port: u16| {
            format!("[[nodes]]\nid = \"{id}\"\ndatacenter = \"dc1\"\naddress = \"127.0.0.1:{port}\"\ndisks = [\"d0\"]\n")
        };
        let text = format!(
            "format_version = 1\n[[datacenters]]\nname = \"dc1\"\nid = 1\n{}{}{}\
             [[partitions]]\nid = 0\nstate = \"read-write\"\nreplicas = [{{ node = \"s1\", disk = \"d0\" }}, \
             {{ node = \"s2\", disk = \"d0\" }}, {{ node = \"s3\", disk = \"d0\" }}]\n",
            node("s1", 1),
            node("s2", 2),
            node("s3", 3)
        );
        ClusterMap::from_toml(&text).unwrap()
    }

    #[test]
    fn the_horizon_waits_for_every_peer_and_follows_the_slowest() {
        let h = Horizons::new(&map(), "s1", Duration::from_secs(1));
        let at = |sequence| Cursor {
            incarnation: 7,
            sequence,
        };
        assert_eq!(h.horizon(0), None, "nobody pulled yet");
        assert!(h.pulled(0, "s2", at(40), 7));
        assert_eq!(h.horizon(0), None, "s3 unknown");
        assert!(!h.pulled(0, "s9", at(90), 7), "not a replica");
        assert!(h.pulled(0, "s3", at(30), 7));
        assert_eq!(h.horizon(0), Some(30));
        // s3 pulls from the beginning (rebuilt) or from another incarnation of ours.
        assert!(h.pulled(0, "s3", at(50), 8));
        assert_eq!(h.horizon(0), Some(0));
        assert!(h.has_passed(0, "s2", 40) && !h.has_passed(0, "s2", 41));
        assert_eq!(h.horizon(1), None, "not hosted");
    }
}
