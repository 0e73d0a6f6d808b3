//! The moves stream: the cluster changes shape during the run, as an operator (and the map
//! authority's automatic re-replication) changes it, while the nemesis goes on. Its own seeded
//! schedule (apart from the faults' and the clocks'), one step at a time: add a spare (or a
//! drained) node, drain a node, replace a node it kills for good with a spare, add a node and
//! cancel its moves, or kill a node for good and let the authority rebuild its replicas
//! elsewhere. Each step runs the real `larder cluster` command; a refusal (a plan in progress,
//! a datacenter too small, the authority unreachable) is recorded, never fatal. Half of the
//! storage faults aim at the nodes a move copies from or to (`Cluster::moving`).

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use larder_cluster::{ClusterMap, ReplicaState};
use serde::Serialize;

use crate::client::Connection;
use crate::cluster::{wait_for_port, Cluster, Role};
use crate::content::Rng;
use crate::history::History;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveKind {
    /// `add-node` of a spare, or of a node that holds nothing (drained, or its moves
    /// cancelled): it takes its share of its datacenter's replicas.
    AddNode,
    /// `drain-node` of a node in a datacenter with a node to spare.
    DrainNode,
    /// SIGKILL a node for good, then `replace-node` it with a spare of its datacenter.
    ReplaceNode,
    /// `add-node`, then `cancel-moves` to it a moment later.
    AddThenCancel,
    /// SIGKILL a node for good and leave it: past `auto_replace_after` the map authority
    /// rebuilds its replicas on the other nodes of its datacenter.
    KillForAutoReplace,
}

#[derive(Clone, Debug, Serialize)]
pub struct MoveStep {
    pub at_ms: u64,
    pub kind: MoveKind,
    /// Picks the node(s) among those the step can take when it starts.
    pub pick: u64,
    /// Between the kill and `replace-node`, or `add-node` and `cancel-moves`.
    pub wait_ms: u64,
}

/// About one step every 15–30 s, the first after 5–12 s (the workload has written by then).
pub fn schedule(seed: u64, duration: Duration, mean_gap_ms: u64) -> Vec<MoveStep> {
    let mut rng = Rng::derive(seed, 4);
    let end = duration.as_millis() as u64;
    let mut steps = Vec::new();
    let mut at = rng.range(5000, 12000);
    while at < end {
        let kind = match rng.range(0, 100) {
            0..=29 => MoveKind::AddNode,
            30..=54 => MoveKind::DrainNode,
            55..=74 => MoveKind::ReplaceNode,
            75..=89 => MoveKind::AddThenCancel,
            _ => MoveKind::KillForAutoReplace,
        };
        steps.push(MoveStep {
            at_ms: at,
            kind,
            pick: rng.next_u64(),
            wait_ms: rng.range(500, 4000),
        });
        at += rng.range(mean_gap_ms / 2, mean_gap_ms * 3 / 2);
    }
    steps
}

/// What the moves stream needs of the run.
pub struct Mover {
    pub larder: PathBuf,
    pub secret_file: PathBuf,
    pub cluster: Arc<Mutex<Cluster>>,
    pub history: History,
    /// Whether this `larder` has `cluster cancel-moves`.
    pub cancel_moves: bool,
    pub auto_replace: bool,
    /// Outcomes per step and command (`add_node`, `add_node refused`, ...).
    pub counts: BTreeMap<String, u64>,
}

/// How long a `larder cluster` command may take before it is killed (and recorded as such).
const COMMAND_LIMIT: Duration = Duration::from_secs(60);
/// How long a step waits for the moves before it to finish (one plan at a time), before it
/// tries its command anyway (and records the refusal).
const PLAN_WAIT: Duration = Duration::from_secs(20);

/// Whether `larder` has the `cluster cancel-moves` command.
pub fn has_cancel_moves(larder: &std::path::Path) -> bool {
    Command::new(larder)
        .args(["cluster", "cancel-moves", "--help"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn lock(cluster: &Arc<Mutex<Cluster>>) -> std::sync::MutexGuard<'_, Cluster> {
    cluster.lock().unwrap_or_else(|e| e.into_inner())
}

/// Nodes holding at least one replica (any state) in `map`.
fn holders(map: &ClusterMap) -> Vec<String> {
    map.nodes
        .iter()
        .filter(|n| !map.replicas_on(&n.id).is_empty())
        .map(|n| n.id.clone())
        .collect()
}

/// Nodes a move copies from or to.
pub fn moving(map: &ClusterMap) -> Vec<String> {
    let mut nodes: Vec<String> = map
        .partitions
        .iter()
        .flat_map(|p| &p.replicas)
        .filter(|r| r.state != ReplicaState::Live)
        .map(|r| r.node.clone())
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// The newest map any of `nodes` (id, internal address) answers with, and how many answered
/// with that revision.
pub async fn newest_map(
    nodes: &[(String, std::net::SocketAddr)],
    secret_file: &std::path::Path,
) -> Option<(ClusterMap, usize, usize)> {
    let mut newest: Option<ClusterMap> = None;
    let mut revisions = Vec::new();
    for (_, addr) in nodes {
        let mut conn = Connection::internal(*addr, secret_file.to_owned(), Duration::from_secs(3));
        let Ok(answer) = conn
            .send(Method::GET, "/internal/v1/map", &[], Bytes::new())
            .await
        else {
            continue;
        };
        if answer.status != 200 {
            continue;
        }
        let Ok(map) = std::str::from_utf8(&answer.body)
            .map_err(|e| e.to_string())
            .and_then(|t| ClusterMap::from_toml(t).map_err(|e| e.to_string()))
        else {
            continue;
        };
        revisions.push(map.revision);
        if newest.as_ref().is_none_or(|m| map.revision > m.revision) {
            newest = Some(map);
        }
    }
    let map = newest?;
    let at_newest = revisions.iter().filter(|&&r| r == map.revision).count();
    Some((map, at_newest, revisions.len()))
}

impl Mover {
    fn note(&self, event: &str, detail: &str) {
        self.history.note("moves", event, detail);
    }

    fn count(&mut self, what: String) {
        *self.counts.entry(what).or_insert(0) += 1;
    }

    /// The active nodes' ids and internal addresses.
    fn active_nodes(&self) -> Vec<(String, std::net::SocketAddr)> {
        let c = lock(&self.cluster);
        c.active()
            .into_iter()
            .map(|i| (c.storage[i].process.name.clone(), c.storage[i].internal))
            .collect()
    }

    fn fetch_map(&self, runtime: &tokio::runtime::Handle) -> Option<ClusterMap> {
        let nodes = self.active_nodes();
        let map = runtime
            .block_on(newest_map(&nodes, &self.secret_file))
            .map(|(map, ..)| map);
        if let Some(map) = &map {
            lock(&self.cluster).moving = moving(map);
        }
        map
    }

    /// Applies `steps` in order (blocking, on a thread that lives as long as the run: the
    /// processes it starts die with the thread that started them).
    pub fn run(&mut self, steps: &[MoveStep], runtime: &tokio::runtime::Handle) {
        let start = Instant::now();
        for step in steps {
            let at = Duration::from_millis(step.at_ms);
            // Follow the map meanwhile, so that faults can aim at the nodes of a move.
            while start.elapsed() < at {
                self.fetch_map(runtime);
                std::thread::sleep(Duration::from_secs(1).min(at.saturating_sub(start.elapsed())));
            }
            let detail = serde_json::to_string(step).unwrap_or_default();
            self.note("step", &detail);
            if let Err(e) = self.apply(step, runtime) {
                self.note("step-failed", &format!("{detail}: {e:#}"));
                self.count(format!("{:?} failed", step.kind));
            }
            self.reconcile(runtime);
        }
    }

    fn apply(&mut self, step: &MoveStep, runtime: &tokio::runtime::Handle) -> anyhow::Result<()> {
        let waited = Instant::now();
        let map = loop {
            let map = self
                .fetch_map(runtime)
                .ok_or_else(|| anyhow::anyhow!("no node answered with its map"))?;
            if moving(&map).is_empty() || waited.elapsed() > PLAN_WAIT {
                break map;
            }
            std::thread::sleep(Duration::from_secs(1));
        };
        let kind = self.feasible(step.kind, &map);
        if kind != step.kind {
            self.note(
                "instead",
                &format!("{:?} cannot be done now: {kind:?}", step.kind),
            );
        }
        match kind {
            MoveKind::AddNode => {
                self.add_node(&map, step.pick)?;
            }
            MoveKind::AddThenCancel => {
                if let Some(id) = self.add_node(&map, step.pick)? {
                    std::thread::sleep(Duration::from_millis(step.wait_ms));
                    self.cancel_moves(&id);
                }
            }
            MoveKind::DrainNode => {
                let victims = self.drainable(&map);
                let victim = &victims[(step.pick % victims.len() as u64) as usize];
                self.command("drain-node", std::slice::from_ref(victim));
            }
            MoveKind::ReplaceNode => {
                let pairs = self.replaceable(&map);
                let (dead, spare) = &pairs[(step.pick % pairs.len() as u64) as usize];
                self.kill_for_good(dead);
                std::thread::sleep(Duration::from_millis(step.wait_ms));
                let address = {
                    let c = lock(&self.cluster);
                    let slot = c.slot(spare).expect("a spare is a slot");
                    c.storage[slot].address.to_string()
                };
                // Refused while another plan runs: retried, as an operator would.
                let deadline = Instant::now() + PLAN_WAIT;
                while !self.command(
                    "replace-node",
                    &[
                        dead.clone(),
                        spare.clone(),
                        "--address".into(),
                        address.clone(),
                    ],
                ) && Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_secs(2));
                }
            }
            MoveKind::KillForAutoReplace => {
                let victims = self.drainable(&map);
                let victim = &victims[(step.pick % victims.len() as u64) as usize];
                self.kill_for_good(victim);
                self.count("kill_for_auto_replace".into());
            }
        }
        Ok(())
    }

    /// The step's kind if it can be done on `map`, or the next one that can: a replace needs a
    /// spare and a node of its datacenter, a drain (or a node left to the authority) a
    /// datacenter with a node more than its replicas need, an add a node that holds nothing.
    fn feasible(&self, kind: MoveKind, map: &ClusterMap) -> MoveKind {
        let can = |k: MoveKind| match k {
            MoveKind::ReplaceNode => !self.replaceable(map).is_empty(),
            MoveKind::DrainNode => !self.drainable(map).is_empty(),
            MoveKind::KillForAutoReplace => self.auto_replace && !self.drainable(map).is_empty(),
            MoveKind::AddThenCancel => self.cancel_moves && !self.addable(map).is_empty(),
            MoveKind::AddNode => !self.addable(map).is_empty(),
        };
        [
            kind,
            MoveKind::ReplaceNode,
            MoveKind::DrainNode,
            MoveKind::AddNode,
        ]
        .into_iter()
        .find(|&k| can(k))
        .unwrap_or(MoveKind::AddNode)
    }

    /// Spares, and active nodes in the map that hold nothing: (id, datacenter, address).
    fn addable(&self, map: &ClusterMap) -> Vec<(String, String, String)> {
        let holding = holders(map);
        let c = lock(&self.cluster);
        c.storage
            .iter()
            .filter(|n| match n.role {
                Role::Spare => true,
                Role::Active => !holding.contains(&n.process.name),
                Role::Retired => false,
            })
            .map(|n| {
                (
                    n.process.name.clone(),
                    n.datacenter.clone(),
                    n.address.to_string(),
                )
            })
            .collect()
    }

    /// Active nodes holding replicas in datacenters where at least 4 active nodes do (3
    /// replicas per datacenter: one can go).
    fn drainable(&self, map: &ClusterMap) -> Vec<String> {
        let holding = holders(map);
        let c = lock(&self.cluster);
        let active_holders: Vec<&crate::cluster::StorageNode> = c
            .storage
            .iter()
            .filter(|n| n.role == Role::Active && holding.contains(&n.process.name))
            .collect();
        active_holders
            .iter()
            .filter(|n| {
                active_holders
                    .iter()
                    .filter(|m| m.datacenter == n.datacenter)
                    .count()
                    >= 4
            })
            .map(|n| n.process.name.clone())
            .collect()
    }

    /// (node to kill and replace, spare of its datacenter).
    fn replaceable(&self, map: &ClusterMap) -> Vec<(String, String)> {
        let holding = holders(map);
        let c = lock(&self.cluster);
        let mut pairs = Vec::new();
        for spare in c.storage.iter().filter(|n| n.role == Role::Spare) {
            for dead in c.storage.iter().filter(|n| {
                n.role == Role::Active
                    && n.datacenter == spare.datacenter
                    && holding.contains(&n.process.name)
            }) {
                pairs.push((dead.process.name.clone(), spare.process.name.clone()));
            }
        }
        pairs
    }

    /// `add-node` of one of the addable nodes; its id when the map authority accepted it.
    fn add_node(&mut self, map: &ClusterMap, pick: u64) -> anyhow::Result<Option<String>> {
        let nodes = self.addable(map);
        anyhow::ensure!(!nodes.is_empty(), "no node to add");
        let (id, dc, address) = nodes[(pick % nodes.len() as u64) as usize].clone();
        let accepted = self.command(
            "add-node",
            &[
                id.clone(),
                "--address".into(),
                address,
                "--datacenter".into(),
                dc,
            ],
        );
        Ok(accepted.then_some(id))
    }

    fn cancel_moves(&mut self, node: &str) {
        self.command("cancel-moves", &[node.to_owned()]);
    }

    fn kill_for_good(&mut self, node: &str) {
        let mut c = lock(&self.cluster);
        if let Some(slot) = c.slot(node) {
            c.retire(slot);
        }
        drop(c);
        self.note("killed-for-good", node);
    }

    /// `larder cluster <command> <args> --config <an active node's config>`; whether it
    /// succeeded. Its output goes to the history.
    fn command(&mut self, command: &str, args: &[String]) -> bool {
        let config = {
            let c = lock(&self.cluster);
            c.active().first().map(|&i| c.storage[i].config.clone())
        };
        let Some(config) = config else {
            self.note("command-failed", &format!("{command}: no active node"));
            return false;
        };
        let mut child = match Command::new(&self.larder)
            .arg("cluster")
            .arg(command)
            .args(args)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(child) => child,
            Err(e) => {
                self.note("command-failed", &format!("{command}: {e}"));
                return false;
            }
        };
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if started.elapsed() < COMMAND_LIMIT => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let mut output = String::new();
        if let Some(mut out) = child.stdout.take() {
            let _ = out.read_to_string(&mut output);
        }
        if let Some(mut err) = child.stderr.take() {
            let _ = err.read_to_string(&mut output);
        }
        let ok = status.is_some_and(|s| s.success());
        let outcome = match (ok, status) {
            (true, _) => "accepted",
            (false, Some(_)) => "refused",
            (false, None) => "timed out",
        };
        let name = command.replace('-', "_");
        self.count(match ok {
            true => name,
            false => format!("{name} {outcome}"),
        });
        self.note(
            "command",
            &format!(
                "larder cluster {command} {}: {outcome}: {}",
                args.join(" "),
                output.trim()
            ),
        );
        ok
    }

    /// Spares the newest map names start (an `add-node` or `replace-node` that was accepted,
    /// whatever its command said), on the map file as new, and the moves are followed.
    fn reconcile(&mut self, runtime: &tokio::runtime::Handle) {
        let Some(map) = self.fetch_map(runtime) else {
            return;
        };
        let joining: Vec<usize> = {
            let c = lock(&self.cluster);
            map.nodes
                .iter()
                .filter_map(|n| c.slot(&n.id))
                .filter(|&i| c.storage[i].role == Role::Spare)
                .collect()
        };
        for i in joining {
            let (name, internal) = {
                let mut c = lock(&self.cluster);
                let map_file = c.dir.join("cluster.toml");
                let file_revision = ClusterMap::load(&map_file).map_or(0, |m| m.revision);
                if file_revision < map.revision {
                    if let Err(e) = map.save(&map_file) {
                        self.note("map-file", &format!("{e}"));
                    }
                }
                let started = c.activate(i);
                let name = c.storage[i].process.name.clone();
                if let Err(e) = started {
                    drop(c);
                    self.note("start-failed", &format!("{name}: {e:#}"));
                    continue;
                }
                (name, c.storage[i].internal)
            };
            self.note("started", &name);
            wait_for_port(internal, Duration::from_secs(60));
        }
    }
}

/// After the run: nodes killed for good that still hold replicas (their replacement was
/// refused, or could not be planned) come back, then the moves in progress are waited for
/// (`bound`), until every active node runs the newest map and it moves nothing. Returns that
/// map, and why it is not settled if it is not.
pub async fn settle(
    cluster: &Arc<Mutex<Cluster>>,
    secret_file: &std::path::Path,
    history: &History,
    bound: Duration,
) -> (Option<ClusterMap>, Option<String>) {
    let start = Instant::now();
    let mut revived = false;
    loop {
        let nodes: Vec<(String, std::net::SocketAddr)> = {
            let c = lock(cluster);
            c.active()
                .into_iter()
                .map(|i| (c.storage[i].process.name.clone(), c.storage[i].internal))
                .collect()
        };
        let newest = newest_map(&nodes, secret_file).await;
        if let Some((map, ..)) = &newest {
            if !revived {
                revived = true;
                revive_needed(cluster, map, history);
                continue;
            }
        }
        let why = match &newest {
            None => "no node answers with its map".to_owned(),
            Some((map, at_newest, answered)) => {
                let moves = moving(map);
                match (moves.is_empty(), *at_newest == nodes.len(), answered) {
                    (true, true, _) => return (Some(map.clone()), None),
                    (false, _, _) => format!(
                        "revision {} still moves replicas of {moves:?}",
                        map.revision
                    ),
                    (true, false, answered) => format!(
                        "{at_newest} of {} nodes run revision {} ({answered} answered)",
                        nodes.len(),
                        map.revision
                    ),
                }
            }
        };
        if start.elapsed() > bound {
            return (newest.map(|(m, ..)| m), Some(why));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Retired nodes that `map` still places replicas on start again.
fn revive_needed(cluster: &Arc<Mutex<Cluster>>, map: &ClusterMap, history: &History) {
    let holding = holders(map);
    let mut c = lock(cluster);
    let retired: Vec<usize> = (0..c.storage.len())
        .filter(|&i| {
            c.storage[i].role == Role::Retired && holding.contains(&c.storage[i].process.name)
        })
        .collect();
    for i in retired {
        let name = c.storage[i].process.name.clone();
        history.note("moves", "revived", &name);
        if let Err(e) = c.activate(i) {
            history.note("moves", "start-failed", &format!("{name}: {e:#}"));
        }
    }
}

/// Internal addresses of every active node, by id.
pub fn internal_addresses(cluster: &Cluster) -> HashMap<String, std::net::SocketAddr> {
    cluster
        .active()
        .into_iter()
        .map(|i| {
            (
                cluster.storage[i].process.name.clone(),
                cluster.storage[i].internal,
            )
        })
        .collect()
}
