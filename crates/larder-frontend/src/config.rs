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
    /// Optional TLS listener on its own port: ALPN picks h2 or http/1.1. Absent: cleartext only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<PublicTls>,
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
    /// A directory of this frontend's own (relative to the config file) where chunked uploads
    /// in progress are journalled, so that the chunks of uploads cut short by a crash are
    /// tombstoned when it starts again. Unset: such chunks stay on disk, invisible but unreclaimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_journal_dir: Option<PathBuf>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub pool: PoolConfig,
    /// How this frontend proves itself to storage nodes without `[pool.tls]` (`[auth]`).
    #[serde(default)]
    pub auth: FrontendAuth,
    #[serde(default)]
    pub router: RouterConfig,
    /// The `/document/v1` API.
    #[serde(default)]
    pub documents: DocumentsConfig,
    /// The S3-compatible API on its own port (`[s3]`). Absent: no S3 port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<larder_s3::S3Config>,
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

/// `[auth]`: the cluster secret this frontend proves to storage nodes (and checks that they
/// prove back) on every cleartext pool connection, before its first HTTP byte.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FrontendAuth {
    /// The cluster secret file (the first line signs; relative paths are relative to the config
    /// file), re-read on SIGHUP (a broken file keeps the old secrets). Unused with `[pool.tls]`.
    /// Absent without `[pool.tls]`: the pool reaches only storage nodes in insecure mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    /// Every `/v1/blobs` request must carry a presigned URL (SigV4 in the query, as `larder s3
    /// presign … /v1/blobs/<id>` makes them) of a key from the cluster's key ring with a grant
    /// on every bucket (`*`): read for GET and HEAD, write for POST and DELETE. Off: the blob
    /// API is open to whoever reaches the port (the default, as behind a trusted network).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub require_signed_blob_urls: bool,
}

impl FrontendAuth {
    /// Loads the secret file, if one is configured.
    pub fn credentials(&self) -> Result<Option<std::sync::Arc<larder_auth::Credentials>>, String> {
        self.secret_file
            .as_deref()
            .map(|path| larder_auth::Credentials::load(path).map(std::sync::Arc::new))
            .transpose()
            .map_err(|e| e.to_string())
    }
}

/// The public TLS listener (`[tls]`). The certificate and key are read again on SIGHUP; a
/// failed reload keeps the old pair and logs why.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublicTls {
    /// Address of the TLS port (HTTP/1.1 and HTTP/2 by ALPN).
    pub listen: SocketAddr,
    /// PEM certificate chain, leaf first (relative paths are relative to the config file).
    pub cert: PathBuf,
    /// PEM private key of the leaf certificate.
    pub key: PathBuf,
}

/// Protections of the public listeners (both ports), against clients that are slow, greedy or
/// hostile. Request bodies are limited by `max_blob_size`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// HTTP/2 streams one client connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
    /// 1024 leaves room for feed clients (vespa-feed-client uses 128, h2load benchmarks 256) while
    /// bounding the memory one connection can pin.
    pub max_concurrent_streams: u32,
    /// Largest request header block: HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE (larger requests get
    /// 431 or a reset; a CONTINUATION flood past it closes the connection), and the HTTP/1.1 read
    /// buffer. 64 KiB is four times what browsers send with large cookies.
    pub max_header_list_size: ByteSize,
    /// Largest HTTP/2 frame a client may send (SETTINGS_MAX_FRAME_SIZE). The protocol's 16 KiB:
    /// common clients send DATA in 16 KiB frames anyway, and it bounds what one frame can make
    /// the server buffer. (Downloads use the frame size the client advertises.)
    pub max_frame_size: ByteSize,
    /// Per-stream receive window advertised to clients (SETTINGS_INITIAL_WINDOW_SIZE): how much
    /// of an upload may arrive before the client waits for our WINDOW_UPDATE. 4 MiB, one chunk,
    /// so a distant client is not held to 64 KiB per round trip (benchmarks/b3-flow-control-windows
    /// shows what that costs at 5-20 ms).
    pub stream_window: ByteSize,
    /// Per-connection receive window to clients: bounds what one connection's unread uploads can
    /// make the server buffer, whatever its number of streams.
    pub connection_window: ByteSize,
    /// How much h2 buffers per download stream before the body producer waits (the client reads
    /// slowly): memory per stream, like Netty's write-buffer high-water mark.
    pub max_send_buffer: ByteSize,
    /// A client must complete the TLS handshake, send its first bytes (which tell HTTP/1.1 from
    /// h2c), and, over HTTP/1.1, each request's headers within this time (slowloris defence). An idle HTTP/1.1 keep-alive connection is closed
    /// after it too.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection on which no byte moved either way for this long is closed (GOAWAY first on
    /// HTTP/2; dropped if still silent after another period, or at once if its socket takes
    /// nothing the server has to write: such a close would never finish). Reaps abandoned
    /// streams too.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// When reads are held up (this frontend's download budget is spent, or a storage node's
    /// read budget, or a download waits on its replica), a connection whose socket has taken
    /// nothing the server had to write for this long is dropped: its client reads nothing, and
    /// what it pins (a frame of each download, their shares of the download budget) is what
    /// holds the others up. Without pressure, only `idle_timeout` applies. 0 turns it off.
    #[serde(with = "humantime_serde")]
    pub stalled_send_timeout: Duration,
    /// A request body from which nothing arrives for this long is abandoned (408 for blob
    /// uploads). Per stream, so one stalled upload on a busy HTTP/2 connection is caught; time
    /// the server itself spends not reading (backpressure while chunks are stored) does not count.
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// Connections one client IP address may hold open at once (0: no limit); more are closed
    /// right after accept. Cheap insurance against one host exhausting file descriptors.
    pub max_connections_per_ip: usize,
    /// Streams a client may reset before the server accepted them, per connection, before it is
    /// sent GOAWAY (ENHANCE_YOUR_CALM): the rapid-reset defence (CVE-2023-44487). h2's default.
    pub max_pending_accept_reset_streams: usize,
    /// Streams the server may reset because of the client's protocol errors, per connection,
    /// before it is sent GOAWAY (RUSTSEC-2024-0003). hyper's default.
    pub max_local_error_reset_streams: usize,
    /// Request bodies one connection may hold buffered in memory at once, summed over its
    /// streams (document bodies are read whole, up to `documents.max_document_size` each, gzip
    /// bodies twice: compressed and decoded). A request that would pass it gets 429 with
    /// `Retry-After`. 64 MiB: a feed client's 128 streams of typical documents, while one
    /// connection can no longer pin gigabytes.
    pub buffered_bodies_per_connection: ByteSize,
    /// The same budget for all connections together: what request bodies may make the frontend
    /// buffer in total.
    pub buffered_bodies_per_process: ByteSize,
}

impl Limits {
    /// Checks the ranges HTTP/2 imposes, with a message naming the setting.
    pub fn validate(&self) -> Result<(), String> {
        if !(16_384..=16_777_215).contains(&self.max_frame_size.as_u64()) {
            return Err("limits.max_frame_size must be between 16KiB and 16MiB-1".into());
        }
        for (name, v) in [
            ("stream_window", self.stream_window),
            ("connection_window", self.connection_window),
        ] {
            if v.as_u64() < 65_535 || v.as_u64() > i32::MAX as u64 {
                return Err(format!("limits.{name} must be between 64KiB-1 and 2GiB-1"));
            }
        }
        if self.max_send_buffer.as_u64() == 0 {
            return Err("limits.max_send_buffer must be above 0".into());
        }
        if self.max_concurrent_streams == 0 {
            return Err("limits.max_concurrent_streams must be at least 1".into());
        }
        if self.idle_timeout.is_zero()
            || self.header_read_timeout.is_zero()
            || self.body_read_timeout.is_zero()
        {
            return Err("limits.idle_timeout, limits.header_read_timeout and \
                 limits.body_read_timeout must be above 0"
                .into());
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_concurrent_streams: 1024,
            max_header_list_size: ByteSize::kib(64),
            max_frame_size: ByteSize::kib(16),
            stream_window: ByteSize::mib(4),
            connection_window: ByteSize::mib(16),
            max_send_buffer: ByteSize::mib(4),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            stalled_send_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            max_connections_per_ip: 1024,
            max_pending_accept_reset_streams: 20,
            max_local_error_reset_streams: 1024,
            buffered_bodies_per_connection: ByteSize::mib(64),
            buffered_bodies_per_process: ByteSize::mib(512),
        }
    }
}

impl FrontendConfig {
    /// Checks settings that depend on each other, with a message naming the setting.
    pub fn validate(&self) -> Result<(), String> {
        self.pool.validate()?;
        self.limits.validate()?;
        self.validate_body_budgets()?;
        self.chunking.validate(self.max_blob_size.as_u64())
    }

    /// Each budget must fit the largest document twice (a gzip body is held compressed while it
    /// is decoded), or such documents could never be accepted.
    fn validate_body_budgets(&self) -> Result<(), String> {
        let needed = self.documents.max_document_size.as_u64().saturating_mul(2);
        let limits = &self.limits;
        for (name, budget) in [
            (
                "buffered_bodies_per_connection",
                limits.buffered_bodies_per_connection,
            ),
            (
                "buffered_bodies_per_process",
                limits.buffered_bodies_per_process,
            ),
        ] {
            if budget.as_u64() < needed {
                return Err(format!(
                    "limits.{name} must be at least twice documents.max_document_size"
                ));
            }
        }
        Ok(())
    }

    /// A config with every default, for `larder config defaults`.
    pub fn example() -> FrontendConfig {
        FrontendConfig {
            listen: "127.0.0.1:8080".parse().expect("valid address"),
            tls: None,
            cluster_map: "cluster.toml".into(),
            datacenter: "dc1".into(),
            max_blob_size: default_max_blob(),
            chunking: ChunkingConfig::default(),
            upload_journal_dir: Some("frontend-uploads".into()),
            limits: Limits::default(),
            pool: PoolConfig::default(),
            auth: FrontendAuth {
                secret_file: Some("cluster.secret".into()),
                require_signed_blob_urls: false,
            },
            router: RouterConfig::default(),
            documents: DocumentsConfig::default(),
            s3: None,
            shutdown_grace: default_grace(),
        }
    }
}
