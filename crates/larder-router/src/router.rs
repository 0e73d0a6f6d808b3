//! The router's shared plumbing: construction, sending one request, fanning out, quorums.

use std::sync::Arc;
use std::time::Duration;

use std::ops::Range;

use http::{Request, Response};
use hyper::body::Incoming;
use larder_cluster::ClusterMap;
use larder_pool::{Body, StoragePool};
use larder_proto::BlobProperties;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::time::{timeout, timeout_at, Instant};

use crate::download_budget::{DownloadBudget, Share};
use crate::journal::UploadJournal;
use crate::latency::LatencyTracker;
use crate::map_cell::MapCell;
use crate::replies::Replies;
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
    UnknownPartition(u32),
    /// Replicas refused the write because their disks are full (507).
    #[error("{0}")]
    OutOfSpace(String),
    /// A replica refused the request itself (a 4xx it would give again), with its message.
    #[error("{0}")]
    Rejected(String),
    /// This frontend's downloads hold all of `router.download_budget`, and a new one found no
    /// share within `download_budget_wait` (503 with `Retry-After`).
    #[error("{0}")]
    DownloadBudgetSpent(String),
}

/// Why a write did not reach its quorum.
#[derive(Debug)]
pub(crate) struct QuorumError {
    pub message: String,
    /// A replica answered 507: its disk is full (or below its free-space reserve).
    pub out_of_space: bool,
}

impl QuorumError {
    pub fn other(message: String) -> Self {
        QuorumError {
            message,
            out_of_space: false,
        }
    }
}

impl std::fmt::Display for QuorumError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What a GET or HEAD of a blob found, decoded from a replica's answer: the frontend never sees
/// a storage node's status or headers.
pub enum GetAnswer {
    /// The blob (or the requested range of it), with its properties.
    Found(FoundBlob),
    /// It cannot be served; see [`Missing`].
    Missing(Missing),
}

/// A blob a replica serves.
pub struct FoundBlob {
    pub properties: BlobProperties,
    /// Size of the whole blob.
    pub size: u64,
    /// The bytes of `body` within the blob: all of it, or the requested range.
    pub selected: Range<u64>,
    /// Whether a range was asked for and is what `body` holds (a 206 for the client).
    pub partial: bool,
    /// The replica was catching up (it may lack a recent tombstone): the router serves it
    /// only once confirmed (`read.rs`).
    pub catching_up: bool,
    /// The bytes (empty for HEAD).
    pub body: crate::BlobBody,
    /// The storage node that sent them (a read of the rest avoids it if they break off).
    pub replica: String,
}

/// Why a blob cannot be served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missing {
    /// Enough replicas say the blob does not exist that no quorum write can have stored it.
    NotFound,
    /// It was deleted or has expired, at `time_ms` (ms since the Unix epoch) when known.
    Gone {
        reason: GoneReason,
        time_ms: Option<u64>,
    },
    /// The requested range starts at or past the end of a blob of `size` bytes.
    RangeNotSatisfiable { size: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoneReason {
    Deleted,
    Expired,
}

/// Whether this frontend can serve: how many local storage nodes answered a health check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readiness {
    pub reachable_local_nodes: usize,
    /// A write quorum of local nodes.
    pub needed: usize,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.reachable_local_nodes >= self.needed
    }
}

/// Counters the frontend exports; shared handles, registered by the caller.
#[derive(Clone, Default)]
pub struct RouterMetrics {
    /// Second requests sent because the first replica had not answered within the hedge delay.
    pub hedges_sent: Counter,
    /// Hedged requests whose answer was the one used.
    pub hedges_won: Counter,
    /// Blob bodies that broke off mid-way and went on from a new read (`resume.rs`).
    pub reads_resumed: Counter,
    /// Downloads whose replica stream was let go while their client did not read (`park.rs`).
    pub reads_parked: Counter,
    /// Times held-up reads made every watch look for stalled downloads at once
    /// (`park::Pressure`; at most four a second).
    pub read_pressure: Counter,
    /// Bytes this frontend's downloads hold (`download_budget.rs`), as of the last
    /// `observe_download_budget`.
    pub download_budget_held_bytes: Gauge,
    /// New downloads answered 503 because the download budget stayed spent.
    pub download_budget_refusals: Counter,
    /// Requests that carried several small blobs to one node together (`put_batch.rs`).
    pub put_batches: Counter,
    /// Blob copies written within those batches.
    pub put_batched_blobs: Counter,
    /// Requests that read several small blobs from one node together (`get_batch.rs`).
    pub get_batches: Counter,
    /// Blob reads within those batches (answered inline or sent on alone).
    pub get_batched_blobs: Counter,
}

pub struct Router {
    /// The cluster map in use, swapped whole when a newer revision arrives.
    pub(crate) maps: Arc<MapCell>,
    pub(crate) pool: StoragePool,
    pub(crate) config: RouterConfig,
    pub(crate) datacenter: String,
    pub(crate) datacenter_id: u8,
    pub(crate) health: Arc<NodeHealth>,
    pub(crate) latency: LatencyTracker,
    pub(crate) metrics: RouterMetrics,
    /// Where chunked uploads in progress are recorded, if anywhere (see `journal`).
    pub(crate) journal: Option<UploadJournal>,
    /// Journal entries recorded ahead of need (`reserve.rs`).
    pub(crate) reserved: crate::reserve::Reserved,
    /// Word that reads are held up (a node's spent read budget, a download waiting on its
    /// replica), to the park watches.
    pub(crate) pressure: Arc<crate::park::Pressure>,
    /// What downloads may hold at once (`download_budget.rs`).
    pub(crate) downloads: Arc<DownloadBudget>,
    /// The largest frame a replica sends a download in (`pool.max_frame_size`).
    pub(crate) frame: u64,
    /// Small PUTs waiting to go to their nodes together (`put_batch.rs`).
    pub(crate) put_batches: Arc<crate::batch::Batches<crate::put_batch::Puts>>,
    /// GETs waiting to go to their nodes together (`get_batch.rs`).
    pub(crate) get_batches: Arc<crate::batch::Batches<crate::get_batch::Gets>>,
    /// Blobs known to be too large for GET batches (`get_batch.rs`).
    pub(crate) large_blobs: Arc<crate::get_batch::LargeBlobs>,
}

/// Why a request ended at its operation's deadline.
pub(crate) const DEADLINE_PASSED: &str = "operation deadline passed";

/// How long `ready` waits for each local node's health check.
const READY_CHECK_TIMEOUT: Duration = Duration::from_millis(500);

/// The outcome of one request to one replica.
pub(crate) type ReplicaResult = Result<Response<Incoming>, String>;

/// A replica's answer as a quorum counts it: its status.
pub(crate) trait Answered {
    fn answered(&self) -> http::StatusCode;
}

impl Answered for Response<Incoming> {
    fn answered(&self) -> http::StatusCode {
        self.status()
    }
}

/// A blob's answer within a batch of PUTs (`put_batch.rs`), or a PUT's status alone.
impl Answered for http::StatusCode {
    fn answered(&self) -> http::StatusCode {
        *self
    }
}

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
        let health = Arc::new(NodeHealth::new(
            nodes,
            config.failures_to_mark_down,
            config.down_backoff,
        ));
        let dcs = map.datacenters.iter().map(|d| d.name.clone());
        let latency = LatencyTracker::new(dcs, config.hedge_percentile, config.hedge_min_samples);
        let maps = Arc::new(MapCell::new(map, pool.clone(), health.clone(), datacenter));
        let downloads = DownloadBudget::new(config.download_budget, config.download_budget_wait)?;
        crate::put_batch::check_config(&config)?;
        crate::get_batch::check_config(&config)?;
        Ok(Router {
            frame: pool.max_frame_size(),
            downloads: Arc::new(downloads),
            maps,
            pool,
            config,
            datacenter: datacenter.to_owned(),
            datacenter_id,
            health,
            latency,
            metrics: RouterMetrics::default(),
            journal: None,
            reserved: Default::default(),
            pressure: Default::default(),
            put_batches: Default::default(),
            get_batches: Default::default(),
            large_blobs: Default::default(),
        })
    }

    /// A router over the same map, pool and node health that reads, writes and serialises as if
    /// it ran in `datacenter`: quorums are counted there, and read-modify-writes are decided at
    /// that datacenter's partition primary. For records that must have one decision point
    /// across datacenters (the S3 layer's bucket indexes and key ring): two datacenters that each
    /// serialised their own read-modify-writes of one record would each write a whole new state
    /// from what they had seen, and last-writer-wins replication would keep one and drop the
    /// other's changes. Blob IDs it mints name `datacenter`; use it for records only.
    pub fn acting_in(&self, datacenter: &str) -> Result<Router, String> {
        let map = self.map();
        let dc = map
            .datacenter(datacenter)
            .ok_or_else(|| format!("datacenter {datacenter:?} is not in the cluster map"))?;
        let dcs = map.datacenters.iter().map(|d| d.name.clone());
        Ok(Router {
            maps: self.maps.clone(),
            pool: self.pool.clone(),
            config: self.config.clone(),
            datacenter: datacenter.to_owned(),
            datacenter_id: dc.id,
            health: self.health.clone(),
            latency: LatencyTracker::new(
                dcs,
                self.config.hedge_percentile,
                self.config.hedge_min_samples,
            ),
            metrics: self.metrics.clone(),
            journal: None,
            reserved: Default::default(),
            pressure: self.pressure.clone(),
            downloads: self.downloads.clone(),
            frame: self.frame,
            put_batches: self.put_batches.clone(),
            get_batches: self.get_batches.clone(),
            large_blobs: self.large_blobs.clone(),
        })
    }

    /// Records chunked uploads in `journal`, so that a crash mid-upload leaves no chunks behind
    /// once `clean_up_unfinished_uploads` has run at the next start.
    pub fn with_upload_journal(mut self, journal: UploadJournal) -> Router {
        self.journal = Some(journal);
        self
    }

    /// The cluster map in use now (a later call may return a newer one).
    pub fn map(&self) -> Arc<ClusterMap> {
        self.maps.get()
    }

    /// Where the map in use lives: offer it new maps, poll storage nodes for newer ones.
    pub fn maps(&self) -> &Arc<MapCell> {
        &self.maps
    }

    pub fn health(&self) -> &NodeHealth {
        &self.health
    }

    pub fn pool(&self) -> &StoragePool {
        &self.pool
    }

    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    pub fn datacenter(&self) -> &str {
        &self.datacenter
    }

    pub fn metrics(&self) -> &RouterMetrics {
        &self.metrics
    }

    /// `f` of the datacenter `node` is in ("" for a node the map does not list).
    pub(crate) fn with_datacenter_of<T>(&self, node: &str, f: impl FnOnce(&str) -> T) -> T {
        let map = self.maps.get();
        f(map.datacenter_of(node).unwrap_or(""))
    }

    /// Sends one request with the per-request timeout, recording the node's health and, for
    /// answers, the latency to response headers in the node's datacenter.
    pub(crate) async fn send(&self, node: &str, request: Request<Body>) -> ReplicaResult {
        self.send_by(node, request, None).await
    }

    /// Like `send`, giving up at the operation's `deadline` too when that comes first: one timer
    /// for both limits. Passing the operation's deadline only ends the request, as dropping it
    /// would; it says nothing about the node.
    pub(crate) async fn send_by(
        &self,
        node: &str,
        request: Request<Body>,
        deadline: Option<Instant>,
    ) -> ReplicaResult {
        self.send_timed(node, request, deadline, true).await
    }

    /// `send_by`, its latency recorded for hedging only when `record`: a batch's items record
    /// their own (`batch.rs`), from when each began to wait.
    pub(crate) async fn send_timed(
        &self,
        node: &str,
        request: Request<Body>,
        deadline: Option<Instant>,
        record: bool,
    ) -> ReplicaResult {
        let started = Instant::now();
        let request_deadline = started + self.config.request_timeout;
        let until = deadline.map_or(request_deadline, |d| d.min(request_deadline));
        let mut request = request;
        self.maps.stamp(request.headers_mut());
        match timeout_at(until, self.pool.send(node, request)).await {
            Ok(Ok(response)) => {
                self.health.record_success(node);
                self.maps.saw(node, response.headers());
                if record && !response.status().is_server_error() {
                    self.record_latency(node, started);
                }
                Ok(response)
            }
            Ok(Err(err)) => {
                if err.counts_against_node() {
                    self.health.record_failure(node);
                }
                Err(err.to_string())
            }
            Err(_) if until < request_deadline => Err(DEADLINE_PASSED.to_string()),
            Err(_) => {
                // A wait behind other streams is a queue, which marking the node down would
                // only move elsewhere: `record_silence` counts only true silence.
                self.health
                    .record_silence(node, started.into_std(), until.into_std());
                Err(format!(
                    "{node} did not answer within {:?}",
                    self.config.request_timeout
                ))
            }
        }
    }

    /// A request to `node` begun at `started` was answered: a sample for its datacenter's
    /// hedge delay.
    pub(crate) fn record_latency(&self, node: &str, started: Instant) {
        let elapsed = started.elapsed();
        self.with_datacenter_of(node, |dc| self.latency.record(dc, elapsed));
    }

    /// Asks a replica that just lost a hedge race whether it is alive: a health check it does not
    /// answer in time counts as a failure: within `health_check_timeout`, or ten hedge delays
    /// when that is longer (a saturated cluster answers everything slowly; that is not a stall,
    /// and marking its nodes down would only pile the load onto the others). A node that is
    /// merely busier than its peers answers and keeps its standing; a stalled one is soon marked
    /// down and asked last. A check that times out while the node answered other requests does
    /// not count either: the node is alive, only queued.
    pub(crate) fn check_slow_replica(&self, node: &str) {
        let limit = self
            .config
            .health_check_timeout
            .max(self.hedge_delay(node) * 10);
        if !self.health.begin_check(node) {
            return;
        }
        let (pool, health, node) = (self.pool.clone(), self.health.clone(), node.to_owned());
        tokio::spawn(async move {
            let request = Request::get(larder_proto::HEALTH_PATH)
                .body(larder_pool::empty())
                .expect("valid request");
            let started = Instant::now();
            match timeout(limit, pool.send(&node, request)).await {
                Ok(Ok(response)) if response.status().is_success() => health.record_success(&node),
                Ok(Err(err)) if !err.counts_against_node() => {}
                // On a saturated machine a check can queue behind other streams for longer
                // than `limit`: `record_silence` counts only true silence.
                Err(_) => {
                    health.record_silence(&node, started.into_std(), (started + limit).into_std());
                }
                _ => health.record_failure(&node),
            }
            health.end_check(&node);
        });
    }

    /// Whether this frontend can serve: a write quorum of local storage nodes answers a health
    /// check within half a second.
    pub async fn ready(&self) -> Readiness {
        let map = self.maps.get();
        let local: Vec<&str> = map
            .nodes
            .iter()
            .filter(|n| n.datacenter == self.datacenter)
            .map(|n| n.id.as_str())
            .collect();
        let checks = local.iter().map(|node| async move {
            let request = Request::get(larder_proto::HEALTH_PATH)
                .body(larder_pool::empty())
                .expect("a GET of a constant path is a valid request");
            let answer = timeout(READY_CHECK_TIMEOUT, self.pool.send(node, request)).await;
            matches!(answer, Ok(Ok(r)) if r.status() == http::StatusCode::OK)
        });
        let reachable_local_nodes = futures_util::future::join_all(checks)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count();
        Readiness {
            reachable_local_nodes,
            needed: self.config.write_quorum.min(local.len()),
        }
    }

    /// Starts `op` against every node; their answers are awaited in the caller's task, and the
    /// ones still pending when the caller is done finish in one background task (see
    /// `Replies`). Each `op` must give up at `deadline` (`send_by`).
    pub(crate) fn fan_out<T, F, Fut>(self: &Arc<Self>, nodes: &[String], op: F) -> Replies<T>
    where
        T: Send + 'static,
        F: Fn(Arc<Self>, String) -> Fut,
        Fut: std::future::Future<Output = Result<T, String>> + Send + 'static,
    {
        let mut replies = Replies::new();
        for node in nodes {
            let task = op(self.clone(), node.clone());
            let node = node.clone();
            replies.push(async move { (node, task.await) });
        }
        replies
    }

    /// Waits until `rule` is met by answers satisfying `ok`, or until it cannot be met any more.
    pub(crate) async fn await_quorum<T: Answered + Send + 'static>(
        &self,
        results: &mut Replies<T>,
        rule: Quorum,
        ok: impl Fn(&T) -> bool,
    ) -> Result<(), QuorumError> {
        let (mut good_local, mut good_remote) = (0, 0);
        let (mut bad_local, mut bad_remote) = (0, 0);
        let mut failures = Vec::new();
        let mut out_of_space = false;
        while let Some((node, result)) = results.next().await {
            if rule.uncounted.contains(&node) {
                // A bootstrapping replica is written to but counts for no quorum.
                continue;
            }
            let local = self.with_datacenter_of(&node, |dc| dc == self.datacenter);
            match result {
                Ok(response) if ok(&response) => {
                    *(if local {
                        &mut good_local
                    } else {
                        &mut good_remote
                    }) += 1
                }
                other => {
                    *(if local {
                        &mut bad_local
                    } else {
                        &mut bad_remote
                    }) += 1;
                    failures.push(match other {
                        Ok(response) => {
                            out_of_space |=
                                response.answered() == http::StatusCode::INSUFFICIENT_STORAGE;
                            format!("{node}: status {}", response.answered())
                        }
                        Err(err) => format!("{node}: {err}"),
                    });
                }
            }
            if good_local >= rule.local && good_remote >= rule.remote {
                return Ok(());
            }
            if bad_local > rule.local_total - rule.local
                || bad_remote > rule.remote_total - rule.remote
            {
                break;
            }
        }
        let message = format!(
            "{good_local} of {} required local acknowledgements{} ({})",
            rule.local,
            if rule.remote > 0 {
                format!(", {good_remote} of {} remote", rule.remote)
            } else {
                String::new()
            },
            failures.join("; ")
        );
        Err(QuorumError {
            message,
            out_of_space,
        })
    }
}

/// Whether a replica's status says the request itself is unacceptable, so that any replica would
/// refuse it again (a key too long, a malformed header, too large): the client's fault, a 4xx for
/// it. Other 4xx (401/403 from a peer that does not accept this frontend, 408, 429) say nothing
/// about the request: another replica may answer it, and if none does the answer is a 503.
pub(crate) fn refuses_the_request(status: http::StatusCode) -> bool {
    use http::StatusCode as S;
    matches!(
        status,
        S::BAD_REQUEST
            | S::PAYLOAD_TOO_LARGE
            | S::URI_TOO_LONG
            | S::REQUEST_HEADER_FIELDS_TOO_LARGE
    )
}

/// Largest error body read from a replica for its message.
const MAX_REFUSAL_BODY: usize = 4096;

/// The message of a replica's error answer (`{"error":{"message":…}}`) with its status, read
/// until `deadline` at most; the status alone when there is no such message.
pub(crate) async fn refusal_message<B>(response: Response<B>, deadline: Instant) -> String
where
    B: hyper::body::Body<Data = bytes::Bytes>,
    B::Error: Into<larder_pool::BoxError>,
{
    refusal(response, deadline).await.message
}

/// The error code storage nodes give a time or version ahead of their clock by more than their
/// `max_clock_skew`: the fault of this frontend's clock, never of the client's request.
const CLOCK_AHEAD_CODE: &str = "FromTheFuture";

/// A replica's error answer.
pub(crate) struct Refusal {
    pub status: http::StatusCode,
    /// The node refused a time or version this frontend's clock gave (see `CLOCK_AHEAD_CODE`).
    pub clock_ahead: bool,
    pub message: String,
}

/// Reads a replica's error answer (`{"error":{"code":…,"message":…}}`) until `deadline` at
/// most.
pub(crate) async fn refusal<B>(response: Response<B>, deadline: Instant) -> Refusal
where
    B: hyper::body::Body<Data = bytes::Bytes>,
    B::Error: Into<larder_pool::BoxError>,
{
    use http_body_util::BodyExt;
    let status = response.status();
    let body = http_body_util::Limited::new(response.into_body(), MAX_REFUSAL_BODY).collect();
    let body = match tokio::time::timeout_at(deadline, body).await {
        Ok(Ok(body)) => body.to_bytes(),
        _ => bytes::Bytes::new(),
    };
    let json = serde_json::from_slice::<serde_json::Value>(&body).ok();
    let field = |name: &str| {
        json.as_ref()
            .and_then(|v| v["error"][name].as_str().map(str::to_owned))
    };
    let clock_ahead = field("code").as_deref() == Some(CLOCK_AHEAD_CODE);
    let message = match field("message") {
        Some(m) if clock_ahead => format!(
            "status {status}: {m}: this frontend's clock is ahead of that node's by more than \
             the node's max_clock_skew; check the clocks (NTP)"
        ),
        Some(m) => format!("status {status}: {m}"),
        None => format!("status {status}"),
    };
    Refusal {
        status,
        clock_ahead,
        message,
    }
}

/// How many good answers an operation needs, out of how many asked, per side. The totals
/// count caught-up replicas only; `uncounted` (bootstrapping) replicas are asked too but their
/// answers count for nothing.
#[derive(Clone, Debug)]
pub(crate) struct Quorum {
    pub local: usize,
    pub local_total: usize,
    pub remote: usize,
    pub remote_total: usize,
    pub uncounted: Vec<String>,
}

impl Router {
    /// The first share of a new download of `bytes` (its first frame or chunk), waiting at
    /// most `download_budget_wait`; held-up, it raises the pressure that parks stalled
    /// downloads.
    pub(crate) async fn admit_download(&self, bytes: u64) -> Result<Share, RouterError> {
        if let Some(share) = self.downloads.try_take(bytes) {
            return Ok(share);
        }
        self.pressure.raise(&self.metrics.read_pressure);
        match self.downloads.take_within_wait(bytes).await {
            Some(share) => Ok(share),
            None => {
                self.metrics.download_budget_refusals.inc();
                Err(RouterError::DownloadBudgetSpent(format!(
                    "this frontend's downloads hold its whole download budget ({}) and none gave back {bytes} bytes within {:?}; retry",
                    bytesize::ByteSize::b(self.config.download_budget.as_u64()),
                    self.downloads.wait()
                )))
            }
        }
    }

    /// A share of `bytes` for a download under way, waiting as long as it takes; held-up, it
    /// raises the pressure that parks stalled downloads.
    pub(crate) fn download_share(
        &self,
        bytes: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Share> + Send>> {
        if let Some(share) = self.downloads.try_take(bytes) {
            return Box::pin(std::future::ready(share));
        }
        self.pressure.raise(&self.metrics.read_pressure);
        Box::pin(self.downloads.take(bytes))
    }

    /// Resolves the next time reads are held up (`park::Pressure`: a spent download budget, a
    /// storage node's spent read budget, a download waiting on its replica), at most four
    /// times a second: the frontend's edge then drops connections that take nothing.
    pub async fn held_up(&self) {
        self.pressure.raised().await
    }

    /// Sets `download_budget_held_bytes` to what downloads hold now (for a metrics scrape).
    pub fn observe_download_budget(&self) {
        let held = i64::try_from(self.downloads.held()).unwrap_or(i64::MAX);
        self.metrics.download_budget_held_bytes.set(held);
    }
}
