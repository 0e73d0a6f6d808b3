//! Automatic re-replication (`[redistribution] auto_replace_after`; Vespa's default): a node
//! the map authority has not reached for that long has its replicas rebuilt on the other nodes
//! of its datacenter (`larder_cluster::Operation::RebuildElsewhere`: the fewest loaded first,
//! never two replicas of a partition on one node, never on a node that is down too), as one
//! plan the authority offers itself, exactly as `larder cluster drain-node` of a dead node.
//!
//! - **Who.** The authority, from its own health view (a `GET /internal/v1/health` per node and
//!   tick). When the authority itself is the dead node, the node that is authority once the
//!   dead one's replicas leave (the next one listed) decides, as `replace-node` of a dead
//!   authority does; only those two probe.
//! - **Never twice for one outage.** A node's outage starts with the first unanswered probe and
//!   ends with an answer; one plan per outage at most, and none while any move is in progress.
//!   Once its moves complete, the node holds nothing in the map: a node that comes back runs
//!   that map (the authority sends it) and deletes its old replicas after `removal_grace`, as a
//!   drained node does; it is never rejoined as if nothing happened.
//! - **Never short.** When the survivors of the dead node's datacenter cannot take its
//!   replicas on distinct nodes (fewer nodes up than the replica count), no plan is made: the
//!   refusal is logged once per outage and counted in `larder_storage_auto_replace_blocked`;
//!   `larder cluster status` says why.
//! - **Never on a stale map.** A node answering with a newer revision than the decider's means
//!   the decider is behind (it fetches the newer map): nothing is planned until it has it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use larder_cluster::{has_moves_to, plan, ClusterMap, Operation, ReplicaState};
use larder_pool::StoragePool;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::map_state::{MapState, OfferKind};

/// One health probe; a node silent for this long counts as down in that tick.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The metrics automatic re-replication keeps (shared with the node's registry).
#[derive(Clone, Default)]
pub struct AutoReplaceMetrics {
    /// Nodes of the map this decider cannot reach now.
    pub nodes_down: Gauge,
    /// Nodes down past `auto_replace_after` whose replicas cannot be rebuilt elsewhere.
    pub blocked: Gauge,
    /// Plans made to rebuild a dead node's replicas elsewhere.
    pub plans: Counter,
}

pub(crate) struct AutoReplace {
    after: Duration,
    metrics: AutoReplaceMetrics,
    /// When each node stopped answering (this process's view: a restart starts over, which
    /// only ever delays a plan).
    down_since: HashMap<String, Instant>,
    /// Nodes whose replicas were planned elsewhere in their current outage.
    planned: HashSet<String>,
    /// Nodes whose rebuild was refused in their current outage (logged once).
    refused: HashSet<String>,
}

impl AutoReplace {
    /// `None` when `after` is zero (off).
    pub(crate) fn new(after: Duration, metrics: AutoReplaceMetrics) -> Option<AutoReplace> {
        (!after.is_zero()).then(|| AutoReplace {
            after,
            metrics,
            down_since: HashMap::new(),
            planned: HashSet::new(),
            refused: HashSet::new(),
        })
    }

    /// One tick: probe the nodes, then plan the rebuild of one overdue node if this node decides.
    pub(crate) async fn tick(&mut self, maps: &Arc<MapState>, nodes: &StoragePool) {
        let map = maps.current();
        let me = maps.node_id();
        if !decides(&map, me) {
            self.forget_all();
            return;
        }
        let newest = self.probe(&map, me, nodes).await;
        if newest > map.revision {
            maps.saw_newer(); // behind: nothing is planned until the newer map is here
            return;
        }
        let now = Instant::now();
        if moves_in_progress(&map) {
            // One plan at a time; the next waits for these moves. A move to a node down past
            // `after` never finishes: it is cancelled, which unblocks the next plan.
            if let Some((dead, next)) = self.cancellation(&map, me, now) {
                self.offer_cancellation(maps, next, &dead).await;
            }
            return;
        }
        let down: Vec<String> = self.down_since.keys().cloned().collect();
        let overdue: Vec<String> = self
            .overdue(&map, now)
            .into_iter()
            .filter(|n| !map.replicas_on(n).is_empty() && !self.planned.contains(n))
            .collect();
        let mut blocked = 0;
        for dead in overdue {
            let op = Operation::RebuildElsewhere {
                dead: dead.clone(),
                unavailable: down.clone(),
            };
            let next = match plan(&map, &op) {
                Ok(next) => next,
                Err(err) => {
                    blocked += 1;
                    if self.refused.insert(dead.clone()) {
                        tracing::error!(node = %dead, %err, after = ?self.after,
                            "node down past auto_replace_after, but its replicas cannot be rebuilt \
                             elsewhere; the partitions stay a replica short until it is back or replaced");
                    }
                    continue;
                }
            };
            // A dead authority is decided by the next one; anyone else, by the authority.
            if map.authority() != Some(me) && next.authority() != Some(me) {
                continue;
            }
            self.offer(maps, next, &dead).await;
            break;
        }
        self.metrics.blocked.set(blocked);
    }

    /// The nodes of `map` down for at least `after`.
    fn overdue(&self, map: &ClusterMap, now: Instant) -> Vec<String> {
        map.nodes
            .iter()
            .map(|n| n.id.clone())
            .filter(|n| {
                self.down_since
                    .get(n)
                    .is_some_and(|since| now.saturating_duration_since(*since) >= self.after)
            })
            .collect()
    }

    /// The plan cancelling the moves to a node down past `after`, if there is one and `me`
    /// offers it (the authority, or its successor when the authority is that node).
    fn cancellation(
        &self,
        map: &ClusterMap,
        me: &str,
        now: Instant,
    ) -> Option<(String, ClusterMap)> {
        let dead = self
            .overdue(map, now)
            .into_iter()
            .find(|node| has_moves_to(map, node))?;
        let next = plan(map, &Operation::CancelMovesTo(dead.clone())).ok()?;
        (map.authority() == Some(me) || next.authority() == Some(me)).then_some((dead, next))
    }

    async fn offer_cancellation(&mut self, maps: &Arc<MapState>, next: ClusterMap, dead: &str) {
        let revision = next.revision;
        let offered = maps.clone();
        match tokio::task::spawn_blocking(move || offered.offer(next, OfferKind::Change)).await {
            Ok(Ok(_)) => {
                self.metrics.plans.inc();
                tracing::warn!(node = %dead, revision, after = ?self.after,
                    "move target down past auto_replace_after: its moves are cancelled");
            }
            Ok(Err(err)) => {
                tracing::warn!(node = %dead, %err, "cancelling the moves to a dead node was refused")
            }
            Err(err) => {
                tracing::error!(node = %dead, %err, "cancelling the moves to a dead node failed")
            }
        }
    }

    /// Probes every other node of `map`; returns the newest revision among the answers (or
    /// the map's own).
    async fn probe(&mut self, map: &ClusterMap, me: &str, nodes: &StoragePool) -> u64 {
        let others: HashSet<String> = map
            .nodes
            .iter()
            .map(|n| n.id.clone())
            .filter(|n| n != me)
            .collect();
        let asks = others.iter().map(|node| async move {
            (
                node.clone(),
                crate::authority::node_revision(nodes, node, PROBE_TIMEOUT).await,
            )
        });
        let answers = futures_util::future::join_all(asks).await;
        let now = Instant::now();
        let mut newest = map.revision;
        for (node, answer) in answers {
            match answer {
                Some(revision) => {
                    if self.down_since.remove(&node).is_some() {
                        tracing::info!(%node, "node answers again");
                    }
                    self.planned.remove(&node);
                    self.refused.remove(&node);
                    newest = newest.max(revision);
                }
                None => {
                    self.down_since.entry(node).or_insert(now);
                }
            }
        }
        self.down_since.retain(|node, _| others.contains(node));
        let down = i64::try_from(self.down_since.len()).unwrap_or(i64::MAX);
        self.metrics.nodes_down.set(down);
        newest
    }

    async fn offer(&mut self, maps: &Arc<MapState>, next: ClusterMap, dead: &str) {
        let revision = next.revision;
        let moves = next
            .partitions
            .iter()
            .flat_map(|p| &p.replicas)
            .filter(|r| r.state == ReplicaState::Bootstrapping)
            .count();
        let offered = maps.clone();
        match tokio::task::spawn_blocking(move || offered.offer(next, OfferKind::Change)).await {
            Ok(Ok(_)) => {
                self.planned.insert(dead.to_owned());
                self.metrics.plans.inc();
                tracing::warn!(node = %dead, revision, moves, after = ?self.after,
                    "node down past auto_replace_after: its replicas are rebuilt on the other nodes");
            }
            Ok(Err(err)) => {
                tracing::warn!(node = %dead, %err, "rebuilding a dead node's replicas was refused")
            }
            Err(err) => {
                tracing::error!(node = %dead, %err, "rebuilding a dead node's replicas failed")
            }
        }
    }

    fn forget_all(&mut self) {
        self.down_since.clear();
        self.planned.clear();
        self.refused.clear();
        self.metrics.nodes_down.set(0);
        self.metrics.blocked.set(0);
    }
}

/// Whether `me` watches the other nodes' health: the authority, or the node that would be
/// authority without it (the first listed other node holding a replica that is not leaving).
fn decides(map: &ClusterMap, me: &str) -> bool {
    let authority = map.authority();
    if authority == Some(me) {
        return true;
    }
    let successor = map.nodes.iter().map(|n| n.id.as_str()).find(|node| {
        Some(*node) != authority
            && map.partitions.iter().any(|p| {
                p.replicas
                    .iter()
                    .any(|r| r.node == *node && r.state != ReplicaState::Leaving)
            })
    });
    successor == Some(me)
}

fn moves_in_progress(map: &ClusterMap) -> bool {
    map.partitions
        .iter()
        .any(|p| p.replicas.iter().any(|r| !r.state.is_live()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use larder_cluster::{init_map, LayoutSpec};

    fn map(nodes: usize) -> ClusterMap {
        init_map(&LayoutSpec {
            datacenters: vec!["dc1".into()],
            node_addresses: (0..nodes)
                .map(|i| format!("127.0.0.1:{}", 7100 + i).parse().unwrap())
                .collect(),
            partitions: 8,
            replicas_per_datacenter: 3,
        })
        .unwrap()
    }

    #[test]
    fn the_authority_and_its_successor_watch_the_others_do_not() {
        let map = map(4);
        assert!(decides(&map, "s1"));
        assert!(decides(&map, "s2"));
        assert!(!decides(&map, "s3"));
        assert!(!decides(&map, "s4"));
    }

    /// A move to a node that then stays down never finishes and blocks every plan: past
    /// `after`, the authority cancels it (and only then).
    #[test]
    fn moves_to_a_node_down_past_after_are_cancelled() {
        let before = map(3);
        let moving = plan(
            &before,
            &Operation::AddNode(larder_cluster::Node {
                id: "s4".into(),
                datacenter: "dc1".into(),
                address: "127.0.0.1:7200".parse().unwrap(),
                disks: vec!["disk0".into()],
            }),
        )
        .unwrap();
        assert!(moves_in_progress(&moving));
        let mut auto =
            AutoReplace::new(Duration::from_secs(5), AutoReplaceMetrics::default()).expect("on");
        let now = Instant::now();
        auto.down_since.insert("s4".into(), now);
        assert!(
            auto.cancellation(&moving, "s1", now).is_none(),
            "not down long enough"
        );
        let later = now + Duration::from_secs(6);
        assert!(
            auto.cancellation(&moving, "s3", later).is_none(),
            "s3 does not decide"
        );
        let (dead, next) = auto.cancellation(&moving, "s1", later).expect("cancelled");
        assert_eq!(dead, "s4");
        assert!(!moves_in_progress(&next));
        assert_eq!(next.revision, moving.revision + 1);
        assert_eq!(
            next.partitions, before.partitions,
            "the sources stay, s4 holds nothing"
        );
    }

    #[test]
    fn zero_is_off() {
        assert!(AutoReplace::new(Duration::ZERO, AutoReplaceMetrics::default()).is_none());
        assert!(AutoReplace::new(Duration::from_secs(1), AutoReplaceMetrics::default()).is_some());
    }
}
