use std::time::Duration;

use bytesize::ByteSize;

use serde::{Deserialize, Serialize};

/// Quorum, timeouts and health settings of the router.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouterConfig {
    /// Replicas in the local datacenter that must acknowledge a PUT or DELETE durably.
    pub write_quorum: usize,
    /// Deadline of a whole client operation (all retries and failovers included).
    #[serde(with = "humantime_serde")]
    pub operation_timeout: Duration,
    /// Deadline for one request to one storage node to answer with headers.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Consecutive failures (connection errors, timeouts) that mark a node down.
    pub failures_to_mark_down: u32,
    /// How long a down node is tried last; after it, one probe request tests it again.
    #[serde(with = "humantime_serde")]
    pub down_backoff: Duration,
    /// How long the background health check of a replica still silent after losing a hedge race
    /// may take before it counts as a failure (or ten hedge delays, if longer: under saturation
    /// everything is slow). Short, because a health check costs the node nothing and a stalled
    /// node (`failures_to_mark_down` of these) should be asked last soon: until then a third of
    /// its partitions' reads wait for the hedge delay.
    #[serde(with = "humantime_serde")]
    pub health_check_timeout: Duration,
    /// Hedged reads: ask the next replica too when the first is slower than usual.
    pub hedging: bool,
    /// A download (of more than 1 MiB still to send) whose client has not asked for more for
    /// this long lets go of its replica's stream, which gives the pool connection's window back
    /// to the other streams, and reads the rest anew when the client reads again (`park.rs`).
    /// Shorter frees the window sooner for the downloads behind stalled ones; longer parks fewer
    /// slow readers (a client reading less than ~400 KiB per period is parked each period).
    /// 0 turns it off.
    #[serde(with = "humantime_serde")]
    pub park_stalled_reads_after: Duration,
    /// The bytes this frontend's downloads may hold at once: frames taken from replicas and
    /// chunks fetched, until their clients have read them (`download_budget.rs`). A download
    /// under way waits for its share; a new one waits at most `download_budget_wait`, then
    /// 503 `DownloadBudgetSpent`. 1 GiB: a thousand downloads' frames, while clients that read
    /// nothing can no longer make a frontend hold any amount. At least 8 MiB.
    pub download_budget: ByteSize,
    #[serde(with = "humantime_serde")]
    pub download_budget_wait: Duration,
    /// "Slower than usual": this percentile of recent latency in the replica's datacenter.
    pub hedge_percentile: f64,
    /// Samples needed before the percentile is trusted; until then `hedge_fallback_delay`.
    pub hedge_min_samples: usize,
    #[serde(with = "humantime_serde")]
    pub hedge_fallback_delay: Duration,
    /// Floor of the hedge delay, so a very fast datacenter does not double every request.
    #[serde(with = "humantime_serde")]
    pub hedge_min_delay: Duration,
    /// Ceiling of the hedge delay (unset: none), for a bound on how long a read waits for one
    /// replica whatever the percentile says. `0ms` hedges every read at once, to every replica
    /// in read order (a load test of the hedging path).
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub hedge_max_delay: Option<Duration>,
    /// Also wait for one replica in another datacenter to acknowledge a PUT (by default remote
    /// datacenters receive blobs by replication only).
    pub wait_for_remote_ack: bool,
    /// How long a read holding only a catching-up replica's "found" keeps asking again the
    /// local replicas that failed to answer (a node just restarted, a connection still in its
    /// reconnect backoff) for the confirmation it needs, before it answers 503. A little more
    /// than the pool's backoff after a refused connection (50 ms), so a node back on its port
    /// is asked again; it is also how much longer a read waits before a 503 while the
    /// confirming replicas are down.
    #[serde(with = "humantime_serde")]
    pub confirm_retry_for: Duration,
    /// How long a read keeps asking again replicas that answered "not yet" (503 with
    /// `Retry-After`: not checked against their peers since their process started, or busy)
    /// before it answers 503. After a whole cluster restarts, every replica says so until its
    /// first replication round is answered (well under a second; seconds on a loaded machine).
    #[serde(with = "humantime_serde")]
    pub not_yet_retry_for: Duration,
    /// Blobs of at most this size (at most 1 MiB) are written to a storage node many to a
    /// request while `put_requests_in_flight` requests to that node are on the way
    /// (`put_batch.rs`): under load one exchange carries dozens of small PUTs, each costing
    /// both sides less CPU than a request of its own; a light load sends each PUT alone at
    /// once. `0 B` sends every PUT alone.
    pub batch_puts_up_to: ByteSize,
    /// Requests to one storage node that small PUTs may keep in flight before the next
    /// ones wait to go together. At least 1.
    pub put_requests_in_flight: usize,
    /// GETs of whole blobs to a storage node go many to a request while
    /// `get_requests_in_flight` requests to that node are on the way (`get_batch.rs`); the
    /// node answers blobs of at most this size (at most 64 KiB) inline and tells the
    /// frontend to ask for larger ones alone. `0 B` sends every GET alone.
    pub batch_gets_up_to: ByteSize,
    /// Requests to one storage node that GETs may keep in flight before the next ones wait to
    /// go together. At least 1.
    pub get_requests_in_flight: usize,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            write_quorum: 2,
            operation_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(5),
            failures_to_mark_down: 3,
            down_backoff: Duration::from_secs(2),
            health_check_timeout: Duration::from_millis(200),
            hedging: true,
            hedge_percentile: 0.95,
            hedge_min_samples: 100,
            hedge_fallback_delay: Duration::from_millis(20),
            hedge_min_delay: Duration::from_micros(500),
            park_stalled_reads_after: Duration::from_secs(5),
            download_budget: ByteSize::gib(1),
            download_budget_wait: Duration::from_secs(1),
            hedge_max_delay: None,
            wait_for_remote_ack: false,
            confirm_retry_for: Duration::from_millis(300),
            not_yet_retry_for: Duration::from_secs(3),
            batch_puts_up_to: ByteSize::kib(64),
            put_requests_in_flight: 2,
            batch_gets_up_to: ByteSize::kib(64),
            get_requests_in_flight: 2,
        }
    }
}
