//! `POST /internal/v1/compaction`: compact every replica of the node now (an operator's command;
//! the active segment is sealed first so everything written so far can be reclaimed). The
//! replicas are compacted one after the other on a blocking thread.

use std::sync::Arc;

use http::{Response, StatusCode};
use larder_store::{CompactOptions, CompactReport};

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
    })
}

pub async fn compact_now(node: Arc<StorageNode>) -> Response<Body> {
    let outcome = blocking(move || {
        let opts = CompactOptions {
            min_garbage_ratio: 0.0,
            now_ms: now_ms(),
            seal_active: true,
        };
        let mut partitions = serde_json::Map::new();
        let mut failed = false;
        for (partition, store) in node.partitions() {
            let value = match store.compact(&opts) {
                Ok(report) => report_json(&report),
                Err(err) => {
                    tracing::warn!(partition, %err, "compaction failed");
                    failed = true;
                    serde_json::json!({"error": err.to_string()})
                }
            };
            partitions.insert(partition.to_string(), value);
        }
        (failed, partitions)
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
