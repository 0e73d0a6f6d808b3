//! `larder cluster init`: a balanced map for N nodes, P partitions and R replicas.

use std::net::SocketAddr;

use crate::map::{
    ClusterMap, Datacenter, MapError, Node, Partition, PartitionState, Replica, ReplicaState,
    FORMAT_VERSION,
};

/// What `init_map` lays out.
#[derive(Clone, Debug)]
pub struct LayoutSpec {
    /// Datacenter names; nodes are dealt to them round-robin.
    pub datacenters: Vec<String>,
    /// One address per storage node.
    pub node_addresses: Vec<SocketAddr>,
    pub partitions: u32,
    /// Replicas per partition in each datacenter.
    pub replicas_per_datacenter: usize,
}

/// Builds a balanced map: replica `k` of partition `p` in a datacenter with nodes `n_0..n_m` goes on
/// node `n_((p + k) mod m)`, so every node holds the same number of replicas (±1) and no partition
/// has two replicas on one node.
pub fn init_map(spec: &LayoutSpec) -> Result<ClusterMap, MapError> {
    let dcs = &spec.datacenters;
    if dcs.is_empty() || dcs.len() > 255 {
        return Err(MapError::Invalid(
            "need between 1 and 255 datacenters".into(),
        ));
    }
    let nodes: Vec<Node> = spec
        .node_addresses
        .iter()
        .enumerate()
        .map(|(i, address)| Node {
            id: format!("s{}", i + 1),
            datacenter: dcs[i % dcs.len()].clone(),
            address: *address,
            disks: vec!["disk0".into()],
        })
        .collect();
    let datacenters = dcs
        .iter()
        .enumerate()
        .map(|(i, name)| Datacenter {
            name: name.clone(),
            id: i as u8 + 1,
        })
        .collect();
    let mut map = ClusterMap {
        format_version: FORMAT_VERSION,
        revision: 1,
        datacenters,
        nodes,
        partitions: vec![],
    };
    for dc in dcs {
        let in_dc = map.nodes.iter().filter(|n| &n.datacenter == dc).count();
        if in_dc < spec.replicas_per_datacenter {
            return Err(MapError::Invalid(format!(
                "datacenter {dc:?} has {in_dc} nodes but each partition needs {} replicas there",
                spec.replicas_per_datacenter
            )));
        }
    }
    map.partitions = (0..spec.partitions)
        .map(|p| place_partition(&map, dcs, p, spec.replicas_per_datacenter))
        .collect();
    map.validate()?;
    Ok(map)
}

fn place_partition(map: &ClusterMap, dcs: &[String], p: u32, replicas: usize) -> Partition {
    let mut out = Vec::new();
    for dc in dcs {
        let in_dc: Vec<&Node> = map.nodes.iter().filter(|n| &n.datacenter == dc).collect();
        for k in 0..replicas {
            let node = in_dc[(p as usize + k) % in_dc.len()];
            out.push(Replica {
                node: node.id.clone(),
                disk: node.disks[0].clone(),
                state: ReplicaState::Live,
            });
        }
    }
    Partition {
        id: p,
        state: PartitionState::ReadWrite,
        replicas: out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dcs: &[&str], nodes: usize, partitions: u32, replicas: usize) -> LayoutSpec {
        LayoutSpec {
            datacenters: dcs.iter().map(|s| s.to_string()).collect(),
            node_addresses: (0..nodes)
                .map(|i| format!("127.0.0.1:{}", 7000 + i).parse().unwrap())
                .collect(),
            partitions,
            replicas_per_datacenter: replicas,
        }
    }

    #[test]
    fn balanced_single_datacenter() {
        let map = init_map(&spec(&["dc1"], 3, 32, 3)).unwrap();
        assert_eq!(map.partitions.len(), 32);
        assert!(map.replica_counts().values().all(|&c| c == 32));
        let text = map.to_toml();
        assert_eq!(ClusterMap::from_toml(&text).unwrap(), map);
    }

    #[test]
    fn balanced_two_datacenters() {
        let map = init_map(&spec(&["east", "west"], 6, 10, 3)).unwrap();
        for p in &map.partitions {
            assert_eq!(p.replicas.len(), 6);
            let east = p
                .replicas
                .iter()
                .filter(|r| map.datacenter_of(&r.node) == Some("east"))
                .count();
            assert_eq!(east, 3);
        }
        let counts = map.replica_counts();
        assert!(counts.values().all(|&c| c == 10), "{counts:?}");
    }

    #[test]
    fn too_few_nodes_is_an_error() {
        let err = init_map(&spec(&["dc1"], 2, 4, 3)).unwrap_err();
        assert!(err.to_string().contains("needs 3 replicas"), "{err}");
    }
}
