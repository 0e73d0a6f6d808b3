use std::time::Duration;

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
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            write_quorum: 2,
            operation_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(5),
            failures_to_mark_down: 3,
            down_backoff: Duration::from_secs(2),
        }
    }
}
