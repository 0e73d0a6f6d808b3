use proptest::prelude::*;

use super::*;
use crate::layout::{init_map, LayoutSpec};

fn layout(dcs: usize, nodes: usize, partitions: u32, replicas: usize) -> ClusterMap {
    init_map(&LayoutSpec {
        datacenters: (0..dcs).map(|d| format!("dc{d}")).collect(),
        node_addresses: (0..nodes)
            .map(|i| format!("127.0.0.1:{}", 7100 + i).parse().unwrap())
            .collect(),
        partitions,
        replicas_per_datacenter: replicas,
    })
    .unwrap()
}

fn new_node(id: &str, dc: &str, port: u16) -> Node {
    Node {
        id: id.into(),
        datacenter: dc.into(),
        address: format!("127.0.0.1:{port}").parse().unwrap(),
        disks: vec!["disk0".into()],
    }
}

/// Replicas per partition per datacenter, counting where moves end (not leaving ones).
fn shape(map: &ClusterMap) -> Vec<BTreeMap<String, usize>> {
    map.partitions
        .iter()
        .map(|p| {
            let mut per_dc = BTreeMap::new();
            for r in p
                .replicas
                .iter()
                .filter(|r| r.state != ReplicaState::Leaving)
            {
                *per_dc
                    .entry(map.datacenter_of(&r.node).unwrap().to_owned())
                    .or_default() += 1;
            }
            per_dc
        })
        .collect()
}

fn finish(map: &ClusterMap) -> ClusterMap {
    complete_moves(map, |_, _| true)
        .unwrap()
        .unwrap_or_else(|| map.clone())
}

fn moves(map: &ClusterMap) -> usize {
    map.partitions
        .iter()
        .flat_map(|p| &p.replicas)
        .filter(|r| r.state == ReplicaState::Bootstrapping)
        .count()
}

#[test]
fn adding_a_fourth_node_moves_a_quarter_and_balances() {
    let map = layout(1, 3, 32, 3);
    let next = plan(&map, &Operation::AddNode(new_node("s4", "dc0", 7200))).unwrap();
    assert_eq!(next.revision, map.revision + 1);
    assert_eq!(moves(&next), 24, "96 replicas / 4 nodes");
    let done = finish(&next);
    assert_eq!(done.revision, map.revision + 2);
    let counts = done.replica_counts();
    assert!(counts.values().all(|&c| c == 24), "{counts:?}");
    // Primaries stay where they were whenever a non-primary could move instead.
    for p in &done.partitions {
        let before = map.primary_of(p.id, "dc0");
        assert_eq!(done.primary_of(p.id, "dc0"), before, "partition {}", p.id);
    }
}

#[test]
fn a_move_is_leaving_plus_bootstrapping_then_live() {
    let map = layout(1, 3, 4, 3);
    let next = plan(&map, &Operation::DrainNode("s2".into())).unwrap_err();
    assert!(next.to_string().contains("short of replicas"), "{next}");
    let map = layout(1, 4, 4, 3);
    let next = plan(&map, &Operation::DrainNode("s2".into())).unwrap();
    for p in &next.partitions {
        for r in p.replicas.iter().filter(|r| r.node == "s2") {
            assert_eq!(r.state, ReplicaState::Leaving);
        }
    }
    // Only caught-up replicas complete; a partition waits for all of its bootstrapping ones.
    let half = complete_moves(&next, |p, _| p % 2 == 0).unwrap().unwrap();
    assert!(half.partitions.iter().any(|p| moving(&half, p.id)));
    let done = finish(&half);
    assert_eq!(done.replica_counts()["s2"], 0);
    assert!(complete_moves(&done, |_, _| true).unwrap().is_none());
    let err = plan(&next, &Operation::DrainNode("s1".into())).unwrap_err();
    assert!(err.to_string().contains("still moving"), "{err}");
}

#[test]
fn replace_refuses_what_would_not_validate() {
    let map = layout(2, 6, 8, 3);
    let err = plan(
        &map,
        &Operation::ReplaceNode {
            dead: "s1".into(),
            new: new_node("s7", "dc1", 7300),
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("datacenter"), "{err}");
    let err = plan(
        &map,
        &Operation::ReplaceNode {
            dead: "s1".into(),
            new: new_node("s7", "dc0", 7101),
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("duplicate address"), "{err}");
    let err = plan(&map, &Operation::AddNode(new_node("s2", "dc0", 7300))).unwrap_err();
    assert!(err.to_string().contains("already in the map"), "{err}");
    let err = plan(&map, &Operation::DrainNode("s9".into())).unwrap_err();
    assert!(err.to_string().contains("not in the map"), "{err}");
}

/// Moves to a node that died are cancelled whatever else moves: the sources stay live, the
/// dead target's bootstrapping replicas go, and the next plan is accepted again.
#[test]
fn moves_to_a_dead_target_are_cancelled_and_unblock_the_next_plan() {
    let map = layout(1, 3, 8, 3);
    let moving = plan(&map, &Operation::AddNode(new_node("s4", "dc0", 7200))).unwrap();
    assert!(moves(&moving) > 0);
    let err = plan(&moving, &Operation::DrainNode("s3".into())).unwrap_err();
    assert!(err.to_string().contains("still moving"), "{err}");
    let cancelled = plan(&moving, &Operation::CancelMovesTo("s4".into())).unwrap();
    assert_eq!(cancelled.revision, moving.revision + 1);
    assert_eq!(moves(&cancelled), 0);
    assert_eq!(cancelled.partitions, map.partitions);
    assert!(cancelled.replicas_on("s4").is_empty());
    let err = plan(&cancelled, &Operation::CancelMovesTo("s4".into())).unwrap_err();
    assert!(err.to_string().contains("no move to node"), "{err}");
    plan(&cancelled, &Operation::DrainNode("s4".into())).unwrap();
}

/// A drained node (or one rebuilt elsewhere while down) that is back is added again: it takes
/// its share, at the address it has now.
#[test]
fn a_node_that_holds_nothing_is_added_again_and_takes_its_share() {
    let map = layout(1, 4, 8, 3);
    let drained = finish(&plan(&map, &Operation::DrainNode("s2".into())).unwrap());
    assert!(drained.replicas_on("s2").is_empty());
    let back = new_node("s2", "dc0", 7300);
    let next = plan(&drained, &Operation::AddNode(back.clone())).unwrap();
    assert_eq!(next.node("s2"), Some(&back));
    assert_eq!(next.nodes.len(), 4);
    assert_eq!(moves(&next), 6, "24 replicas / 4 nodes");
    let done = finish(&next);
    let counts = done.replica_counts();
    assert!(counts.values().all(|&c| c == 6), "{counts:?}");
}

#[test]
fn a_dead_nodes_replicas_are_spread_over_the_nodes_that_are_up_or_refused() {
    let map = layout(1, 4, 8, 3);
    let rebuild = |unavailable: &[&str]| {
        plan(
            &map,
            &Operation::RebuildElsewhere {
                dead: "s1".into(),
                unavailable: unavailable.iter().map(|n| n.to_string()).collect(),
            },
        )
    };
    let done = finish(&rebuild(&["s1"]).unwrap());
    let counts = done.replica_counts();
    assert_eq!(counts["s1"], 0);
    for node in ["s2", "s3", "s4"] {
        assert_eq!(counts[node], 8, "{counts:?}");
    }
    // With s4 down too, 3 replicas would need two on one node: refused, with the partition.
    let err = rebuild(&["s1", "s4"]).unwrap_err().to_string();
    assert!(err.contains("short of replicas"), "{err}");
    assert!(err.contains("that is up"), "{err}");
}

fn operation() -> impl Strategy<Value = (usize, usize, u32, usize, u8, usize)> {
    (
        1usize..3,
        0usize..4,
        1u32..40,
        1usize..4,
        0u8..4,
        0usize..12,
    )
}

proptest! {
    #[test]
    fn plans_keep_every_partition_whole_and_distinct(
        (dcs, extra, partitions, replicas, kind, pick) in operation()
    ) {
        let nodes = dcs * replicas + extra;
        let map = layout(dcs, nodes, partitions, replicas);
        let victim = map.nodes[pick % nodes].clone();
        let op = match kind {
            0 => Operation::AddNode(new_node("n1", &victim.datacenter, 9000)),
            1 => Operation::DrainNode(victim.id.clone()),
            // A dead node, and with `extra` odd, another node of the map down too.
            3 => Operation::RebuildElsewhere {
                dead: victim.id.clone(),
                unavailable: map.nodes.iter().filter(|n| n.id != victim.id)
                    .take(extra % 2).map(|n| n.id.clone()).collect(),
            },
            _ => Operation::ReplaceNode { dead: victim.id.clone(), new: new_node("n1", &victim.datacenter, 9000) },
        };
        match plan(&map, &op) {
            Err(err) => {
                // Only a drain (or a rebuild elsewhere) can be impossible: its datacenter has
                // no spare node that is up.
                let unavailable = match &op {
                    Operation::DrainNode(_) => Vec::new(),
                    Operation::RebuildElsewhere { unavailable, .. } => unavailable.clone(),
                    _ => return Err(TestCaseError::fail(format!("{op:?}: {err}"))),
                };
                prop_assert!(err.to_string().contains("short of replicas"));
                let up_in_dc = map.nodes.iter()
                    .filter(|n| n.datacenter == victim.datacenter && !unavailable.contains(&n.id))
                    .count();
                prop_assert!(up_in_dc <= replicas);
            }
            Ok(next) => {
                prop_assert!(next.validate().is_ok());
                prop_assert_eq!(next.revision, map.revision + 1);
                prop_assert_eq!(shape(&next), shape(&map));
                let done = finish(&next);
                prop_assert!(done.validate().is_ok());
                prop_assert_eq!(shape(&done), shape(&map));
                prop_assert!(done.partitions.iter().all(|p| p.replicas.iter().all(|r| r.state.is_live())));
                let counts = done.replica_counts();
                match &op {
                    Operation::AddNode(n) => {
                        // Moves no more than the new node's share, and balances the datacenter.
                        let in_dc: Vec<usize> = done.nodes.iter()
                            .filter(|m| m.datacenter == n.datacenter)
                            .map(|m| counts[m.id.as_str()]).collect();
                        let total: usize = in_dc.iter().sum();
                        prop_assert!(moves(&next) <= total / in_dc.len());
                        let (max, min) = (in_dc.iter().max().unwrap(), in_dc.iter().min().unwrap());
                        // `init_map` balances every datacenter within 1 (it once left a
                        // spread of 3: the regression case kept in proptest-regressions), and
                        // adding a node keeps it within 1.
                        let before = map.replica_counts();
                        let old: Vec<usize> = map.nodes.iter()
                            .filter(|m| m.datacenter == n.datacenter)
                            .map(|m| before.get(m.id.as_str()).copied().unwrap_or(0)).collect();
                        let spread = old.iter().max().unwrap_or(&0) - old.iter().min().unwrap_or(&0);
                        prop_assert!(spread <= 1, "init_map left {:?}", old);
                        if partitions as usize >= in_dc.len() {
                            prop_assert!(max - min <= 1, "{:?} from {:?}", in_dc, old);
                        }
                    }
                    Operation::DrainNode(id) => prop_assert_eq!(counts[id.as_str()], 0),
                    Operation::RebuildElsewhere { dead, unavailable } => {
                        prop_assert_eq!(counts[dead.as_str()], 0);
                        // Nothing new lands on a node that is down.
                        let before = map.replica_counts();
                        for node in unavailable {
                            prop_assert!(counts[node.as_str()] <= before[node.as_str()]);
                        }
                    }
                    Operation::ReplaceNode { dead, new } => {
                        prop_assert_eq!(counts[dead.as_str()], 0);
                        prop_assert_eq!(counts[new.id.as_str()], map.replica_counts()[dead.as_str()]);
                    }
                    Operation::CancelMovesTo(_) => unreachable!("not generated"),
                }
            }
        }
    }
}
