//! Pull replication: for each local replica and each peer replica of the same partition, read the
//! peer's change feed after a saved cursor, fetch what is missing (tombstones included), append it
//! locally, then advance and save the cursor. Blobs are immutable and tombstones win, so applying
//! changes in any order converges; a page's changes are applied concurrently and the cursor moves
//! only once the whole page is durable here.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use larder_cluster::{ClusterMap, PartitionId};
use larder_pool::StoragePool;
use larder_proto::{blob_path, changes_path, header as h, BlobProperties, ChangeEntry, ChangePage};
use larder_store::{BlobLookup, BlobMeta, Cursor, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::handlers::now_ms;
use crate::metrics::PeerLabels;
use crate::{props, StorageNode};

/// Replication settings of a storage node.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicationConfig {
    pub enabled: bool,
    /// Pause between rounds once a peer has nothing new.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Changes fetched per request.
    pub page_size: usize,
    /// Bound on the work of one round per peer replica, so every partition gets its turn.
    pub max_pages_per_round: usize,
    /// Changes of one page fetched and applied at once.
    pub concurrency: usize,
    /// After errors, wait up to this long before asking the peer again (doubling from `interval`).
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// Deadline for one request to a peer: a stalled peer must not hold up the others.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig {
            enabled: true,
            interval: Duration::from_millis(200),
            page_size: 256,
            max_pages_per_round: 16,
            concurrency: 16,
            backoff_max: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// One (local replica, peer replica) pair and where we are in the peer's feed.
struct Link {
    partition: PartitionId,
    peer: String,
    store: Store,
    cursor: Cursor,
    cursor_file: PathBuf,
}

/// Starts one replication task per peer node; they stop when `stop` turns true.
pub fn start(
    node: Arc<StorageNode>,
    map: &ClusterMap,
    pool: StoragePool,
    config: ReplicationConfig,
    dir: &Path,
    stop: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    if !config.enabled {
        return Vec::new();
    }
    let mut by_peer: std::collections::BTreeMap<String, Vec<Link>> = Default::default();
    for (partition, store) in node.partitions() {
        let replicas = &map
            .partition(*partition)
            .expect("hosted partitions are in the map")
            .replicas;
        for peer in replicas.iter().filter(|r| r.node != node.node_id) {
            let cursor_file = dir.join(format!("p{partition}-{}.cursor", peer.node));
            let cursor = load_cursor(&cursor_file);
            let link = Link {
                partition: *partition,
                peer: peer.node.clone(),
                store: store.clone(),
                cursor,
                cursor_file,
            };
            by_peer.entry(peer.node.clone()).or_default().push(link);
        }
    }
    by_peer
        .into_values()
        .map(|links| {
            let worker = Worker {
                node: node.clone(),
                pool: pool.clone(),
                config: config.clone(),
            };
            tokio::spawn(worker.run(links, stop.clone()))
        })
        .collect()
}

fn load_cursor(path: &Path) -> Cursor {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(Cursor::START)
}

/// Saves a cursor durably: a crash must never move it past changes that are not applied here.
/// (Moving it back is harmless: applying a change twice is a no-op.)
fn save_cursor(path: &Path, cursor: Cursor) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(cursor.to_string().as_bytes())?;
    file.sync_data()?;
    std::fs::rename(&tmp, path)
}

struct Worker {
    node: Arc<StorageNode>,
    pool: StoragePool,
    config: ReplicationConfig,
}

impl Worker {
    async fn run(self, mut links: Vec<Link>, mut stop: watch::Receiver<bool>) {
        let mut delay = self.config.interval;
        while !*stop.borrow() {
            let mut failed = false;
            for link in &mut links {
                let limit = self.config.request_timeout * self.config.max_pages_per_round as u32;
                let outcome = tokio::time::timeout(limit, self.round(link)).await;
                if let Err(err) = outcome.unwrap_or_else(|_| Err("round timed out".into())) {
                    failed = true;
                    tracing::debug!(partition = link.partition, peer = %link.peer, %err, "replication round failed");
                    self.node
                        .metrics
                        .replication_errors
                        .get_or_create(&labels(link))
                        .inc();
                }
            }
            delay = if failed {
                (delay * 2).min(self.config.backoff_max)
            } else {
                self.config.interval
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// Up to `max_pages_per_round` pages of the peer's feed; stops early once caught up.
    async fn round(&self, link: &mut Link) -> Result<(), String> {
        for _ in 0..self.config.max_pages_per_round {
            let page = self.fetch_page(link).await?;
            self.record_lag(link, &page.changes);
            if page.changes.is_empty() {
                return Ok(());
            }
            let mut pending = Vec::with_capacity(page.changes.len());
            for change in &page.changes {
                pending.push(self.apply(link, change));
            }
            let applied: Vec<Result<(), String>> = stream::iter(pending)
                .buffer_unordered(self.config.concurrency.max(1))
                .collect()
                .await;
            applied.into_iter().collect::<Result<Vec<()>, String>>()?;
            let count = page.changes.len() as u64;
            self.node
                .metrics
                .replicated_records
                .get_or_create(&labels(link))
                .inc_by(count);
            link.cursor = page
                .next
                .parse()
                .map_err(|_| format!("peer sent a bad cursor {:?}", page.next))?;
            save_cursor(&link.cursor_file, link.cursor)
                .map_err(|e| format!("saving cursor: {e}"))?;
        }
        Ok(())
    }

    fn record_lag(&self, link: &Link, changes: &[ChangeEntry]) {
        let labels = labels(link);
        let oldest = changes.iter().map(|c| c.time_ms).min();
        let lag_seconds = oldest.map_or(0.0, |t| now_ms().saturating_sub(t) as f64 / 1000.0);
        self.node
            .metrics
            .replication_lag_records
            .get_or_create(&labels)
            .set(changes.len() as i64);
        self.node
            .metrics
            .replication_lag_seconds
            .get_or_create(&labels)
            .set(lag_seconds);
    }

    /// One request to a peer, bounded by `request_timeout` until its response headers.
    async fn send(
        &self,
        peer: &str,
        request: Request<larder_pool::Body>,
    ) -> Result<http::Response<hyper::body::Incoming>, String> {
        match tokio::time::timeout(self.config.request_timeout, self.pool.send(peer, request)).await
        {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err(format!(
                "{peer} did not answer within {:?}",
                self.config.request_timeout
            )),
        }
    }

    async fn fetch_page(&self, link: &Link) -> Result<ChangePage, String> {
        let path = changes_path(
            link.partition,
            &link.cursor.to_string(),
            self.config.page_size,
        );
        let (status, body) = self.get(&link.peer, path).await?;
        if status != StatusCode::OK {
            return Err(format!("change feed answered {status}"));
        }
        let body = body.into_iter().fold(Vec::new(), |mut v, c| {
            v.extend_from_slice(&c);
            v
        });
        serde_json::from_slice(&body).map_err(|e| format!("bad change page: {e}"))
    }

    async fn get(&self, peer: &str, path: String) -> Result<(StatusCode, Vec<Bytes>), String> {
        let request = Request::get(path)
            .body(larder_pool::empty())
            .expect("valid request");
        let response = self.send(peer, request).await?;
        let status = response.status();
        Ok((status, read_all(response.into_body()).await?))
    }

    async fn apply(&self, link: &Link, change: &ChangeEntry) -> Result<(), String> {
        match change.op.as_str() {
            "put-blob" => self.copy_blob(link, change).await,
            "delete-blob" => delete_locally(&link.store, &change.key, change.time_ms).await,
            "put-doc" | "remove-doc" => self.copy_doc(link, change).await,
            _ => Ok(()),
        }
    }

    /// Copies the peer's current version of a document unless this replica has it or a newer
    /// one; the store's last-writer-wins check makes the result independent of order.
    async fn copy_doc(&self, link: &Link, change: &ChangeEntry) -> Result<(), String> {
        if crate::documents::holds_version(&link.store, &change.key, change.version) {
            return Ok(());
        }
        let request = Request::get(larder_proto::doc_path(link.partition, &change.key))
            .body(larder_pool::empty())
            .expect("valid request");
        let response = self.send(&link.peer, request).await?;
        crate::documents::apply_peer_answer(&link.store, &change.key, response).await
    }

    /// Fetches a blob the peer has and we lack; a tombstone there becomes one here.
    async fn copy_blob(&self, link: &Link, change: &ChangeEntry) -> Result<(), String> {
        match link
            .store
            .get_blob(change.key.as_bytes(), now_ms())
            .map_err(|e| e.to_string())?
        {
            BlobLookup::NotFound => {}
            _ => return Ok(()), // already here, or deleted here (tombstones win)
        }
        let path = format!(
            "{}?{}",
            blob_path(link.partition, &change.key),
            larder_proto::INCLUDE_EXPIRED_QUERY
        );
        let request = Request::get(path)
            .body(larder_pool::empty())
            .expect("valid request");
        let response = self.send(&link.peer, request).await?;
        let status = response.status();
        let (parts, body) = response.into_parts();
        match status {
            StatusCode::OK => {}
            StatusCode::GONE => {
                let time = parts
                    .headers
                    .get(h::TIME_MS)
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(change.time_ms);
                return delete_locally(&link.store, &change.key, time).await;
            }
            // Gone from the peer's index (compacted away): nothing left to copy.
            StatusCode::NOT_FOUND => return Ok(()),
            other => return Err(format!("fetching {} answered {other}", change.key)),
        }
        let properties = BlobProperties::from_headers(&parts.headers).map_err(|e| e.to_string())?;
        let chunks = read_all(body).await?;
        let received: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        if received != change.size {
            return Err(format!(
                "{}: got {received} of {} bytes",
                change.key, change.size
            ));
        }
        let meta = BlobMeta {
            props: props::encode(&properties),
            time_ms: change.time_ms,
            expires_ms: properties.expires_ms,
        };
        let store = link.store.clone();
        let key = change.key.clone();
        tokio::task::spawn_blocking(move || store.put_blob(key.as_bytes(), meta, &chunks))
            .await
            .expect("store tasks do not panic")
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// A response body as the chunks that arrived (bounded by the record size the peer serves).
async fn read_all(mut body: hyper::body::Incoming) -> Result<Vec<Bytes>, String> {
    let mut chunks = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.map_err(|e| e.to_string())?.into_data() {
            chunks.push(data);
        }
    }
    Ok(chunks)
}

async fn delete_locally(store: &Store, key: &str, time_ms: u64) -> Result<(), String> {
    let store = store.clone();
    let key = key.to_owned();
    tokio::task::spawn_blocking(move || store.delete_blob(key.as_bytes(), time_ms))
        .await
        .expect("store tasks do not panic")
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn labels(link: &Link) -> PeerLabels {
    PeerLabels {
        partition: link.partition.to_string(),
        peer: link.peer.clone(),
    }
}
