//! `larder storage --config F`: the storage node's typed configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use larder_tls::MutualTls;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// This node's id in the cluster map.
    pub node_id: String,
    /// Path of the cluster map (relative paths are relative to the config file).
    pub cluster_map: PathBuf,
    /// Where replicas live: `<data_dir>/<disk>/p<partition>/`.
    pub data_dir: PathBuf,
    /// Listen address; defaults to the node's address in the cluster map.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// Mutual TLS (`[tls]`: `ca`, `cert`, `key`): only clients whose certificate chains to the
    /// cluster CA are served, and this node presents a certificate for its address. Absent:
    /// cleartext h2c (a trusted network only). All three files are re-read on SIGHUP (a broken
    /// one keeps the old files in use); new handshakes use them, open connections keep theirs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<MutualTls>,
    /// How clients prove themselves without `[tls]` (`[auth]`).
    #[serde(default)]
    pub auth: AuthSettings,
    #[serde(default)]
    pub http2: Http2Settings,
    #[serde(default)]
    pub store: StoreSettings,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub replication: ReplicationConfig,
    #[serde(default)]
    pub compaction: CompactionConfig,
    /// Bootstrapping new replicas from their peers and retiring removed ones.
    #[serde(default)]
    pub redistribution: RedistributionConfig,
    /// Connections to peer storage nodes (replication), tuned like the frontend's pool.
    #[serde(default)]
    pub pool: larder_pool::PoolConfig,
    /// On SIGTERM, wait this long for in-flight requests before closing the stores.
    #[serde(default = "default_grace", with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

fn default_grace() -> Duration {
    Duration::from_secs(10)
}

/// `[auth]`: without `[tls]`, every connection to the internal API (from frontends and from
/// peer storage nodes) must first prove it holds the cluster secret (`larder-auth`'s handshake),
/// and this node proves it to them. A node with neither `[tls]` nor a secret refuses to start,
/// unless told otherwise by the setting named for what it does.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    /// The cluster secret file (one hex secret per line: the first signs, every one is
    /// accepted; relative paths are relative to the config file). Re-read on SIGHUP (a broken
    /// file keeps the old secrets). Also proves this node to its peers when it replicates over
    /// cleartext. `larder cluster init` and `larder dev` write one next to the cluster map.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    /// Serve the internal API to anyone who can reach the port, with no `[tls]` and no secret:
    /// anyone could read, delete and plant data. Only for a network nothing else can reach.
    pub insecure_unauthenticated_internal_api: bool,
}

/// Server-side HTTP/2 settings of the internal API.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Http2Settings {
    /// Streams one frontend connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Receive windows: uploads of 4 MiB chunks should not wait for WINDOW_UPDATEs.
    pub stream_window: ByteSize,
    pub connection_window: ByteSize,
    /// Largest frame we accept: sets the frame size of uploads (the sender uses what we advertise).
    pub max_frame_size: ByteSize,
    /// h2's per-stream send buffer for downloads.
    pub max_send_buffer: ByteSize,
    pub max_header_list_size: ByteSize,
    /// Streams a trusted peer (mutual TLS, or a proven cluster secret) may open and reset before
    /// this node accepts them, per connection. The frontend cancels every hedged read that lost
    /// its race with RST_STREAM; under load many are reset before they are accepted, and h2's
    /// default (20) then closes the pool's connection with ENHANCE_YOUR_CALM. Connections not
    /// known to be a peer keep h2's default, the protection against rapid-reset floods.
    pub trusted_max_pending_accept_reset_streams: usize,
    /// Streams this node may reset for a trusted peer's protocol errors (and refuse) before
    /// closing the connection; unset: no limit. h2 counts these over the connection's whole life,
    /// never forgetting one, so any finite limit would eventually close a long-lived pool
    /// connection. Other connections keep h2's default (1024).
    pub trusted_max_local_error_reset_streams: Option<usize>,
}

impl Default for Http2Settings {
    fn default() -> Self {
        Http2Settings {
            max_concurrent_streams: 1024,
            stream_window: ByteSize::mib(4),
            connection_window: ByteSize::mib(16),
            max_frame_size: ByteSize::mib(1),
            max_send_buffer: ByteSize::mib(4),
            max_header_list_size: ByteSize::kib(64),
            trusted_max_pending_accept_reset_streams: 4096,
            trusted_max_local_error_reset_streams: None,
        }
    }
}

/// Bounds on what one request, and all requests together, may make this node hold or believe.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Request bodies (blob and document PUTs, and what replication fetches) are buffered whole
    /// before they are written; together they may hold at most this much memory. A declared
    /// `Content-Length` is reserved before the body is read (an admitted upload is never turned
    /// away half-way), bytes beyond it as they arrive; a body that does not fit is answered 503
    /// with `Retry-After`, and its share is given back when the request ends, however it ends.
    pub body_budget: ByteSize,
    /// A request body that sends nothing for this long is answered 408 and its memory freed.
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// Operation times and document versions (whose high 48 bits are a time in ms) further
    /// than this ahead of this node's clock are refused: one write with a version from the far
    /// future would otherwise make every later write of that document stale.
    #[serde(with = "humantime_serde")]
    pub max_clock_skew: Duration,
    /// Blob reads larger than 64 KiB hold at most this many bytes at once, summed over every
    /// read of the node (`read_budget.rs`): each piece from before it is read until h2 has
    /// written it (a stalled read holds three). At least three times `store.read_piece_size`.
    pub read_budget: ByteSize,
    /// How long a new read waits for its share of `read_budget` before it is answered 503 with
    /// `Retry-After` (a frontend then asks another replica). A read under way never fails
    /// for want of budget: it waits.
    #[serde(with = "humantime_serde")]
    pub read_budget_wait: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_budget: ByteSize::mib(512),
            body_read_timeout: Duration::from_secs(30),
            max_clock_skew: Duration::from_secs(300),
            read_budget: ByteSize::mib(256),
            read_budget_wait: Duration::from_secs(1),
        }
    }
}

/// Log store settings for every replica on this node.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSettings {
    pub segment_size: ByteSize,
    /// Largest record; a blob chunk must fit.
    pub max_record_size: ByteSize,
    /// `durable` (default: fdatasync before acknowledging) or `relaxed-no-sync-for-benchmarks`.
    pub durability: String,
    /// Blob and document writes get 507 while the data disk has less than this free; deletes
    /// still land. A disk filled to the last byte fails writes half-way and has no room left
    /// for what frees space; this keeps some (more than the writes of a tenth of a second,
    /// when free space is counted between checks).
    pub min_free_space: ByteSize,
    /// Group commit under load: a disk's commit round starts no sooner than this after the
    /// one before it started, so that one `fdatasync` covers the writes that came meanwhile
    /// (a write that comes later starts its round at once). 0 turns it off. Measured in
    /// `benchmarks/cpu-per-request/PUT-SYNCS.md`.
    #[serde(with = "humantime_serde")]
    pub min_round_interval: Duration,
    /// A blob read larger than this is streamed in verified pieces of this size, the next
    /// read (one ahead) while the last is sent, so a read holds at most two pieces however
    /// large its record, and a slow reader makes the node read more slowly instead of holding
    /// the record. Each piece is a DATA frame at most (h2 splits larger ones, never joins
    /// smaller ones): keep it at least the frontends' `pool.max_frame_size` (1 MiB).
    pub read_piece_size: ByteSize,
    /// A record at least this large (a blob chunk, usually) is dropped from the page cache
    /// once synced and past `uncache_after_recent`, so that the next ones reuse its pages
    /// instead of taking fresh ones (0.54× a node's CPU per 4 MiB S3 PUT on a VM,
    /// `benchmarks/store/UNCACHE.md`); read back then, it comes from disk. 0 keeps everything
    /// cached.
    pub uncache_synced_from: ByteSize,
    /// How many bytes of the most recently synced large records a disk keeps in the page cache
    /// before dropping the oldest: what was just written is what is read next (a client reading
    /// its upload back, a replica catching up). 0 drops each as soon as it is synced.
    pub uncache_after_recent: ByteSize,
    /// Records at least this large are read past the page cache (`O_DIRECT`) when it does not
    /// hold the part asked for: those past `uncache_after_recent`, or evicted. Their pages are
    /// then neither filled nor kept (`benchmarks/store/DIRECT-READS.md`). 0 reads everything
    /// through the page cache.
    pub direct_cold_reads_from: ByteSize,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            segment_size: ByteSize::mib(256),
            max_record_size: ByteSize::mib(16),
            durability: "durable".into(),
            min_free_space: ByteSize::mib(256),
            min_round_interval: Duration::from_millis(1),
            read_piece_size: ByteSize::mib(1),
            uncache_synced_from: ByteSize::mib(1),
            uncache_after_recent: ByteSize::gib(1),
            direct_cold_reads_from: ByteSize::mib(1),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("store.durability {0:?} is not durable or relaxed-no-sync-for-benchmarks")]
    Durability(String),
    #[error("store.min_round_interval {0:?} is past {MAX_ROUND_INTERVAL:?}: every write would wait for it")]
    RoundInterval(Duration),
    #[error("store.read_piece_size {0} is not between 64 KiB (a checksummed block) and 16 MiB")]
    ReadPiece(ByteSize),
    #[error(
        "limits.read_budget {limit} is not between three times store.read_piece_size ({least}) and 1 TiB"
    )]
    ReadBudget { limit: ByteSize, least: ByteSize },
}

/// The longest `store.min_round_interval` taken: a write waits up to that long for its round.
pub const MAX_ROUND_INTERVAL: Duration = Duration::from_millis(100);

impl StoreSettings {
    /// The commit settings of every disk of the node.
    pub fn disk_options(&self) -> larder_store::DiskOptions {
        larder_store::DiskOptions {
            min_round_interval: self.min_round_interval,
            uncache_after_recent: self.uncache_after_recent.as_u64(),
            ..larder_store::DiskOptions::default()
        }
    }

    pub fn to_options(&self) -> Result<larder_store::Options, ConfigError> {
        let durability = match self.durability.as_str() {
            "durable" => larder_store::Durability::Durable,
            "relaxed-no-sync-for-benchmarks" => {
                larder_store::Durability::RelaxedNoSyncForBenchmarks
            }
            other => return Err(ConfigError::Durability(other.to_owned())),
        };
        if self.min_round_interval > MAX_ROUND_INTERVAL {
            return Err(ConfigError::RoundInterval(self.min_round_interval));
        }
        if !(64 << 10..=16 << 20).contains(&self.read_piece_size.as_u64()) {
            return Err(ConfigError::ReadPiece(self.read_piece_size));
        }
        Ok(larder_store::Options {
            segment_size: self.segment_size.as_u64(),
            max_record_size: self.max_record_size.as_u64(),
            durability,
            min_free_space: self.min_free_space.as_u64(),
            // Each verified piece the store returns becomes its own HTTP/2 DATA frame (h2 splits
            // pieces larger than the peer's max frame size but never joins smaller ones), so
            // 256 KiB pieces capped downloads at 256 KiB frames whatever the frontend advertised
            // (tests/wire_frames.rs caught it); pieces are streamed (`streamed.rs`).
            read_chunk_size: self.read_piece_size.as_u64() as usize,
            uncache_synced_from: Some(self.uncache_synced_from.as_u64()).filter(|&n| n > 0),
            direct_cold_reads_from: Some(self.direct_cold_reads_from.as_u64()).filter(|&n| n > 0),
            ..larder_store::Options::default()
        })
    }
}

impl StorageConfig {
    /// A config with every default, for `larder config defaults`.
    pub fn example() -> StorageConfig {
        StorageConfig {
            node_id: "s1".into(),
            cluster_map: "cluster.toml".into(),
            data_dir: "larder-data/s1".into(),
            listen: None,
            tls: None,
            auth: AuthSettings {
                secret_file: Some("cluster.secret".into()),
                insecure_unauthenticated_internal_api: false,
            },
            http2: Http2Settings::default(),
            store: StoreSettings::default(),
            limits: Limits::default(),
            replication: ReplicationConfig::default(),
            compaction: CompactionConfig::default(),
            redistribution: RedistributionConfig::default(),
            pool: larder_pool::PoolConfig::default(),
            shutdown_grace: default_grace(),
        }
    }
}

/// Background compaction of a storage node's replicas (on by default).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompactionConfig {
    /// `false` turns background compaction off (benchmarks); `POST /internal/v1/compaction`
    /// still works.
    pub enabled: bool,
    /// Pause between background passes over the node's replicas.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// A sealed segment is rewritten once this fraction of its bytes is garbage.
    pub min_garbage_ratio: f64,
    /// Copy rate limit of a background pass, in MB/s (10^6 bytes; 0: unlimited).
    pub rate_mb_per_s: u64,
    /// How old (by its operation time) a tombstone must be before compaction may drop it, on
    /// top of every other current replica having replicated past it (`DESIGN.md` 6.1). The
    /// peers' positions already cover convergence (an absent replica blocks every drop), so
    /// this only has to outlast anything that can still carry an older write of the key: a
    /// request or body in flight (timeouts of seconds to a minute), a clock up to
    /// `limits.max_clock_skew` (5 min) ahead. A day leaves a wide margin and keeps a day of
    /// deletes at most. Tests set it short; never set it below `max_clock_skew` plus the
    /// longest request deadline.
    #[serde(with = "humantime_serde")]
    pub tombstone_retention: Duration,
    /// The node is busy while more than this many blob and document requests (from frontends,
    /// and peers fetching blobs) are in flight: compaction then pauses between
    /// records, for at most 90% of its time (a node that is never idle still compacts).
    pub busy_requests: u64,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            enabled: true,
            interval: Duration::from_secs(60),
            min_garbage_ratio: 0.5,
            rate_mb_per_s: 64,
            tombstone_retention: Duration::from_secs(24 * 3600),
            busy_requests: 8,
        }
    }
}

/// Replication settings of a storage node.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicationConfig {
    pub enabled: bool,
    /// Pause between rounds once a peer has nothing new.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Changes fetched per request.
    pub page_size: usize,
    /// Bound on the work of one round per peer replica, so every partition gets its turn.
    pub max_pages_per_round: usize,
    /// Changes of one page fetched and applied at once.
    pub concurrency: usize,
    /// After errors, wait up to this long before asking the peer again (doubling from `interval`).
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// Deadline for one request to a peer: a stalled peer must not hold up the others.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// A replica answers "found" on its own only while its pulls reached the head of every
    /// caught-up peer's feed in its datacenter within this long; otherwise (just started and
    /// not caught up yet, cut off from a peer, replication off) its found answers say
    /// `x-larder-catching-up` and the frontend confirms them with another replica. A delete
    /// acknowledged longer ago than this is never read back as present through its
    /// datacenter (`ARCHITECTURE.md`, "The read path").
    #[serde(with = "humantime_serde")]
    pub caught_up_window: Duration,
    /// A link's position is saved (one `fdatasync`) at most this often while it moves; a
    /// restart pulls again what came since its last save. 0: after every page.
    #[serde(with = "humantime_serde")]
    pub cursor_save_every: Duration,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig {
            enabled: true,
            interval: Duration::from_millis(200),
            page_size: 256,
            max_pages_per_round: 16,
            concurrency: 16,
            backoff_max: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            caught_up_window: Duration::from_secs(5),
            cursor_save_every: Duration::from_secs(1),
        }
    }
}

/// `[redistribution]`: how a replica newly placed on this node copies its peers' data (one
/// streamed export per partition, `bootstrap.rs`), and how one no longer placed here goes.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedistributionConfig {
    /// Bulk copy rate of this node's bootstraps together, in MB/s (10^6 bytes; 0: as fast as
    /// the disk and the network go). The default leaves most of a disk to foreground traffic.
    pub rate_mb_per_s: u64,
    /// Bootstraps (partitions) copying at once on this node; the others wait their turn.
    pub concurrent_bootstraps: usize,
    /// Records appended per batch (one durable commit, then the bootstrap cursor is saved).
    pub batch_records: usize,
    /// ... or at most this many bytes per batch.
    pub batch_bytes: ByteSize,
    /// A replica no longer placed on this node stops being served at once; its data is deleted
    /// after this long (requests already reading it finish).
    #[serde(with = "humantime_serde")]
    pub removal_grace: Duration,
    /// Automatic re-replication: a node the map authority has not reached for this long has
    /// its replicas rebuilt on the other nodes of its datacenter (never two of a partition on
    /// one node, never fewer distinct nodes than the replica count: then it waits, logged and
    /// counted in `larder_storage_auto_replace_blocked`). `0s` turns it off (`larder dev` does).
    /// Read on the map authority and the node next in line. Ten minutes outlasts a restart or
    /// an upgrade (which should not copy a node's data), yet a dead disk is rebuilt soon.
    #[serde(with = "humantime_serde")]
    pub auto_replace_after: Duration,
}

impl Default for RedistributionConfig {
    fn default() -> Self {
        RedistributionConfig {
            rate_mb_per_s: 40,
            concurrent_bootstraps: 2,
            batch_records: 512,
            batch_bytes: ByteSize::mib(16),
            removal_grace: Duration::from_secs(30),
            auto_replace_after: Duration::from_secs(600),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round interval long enough to hold every write back is refused at load, not served.
    #[test]
    fn a_round_interval_past_the_bound_is_refused() {
        let mut store = StoreSettings::default();
        assert!(store.to_options().is_ok());
        assert_eq!(
            store.disk_options().min_round_interval,
            store.min_round_interval
        );
        store.min_round_interval = MAX_ROUND_INTERVAL;
        assert!(store.to_options().is_ok());
        store.min_round_interval = Duration::from_secs(10);
        assert!(matches!(
            store.to_options(),
            Err(ConfigError::RoundInterval(_))
        ));
    }

    /// Read pieces are at least a checksummed block (64 KiB) and at most a record (16 MiB).
    #[test]
    fn read_pieces_outside_a_block_and_a_record_are_refused() {
        let with = |size| StoreSettings {
            read_piece_size: size,
            ..StoreSettings::default()
        };
        assert_eq!(
            StoreSettings::default()
                .to_options()
                .unwrap()
                .read_chunk_size,
            1 << 20
        );
        for ok in [ByteSize::kib(64), ByteSize::mib(16)] {
            assert_eq!(
                with(ok).to_options().unwrap().read_chunk_size,
                ok.as_u64() as usize
            );
        }
        for bad in [
            ByteSize::b(0),
            ByteSize::kib(63),
            ByteSize::b((16 << 20) + 1),
        ] {
            assert!(
                matches!(with(bad).to_options(), Err(ConfigError::ReadPiece(_))),
                "{bad}"
            );
        }
    }

    /// The page-cache settings reach the store as written, 0 turning each off.
    #[test]
    fn page_cache_settings_reach_the_store_and_zero_turns_them_off() {
        let defaults = StoreSettings::default().to_options().unwrap();
        assert_eq!(defaults.uncache_synced_from, Some(1 << 20));
        assert_eq!(defaults.direct_cold_reads_from, Some(1 << 20));
        let set = StoreSettings {
            uncache_synced_from: ByteSize::mib(2),
            direct_cold_reads_from: ByteSize::mib(3),
            ..StoreSettings::default()
        };
        let opts = set.to_options().unwrap();
        assert_eq!(opts.uncache_synced_from, Some(2 << 20));
        assert_eq!(opts.direct_cold_reads_from, Some(3 << 20));
        let off = StoreSettings {
            uncache_synced_from: ByteSize::b(0),
            direct_cold_reads_from: ByteSize::b(0),
            ..StoreSettings::default()
        };
        let opts = off.to_options().unwrap();
        assert_eq!(opts.uncache_synced_from, None);
        assert_eq!(opts.direct_cold_reads_from, None);
    }
}
