//! The cluster map a storage node runs, swappable while it serves. Other modules follow it
//! with `subscribe()` (a `tokio::sync::watch` of `Arc<ClusterMap>`). A new map is taken whole
//! when it validates and its revision is newer; it is written durably next to the node's data
//! first (`cluster-map.toml` in the data directory), so that a restart runs the newer of that
//! file and the configured one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use http::HeaderValue;
use larder_cluster::{ClusterMap, MapError, Offer};
use larder_pool::StoragePool;
use tokio::sync::watch;

/// The accepted map's file, in the node's data directory.
pub const MAP_FILE: &str = "cluster-map.toml";

/// How an offered map arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OfferKind {
    /// A revision the map authority already accepted, on its way to every node: any newer
    /// revision is taken.
    Distribution,
    /// A change asked of the map authority: taken only by the authority, and only as the next
    /// revision of its current map (compare-and-set).
    Change,
}

pub struct MapState {
    node_id: String,
    tx: watch::Sender<Arc<ClusterMap>>,
    /// The current revision and its `larder-map-revision` value, for the per-request fence.
    revision: AtomicU64,
    header: Mutex<HeaderValue>,
    persisted: PathBuf,
    /// One offer at a time: compare, persist, publish.
    offers: Mutex<()>,
    /// Connections to every node of the map (set once the server has built them).
    peers: OnceLock<StoragePool>,
    /// A fetch of a newer map is under way: one at a time.
    fetching: AtomicBool,
}

impl MapState {
    /// Holds the map `tx` carries now; every map this node takes from now on is published on
    /// `tx` (a clone of the node's one map channel).
    pub fn new(tx: watch::Sender<Arc<ClusterMap>>, node_id: &str, data_dir: &Path) -> MapState {
        let revision = tx.borrow().revision;
        MapState {
            node_id: node_id.to_owned(),
            tx,
            revision: AtomicU64::new(revision),
            header: Mutex::new(HeaderValue::from(revision)),
            persisted: data_dir.join(MAP_FILE),
            offers: Mutex::new(()),
            peers: OnceLock::new(),
            fetching: AtomicBool::new(false),
        }
    }

    pub fn current(&self) -> Arc<ClusterMap> {
        self.tx.borrow().clone()
    }

    /// Follows every map this node takes from now on.
    pub fn subscribe(&self) -> watch::Receiver<Arc<ClusterMap>> {
        self.tx.subscribe()
    }

    /// The channel itself, for modules that publish through it (tests).
    pub fn sender(&self) -> &watch::Sender<Arc<ClusterMap>> {
        &self.tx
    }

    pub fn revision(&self) -> u64 {
        self.revision.load(Ordering::Acquire)
    }

    pub(crate) fn revision_header(&self) -> HeaderValue {
        self.header
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether this node decides map changes at its current map.
    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub fn is_authority(&self) -> bool {
        self.current().authority() == Some(self.node_id.as_str())
    }

    pub(crate) fn attach_peers(&self, peers: StoragePool) {
        let _ = self.peers.set(peers);
    }

    /// Offers a new map (blocking: it is fsynced before it is taken). The old map stays on any
    /// error.
    pub fn offer(&self, map: ClusterMap, kind: OfferKind) -> Result<Offer, MapError> {
        let _one_at_a_time = self.offers.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.current();
        let offer = match kind {
            OfferKind::Distribution => current.compare_offer(&map)?,
            OfferKind::Change => {
                let me = Some(self.node_id.as_str());
                if current.authority() != me && map.authority() != me {
                    return Err(MapError::Invalid(format!(
                        "node {} does not decide map changes; the map authority is {}",
                        self.node_id,
                        current.authority().unwrap_or("(none)")
                    )));
                }
                current.compare_next(&map)?
            }
        };
        if offer == Offer::Same {
            return Ok(offer);
        }
        if map.node(&self.node_id).is_none() {
            return Err(MapError::Invalid(format!(
                "node {} is not in map revision {}",
                self.node_id, map.revision
            )));
        }
        if let Some(dir) = self.persisted.parent() {
            larder_store::create_dir_all_durable(dir).map_err(|source| MapError::Write {
                path: dir.display().to_string(),
                source,
            })?;
        }
        map.save_durably(&self.persisted)?;
        tracing::info!(
            from = current.revision,
            to = map.revision,
            "cluster map changed"
        );
        let revision = map.revision;
        *self.header.lock().unwrap_or_else(|e| e.into_inner()) = HeaderValue::from(revision);
        self.revision.store(revision, Ordering::Release);
        if let Some(peers) = self.peers.get() {
            peers.set_nodes(node_addresses(&map));
        }
        self.tx.send_replace(Arc::new(map));
        Ok(offer)
    }

    /// A frontend's request named a newer revision than ours: fetch the map from the map
    /// authority (or, failing that, the other nodes) in the background, one fetch at a time.
    pub(crate) fn saw_newer(self: &Arc<Self>) {
        if self.fetching.swap(true, Ordering::AcqRel) {
            return;
        }
        let state = self.clone();
        tokio::spawn(async move {
            if let Err(err) = state.fetch_newer().await {
                tracing::warn!(%err, "cannot fetch the newer cluster map");
            }
            state.fetching.store(false, Ordering::Release);
        });
    }

    async fn fetch_newer(self: &Arc<Self>) -> Result<(), String> {
        let Some(peers) = self.peers.get() else {
            return Err("no connections to peers yet".into());
        };
        let map = self.current();
        let authority = map.authority().map(str::to_owned);
        let others = map.nodes.iter().map(|n| n.id.clone());
        let order: Vec<String> = authority
            .into_iter()
            .chain(others)
            .filter(|n| *n != self.node_id)
            .collect();
        let mut last = String::from("no peer to ask");
        for node in order {
            match crate::authority::fetch_map(peers, &node).await {
                Ok(newer) if newer.revision > map.revision => {
                    let state = self.clone();
                    return tokio::task::spawn_blocking(move || {
                        state.offer(newer, OfferKind::Distribution)
                    })
                    .await
                    .map_err(|e| e.to_string())?
                    .map(|_| ())
                    .map_err(|e| e.to_string());
                }
                Ok(_) => last = format!("{node} has no newer map"),
                Err(err) => last = err,
            }
        }
        Err(last)
    }
}

/// The map this node starts with: the newer of the one it accepted last (in `data_dir`) and the
/// configured one. A persisted file that does not read is reported and ignored.
pub fn newest(configured: ClusterMap, data_dir: &Path) -> ClusterMap {
    let path = data_dir.join(MAP_FILE);
    if !path.exists() {
        return configured;
    }
    match ClusterMap::load(&path) {
        Ok(accepted) if accepted.revision > configured.revision => {
            tracing::info!(
                revision = accepted.revision,
                configured = configured.revision,
                "running the map accepted before the restart (newer than the configured one)"
            );
            accepted
        }
        Ok(_) => configured,
        Err(err) => {
            tracing::error!(%err, "ignoring the accepted map file");
            configured
        }
    }
}

/// Every node of `map` (this one too: the authority asks itself like the others), with its
/// address.
pub(crate) fn node_addresses(map: &ClusterMap) -> Vec<(String, std::net::SocketAddr)> {
    map.nodes
        .iter()
        .map(|n| (n.id.clone(), n.address))
        .collect()
}
