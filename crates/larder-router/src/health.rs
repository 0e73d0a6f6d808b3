//! Node health as this frontend sees it: consecutive failures mark a node down for a backoff
//! period; after it, exactly one request probes the node, and its success brings the node back
//! (its failure starts another period). Down nodes are tried last, never skipped, so a wrong
//! verdict costs latency, not availability.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    Up,
    Down,
}

#[derive(Default)]
struct Entry {
    consecutive_failures: u32,
    down_until: Option<Instant>,
    /// When the single probe of a down node was handed out; another is allowed after `backoff`
    /// in case the prober never reported (its request was cancelled by a hedge).
    probe_started: Option<Instant>,
    state_changes: u64,
    /// When the node last answered anything: a node that answers is alive, however slowly.
    last_answer: Option<Instant>,
    /// A health check of the node is under way: one at a time, so that a burst of lost hedge
    /// races (all timing out together after one stall) counts once, not once per race.
    check_in_flight: bool,
}

/// A timeout that fires this much after its deadline says this process was not running (a
/// saturated machine, a paused VM): its silence is ours, not the node's, and no verdict.
const STALL_SLACK: Duration = Duration::from_millis(100);

pub struct NodeHealth {
    /// Written only when the cluster map changes (`set_nodes`).
    nodes: RwLock<HashMap<String, Mutex<Entry>>>,
    threshold: u32,
    backoff: Duration,
}

impl NodeHealth {
    pub fn new(
        nodes: impl IntoIterator<Item = String>,
        threshold: u32,
        backoff: Duration,
    ) -> NodeHealth {
        let nodes = nodes
            .into_iter()
            .map(|n| (n, Mutex::new(Entry::default())))
            .collect();
        NodeHealth {
            nodes: RwLock::new(nodes),
            threshold: threshold.max(1),
            backoff,
        }
    }

    /// Tracks exactly `nodes` (a new cluster map): known nodes keep their state, new ones start
    /// up, others are forgotten.
    pub fn set_nodes(&self, nodes: impl IntoIterator<Item = String>) {
        let mut current = self.nodes.write();
        let wanted: std::collections::HashSet<String> = nodes.into_iter().collect();
        current.retain(|id, _| wanted.contains(id));
        for id in wanted {
            current.entry(id).or_default();
        }
    }

    /// True while the node is marked down, probe or not; asks nothing of the probe (for choices
    /// such as which partition to write to, which send nothing to the node by themselves).
    pub fn is_marked_down(&self, node: &str) -> bool {
        self.nodes
            .read()
            .get(node)
            .is_some_and(|e| e.lock().down_until.is_some())
    }

    /// Whether to treat the node as down for one request about to be sent (it is then tried
    /// last). Once the backoff has passed, the first caller is told "up" and becomes the probe;
    /// everyone else still sees "down" until the probe reports. Call once per node per request.
    pub fn is_down(&self, node: &str) -> bool {
        let nodes = self.nodes.read();
        let Some(entry) = nodes.get(node) else {
            return false;
        };
        let mut e = entry.lock();
        let Some(until) = e.down_until else {
            return false;
        };
        let now = Instant::now();
        if now < until {
            return true;
        }
        let probe_free = e
            .probe_started
            .is_none_or(|started| now - started > self.backoff);
        if probe_free {
            e.probe_started = Some(now);
            return false;
        }
        true
    }

    pub fn record_success(&self, node: &str) {
        if let Some(entry) = self.nodes.read().get(node) {
            let mut e = entry.lock();
            if e.down_until.take().is_some() {
                e.state_changes += 1;
                tracing::info!(node, "storage node is up again");
            }
            e.probe_started = None;
            e.consecutive_failures = 0;
            e.last_answer = Some(Instant::now());
        }
    }

    /// Whether the node answered any request after `since`.
    pub fn answered_since(&self, node: &str, since: Instant) -> bool {
        self.nodes
            .read()
            .get(node)
            .is_some_and(|e| e.lock().last_answer.is_some_and(|at| at >= since))
    }

    /// Starts the node's one health check; false if one is already under way.
    pub fn begin_check(&self, node: &str) -> bool {
        self.nodes.read().get(node).is_some_and(|e| {
            let mut e = e.lock();
            !std::mem::replace(&mut e.check_in_flight, true)
        })
    }

    pub fn end_check(&self, node: &str) {
        if let Some(entry) = self.nodes.read().get(node) {
            entry.lock().check_in_flight = false;
        }
    }

    /// A request sent at `started` got no answer by `deadline`. Only silence is a verdict: a
    /// node that answered other requests meanwhile is alive and the wait was a queue; and a
    /// timer that fired long after its deadline means this process was stalled, when neither
    /// the node's answers nor the timer could be seen. Returns whether it counted as a failure.
    pub fn record_silence(&self, node: &str, started: Instant, deadline: Instant) -> bool {
        let stalled = Instant::now().saturating_duration_since(deadline) > STALL_SLACK;
        if stalled || self.answered_since(node, started) {
            return false;
        }
        self.record_failure(node);
        true
    }

    pub fn record_failure(&self, node: &str) {
        if let Some(entry) = self.nodes.read().get(node) {
            let mut e = entry.lock();
            e.consecutive_failures += 1;
            if e.consecutive_failures >= self.threshold {
                if e.down_until.is_none() {
                    e.state_changes += 1;
                    tracing::warn!(
                        node,
                        failures = e.consecutive_failures,
                        "marking storage node down"
                    );
                }
                // Every further failure (including a failed probe) starts a new down period.
                e.down_until = Some(Instant::now() + self.backoff);
                e.probe_started = None;
            }
        }
    }

    /// Each node's state, consecutive failures and number of state changes.
    pub fn snapshot(&self) -> Vec<(String, NodeState, u32, u64)> {
        let mut out: Vec<_> = self
            .nodes
            .read()
            .iter()
            .map(|(id, e)| {
                let e = e.lock();
                let state = if e.down_until.is_some() {
                    NodeState::Down
                } else {
                    NodeState::Up
                };
                (id.clone(), state, e.consecutive_failures, e.state_changes)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_mark_down_then_one_probe_decides() {
        let health = NodeHealth::new(["a".to_string()], 2, Duration::from_millis(50));
        health.record_failure("a");
        assert!(!health.is_down("a"));
        health.record_failure("a");
        assert!(health.is_down("a"));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!health.is_down("a"), "after the backoff one caller probes");
        assert!(health.is_down("a"), "others wait for the probe's result");
        health.record_failure("a");
        assert!(
            health.is_down("a"),
            "a failed probe starts another down period"
        );
        std::thread::sleep(Duration::from_millis(60));
        assert!(!health.is_down("a"));
        health.record_success("a");
        assert!(!health.is_down("a") && !health.is_down("a"));
        assert_eq!(health.snapshot()[0].1, NodeState::Up);
        assert_eq!(health.snapshot()[0].3, 2);
    }

    #[test]
    fn an_answer_after_a_moment_shows_the_node_alive_since_then() {
        let health = NodeHealth::new(["a".to_string()], 2, Duration::from_millis(50));
        let before = Instant::now();
        assert!(!health.answered_since("a", before), "no answer yet");
        health.record_success("a");
        assert!(health.answered_since("a", before));
        std::thread::sleep(Duration::from_millis(5));
        assert!(
            !health.answered_since("a", Instant::now()),
            "nothing since now"
        );
        assert!(!health.answered_since("unknown", before));
    }

    #[test]
    fn silence_counts_only_when_this_process_was_running_and_the_node_said_nothing() {
        let health = NodeHealth::new(["a".to_string()], 1, Duration::from_secs(60));
        let started = Instant::now();
        let long_ago = started - STALL_SLACK * 2;
        assert!(
            !health.record_silence("a", long_ago, long_ago),
            "a timer that fired this late saw a stalled process, not a silent node"
        );
        assert!(!health.is_marked_down("a"));
        health.record_success("a");
        assert!(
            !health.record_silence("a", started, Instant::now()),
            "the node answered something meanwhile"
        );
        std::thread::sleep(Duration::from_millis(2));
        let started = Instant::now();
        assert!(health.record_silence("a", started, Instant::now()));
        assert!(health.is_marked_down("a"));
    }

    #[test]
    fn one_health_check_at_a_time_per_node() {
        let health = NodeHealth::new(["a".to_string(), "b".to_string()], 1, Duration::ZERO);
        assert!(health.begin_check("a"));
        assert!(
            !health.begin_check("a"),
            "a second check waits for the first"
        );
        assert!(health.begin_check("b"), "each node has its own");
        health.end_check("a");
        assert!(health.begin_check("a"));
        assert!(!health.begin_check("unknown"));
    }
}
