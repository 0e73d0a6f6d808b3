//! Pool tuning. Defaults follow the Ambry article and DESIGN.md §11, measured on loopback.

use std::time::Duration;

use bytesize::ByteSize;
use larder_tls::MutualTls;
use serde::{Deserialize, Serialize};

/// Tuning of the frontend → storage HTTP/2 pool.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// HTTP/2 connections per storage node. h2 serialises a connection's streams behind one lock,
    /// so several connections spread work over cores (Ambry: 4 was within 1 % of 8).
    pub connections_per_node: usize,
    /// Per-stream receive window. 4 MiB lets a whole chunk be in flight without a WINDOW_UPDATE
    /// round trip (Ambry raised it from 64 KiB for exactly this).
    pub stream_window: ByteSize,
    /// Per-connection receive window: room for several concurrent chunk downloads.
    pub connection_window: ByteSize,
    /// Largest frame we agree to receive. The peer sends with the size we advertise, so this sets
    /// the frame size of downloads (16 KiB → 1 MiB took 4 MiB GETs from ~2.3 to ~6 GiB/s).
    pub max_frame_size: ByteSize,
    /// How much h2 buffers per stream before the sender waits: the equivalent of Netty's
    /// write-buffer high-water mark, which had to be raised before large frames took effect.
    pub max_send_buffer: ByteSize,
    /// SO_SNDBUF / SO_RCVBUF; unset leaves the kernel's autotuning alone.
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
    /// Backoff between failed connection attempts to one node: starts here, doubles up to the max.
    #[serde(with = "humantime_serde")]
    pub reconnect_backoff_min: Duration,
    #[serde(with = "humantime_serde")]
    pub reconnect_backoff_max: Duration,
    /// Mutual TLS to the storage nodes (`[pool.tls]`: `ca`, `cert`, `key`): storage nodes must
    /// present a certificate from the cluster CA for their address, and this frontend presents
    /// its own. Absent: cleartext h2c (a trusted network only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<MutualTls>,
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
        }
    }
}

impl PoolConfig {
    /// Checks ranges the HTTP/2 spec and h2 impose, with a message naming the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.connections_per_node == 0 {
            return Err("pool.connections_per_node must be at least 1".into());
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
