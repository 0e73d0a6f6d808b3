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

/// Builds a balanced map: in each datacenter every node holds the same number of replicas (±1)
/// and no partition has two replicas on one node. With nodes `n_0..n_m` there, the partitions
/// of whole rounds of `m` (`p < m * (P / m)`) put replica `k` of partition `p` on
/// `n_((p + k) mod m)`, as every map before this rule did (so a cluster whose partition count
/// is a multiple of its node count is laid out exactly as before); the `P mod m` partitions
/// left over are dealt their replicas in turn (`n_0, n_1, ...` from where the last one stopped),
/// which the old rule did not do: it piled them onto neighbouring nodes (1 datacenter, 6 nodes,
/// 9 partitions of 3 replicas gave counts from 3 to 6). Each left-over partition's primary is
/// the one of its nodes that is primary of the fewest partitions so far. Only new maps are
/// built here: an existing map file is loaded as it is written.
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
    let partitions = usize::try_from(spec.partitions)
        .map_err(|_| MapError::Invalid("too many partitions".into()))?;
    let mut replicas: Vec<Vec<Replica>> = vec![Vec::new(); partitions];
    for dc in dcs {
        let in_dc: Vec<&Node> = map.nodes.iter().filter(|n| &n.datacenter == dc).collect();
        let placed = place_in_datacenter(in_dc.len(), partitions, spec.replicas_per_datacenter);
        for (out, nodes) in replicas.iter_mut().zip(placed) {
            out.extend(nodes.into_iter().map(|i| Replica {
                node: in_dc[i].id.clone(),
                disk: in_dc[i].disks[0].clone(),
                state: ReplicaState::Live,
            }));
        }
    }
    map.partitions = replicas
        .into_iter()
        .zip(0..spec.partitions)
        .map(|(replicas, id)| Partition {
            id,
            state: PartitionState::ReadWrite,
            replicas,
        })
        .collect();
    map.validate()?;
    Ok(map)
}

/// For each of `partitions` partitions, the indices (among a datacenter's `nodes`, at least
/// `replicas` of them) of the nodes holding its replicas there, its primary first (see
/// [`init_map`]).
fn place_in_datacenter(nodes: usize, partitions: usize, replicas: usize) -> Vec<Vec<usize>> {
    if nodes == 0 {
        return vec![Vec::new(); partitions];
    }
    let whole_rounds = partitions - partitions % nodes;
    let mut primaries = vec![whole_rounds / nodes; nodes];
    let mut out: Vec<Vec<usize>> = (0..whole_rounds)
        .map(|p| (0..replicas).map(|k| (p + k) % nodes).collect())
        .collect();
    for left_over in 0..partitions - whole_rounds {
        let dealt: Vec<usize> = (0..replicas)
            .map(|k| (left_over * replicas + k) % nodes)
            .collect();
        let first = (0..replicas)
            .min_by_key(|&k| (primaries[dealt[k]], k))
            .unwrap_or(0);
        primaries[dealt[first]] += 1;
        out.push(
            (0..replicas)
                .map(|k| dealt[(first + k) % replicas])
                .collect(),
        );
    }
    out
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

    /// The old rule (replica `k` of `p` on node `(p + k) mod m`) gave 1 datacenter of 6 nodes
    /// with 9 partitions of 3 replicas counts from 3 to 6.
    #[test]
    fn left_over_partitions_are_dealt_evenly() {
        let map = init_map(&spec(&["dc1"], 6, 9, 3)).unwrap();
        let counts = map.replica_counts();
        assert!(counts.values().all(|&c| c == 4 || c == 5), "{counts:?}");
        // A partition count that is a multiple of the node count is laid out as before.
        let map = init_map(&spec(&["dc1"], 4, 8, 3)).unwrap();
        for p in &map.partitions {
            let nodes: Vec<String> = (0..3)
                .map(|k| format!("s{}", (p.id as usize + k) % 4 + 1))
                .collect();
            let placed: Vec<String> = p.replicas.iter().map(|r| r.node.clone()).collect();
            assert_eq!(placed, nodes, "partition {}", p.id);
        }
    }

    /// Per datacenter, the spread of `count(node)` over its nodes.
    fn spreads(map: &ClusterMap, count: impl Fn(&str) -> usize) -> Vec<usize> {
        map.datacenters
            .iter()
            .map(|dc| {
                let counts: Vec<usize> = map
                    .nodes
                    .iter()
                    .filter(|n| n.datacenter == dc.name)
                    .map(|n| count(&n.id))
                    .collect();
                counts.iter().max().unwrap() - counts.iter().min().unwrap()
            })
            .collect()
    }

    proptest::proptest! {
        #[test]
        fn every_datacenter_is_balanced_within_one(
            dcs in 1usize..4, extra in 0usize..8, partitions in 1u32..70, replicas in 1usize..5
        ) {
            let names: Vec<String> = (0..dcs).map(|d| format!("dc{d}")).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let map = init_map(&spec(&names, dcs * replicas + extra, partitions, replicas)).unwrap();
            let counts = map.replica_counts();
            for spread in spreads(&map, |n| counts[n]) {
                proptest::prop_assert!(spread <= 1, "{:?}", counts);
            }
            // Primaries (first replica in each datacenter) are spread too.
            let primaries = |node: &str| {
                let dc = map.datacenter_of(node).unwrap();
                map.partitions.iter().filter(|p| map.primary_of(p.id, dc) == Some(node)).count()
            };
            for spread in spreads(&map, primaries) {
                proptest::prop_assert!(spread <= 1);
            }
        }
    }

    #[test]
    fn too_few_nodes_is_an_error() {
        let err = init_map(&spec(&["dc1"], 2, 4, 3)).unwrap_err();
        assert!(err.to_string().contains("needs 3 replicas"), "{err}");
    }
}
