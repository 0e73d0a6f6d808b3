//! The map authority's work, and the map file watch every node runs. Once a second:
//!
//! - the configured map file is re-read when it changed, and a newer valid map there is taken;
//! - on the authority only (`ClusterMap::authority`: the first listed node holding a replica
//!   that is not leaving), every node not yet known to run the current revision is sent it
//!   (`PUT /internal/v1/map`), until it answers with that revision; and each bootstrapping
//!   replica's node is asked whether it has caught up
//!   (`GET /internal/v1/partitions/<p>/replica`); the partitions whose new replicas all have are
//!   completed in the next revision (`larder_cluster::complete_moves`).
//!
//! The plan's whole state is the map, held durably by every node: when the authority is down,
//! map changes wait (serving goes on), and whichever node is authority next resumes the plan
//! from the map it holds.
//!
//! With `[redistribution] auto_replace_after` set, the same tick also runs automatic
//! re-replication (`auto_replace.rs`) on the authority and the node next in line.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use larder_cluster::{
    complete_moves, ClusterMap, FileWatch, PartitionId, ReplicaState, MAX_MAP_BYTES,
};
use larder_pool::StoragePool;
use larder_proto::header_name::MAP_REVISION;
use tokio::sync::watch;

use crate::auto_replace::AutoReplace;
use crate::map_state::{MapState, OfferKind};

/// How often the map file, the other nodes' revisions and the moves are checked.
pub const MAP_TICK: Duration = Duration::from_secs(1);
/// One request of the authority to one node.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest replica-state answer read.
const MAX_REPLICA_ANSWER: usize = 64 * 1024;

pub(crate) fn start(
    maps: Arc<MapState>,
    nodes: StoragePool,
    map_file: PathBuf,
    mut auto: Option<AutoReplace>,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut file = FileWatch::seen_now(&map_file);
        // Which revision each node answered with last (the authority's view).
        let mut known: HashMap<String, u64> = HashMap::new();
        let mut tick = tokio::time::interval(MAP_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            follow_file(&maps, &mut file, &map_file).await;
            if maps.is_authority() {
                distribute(&maps, &nodes, &mut known).await;
                advance_moves(&maps, &nodes).await;
            } else {
                known.clear();
            }
            if let Some(auto) = auto.as_mut() {
                auto.tick(&maps, &nodes).await;
            }
        }
    })
}

async fn follow_file(maps: &Arc<MapState>, file: &mut FileWatch, path: &std::path::Path) {
    let Some(read) = file.changed(path) else {
        return;
    };
    let maps = maps.clone();
    let taken = tokio::task::spawn_blocking(move || {
        read.and_then(|map| maps.offer(map, OfferKind::Distribution))
    })
    .await;
    match taken {
        Ok(Ok(_)) => {}
        Ok(Err(err)) => {
            tracing::error!(file = %path.display(), %err, "cluster map file refused; keeping the current map")
        }
        Err(err) => tracing::error!(%err, "cluster map file check failed"),
    }
}

/// Sends the current map to every node not known to run it.
async fn distribute(maps: &MapState, nodes: &StoragePool, known: &mut HashMap<String, u64>) {
    let map = maps.current();
    let text = Bytes::from(map.to_toml());
    let behind: Vec<String> = map
        .nodes
        .iter()
        .map(|n| n.id.clone())
        .filter(|id| known.get(id).is_none_or(|r| *r < map.revision))
        .collect();
    let pushes = behind.iter().map(|node| {
        let text = text.clone();
        async move { (node, push_map(nodes, node, text).await) }
    });
    for (node, result) in futures_util::future::join_all(pushes).await {
        match result {
            Ok(revision) => {
                known.insert(node.clone(), revision);
            }
            Err(err) => tracing::debug!(%node, %err, "map not delivered yet; retrying"),
        }
    }
}

/// Completes the moves whose new replicas have all caught up, as the next revision.
async fn advance_moves(maps: &Arc<MapState>, nodes: &StoragePool) {
    let map = maps.current();
    let booting: Vec<(PartitionId, String)> = map
        .partitions
        .iter()
        .flat_map(|p| {
            p.replicas
                .iter()
                .filter(|r| r.state == ReplicaState::Bootstrapping)
                .map(move |r| (p.id, r.node.clone()))
        })
        .collect();
    if booting.is_empty() {
        return;
    }
    let asks = booting.iter().map(|(p, node)| async move {
        let state = replica_state(nodes, node, *p).await;
        (*p, node.clone(), state.is_ok_and(|s| s == "caught_up"))
    });
    let caught_up: HashSet<(PartitionId, String)> = futures_util::future::join_all(asks)
        .await
        .into_iter()
        .filter(|(_, _, done)| *done)
        .map(|(p, node, _)| (p, node))
        .collect();
    if caught_up.is_empty() {
        return;
    }
    let next = match complete_moves(&map, |p, node| caught_up.contains(&(p, node.to_owned()))) {
        Ok(Some(next)) => next,
        Ok(None) => return,
        Err(err) => {
            tracing::error!(%err, "cannot complete the moves");
            return;
        }
    };
    let revision = next.revision;
    let maps = maps.clone();
    match tokio::task::spawn_blocking(move || maps.offer(next, OfferKind::Change)).await {
        Ok(Ok(_)) => tracing::info!(revision, "moves completed: caught-up replicas are live"),
        Ok(Err(err)) => tracing::warn!(%err, "completing the moves was refused"),
        Err(err) => tracing::error!(%err, "completing the moves failed"),
    }
}

/// `node`'s state of its replica of `partition` (`"bootstrapping"`, `"caught_up"`, ...).
async fn replica_state(
    nodes: &StoragePool,
    node: &str,
    partition: PartitionId,
) -> Result<String, String> {
    let path = format!("/internal/v1/partitions/{partition}/replica");
    let (status, body) = ask(
        nodes,
        node,
        Request::get(path).body(larder_pool::empty()),
        MAX_REPLICA_ANSWER,
    )
    .await?;
    if status != StatusCode::OK {
        return Err(format!("{node} answered {status}"));
    }
    let value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    value["state"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{node}: no state in the replica answer"))
}

/// The map revision `node` runs, from its health answer; `None` when it does not answer
/// within `limit` (any answer is a node that is up).
pub(crate) async fn node_revision(nodes: &StoragePool, node: &str, limit: Duration) -> Option<u64> {
    let request = Request::get(larder_proto::HEALTH_PATH)
        .body(larder_pool::empty())
        .ok()?;
    let response = tokio::time::timeout(limit, nodes.send(node, request))
        .await
        .ok()?
        .ok()?;
    Some(larder_proto::map_revision(response.headers()).unwrap_or(0))
}

/// `node`'s map.
pub(crate) async fn fetch_map(nodes: &StoragePool, node: &str) -> Result<ClusterMap, String> {
    let limit = usize::try_from(MAX_MAP_BYTES).unwrap_or(usize::MAX);
    let request = Request::get(larder_proto::MAP_PATH).body(larder_pool::empty());
    let (status, body) = ask(nodes, node, request, limit).await?;
    if status != StatusCode::OK {
        return Err(format!("{node} answered {status}"));
    }
    let text = std::str::from_utf8(&body).map_err(|e| e.to_string())?;
    ClusterMap::from_toml(text).map_err(|e| format!("{node}'s map: {e}"))
}

/// Sends `text` (a map) to `node`; returns the revision it runs afterwards.
async fn push_map(nodes: &StoragePool, node: &str, text: Bytes) -> Result<u64, String> {
    let request = Request::put(larder_proto::MAP_PATH).body(larder_pool::full(text));
    let send = async {
        let request = request.map_err(|e| e.to_string())?;
        nodes.send(node, request).await.map_err(|e| e.to_string())
    };
    let response = tokio::time::timeout(ASK_TIMEOUT, send)
        .await
        .map_err(|_| format!("{node} did not answer within {ASK_TIMEOUT:?}"))??;
    let revision = response
        .headers()
        .get(MAP_REVISION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    match (response.status().is_success(), revision) {
        (true, Some(revision)) => Ok(revision),
        _ => Err(format!("{node} answered {}", response.status())),
    }
}

async fn ask(
    nodes: &StoragePool,
    node: &str,
    request: http::Result<Request<larder_pool::Body>>,
    limit: usize,
) -> Result<(StatusCode, Bytes), String> {
    let request = request.map_err(|e| e.to_string())?;
    let exchange = async {
        let response = nodes.send(node, request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), limit)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, body))
    };
    tokio::time::timeout(ASK_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("{node} did not answer within {ASK_TIMEOUT:?}"))?
}
