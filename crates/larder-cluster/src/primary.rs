//! The primary replica of a partition: the one point where read-modify-writes of its documents
//! are serialised (DESIGN 6.1). It is the first replica the map lists for the partition in a
//! datacenter (documents are written and read per datacenter, so each datacenter serialises its
//! own). Moving the primary is a map change: reorder the partition's replicas.
//!
//! A frontend names the primary it believes in with a fence: the primary's node id and a digest
//! of the partition's whole replica list in that map. A node accepts a serialised write only when
//! its own map gives the same fence, so a frontend (or node) on another map cannot apply a
//! read-modify-write at a point the other does not agree on.

use crate::map::{ClusterMap, PartitionId};

impl ClusterMap {
    /// The node holding the primary replica of `partition` in datacenter `dc`: never a
    /// bootstrapping replica (it has not caught up, so it cannot order read-modify-writes).
    pub fn primary_of(&self, partition: PartitionId, dc: &str) -> Option<&str> {
        self.partition(partition)?
            .replicas
            .iter()
            .filter(|r| r.state.is_caught_up())
            .map(|r| r.node.as_str())
            .find(|node| self.datacenter_of(node) == Some(dc))
    }

    /// `<primary node>.<16 hex digits>`: the primary of `partition` in `dc` and an FNV-1a digest
    /// of the partition's replica list (node and disk, in order, every datacenter).
    pub fn primary_fence(&self, partition: PartitionId, dc: &str) -> Option<String> {
        let primary = self.primary_of(partition, dc)?;
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for replica in &self.partition(partition)?.replicas {
            for byte in replica
                .node
                .bytes()
                .chain([b'/'])
                .chain(replica.disk.bytes())
            {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
            hash ^= u64::from(b',');
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Some(format!("{primary}.{hash:016x}"))
    }
}

#[cfg(test)]
mod tests {
    use crate::layout::{init_map, LayoutSpec};

    #[test]
    fn the_first_listed_replica_is_primary_and_a_reorder_changes_the_fence() {
        let mut map = init_map(&LayoutSpec {
            datacenters: vec!["dc1".into()],
            node_addresses: (0..3)
                .map(|i| format!("127.0.0.1:{}", 7100 + i).parse().unwrap())
                .collect(),
            partitions: 2,
            replicas_per_datacenter: 3,
        })
        .unwrap();
        let first = map.partitions[1].replicas[0].node.clone();
        assert_eq!(map.primary_of(1, "dc1"), Some(first.as_str()));
        assert_eq!(map.primary_of(1, "mars"), None);
        let fence = map.primary_fence(1, "dc1").unwrap();
        assert!(fence.starts_with(&format!("{first}.")));
        assert_eq!(map.primary_fence(1, "dc1"), Some(fence.clone()));
        map.partitions[1].replicas.swap(0, 1);
        let moved = map.primary_fence(1, "dc1").unwrap();
        assert_ne!(moved, fence);
        assert!(!moved.starts_with(&format!("{first}.")));
        // Same primary, another replica set: another fence too.
        map.partitions[1].replicas.swap(1, 2);
        map.partitions[1].replicas.swap(0, 2);
        assert_eq!(map.partitions[1].replicas[0].node, first);
        assert_ne!(map.primary_fence(1, "dc1").unwrap(), fence);
    }
}
