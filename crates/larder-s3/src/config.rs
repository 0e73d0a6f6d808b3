//! `[s3]` in the frontend's config: the S3 listener.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// The S3 API's own port (HTTP/1.1 and h2c prior knowledge), apart from the main port
    /// whose `/` belongs to Vespa's tools.
    pub listen: SocketAddr,
    /// An S3 port with TLS (HTTP/1.1 and HTTP/2 by ALPN), with the frontend's `[tls]`
    /// certificate and key (reloaded with them on SIGHUP). Needs `[tls]`. Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_listen: Option<SocketAddr>,
    /// How long the blob of an overwritten or deleted name stays readable before it is
    /// tombstoned: a GET that resolved the name just before may still be reading it.
    #[serde(default = "default_grace", with = "humantime_serde")]
    pub replaced_blob_grace: Duration,
    /// How often this frontend tombstones the blobs whose grace period is over.
    #[serde(default = "default_sweep", with = "humantime_serde")]
    pub sweep_interval: Duration,
}

fn default_grace() -> Duration {
    Duration::from_secs(15 * 60)
}

fn default_sweep() -> Duration {
    Duration::from_secs(60)
}
