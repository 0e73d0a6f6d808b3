//! The order in which replicas are asked: local datacenter first, then the blob's datacenter of
//! origin, then the rest; within each group live nodes before known-down ones.

use larder_cluster::{ClusterMap, Partition};

use crate::NodeHealth;

pub fn read_order(
    map: &ClusterMap,
    partition: &Partition,
    local_dc: &str,
    origin_dc: Option<&str>,
    health: &NodeHealth,
) -> Vec<String> {
    let rank = |node: &str| {
        let dc = map.datacenter_of(node).unwrap_or("");
        let place = if dc == local_dc {
            0
        } else if Some(dc) == origin_dc {
            1
        } else {
            2
        };
        (health.is_down(node), place)
    };
    let mut nodes: Vec<String> = partition.replicas.iter().map(|r| r.node.clone()).collect();
    // Shuffle first so that equally ranked replicas share the read load.
    use rand::seq::SliceRandom;
    nodes.shuffle(&mut rand::rng());
    // Rank each node once: `is_down` may hand out the node's single probe.
    let mut ranked: Vec<_> = nodes.into_iter().map(|n| (rank(&n), n)).collect();
    ranked.sort_by_key(|(r, _)| *r);
    ranked.into_iter().map(|(_, n)| n).collect()
}

/// Replicas of `partition` in datacenter `dc`.
pub fn replicas_in(map: &ClusterMap, partition: &Partition, dc: &str) -> Vec<String> {
    partition
        .replicas
        .iter()
        .filter(|r| map.datacenter_of(&r.node) == Some(dc))
        .map(|r| r.node.clone())
        .collect()
}
