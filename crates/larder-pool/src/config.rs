//! Pool tuning. Defaults follow the Ambry article and the HTTP/2 facts in docs/STACK.md, measured
//! on loopback.

use std::time::Duration;

use bytesize::ByteSize;
use larder_tls::MutualTls;
use serde::{Deserialize, Serialize};

/// Tuning of the frontend → storage HTTP/2 pool.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// HTTP/2 connections per storage node, used round-robin, each carrying any number of
    /// concurrent streams. h2 serialises a connection's streams behind one lock and one TCP
    /// connection is limited by its own congestion window, so a few connections spread the work
    /// over cores and paths. 4 is Ambry's production choice (4 was within 1 % of 8 in their
    /// throughput test; benchmarks/b2-pool-connections measures it here).
    pub connections_per_node: usize,
    /// Per-stream receive window (HTTP/2 SETTINGS_INITIAL_WINDOW_SIZE we advertise): how much a
    /// storage node may send on one stream before waiting for our WINDOW_UPDATE. 4 MiB lets a
    /// whole chunk be in flight without a round trip; the protocol default of 64 KiB caps a stream
    /// at 64 KiB per RTT (Ambry raised it for exactly this; benchmarks/b3-flow-control-windows).
    pub stream_window: ByteSize,
    /// Per-connection receive window: shared by all streams of a connection, so 16 MiB leaves
    /// room for four concurrent chunk downloads at full speed.
    pub connection_window: ByteSize,
    /// Largest frame we agree to receive (SETTINGS_MAX_FRAME_SIZE). The peer sends with the size
    /// we advertise, so this sets the DATA frame size of downloads from storage (the storage
    /// node's own `http2.max_frame_size` sets it for uploads). Fewer, larger frames cost less CPU
    /// per byte: 16 KiB → 1 MiB took 4 MiB GETs on loopback from ~2.3 to ~6 GiB/s; beyond 1 MiB
    /// nothing more was gained. The main knob (tests/wire_frames.rs checks it on the wire).
    pub max_frame_size: ByteSize,
    /// How much h2 buffers per stream before the body producer must wait (`max_send_buf_size`;
    /// hyper's default is 400 KiB): the nearest equivalent of Netty's write-buffer high-water
    /// mark, which Ambry had to raise before large frames took effect. In h2 it does not cap the
    /// frame size (tests/wire_frames.rs sends 1 MiB frames with a 64 KiB send buffer); it bounds
    /// memory per stream and how far a sender can run ahead of flow control. 4 MiB = one chunk,
    /// so a chunk upload is handed to h2 at once. What did cap frames here, like Netty's mark in
    /// Ambry, was the storage node handing h2 256 KiB pieces: h2 never joins small pieces into
    /// large frames (fixed in the storage node's store options).
    pub max_send_buffer: ByteSize,
    /// SO_SNDBUF / SO_RCVBUF. Unset (the default) leaves Linux's autotuning alone, which grows
    /// buffers to the bandwidth-delay product by itself (tcp_rmem/tcp_wmem up to 6/4 MiB);
    /// setting a value turns autotuning off for the socket. Ambry set 4 MiB on a JVM where
    /// autotuning did not apply.
    pub tcp_send_buffer: Option<ByteSize>,
    pub tcp_recv_buffer: Option<ByteSize>,
    /// Give up connecting after this long.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Send a PING after this much idle time, to find dead connections before requests do.
    #[serde(with = "humantime_serde")]
    pub keepalive_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub keepalive_timeout: Duration,
    /// Backoff between failed connection attempts to one node: starts here, doubles up to the
    /// max (a refused connection keeps the minimum: the node may be restarting).
    #[serde(with = "humantime_serde")]
    pub reconnect_backoff_min: Duration,
    #[serde(with = "humantime_serde")]
    pub reconnect_backoff_max: Duration,
    /// Mutual TLS to the storage nodes (`[pool.tls]`: `ca`, `cert`, `key`): storage nodes must
    /// present a certificate from the cluster CA for their address, and this frontend presents
    /// its own. Absent: cleartext h2c (a trusted network only). The files are re-read on SIGHUP
    /// (a broken one keeps the old files in use); connections opened after it use the new ones,
    /// open connections keep theirs until they close.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<MutualTls>,
    /// `http2` (the design), or `http1-for-comparison`: a pool of HTTP/1.1 connections that
    /// carry one request at a time, the way Ambry's pre-HTTP/2 stack did. It exists only to
    /// measure what HTTP/2 buys (benchmarks/b4-http1-vs-http2-pool); never use it otherwise.
    pub protocol: PoolProtocol,
    /// Connections per storage node in `http1-for-comparison` mode; a request waits for a free
    /// one. 30 is what Ambry ran with before HTTP/2.
    pub http1_connections_per_node: usize,
}

/// Which protocol the pool speaks to storage nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolProtocol {
    #[default]
    Http2,
    /// One request per connection at a time; for benchmarks only.
    Http1ForComparison,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            connections_per_node: 4,
            stream_window: ByteSize::mib(4),
            connection_window: ByteSize::mib(16),
            max_frame_size: ByteSize::mib(1),
            max_send_buffer: ByteSize::mib(4),
            tcp_send_buffer: None,
            tcp_recv_buffer: None,
            connect_timeout: Duration::from_secs(1),
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(5),
            reconnect_backoff_min: Duration::from_millis(50),
            reconnect_backoff_max: Duration::from_secs(2),
            tls: None,
            protocol: PoolProtocol::Http2,
            http1_connections_per_node: 30,
        }
    }
}

impl PoolConfig {
    /// Checks ranges the HTTP/2 spec and h2 impose, with a message naming the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.connections_per_node == 0 || self.http1_connections_per_node == 0 {
            return Err(
                "pool.connections_per_node and pool.http1_connections_per_node must be at least 1"
                    .into(),
            );
        }
        if self.protocol == PoolProtocol::Http1ForComparison && self.tls.is_some() {
            return Err(
                "pool.protocol = \"http1-for-comparison\" does not support pool.tls".into(),
            );
        }
        let frame = self.max_frame_size.as_u64();
        if !(16_384..=16_777_215).contains(&frame) {
            return Err("pool.max_frame_size must be between 16KiB and 16MiB-1".into());
        }
        for (name, v) in [
            ("stream_window", self.stream_window),
            ("connection_window", self.connection_window),
        ] {
            if v.as_u64() < 65_535 || v.as_u64() > i32::MAX as u64 {
                return Err(format!("pool.{name} must be between 64KiB-1 and 2GiB-1"));
            }
        }
        Ok(())
    }
}
