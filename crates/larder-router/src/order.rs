//! The order in which replicas are asked: local datacenter first, then the blob's datacenter of
//! origin, then the rest; within each group live nodes before known-down ones.

use larder_cluster::{ClusterMap, Partition};

use crate::NodeHealth;

/// The replicas of `partition` that serve reads (caught up: live or leaving, never
/// bootstrapping) but those in `avoid`, in read order, borrowed from the map (a read
/// allocates no node names).
pub fn read_order<'a>(
    map: &'a ClusterMap,
    partition: &'a Partition,
    (local_dc, origin_dc): (&str, Option<&str>),
    health: &NodeHealth,
    avoid: &[String],
) -> impl ExactSizeIterator<Item = &'a str> {
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
    // Rank each node once: `is_down` may hand out the node's single probe.
    let mut ranked: Vec<_> = partition
        .replicas
        .iter()
        .filter(|r| r.state.is_caught_up() && !avoid.contains(&r.node))
        .map(|r| (rank(&r.node), r.node.as_str()))
        .collect();
    // Shuffled, then stably sorted: equally ranked replicas share the read load.
    use rand::seq::SliceRandom;
    ranked.shuffle(&mut rand::rng());
    ranked.sort_by_key(|(rank, _)| *rank);
    ranked.into_iter().map(|(_, node)| node)
}

/// Replicas of `partition` in datacenter `dc`, every state: where writes go.
pub fn replicas_in(map: &ClusterMap, partition: &Partition, dc: &str) -> Vec<String> {
    partition
        .replicas
        .iter()
        .filter(|r| map.datacenter_of(&r.node) == Some(dc))
        .map(|r| r.node.clone())
        .collect()
}

/// Caught-up replicas of `partition` in datacenter `dc`: the ones that serve reads and count
/// toward quorums.
pub fn caught_up_in(map: &ClusterMap, partition: &Partition, dc: &str) -> Vec<String> {
    partition
        .replicas
        .iter()
        .filter(|r| r.state.is_caught_up() && map.datacenter_of(&r.node) == Some(dc))
        .map(|r| r.node.clone())
        .collect()
}

/// How many caught-up replicas of `partition` are in datacenter `dc` (without collecting them).
pub fn count_in(map: &ClusterMap, partition: &Partition, dc: &str) -> usize {
    partition
        .replicas
        .iter()
        .filter(|r| r.state.is_caught_up() && map.datacenter_of(&r.node) == Some(dc))
        .count()
}

/// Bootstrapping replicas of `partition`: written to, never counted. Empty (no allocation)
/// unless a move is under way.
pub fn bootstrapping(partition: &Partition) -> Vec<String> {
    partition
        .replicas
        .iter()
        .filter(|r| !r.state.is_caught_up())
        .map(|r| r.node.clone())
        .collect()
}
