//! The cluster map a frontend runs, swappable while it serves. A new map is taken whole when it
//! validates and its revision is newer (`ClusterMap::compare_offer`); otherwise the old one
//! stays. Maps arrive from the map file (polled by the frontend), and from storage nodes: every
//! answer carries the node's revision, and a newer one than ours makes us fetch the node's map.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request, StatusCode};
use http_body_util::BodyExt;
use larder_cluster::{ClusterMap, MapError, Offer, MAX_MAP_BYTES};
use larder_pool::StoragePool;
use larder_proto::header_name::MAP_REVISION;
use parking_lot::{Mutex, RwLock};

/// How long one fetch of a node's map may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

pub struct MapCell {
    current: RwLock<Current>,
    pool: StoragePool,
    health: Arc<crate::NodeHealth>,
    datacenter: String,
    /// The newest revision a storage node has said it runs, and which node said it.
    newest_seen: AtomicU64,
    newest_from: Mutex<Option<String>>,
    /// A background fetch is under way: one at a time.
    fetching: AtomicBool,
}

struct Current {
    map: Arc<ClusterMap>,
    /// `larder-map-revision` for requests, built once per map.
    header: HeaderValue,
}

impl Current {
    fn new(map: Arc<ClusterMap>) -> Current {
        let header = HeaderValue::from(map.revision);
        Current { map, header }
    }
}

impl MapCell {
    pub(crate) fn new(
        map: Arc<ClusterMap>,
        pool: StoragePool,
        health: Arc<crate::NodeHealth>,
        datacenter: &str,
    ) -> MapCell {
        let revision = map.revision;
        MapCell {
            current: RwLock::new(Current::new(map)),
            pool,
            health,
            datacenter: datacenter.to_owned(),
            newest_seen: AtomicU64::new(revision),
            newest_from: Mutex::new(None),
            fetching: AtomicBool::new(false),
        }
    }

    pub fn get(&self) -> Arc<ClusterMap> {
        self.current.read().map.clone()
    }

    pub fn revision(&self) -> u64 {
        self.current.read().map.revision
    }

    /// Adds this frontend's revision to a request for a storage node.
    pub(crate) fn stamp(&self, headers: &mut HeaderMap) {
        let value = self.current.read().header.clone();
        headers.insert(MAP_REVISION, value);
    }

    /// Offers a new map: taken when it is newer and keeps this frontend's datacenter; the pool
    /// learns the new nodes' addresses before any request can name them.
    pub fn offer(&self, map: ClusterMap) -> Result<Offer, MapError> {
        let mut current = self.current.write();
        let offer = current.map.compare_offer(&map)?;
        if offer == Offer::Same {
            return Ok(offer);
        }
        if map.datacenter(&self.datacenter).is_none() {
            return Err(MapError::Invalid(format!(
                "this frontend's datacenter {:?} is not in map revision {}",
                self.datacenter, map.revision
            )));
        }
        self.pool
            .set_nodes(map.nodes.iter().map(|n| (n.id.clone(), n.address)));
        self.health
            .set_nodes(map.nodes.iter().map(|n| n.id.clone()));
        tracing::info!(
            from = current.map.revision,
            to = map.revision,
            "cluster map changed"
        );
        *current = Current::new(Arc::new(map));
        Ok(offer)
    }

    /// Notes the revision a storage node answered with; a newer one than ours starts a fetch
    /// of that node's map in the background (one at a time).
    pub(crate) fn saw(self: &Arc<Self>, node: &str, headers: &HeaderMap) {
        let Some(revision) = revision_in(headers) else {
            return;
        };
        if revision <= self.revision() {
            return;
        }
        if self.newest_seen.fetch_max(revision, Ordering::Relaxed) < revision {
            *self.newest_from.lock() = Some(node.to_owned());
        }
        if self.fetching.swap(true, Ordering::AcqRel) {
            return;
        }
        let cell = self.clone();
        tokio::spawn(async move {
            cell.catch_up().await;
            cell.fetching.store(false, Ordering::Release);
        });
    }

    /// Whether a storage node has shown a newer revision than the one this frontend runs.
    pub(crate) fn behind(&self) -> bool {
        self.newest_seen.load(Ordering::Relaxed) > self.revision()
    }

    /// Fetches the map of the node that showed the newest revision, when it is newer than ours.
    pub async fn catch_up(&self) {
        if !self.behind() {
            return;
        }
        let Some(node) = self.newest_from.lock().clone() else {
            return;
        };
        if let Err(err) = self.fetch_from(&node).await {
            tracing::warn!(%node, %err, "cannot fetch the newer cluster map");
        }
    }

    /// Fetches `node`'s map and offers it.
    pub async fn fetch_from(&self, node: &str) -> Result<Offer, String> {
        let request = Request::get(larder_proto::MAP_PATH)
            .body(larder_pool::empty())
            .expect("a GET of a constant path is a valid request");
        let fetch = async {
            let response = self
                .pool
                .send(node, request)
                .await
                .map_err(|e| e.to_string())?;
            if response.status() != StatusCode::OK {
                return Err(format!("{node} answered {}", response.status()));
            }
            let limit = usize::try_from(MAX_MAP_BYTES).unwrap_or(usize::MAX);
            let body = http_body_util::Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| format!("reading {node}'s map: {e}"))?
                .to_bytes();
            let text = std::str::from_utf8(&body).map_err(|e| e.to_string())?;
            let map = ClusterMap::from_toml(text).map_err(|e| e.to_string())?;
            self.offer(map).map_err(|e| e.to_string())
        };
        tokio::time::timeout(FETCH_TIMEOUT, fetch)
            .await
            .map_err(|_| format!("{node} did not send its map within {FETCH_TIMEOUT:?}"))?
    }

    /// Asks storage nodes (the map authority first, then the others in map order) for their
    /// revision with a health check, and fetches the map of the first that runs a newer one:
    /// an idle frontend, or one that was stopped during a change, catches up within a poll.
    pub async fn poll_nodes(&self) {
        let map = self.get();
        let authority = map.authority().map(str::to_owned);
        let order = authority.iter().cloned().chain(
            map.nodes
                .iter()
                .map(|n| n.id.clone())
                .filter(|n| Some(n) != authority.as_ref()),
        );
        for node in order {
            let request = Request::get(larder_proto::HEALTH_PATH)
                .body(larder_pool::empty())
                .expect("a GET of a constant path is a valid request");
            let answer = tokio::time::timeout(FETCH_TIMEOUT, self.pool.send(&node, request)).await;
            let Ok(Ok(response)) = answer else { continue };
            if revision_in(response.headers()).is_some_and(|r| r > map.revision) {
                if let Err(err) = self.fetch_from(&node).await {
                    tracing::warn!(%node, %err, "cannot fetch the newer cluster map");
                }
            }
            return;
        }
    }
}

/// The `larder-map-revision` of a message, when present and a number.
pub fn revision_in(headers: &HeaderMap) -> Option<u64> {
    headers.get(MAP_REVISION)?.to_str().ok()?.parse().ok()
}
