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
    /// The datacenter whose partition primaries decide every change of the S3 layer's records
    /// (bucket indexes, the key ring), and whose replicas answer their reads, for frontends
    /// in every datacenter (`README.md`, "One datacenter decides"). Absent: the first
    /// datacenter of the cluster map.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home_datacenter: Option<String>,
    /// Names one record of a bucket's index holds before it splits in two (`index_tree.rs`):
    /// what every read and change of a name reads and writes, at ~250 bytes per name.
    #[serde(default = "default_leaf_entries")]
    pub index_leaf_entries: usize,
    /// A leaf of at most this many names is merged into the leaf on its left when the two fit
    /// in one leaf (`index_tree/merge.rs`), so that deletes leave no run of nearly empty
    /// leaves for listings to walk. Absent: a quarter of `index_leaf_entries`; 0: only empty
    /// leaves are merged; at most half of `index_leaf_entries` (a split leaves halves, which
    /// more would merge back at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_merge_entries: Option<usize>,
    /// Bytes of changed names a write of an index leaf sends as a delta from the leaf's base
    /// blob, instead of the whole leaf (`leaf_base.rs`); past it the leaf is folded into a new
    /// base. Leaves smaller than 4 times this are written whole. 0: every leaf whole.
    #[serde(default = "default_index_delta_bytes")]
    pub index_delta_bytes: usize,
    /// Blobs of replaced names one index record holds through their grace period. Past it,
    /// the oldest are tombstoned at once by a sweep woken for it (a read still fetching one
    /// of them may fail): a name overwritten without pause would otherwise grow its record by
    /// one entry per overwrite for the whole grace period, until every read and write of the
    /// record's names was slow and the record past its size bound (`objects.rs`, `hurry`).
    #[serde(default = "default_max_held_garbage")]
    pub max_held_garbage: usize,
    /// How long the record of an index leaf merged into its left neighbour stays, as a stub,
    /// before the sweep removes it (`index_tree/stubs.rs`): a frontend paused inside a split
    /// for longer than this could write that leaf again with the names it held then.
    #[serde(default = "default_merged_leaf_grace", with = "humantime_serde")]
    pub merged_leaf_grace: Duration,
    /// Bytes of index records this frontend keeps by version, so that reads of a name,
    /// listings and read-modify-writes ask the quorum whether a record changed instead of
    /// reading it whole
    /// (`record_cache.rs`; a record counts at 4 times its JSON). 0 keeps none.
    #[serde(default = "default_index_cache_bytes")]
    pub index_cache_bytes: usize,
    /// Bytes of small object bodies this frontend keeps by blob ID once read, so that a GET
    /// of a kept body asks storage only whether its name still points at it
    /// (`body_cache.rs`: a blob's bytes never change). 0 keeps none.
    #[serde(default = "default_body_cache_bytes")]
    pub body_cache_bytes: usize,
    /// Largest body kept there.
    #[serde(default = "default_body_cache_max_object")]
    pub body_cache_max_object: u64,
    /// Whether requests signed with AWS Signature Version 2 (HMAC-SHA1, in an `Authorization:
    /// AWS ...` header or a presigned URL's `Signature`) are taken. `false` refuses them with
    /// 400 `InvalidRequest` before any key is looked up, as S3 regions that take only SigV4
    /// do; SigV4 and anonymous requests are unchanged.
    #[serde(default = "default_signature_v2")]
    pub signature_v2: bool,
}

impl S3Config {
    /// The router the S3 layer's records go through: `router` itself in the home datacenter,
    /// else one acting in the home datacenter (`Router::acting_in`).
    pub fn records_router(
        &self,
        router: &std::sync::Arc<larder_router::Router>,
    ) -> Result<std::sync::Arc<larder_router::Router>, String> {
        records_router(router, self.home_datacenter.as_deref())
    }
}

/// `S3Config::records_router` for a frontend config with or without `[s3]`.
pub fn records_router(
    router: &std::sync::Arc<larder_router::Router>,
    home: Option<&str>,
) -> Result<std::sync::Arc<larder_router::Router>, String> {
    let map = router.map();
    let home = match home {
        Some(home) => home.to_owned(),
        None => map
            .datacenters
            .first()
            .map(|dc| dc.name.clone())
            .ok_or("the cluster map has no datacenter")?,
    };
    if home == router.datacenter() {
        return Ok(router.clone());
    }
    let acting = router
        .acting_in(&home)
        .map_err(|e| format!("[s3] home_datacenter: {e}"))?;
    Ok(std::sync::Arc::new(acting))
}

fn default_signature_v2() -> bool {
    true
}

fn default_leaf_entries() -> usize {
    1000
}

fn default_index_delta_bytes() -> usize {
    16 << 10
}

fn default_index_cache_bytes() -> usize {
    128 << 20
}

fn default_body_cache_bytes() -> usize {
    64 << 20
}

fn default_body_cache_max_object() -> u64 {
    64 << 10
}

fn default_merged_leaf_grace() -> Duration {
    Duration::from_secs(24 * 3600)
}

fn default_max_held_garbage() -> usize {
    4096
}

fn default_grace() -> Duration {
    Duration::from_secs(15 * 60)
}

fn default_sweep() -> Duration {
    Duration::from_secs(60)
}
