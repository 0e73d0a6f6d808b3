//! Plans: from a map and an operator's operation, the next map. A replica moving from node c to
//! node d is written as c `leaving` plus d `bootstrapping` in one revision; once d has caught
//! up, [`complete_moves`] gives the revision where d is live and c is gone. The plan's whole
//! state is the map itself, so whoever holds the map can resume it.
//!
//! Moves stay inside a datacenter (a partition keeps its replica count in each), go to the
//! node with the fewest replicas, and never put two replicas of a partition on one node.

use std::collections::BTreeMap;

use crate::map::{ClusterMap, MapError, Node, PartitionId, Replica, ReplicaState};

/// What an operator asks of the cluster.
#[derive(Clone, Debug)]
pub enum Operation {
    /// A new node, and a balanced share of its datacenter's replicas moved to it; also a node
    /// of the map that holds no replica (drained, or replaced while it was down) and is back.
    AddNode(Node),
    /// Every replica of the node moves to the others of its datacenter.
    DrainNode(String),
    /// Every replica of a dead node is rebuilt on a new node of the same datacenter.
    ReplaceNode { dead: String, new: Node },
    /// Every replica of a dead node is rebuilt on the other nodes of its datacenter, none on a
    /// node in `unavailable` (down too): automatic re-replication. A drain, except that the
    /// targets must be up.
    RebuildElsewhere {
        dead: String,
        unavailable: Vec<String>,
    },
    /// Every move to the node (dead, or unable to finish its bootstraps) is cancelled: its
    /// bootstrapping replicas go and the replicas they were to replace stay live. The one plan
    /// made while moves are in progress: it is what unblocks the next plan.
    CancelMovesTo(String),
}

fn refuse(msg: impl Into<String>) -> MapError {
    MapError::Invalid(msg.into())
}

/// The map that starts `op`, at the next revision. Refused while another plan's moves are
/// still in progress, and whenever the result would not validate (a partition short of
/// replicas, two replicas on one node).
pub fn plan(map: &ClusterMap, op: &Operation) -> Result<ClusterMap, MapError> {
    if let Operation::CancelMovesTo(node) = op {
        let mut next = map.next_revision()?;
        cancel_moves_to(&mut next, node)?;
        next.validate()?;
        return Ok(next);
    }
    if let Some(p) = map.partitions.iter().find(|p| moving(map, p.id)) {
        return Err(refuse(format!(
            "partition {} is still moving (a plan is in progress); wait until `larder cluster \
             status` shows no moves, then plan again",
            p.id
        )));
    }
    let mut next = map.next_revision()?;
    match op {
        Operation::AddNode(node) => add_node(&mut next, node)?,
        Operation::DrainNode(node) => drain_node(&mut next, node, &[])?,
        Operation::RebuildElsewhere { dead, unavailable } => {
            drain_node(&mut next, dead, unavailable)?
        }
        Operation::ReplaceNode { dead, new } => replace_node(&mut next, dead, new)?,
        Operation::CancelMovesTo(_) => unreachable!("handled above"),
    }
    next.validate()?;
    Ok(next)
}

/// The next revision once the bootstrapping replicas for which `caught_up(partition, node)`
/// holds are live: in each partition whose bootstrapping replicas have all caught up, they
/// turn live and its leaving replicas are dropped. `None` when nothing changes.
pub fn complete_moves(
    map: &ClusterMap,
    caught_up: impl Fn(PartitionId, &str) -> bool,
) -> Result<Option<ClusterMap>, MapError> {
    let mut next = map.next_revision()?;
    let mut changed = false;
    for partition in &mut next.partitions {
        let mut booting = partition
            .replicas
            .iter()
            .filter(|r| r.state == ReplicaState::Bootstrapping)
            .peekable();
        if booting.peek().is_none() {
            continue;
        }
        if !booting.all(|r| caught_up(partition.id, &r.node)) {
            continue;
        }
        partition
            .replicas
            .retain(|r| r.state != ReplicaState::Leaving);
        for r in &mut partition.replicas {
            r.state = ReplicaState::Live;
        }
        changed = true;
    }
    if !changed {
        return Ok(None);
    }
    next.validate()?;
    Ok(Some(next))
}

fn moving(map: &ClusterMap, partition: PartitionId) -> bool {
    map.partition(partition)
        .is_some_and(|p| p.replicas.iter().any(|r| !r.state.is_live()))
}

fn add_node(map: &mut ClusterMap, node: &Node) -> Result<(), MapError> {
    match map.nodes.iter().position(|n| n.id == node.id) {
        // A node that holds nothing (drained, replaced or rebuilt elsewhere while it was down)
        // and came back is added again as it is now, and takes its share like a new one.
        Some(i) if map.replicas_on(&node.id).is_empty() => map.nodes[i] = node.clone(),
        Some(_) => {
            return Err(refuse(format!(
                "node {:?} is already in the map and holds replicas",
                node.id
            )))
        }
        None => map.nodes.push(node.clone()),
    }
    map.validate()?;
    let dc = node.datacenter.clone();
    let total: usize = future_counts(map, &dc).values().sum();
    let in_dc = map.nodes.iter().filter(|n| n.datacenter == dc).count();
    let share = total / in_dc.max(1);
    for _ in 0..share {
        let counts = future_counts(map, &dc);
        // The most loaded node that has a replica not already moving, in a partition the new
        // node is not in yet; a non-primary replica first, so that primaries stay put.
        let Some((partition, from)) = pick_source(map, &counts, &node.id) else {
            break;
        };
        start_move(map, partition, &from, &node.id);
    }
    Ok(())
}

/// Moves every replica of `node` to the other nodes of its datacenter, none to a node in
/// `unavailable`.
fn drain_node(map: &mut ClusterMap, node: &str, unavailable: &[String]) -> Result<(), MapError> {
    let Some(dc) = map.datacenter_of(node).map(str::to_owned) else {
        return Err(refuse(format!("node {node:?} is not in the map")));
    };
    let exclude: Vec<&str> = std::iter::once(node)
        .chain(unavailable.iter().map(String::as_str))
        .collect();
    let up = if unavailable.is_empty() {
        ""
    } else {
        " that is up"
    };
    for (partition, _) in map.replicas_on(node) {
        let to = pick_target(map, &dc, partition, &exclude).ok_or_else(|| {
            refuse(format!(
                "draining {node:?} would leave partition {partition} short of replicas: no \
                 other node of datacenter {dc:?}{up} is free to take its replica"
            ))
        })?;
        start_move(map, partition, node, &to);
    }
    Ok(())
}

fn replace_node(map: &mut ClusterMap, dead: &str, new: &Node) -> Result<(), MapError> {
    let Some(dc) = map.datacenter_of(dead).map(str::to_owned) else {
        return Err(refuse(format!("node {dead:?} is not in the map")));
    };
    if new.datacenter != dc {
        return Err(refuse(format!(
            "the new node must be in {dead:?}'s datacenter {dc:?}, not {:?}",
            new.datacenter
        )));
    }
    if map.node(&new.id).is_some() {
        return Err(refuse(format!("node {:?} is already in the map", new.id)));
    }
    map.nodes.push(new.clone());
    map.validate()?;
    for (partition, _) in map.replicas_on(dead) {
        start_move(map, partition, dead, &new.id);
    }
    Ok(())
}

/// Replicas each node of `dc` will hold once the moves in `map` are done.
fn future_counts(map: &ClusterMap, dc: &str) -> BTreeMap<String, usize> {
    let mut counts: BTreeMap<String, usize> = map
        .nodes
        .iter()
        .filter(|n| n.datacenter == dc)
        .map(|n| (n.id.clone(), 0))
        .collect();
    for p in &map.partitions {
        for r in p
            .replicas
            .iter()
            .filter(|r| r.state != ReplicaState::Leaving)
        {
            if let Some(count) = counts.get_mut(&r.node) {
                *count += 1;
            }
        }
    }
    counts
}

fn pick_source(
    map: &ClusterMap,
    counts: &BTreeMap<String, usize>,
    to: &str,
) -> Option<(PartitionId, String)> {
    let mut best: Option<(usize, bool, PartitionId, String)> = None;
    for p in &map.partitions {
        if p.replicas.iter().any(|r| r.node == to) {
            continue;
        }
        for (index, r) in p.replicas.iter().enumerate() {
            let Some(&count) = counts.get(&r.node) else {
                continue;
            };
            if r.state != ReplicaState::Live || r.node == to {
                continue;
            }
            let primary = index == first_in_dc(map, p.id, &r.node);
            let better = match &best {
                None => true,
                Some((c, was_primary, ..)) => {
                    count > *c || (count == *c && *was_primary && !primary)
                }
            };
            if better {
                best = Some((count, primary, p.id, r.node.clone()));
            }
        }
    }
    // Moving from a node that would then hold fewer than the new one gains no balance.
    let to_count = counts.get(to).copied().unwrap_or(0);
    best.filter(|(count, ..)| *count > to_count + 1)
        .map(|(_, _, p, node)| (p, node))
}

/// Index of the first replica of `partition` in `node`'s datacenter (the primary there).
fn first_in_dc(map: &ClusterMap, partition: PartitionId, node: &str) -> usize {
    let dc = map.datacenter_of(node);
    map.partition(partition)
        .and_then(|p| {
            p.replicas
                .iter()
                .position(|r| map.datacenter_of(&r.node) == dc)
        })
        .unwrap_or(0)
}

/// The node of `dc` with the fewest (future) replicas that holds none of `partition` and is
/// not excluded.
fn pick_target(
    map: &ClusterMap,
    dc: &str,
    partition: PartitionId,
    exclude: &[&str],
) -> Option<String> {
    let p = map.partition(partition)?;
    future_counts(map, dc)
        .into_iter()
        .filter(|(node, _)| !exclude.contains(&node.as_str()))
        .filter(|(node, _)| !p.replicas.iter().any(|r| &r.node == node))
        .min_by_key(|(node, count)| (*count, node.clone()))
        .map(|(node, _)| node)
}

/// Whether a move to `node` is in progress (it holds a bootstrapping replica).
pub fn has_moves_to(map: &ClusterMap, node: &str) -> bool {
    map.partitions.iter().any(|p| {
        p.replicas
            .iter()
            .any(|r| r.node == node && r.state == ReplicaState::Bootstrapping)
    })
}

/// Undoes every move to `node`: a plan starts at most one move per partition (a partition is
/// never planned while it moves), so in a partition where `node` bootstraps, the leaving
/// replicas are that move's sources and turn live again.
fn cancel_moves_to(map: &mut ClusterMap, node: &str) -> Result<(), MapError> {
    if !has_moves_to(map, node) {
        return Err(refuse(format!("no move to node {node:?} is in progress")));
    }
    for p in &mut map.partitions {
        let before = p.replicas.len();
        p.replicas
            .retain(|r| !(r.node == node && r.state == ReplicaState::Bootstrapping));
        if p.replicas.len() == before {
            continue;
        }
        for r in &mut p.replicas {
            if r.state == ReplicaState::Leaving {
                r.state = ReplicaState::Live;
            }
        }
    }
    Ok(())
}

/// c → leaving, d appended as bootstrapping (after the others, so never the primary).
fn start_move(map: &mut ClusterMap, partition: PartitionId, from: &str, to: &str) {
    let disk = map
        .node(to)
        .and_then(|n| n.disks.first().cloned())
        .unwrap_or_default();
    let p = &mut map.partitions[partition as usize];
    for r in p.replicas.iter_mut().filter(|r| r.node == from) {
        r.state = ReplicaState::Leaving;
    }
    p.replicas.push(Replica {
        node: to.to_owned(),
        disk,
        state: ReplicaState::Bootstrapping,
    });
}

#[cfg(test)]
mod tests;
