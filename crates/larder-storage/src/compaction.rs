//! Compaction in the node: a background pass over every replica every `[compaction] interval`
//! (sealed segments past `min_garbage_ratio`, copying at most `rate_mb_per_s`), and
//! `POST /internal/v1/compaction`, an operator's "compact now" (the active segment is sealed
//! first, any garbage counts, no rate limit). Replicas are compacted one after the other on a
//! blocking thread; a pass runs alone (one mutex), so the two never compete for the disk. Both
//! drop tombstones past the partition's horizon and `tombstone_retention` (`horizon.rs`).

use std::sync::Arc;

use http::{Response, StatusCode};
use larder_store::{CompactOptions, CompactReport};
use tokio::sync::watch;

use crate::config::CompactionConfig;

use crate::node::blocking;
use crate::reply::{self, Body};
use crate::validate::now_ms;
use crate::StorageNode;

fn report_json(r: &CompactReport) -> serde_json::Value {
    serde_json::json!({
        "segments_compacted": r.segments_compacted,
        "bytes_reclaimed": r.bytes_reclaimed,
        "live_bytes_copied": r.live_bytes_copied,
        "corrupt_records_dropped": r.corrupt_records_dropped,
        "tombstones_dropped": r.tombstones_dropped,
    })
}

/// One pass over every replica; returns whether one failed, and each one's answer.
fn pass(
    node: &StorageNode,
    opts: &CompactOptions,
) -> (bool, serde_json::Map<String, serde_json::Value>) {
    // A poisoned lock only means an earlier pass panicked; passes share no state through it.
    let _one_pass_at_a_time = node
        .compaction
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut partitions = serde_json::Map::new();
    let mut failed = false;
    for (partition, store) in node.partitions() {
        // Tombstones go once every peer replica has replicated past them and they are old
        // enough (`horizon.rs`); the horizon is read per replica, just before its turn.
        let opts = CompactOptions {
            tombstone_horizon: node.horizons.horizon(*partition),
            tombstone_retention_ms: node.horizons.retention_ms(),
            ..opts.clone()
        };
        let value = match store.compact(&opts) {
            Ok(report) => {
                node.metrics.record_compaction(*partition, &report);
                report_json(&report)
            }
            Err(err) => {
                tracing::warn!(partition, %err, "compaction failed");
                failed = true;
                serde_json::json!({"error": err.to_string()})
            }
        };
        partitions.insert(partition.to_string(), value);
    }
    (failed, partitions)
}

/// Runs a background pass every `config.interval` until `stop` turns true.
pub fn start(
    node: Arc<StorageNode>,
    config: CompactionConfig,
    mut stop: watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    if !config.enabled {
        return None;
    }
    Some(tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(config.interval) => {}
                _ = stop.changed() => return,
            }
            if *stop.borrow() {
                return;
            }
            let node = node.clone();
            let opts = CompactOptions {
                min_garbage_ratio: config.min_garbage_ratio,
                now_ms: now_ms(),
                seal_active: false,
                max_bytes_per_sec: config.rate_mb_per_s.saturating_mul(1_000_000),
                // Set per replica by `pass`.
                tombstone_horizon: None,
                tombstone_retention_ms: 0,
            };
            blocking(move || pass(&node, &opts)).await;
        }
    }))
}

pub async fn compact_now(node: Arc<StorageNode>) -> Response<Body> {
    let outcome = blocking(move || {
        let opts = CompactOptions {
            min_garbage_ratio: 0.0,
            now_ms: now_ms(),
            seal_active: true,
            max_bytes_per_sec: 0,
            // Set per replica by `pass`.
            tombstone_horizon: None,
            tombstone_retention_ms: 0,
        };
        pass(&node, &opts)
    })
    .await;
    let (failed, partitions) = outcome;
    let status = if failed {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    reply::json(status, &serde_json::json!({"partitions": partitions}))
}
