//! `larder frontend --config F`: the frontend's typed configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use larder_pool::PoolConfig;
use larder_router::RouterConfig;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontendConfig {
    /// Cleartext listener: HTTP/1.1 and h2c (prior knowledge) on the same port.
    pub listen: SocketAddr,
    /// Path of the cluster map (relative paths are relative to the config file).
    pub cluster_map: PathBuf,
    /// This frontend's datacenter (a name from the cluster map).
    pub datacenter: String,
    /// Largest blob accepted in one upload. Chunking of larger blobs is a later milestone; until
    /// then larger uploads get 413.
    #[serde(default = "default_max_blob")]
    pub max_blob_size: ByteSize,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub pool: PoolConfig,
    #[serde(default)]
    pub router: RouterConfig,
    /// On SIGTERM, wait this long for in-flight requests (GOAWAY is sent first).
    #[serde(default = "default_grace", with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

fn default_max_blob() -> ByteSize {
    ByteSize::mib(4)
}

fn default_grace() -> Duration {
    Duration::from_secs(10)
}

/// Protections of the public listener.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// HTTP/2 streams one client connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Largest request header block (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE; HTTP/1.1 buffer).
    pub max_header_list_size: ByteSize,
    /// An HTTP/1.1 client must send its request headers within this time (slowloris defence).
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_concurrent_streams: 1024,
            max_header_list_size: ByteSize::kib(64),
            header_read_timeout: Duration::from_secs(10),
        }
    }
}

impl FrontendConfig {
    /// A config with every default, for `larder config defaults`.
    pub fn example() -> FrontendConfig {
        FrontendConfig {
            listen: "127.0.0.1:8080".parse().expect("valid address"),
            cluster_map: "cluster.toml".into(),
            datacenter: "dc1".into(),
            max_blob_size: default_max_blob(),
            limits: Limits::default(),
            pool: PoolConfig::default(),
            router: RouterConfig::default(),
            shutdown_grace: default_grace(),
        }
    }
}
