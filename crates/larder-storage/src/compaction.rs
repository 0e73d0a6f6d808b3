//! Compaction in the node: a background pass over every replica every `[compaction] interval`
//! (sealed segments past `min_garbage_ratio`, copying at most `rate_mb_per_s`), and
//! `POST /internal/v1/compaction`, an operator's "compact now" (the active segment is sealed
//! first, any garbage counts, no rate limit). Replicas are compacted one after the other on a
//! blocking thread; a pass runs alone (one mutex), so the two never compete for the disk. Both
//! drop tombstones past the partition's horizon and `tombstone_retention` (`horizon.rs`).
//!
//! Both give way to foreground work: the node counts its data requests in flight
//! ([`Compaction::foreground`]) and the store's rewrite pauses while more than
//! `busy_requests` are (`larder_store::Foreground`); the pass's thread also runs in the idle I/O
//! class ([`IdleIo`]), and the store copies at idle CPU priority. `GET /internal/v1/compaction`
//! shows what the last pass over each replica measured (garbage ratio) and how long ago it
//! completed (the lag).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use http::{Response, StatusCode};
use larder_cluster::PartitionId;
use larder_store::{CompactOptions, CompactReport, Foreground};
use tokio::sync::watch;

use crate::background::IdleIo;
use crate::config::CompactionConfig;
use crate::error::Error;

use crate::node::blocking;
use crate::reply::{self, Body};
use crate::validate::now_ms;
use crate::StorageNode;

/// A node's compaction state: one pass at a time, the last pass over each replica, and the
/// foreground load passes yield to.
pub struct Compaction {
    config: CompactionConfig,
    /// Held by a pass: background and operator passes never run at once.
    pass: Mutex<()>,
    /// The last completed pass over each replica (absent: none since the node started).
    replicas: Mutex<HashMap<PartitionId, LastPass>>,
    /// Data requests in flight (counted in `routes`), which rewrites give way to.
    pub foreground: Foreground,
    started: Instant,
    /// The last completed pass over the whole node.
    last_node_pass: Mutex<Option<NodePass>>,
}

/// What one pass over every replica of the node did, in total.
#[derive(Clone, Debug, Default)]
struct NodePass {
    finished_ms: u64,
    seconds: f64,
    /// Copy rate limit of the pass in MB/s (0: none).
    rate_mb_per_s: u64,
    segments_compacted: u64,
    bytes_reclaimed: u64,
    live_bytes_copied: u64,
    /// Sealed bytes read to plan (segments with nothing new to reclaim are not read).
    bytes_read: u64,
}

impl NodePass {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "finished_ms": self.finished_ms,
            "seconds": self.seconds,
            "rate_mb_per_s": self.rate_mb_per_s,
            "segments_compacted": self.segments_compacted,
            "bytes_reclaimed": self.bytes_reclaimed,
            "live_bytes_copied": self.live_bytes_copied,
            "bytes_read": self.bytes_read,
        })
    }
}

/// What the last pass over one replica did, and when it completed.
#[derive(Clone, Debug)]
pub struct LastPass {
    pub finished: Instant,
    pub finished_ms: u64,
    pub outcome: Result<CompactReport, String>,
}

impl LastPass {
    /// Garbage bytes over the bytes of the replica's sealed segments, as the pass measured them
    /// (`None` after a failed pass; 0 when there are no sealed segments).
    pub fn garbage_ratio(&self) -> Option<f64> {
        let report = self.outcome.as_ref().ok()?;
        Some(match report.sealed_bytes {
            0 => 0.0,
            sealed => report.garbage_bytes as f64 / sealed as f64,
        })
    }
}

/// Locks `mutex` even if a pass panicked while holding it: no state is shared through it that
/// a panic could leave half-changed (each value is replaced whole).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Compaction {
    pub fn new(config: &CompactionConfig) -> Compaction {
        Compaction {
            config: config.clone(),
            pass: Mutex::new(()),
            replicas: Mutex::new(HashMap::new()),
            foreground: Foreground::new(config.busy_requests),
            started: Instant::now(),
            last_node_pass: Mutex::new(None),
        }
    }

    /// Waits for the pass running now, if any, and keeps others from starting until dropped
    /// (`rebuild.rs` replaces a replica's store under it).
    pub(crate) fn hold_passes(&self) -> MutexGuard<'_, ()> {
        lock(&self.pass)
    }

    /// The last completed pass over `partition`.
    pub fn last_pass(&self, partition: PartitionId) -> Option<LastPass> {
        lock(&self.replicas).get(&partition).cloned()
    }

    /// Time since the last completed pass over `partition` (since the node started when none
    /// has completed): grows without bound when passes stop completing.
    pub fn lag(&self, partition: PartitionId) -> Duration {
        match lock(&self.replicas).get(&partition) {
            Some(last) => last.finished.elapsed(),
            None => self.started.elapsed(),
        }
    }

    fn record(&self, partition: PartitionId, outcome: Result<CompactReport, String>) {
        let last = LastPass {
            finished: Instant::now(),
            finished_ms: now_ms(),
            outcome,
        };
        lock(&self.replicas).insert(partition, last);
    }
}

fn report_json(r: &CompactReport) -> serde_json::Value {
    serde_json::json!({
        "segments_compacted": r.segments_compacted,
        "bytes_reclaimed": r.bytes_reclaimed,
        "live_bytes_copied": r.live_bytes_copied,
        "corrupt_records_dropped": r.corrupt_records_dropped,
        "tombstones_dropped": r.tombstones_dropped,
        "sealed_bytes": r.sealed_bytes,
        "garbage_bytes": r.garbage_bytes,
        "bytes_read": r.bytes_read,
        "segments_skipped": r.segments_skipped,
    })
}

/// One pass over every replica; returns whether one failed, and each one's answer.
fn pass(
    node: &StorageNode,
    opts: &CompactOptions,
) -> (bool, serde_json::Map<String, serde_json::Value>) {
    let _one_pass_at_a_time = lock(&node.compaction.pass);
    let _idle_io = IdleIo::enter();
    let started = Instant::now();
    let mut total = NodePass {
        rate_mb_per_s: opts.max_bytes_per_sec / 1_000_000,
        ..NodePass::default()
    };
    let mut partitions = serde_json::Map::new();
    let mut failed = false;
    for (partition, store) in &node.partitions() {
        // Tombstones go once every peer replica has replicated past them and they are old
        // enough (`horizon.rs`); the horizon is read per replica, just before its turn.
        let opts = CompactOptions {
            tombstone_horizon: node.horizons.horizon(*partition),
            tombstone_retention_ms: node.horizons.retention_ms(),
            ..opts.clone()
        };
        let outcome = store.compact(&opts);
        let value = match &outcome {
            Ok(report) => {
                node.metrics.record_compaction(*partition, report);
                total.segments_compacted += report.segments_compacted;
                total.bytes_reclaimed += report.bytes_reclaimed;
                total.live_bytes_copied += report.live_bytes_copied;
                total.bytes_read += report.bytes_read;
                report_json(report)
            }
            Err(err) => {
                tracing::warn!(partition, %err, "compaction failed");
                failed = true;
                serde_json::json!({"error": err.to_string()})
            }
        };
        let outcome = outcome.map_err(|err| err.to_string());
        node.compaction.record(*partition, outcome);
        partitions.insert(partition.to_string(), value);
    }
    total.seconds = started.elapsed().as_secs_f64();
    total.finished_ms = now_ms();
    if total.segments_compacted > 0 {
        tracing::info!(
            segments = total.segments_compacted,
            reclaimed = total.bytes_reclaimed,
            copied = total.live_bytes_copied,
            seconds = total.seconds,
            "compaction pass done"
        );
    }
    *lock(&node.compaction.last_node_pass) = Some(total);
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

/// `POST /internal/v1/compaction[?rate_mb_per_s=N]`: the copy rate limit of this pass, in
/// MB/s (absent or 0: none).
fn parse_rate(query: Option<&str>) -> Result<u64, Error> {
    let mut rate = 0;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("rate_mb_per_s", value)) if value.len() <= 12 => {
                rate = value
                    .parse()
                    .map_err(|_| Error::BadQuery("rate_mb_per_s is not a whole number"))?;
            }
            _ => return Err(Error::BadQuery("the only parameter is rate_mb_per_s")),
        }
    }
    Ok(rate)
}

pub async fn compact_now(
    node: Arc<StorageNode>,
    query: Option<&str>,
) -> Result<Response<Body>, Error> {
    let rate = parse_rate(query)?;
    let outcome = blocking(move || {
        let opts = CompactOptions {
            min_garbage_ratio: 0.0,
            now_ms: now_ms(),
            seal_active: true,
            max_bytes_per_sec: rate.saturating_mul(1_000_000),
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
    Ok(reply::json(
        status,
        &serde_json::json!({"partitions": partitions}),
    ))
}

/// `GET /internal/v1/compaction`: the settings, and per replica what the last pass measured.
pub fn status(node: &StorageNode) -> Response<Body> {
    let compaction = &node.compaction;
    let partitions: serde_json::Map<String, serde_json::Value> = node
        .partitions()
        .iter()
        .map(|(partition, store)| {
            let last = compaction.last_pass(*partition);
            let mut value = serde_json::json!({
                "bytes_on_disk": store.stats().bytes_on_disk,
                "lag_seconds": compaction.lag(*partition).as_secs_f64(),
                "garbage_ratio": last.as_ref().and_then(LastPass::garbage_ratio),
                "last_pass_ms": last.as_ref().map(|l| l.finished_ms),
            });
            match last.map(|l| l.outcome) {
                Some(Ok(report)) => value["last_pass"] = report_json(&report),
                Some(Err(error)) => value["last_error"] = error.into(),
                None => {}
            }
            (partition.to_string(), value)
        })
        .collect();
    let config = &compaction.config;
    reply::json(
        StatusCode::OK,
        &serde_json::json!({
            "node": node.node_id,
            "enabled": config.enabled,
            "interval_seconds": config.interval.as_secs_f64(),
            "min_garbage_ratio": config.min_garbage_ratio,
            "rate_mb_per_s": config.rate_mb_per_s,
            "busy_requests": config.busy_requests,
            "running": compaction.pass.try_lock().is_err(),
            "foreground_in_flight": compaction.foreground.in_flight(),
            "yielded_seconds": compaction.foreground.yielded().as_secs_f64(),
            "disks": disks_json(node),
            "last_pass": lock(&compaction.last_node_pass).as_ref().map(NodePass::json),
            "partitions": partitions,
        }),
    )
}

/// Each disk's commit round syncs, and how often compaction write-back was in flight when one
/// started (what yielding to them should keep near 0; `larder-store`'s `sync_watch.rs`).
fn disks_json(node: &StorageNode) -> serde_json::Value {
    let disks = node.disks().into_iter().map(|(name, disk)| {
        let stats = disk.stats();
        let value = serde_json::json!({
            "journal_syncs": stats.journal_syncs,
            "segment_syncs": stats.segment_syncs,
            "sync_seconds": stats.sync_time.as_secs_f64(),
            "syncs_during_compaction_writeback": stats.syncs_during_writeback,
            "compaction_writeback_bytes_during_syncs": stats.writeback_bytes_during_syncs,
        });
        (name, value)
    });
    serde_json::Value::Object(disks.collect())
}

#[cfg(test)]
mod tests {
    use super::parse_rate;

    #[test]
    fn the_rate_parameter_is_a_whole_number_and_the_only_one() {
        assert_eq!(parse_rate(None).unwrap(), 0);
        assert_eq!(parse_rate(Some("rate_mb_per_s=64")).unwrap(), 64);
        for bad in [
            "rate_mb_per_s=-1",
            "rate_mb_per_s=1e3",
            "x=1",
            "rate_mb_per_s=1111111111111",
        ] {
            assert!(parse_rate(Some(bad)).is_err(), "{bad}");
        }
    }
}
