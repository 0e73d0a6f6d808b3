//! `larder frontend --config F`: the frontend's typed configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use larder_pool::PoolConfig;
use larder_router::{ChunkingConfig, RouterConfig};
use serde::{Deserialize, Serialize};

pub use crate::api::DocumentsConfig;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontendConfig {
    /// Cleartext listener: HTTP/1.1 and h2c (prior knowledge) on the same port.
    pub listen: SocketAddr,
    /// Path of the cluster map (relative paths are relative to the config file).
    pub cluster_map: PathBuf,
    /// This frontend's datacenter (a name from the cluster map).
    pub datacenter: String,
    /// Largest blob accepted in one upload (413 above it). Blobs larger than
    /// `chunking.chunk_size` are stored as chunks, so this bounds disk use per blob, not memory;
    /// 64 GiB is a large video or disk image, and its manifest lists 16 Ki chunks (~440 KiB).
    #[serde(default = "default_max_blob")]
    pub max_blob_size: ByteSize,
    /// How large blobs are cut into chunks and streamed back.
    #[serde(default)]
    pub chunking: ChunkingConfig,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub pool: PoolConfig,
    #[serde(default)]
    pub router: RouterConfig,
    /// The `/document/v1` API.
    #[serde(default)]
    pub documents: DocumentsConfig,
    /// On SIGTERM, wait this long for in-flight requests (GOAWAY is sent first).
    #[serde(default = "default_grace", with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

fn default_max_blob() -> ByteSize {
    ByteSize::gib(64)
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
    /// Checks settings that depend on each other, with a message naming the setting.
    pub fn validate(&self) -> Result<(), String> {
        self.pool.validate()?;
        self.chunking.validate(self.max_blob_size.as_u64())
    }

    /// A config with every default, for `larder config defaults`.
    pub fn example() -> FrontendConfig {
        FrontendConfig {
            listen: "127.0.0.1:8080".parse().expect("valid address"),
            cluster_map: "cluster.toml".into(),
            datacenter: "dc1".into(),
            max_blob_size: default_max_blob(),
            chunking: ChunkingConfig::default(),
            limits: Limits::default(),
            pool: PoolConfig::default(),
            router: RouterConfig::default(),
            documents: DocumentsConfig::default(),
            shutdown_grace: default_grace(),
        }
    }
}
