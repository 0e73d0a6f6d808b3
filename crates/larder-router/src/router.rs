//! Blob operations across replicas.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use larder_cluster::{BlobId, BlobKind, ClusterMap, PartitionId, PartitionState};
use larder_pool::{Body, StoragePool};
use larder_proto::{blob_path, header as h, BlobProperties, ByteRange};
use rand::seq::IndexedRandom;
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

use crate::order::{read_order, replicas_in};
use crate::{NodeHealth, RouterConfig};

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// Not enough replicas could be reached or acknowledged (503).
    #[error("{0}")]
    Unavailable(String),
    /// The operation's deadline passed (504).
    #[error("operation timed out after {0:?}")]
    Timeout(Duration),
    /// The blob ID names a partition this cluster does not have (404).
    #[error("no partition {0} in this cluster")]
    UnknownPartition(PartitionId),
}

/// What a GET or HEAD found.
pub enum GetAnswer {
    /// A replica's answer to relay: 200, 206, 410 (deleted or expired), 416.
    Replica(Response<Incoming>),
    /// Enough replicas say the blob does not exist that no quorum write can have stored it.
    NotFound,
}

pub struct Router {
    map: Arc<ClusterMap>,
    pool: StoragePool,
    config: RouterConfig,
    datacenter: String,
    datacenter_id: u8,
    health: NodeHealth,
}

/// The outcome of one request to one replica.
type ReplicaResult = Result<Response<Incoming>, String>;

impl Router {
    pub fn new(
        map: Arc<ClusterMap>,
        pool: StoragePool,
        config: RouterConfig,
        datacenter: &str,
    ) -> Result<Router, String> {
        let dc = map
            .datacenter(datacenter)
            .ok_or_else(|| format!("datacenter {datacenter:?} is not in the cluster map"))?;
        let datacenter_id = dc.id;
        let nodes = map.nodes.iter().map(|n| n.id.clone());
        let health = NodeHealth::new(nodes, config.failures_to_mark_down, config.down_backoff);
        Ok(Router {
            map,
            pool,
            config,
            datacenter: datacenter.to_owned(),
            datacenter_id,
            health,
        })
    }

    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    pub fn health(&self) -> &NodeHealth {
        &self.health
    }

    pub fn pool(&self) -> &StoragePool {
        &self.pool
    }

    pub fn datacenter(&self) -> &str {
        &self.datacenter
    }

    /// Stores `data` on a quorum of a random writable partition's local replicas; on failure,
    /// once more on another partition. Returns the new blob's ID.
    pub async fn put_blob(
        self: &Arc<Self>,
        props: &BlobProperties,
        data: Bytes,
    ) -> Result<BlobId, RouterError> {
        let deadline = Instant::now() + self.config.operation_timeout;
        let first = self.pick_partition(None)?;
        let first_error = match self.put_on(first, props, data.clone(), deadline).await {
            Ok(id) => return Ok(id),
            Err(err) => err,
        };
        tracing::warn!(partition = first, error = %first_error, "put failed; retrying on another partition");
        let second = self.pick_partition(Some(first))?;
        self.put_on(second, props, data, deadline).await.map_err(|second_error| {
            RouterError::Unavailable(format!(
                "not enough storage replicas acknowledged the write (partition {first}: {first_error}; partition {second}: {second_error})"
            ))
        })
    }

    /// A random read-write partition, preferring those whose local replicas are all up.
    fn pick_partition(&self, except: Option<PartitionId>) -> Result<PartitionId, RouterError> {
        let writable: Vec<_> = self
            .map
            .partitions
            .iter()
            .filter(|p| p.state == PartitionState::ReadWrite && Some(p.id) != except)
            .collect();
        let healthy: Vec<_> = writable
            .iter()
            .filter(|p| {
                replicas_in(&self.map, p, &self.datacenter)
                    .iter()
                    .all(|n| !self.health.is_down(n))
            })
            .collect();
        let rng = &mut rand::rng();
        healthy
            .choose(rng)
            .map(|p| p.id)
            .or_else(|| writable.choose(rng).map(|p| p.id))
            .ok_or_else(|| RouterError::Unavailable("no writable partition".into()))
    }

    async fn put_on(
        self: &Arc<Self>,
        partition: PartitionId,
        props: &BlobProperties,
        data: Bytes,
        deadline: Instant,
    ) -> Result<BlobId, String> {
        let id = BlobId::mint(BlobKind::Simple, self.datacenter_id, partition);
        let local = replicas_in(
            &self.map,
            self.map.partition(partition).expect("picked from the map"),
            &self.datacenter,
        );
        let crc = crc32c::crc32c(&data);
        let results = self.fan_out(&local, deadline, |router, node| {
            let props = props.clone();
            let data = data.clone();
            async move {
                router
                    .put_one(&node, partition, &id, &props, data, crc)
                    .await
            }
        });
        match self
            .await_quorum(results, local.len(), |r| {
                matches!(r.status(), StatusCode::CREATED | StatusCode::OK)
            })
            .await
        {
            Ok(()) => Ok(id),
            Err(err) => {
                // The ID was never handed out, so nothing can read it; tombstone what did land.
                self.spawn_cleanup(partition, id);
                Err(err)
            }
        }
    }

    async fn put_one(
        &self,
        node: &str,
        partition: PartitionId,
        id: &BlobId,
        props: &BlobProperties,
        data: Bytes,
        crc: u32,
    ) -> ReplicaResult {
        let mut request = Request::builder()
            .method(Method::PUT)
            .uri(blob_path(partition, &id.to_string()))
            .header(header::CONTENT_LENGTH, data.len())
            .header(h::BODY_CRC32C, crc)
            .body(larder_pool::full(data))
            .expect("valid request");
        props.write_headers(request.headers_mut());
        self.send(node, request).await
    }

    fn spawn_cleanup(self: &Arc<Self>, partition: PartitionId, id: BlobId) {
        let router = self.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + router.config.operation_timeout;
            let _ = router.delete_on_all(partition, &id, deadline).await;
        });
    }

    /// Sends one request with the per-request timeout, recording the node's health.
    async fn send(&self, node: &str, request: Request<Body>) -> ReplicaResult {
        match timeout(self.config.request_timeout, self.pool.send(node, request)).await {
            Ok(Ok(response)) => {
                self.health.record_success(node);
                Ok(response)
            }
            Ok(Err(err)) => {
                self.health.record_failure(node);
                Err(err.to_string())
            }
            Err(_) => {
                self.health.record_failure(node);
                Err(format!(
                    "{node} did not answer within {:?}",
                    self.config.request_timeout
                ))
            }
        }
    }

    /// Starts `op` against every node in its own task (so stragglers finish after a quorum
    /// answered) and returns the channel their results arrive on.
    fn fan_out<F, Fut>(
        self: &Arc<Self>,
        nodes: &[String],
        deadline: Instant,
        op: F,
    ) -> mpsc::Receiver<(String, ReplicaResult)>
    where
        F: Fn(Arc<Self>, String) -> Fut,
        Fut: std::future::Future<Output = ReplicaResult> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(nodes.len().max(1));
        for node in nodes {
            let task = op(self.clone(), node.clone());
            let tx = tx.clone();
            let node = node.clone();
            tokio::spawn(async move {
                let result = match tokio::time::timeout_at(deadline, task).await {
                    Ok(result) => result,
                    Err(_) => Err("operation deadline passed".to_string()),
                };
                let _ = tx.send((node, result)).await;
            });
        }
        rx
    }

    /// Waits until `quorum` of `total` answers satisfy `ok`, or until that has become impossible.
    async fn await_quorum(
        &self,
        mut results: mpsc::Receiver<(String, ReplicaResult)>,
        total: usize,
        ok: impl Fn(&Response<Incoming>) -> bool,
    ) -> Result<(), String> {
        let quorum = self.config.write_quorum.clamp(1, total.max(1));
        let (mut good, mut failures) = (0, Vec::new());
        while let Some((node, result)) = results.recv().await {
            match result {
                Ok(response) if ok(&response) => good += 1,
                Ok(response) => failures.push(format!("{node}: status {}", response.status())),
                Err(err) => failures.push(format!("{node}: {err}")),
            }
            if good >= quorum {
                return Ok(());
            }
            if failures.len() > total - quorum {
                break;
            }
        }
        Err(format!(
            "{good} of {quorum} required acknowledgements ({})",
            failures.join("; ")
        ))
    }

    /// Reads from one replica at a time in read order, failing over on errors, timeouts and 404s.
    pub async fn get_blob(
        &self,
        id: &BlobId,
        method: Method,
        range: Option<ByteRange>,
    ) -> Result<GetAnswer, RouterError> {
        let partition = self
            .map
            .partition(id.partition)
            .ok_or(RouterError::UnknownPartition(id.partition))?;
        let origin = self
            .map
            .datacenter_by_id(id.datacenter)
            .map(|d| d.name.as_str());
        let order = read_order(&self.map, partition, &self.datacenter, origin, &self.health);
        let local = replicas_in(&self.map, partition, &self.datacenter).len();
        let deadline = Instant::now() + self.config.operation_timeout;
        let (mut not_found, mut errors) = (0, Vec::new());
        for node in &order {
            let mut request = Request::builder()
                .method(method.clone())
                .uri(blob_path(id.partition, &id.to_string()));
            if let Some(range) = range {
                request = request.header(header::RANGE, range.to_header());
            }
            let request = request.body(larder_pool::empty()).expect("valid request");
            let result = tokio::time::timeout_at(deadline, self.send(node, request)).await;
            match result {
                Err(_) => return Err(RouterError::Timeout(self.config.operation_timeout)),
                Ok(Ok(response)) if response.status() == StatusCode::NOT_FOUND => not_found += 1,
                Ok(Ok(response)) if response.status().is_server_error() => {
                    errors.push(format!("{node}: status {}", response.status()))
                }
                Ok(Ok(response)) => return Ok(GetAnswer::Replica(response)),
                Ok(Err(err)) => errors.push(err),
            }
        }
        // A quorum write reached `write_quorum` local replicas, so once more than the rest say
        // "not found", no acknowledged write can exist.
        let quorum = self.config.write_quorum.clamp(1, local.max(1));
        if not_found > local.saturating_sub(quorum) {
            return Ok(GetAnswer::NotFound);
        }
        Err(RouterError::Unavailable(format!(
            "no replica could answer ({})",
            errors.join("; ")
        )))
    }

    /// Deletes at every replica; succeeds once a quorum of local replicas holds the tombstone.
    pub async fn delete_blob(self: &Arc<Self>, id: &BlobId) -> Result<(), RouterError> {
        if self.map.partition(id.partition).is_none() {
            return Err(RouterError::UnknownPartition(id.partition));
        }
        let deadline = Instant::now() + self.config.operation_timeout;
        self.delete_on_all(id.partition, id, deadline)
            .await
            .map_err(|err| {
                RouterError::Unavailable(format!("delete not acknowledged by a quorum: {err}"))
            })
    }

    async fn delete_on_all(
        self: &Arc<Self>,
        partition: PartitionId,
        id: &BlobId,
        deadline: Instant,
    ) -> Result<(), String> {
        let partition_map = self
            .map
            .partition(partition)
            .expect("checked by the caller");
        let all: Vec<String> = partition_map
            .replicas
            .iter()
            .map(|r| r.node.clone())
            .collect();
        let local = replicas_in(&self.map, partition_map, &self.datacenter);
        let time_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let path = blob_path(partition, &id.to_string());
        let results = self.fan_out(&all, deadline, |router, node| {
            let request = Request::delete(path.clone())
                .header(h::TIME_MS, time_ms)
                .body(larder_pool::empty())
                .expect("valid request");
            async move { router.send(&node, request).await }
        });
        self.await_local_quorum(results, local).await
    }

    /// Like `await_quorum`, counting only answers from replicas in this frontend's datacenter.
    async fn await_local_quorum(
        &self,
        mut results: mpsc::Receiver<(String, ReplicaResult)>,
        local: Vec<String>,
    ) -> Result<(), String> {
        let total = local.len();
        let (tx, rx) = mpsc::channel(total.max(1));
        tokio::spawn(async move {
            while let Some((node, result)) = results.recv().await {
                if local.contains(&node) && tx.send((node, result)).await.is_err() {
                    break;
                }
            }
        });
        self.await_quorum(rx, total, |r| r.status() == StatusCode::ACCEPTED)
            .await
    }
}
