//! Prometheus metrics of one storage node (a registry per node, never a global).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use larder_cluster::PartitionId;
use larder_store::Store;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    pub partition: String,
    pub peer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    pub partition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DiskLabels {
    /// The disk's name in the cluster map.
    pub disk: String,
}

/// Where the data of large records' reads came from: `page_cache`, or `disk` past it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReadSourceLabels {
    pub source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DiskSyncLabels {
    /// The disk's name in the cluster map.
    pub disk: String,
    /// `journal` (one per commit round) or `segment` (a segment that got a record too large to
    /// batch, a sealed one, or one synced before its journal file is deleted).
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `server` (`[tls]`: served certificate and the CA clients must chain to) or `pool`
    /// (`[pool.tls]`: what this node presents to its peers).
    pub certificate: &'static str,
    /// `ok` or `failed` (the old files stay in use).
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthRefusalLabels {
    /// `larder_auth::AuthError::kind`: `timeout`, `bad_magic`, `refused` or `io`.
    pub reason: &'static str,
}

pub struct StorageMetrics {
    registry: Registry,
    /// Records the last replication round found after our cursor on the peer (0 = caught up).
    pub replication_lag_records: Family<PeerLabels, Gauge>,
    /// Age of the oldest record the last round found unapplied (0 = caught up).
    pub replication_lag_seconds: Family<PeerLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub replicated_records: Family<PeerLabels, Counter>,
    pub replication_errors: Family<PeerLabels, Counter>,
    /// Changes of a peer skipped because this node refuses them (a time or version from the
    /// far future, bad properties): logged at warn, never retried.
    pub replication_refused: Family<PeerLabels, Counter>,
    live_keys: Family<PartitionLabels, Gauge>,
    bytes_on_disk: Family<PartitionLabels, Gauge>,
    corrupt_records: Family<PartitionLabels, Gauge>,
    disk_fdatasyncs: Family<DiskSyncLabels, Counter>,
    large_read_bytes: Family<ReadSourceLabels, Counter>,
    disk_sync_seconds: Family<DiskLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
    disk_syncs_during_writeback: Family<DiskLabels, Counter>,
    disk_unjournaled_rounds: Family<DiskLabels, Counter>,
    disk_refusing_writes: Family<DiskLabels, Gauge>,
    disk_writeback_bytes_during_syncs: Family<DiskLabels, Counter>,
    compaction_bytes_reclaimed: Family<PartitionLabels, Counter>,
    compaction_segments: Family<PartitionLabels, Counter>,
    compaction_corrupt_dropped: Family<PartitionLabels, Counter>,
    compaction_live_bytes_copied: Family<PartitionLabels, Counter>,
    compaction_tombstones_dropped: Family<PartitionLabels, Counter>,
    compaction_bytes_read: Family<PartitionLabels, Counter>,
    compaction_garbage_ratio: Family<PartitionLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    compaction_garbage_bytes: Family<PartitionLabels, Gauge>,
    compaction_lag_seconds: Family<PartitionLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    compaction_yielded_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    certificate_reloads: Family<ReloadLabels, Counter>,
    internal_auth_refusals: Family<AuthRefusalLabels, Counter>,
    /// Automatic re-replication (`auto_replace.rs`), on the node that decides it.
    pub auto_replace: crate::auto_replace::AutoReplaceMetrics,
    /// Bulk bootstraps copying now (`bootstrap.rs`).
    pub bootstraps_in_progress: Gauge,
    /// Bytes and records bulk bootstraps made durable here.
    pub bootstrap_bytes: Counter,
    pub bootstrap_records: Counter,
    /// Estimated seconds until every running bulk copy is done (set when encoded).
    pub bootstrap_seconds_left: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Records an export left out because they failed their checksum here.
    pub export_corrupt_skipped: Counter,
    /// Bytes blob reads hold of the read budget (`read_budget.rs`; set when encoded).
    pub read_budget_held_bytes: Gauge,
    /// Reads answered 503 because their share of the read budget stayed spent.
    pub read_budget_refusals: Counter,
    /// Replicas found behind their peers' dropped tombstones and rebuilt (`rebuild.rs`).
    pub rebuilds: Counter,
    /// Replicas being rebuilt now.
    pub replicas_rebuilding: Gauge,
}

impl StorageMetrics {
    pub fn new() -> StorageMetrics {
        let mut registry = Registry::with_prefix("larder_storage");
        let m = StorageMetrics {
            replication_lag_records: Family::default(),
            replication_lag_seconds: Family::default(),
            replicated_records: Family::default(),
            replication_errors: Family::default(),
            replication_refused: Family::default(),
            live_keys: Family::default(),
            bytes_on_disk: Family::default(),
            corrupt_records: Family::default(),
            disk_fdatasyncs: Family::default(),
            large_read_bytes: Family::default(),
            disk_sync_seconds: Family::default(),
            disk_syncs_during_writeback: Family::default(),
            disk_unjournaled_rounds: Family::default(),
            disk_refusing_writes: Family::default(),
            disk_writeback_bytes_during_syncs: Family::default(),
            compaction_bytes_reclaimed: Family::default(),
            compaction_segments: Family::default(),
            compaction_corrupt_dropped: Family::default(),
            compaction_live_bytes_copied: Family::default(),
            compaction_tombstones_dropped: Family::default(),
            compaction_bytes_read: Family::default(),
            compaction_garbage_ratio: Family::default(),
            compaction_garbage_bytes: Family::default(),
            compaction_lag_seconds: Family::default(),
            compaction_yielded_seconds: Counter::default(),
            certificate_reloads: Family::default(),
            internal_auth_refusals: Family::default(),
            auto_replace: Default::default(),
            bootstraps_in_progress: Gauge::default(),
            bootstrap_bytes: Counter::default(),
            bootstrap_records: Counter::default(),
            bootstrap_seconds_left: Gauge::default(),
            export_corrupt_skipped: Counter::default(),
            read_budget_held_bytes: Gauge::default(),
            read_budget_refusals: Counter::default(),
            rebuilds: Counter::default(),
            replicas_rebuilding: Gauge::default(),
            registry: Registry::default(),
        };
        // Zeros up front, so a failed reload is an increase, not a new series.
        for certificate in ["server", "pool"] {
            for result in ["ok", "failed"] {
                let labels = ReloadLabels {
                    certificate,
                    result,
                };
                let _ = m.certificate_reloads.get_or_create(&labels);
            }
        }
        for reason in ["timeout", "bad_magic", "refused", "io"] {
            let _ = m
                .internal_auth_refusals
                .get_or_create(&AuthRefusalLabels { reason });
        }
        registry.register(
            "internal_auth_refusals",
            "Connections closed in the cluster-secret handshake, by reason",
            m.internal_auth_refusals.clone(),
        );
        registry.register(
            "replication_lag_records",
            "Records found behind a peer replica in the last round",
            m.replication_lag_records.clone(),
        );
        registry.register(
            "replication_lag_seconds",
            "Age of the oldest unapplied record of a peer replica",
            m.replication_lag_seconds.clone(),
        );
        registry.register(
            "replicated_records",
            "Records applied from a peer replica",
            m.replicated_records.clone(),
        );
        registry.register(
            "replication_errors",
            "Failed replication rounds per peer replica",
            m.replication_errors.clone(),
        );
        registry.register(
            "replication_refused",
            "Changes of a peer replica skipped because this node refuses them",
            m.replication_refused.clone(),
        );
        registry.register("live_keys", "Live keys per replica", m.live_keys.clone());
        registry.register(
            "compaction_bytes_reclaimed",
            "Garbage bytes compaction gave back per replica",
            m.compaction_bytes_reclaimed.clone(),
        );
        registry.register(
            "compaction_segments",
            "Segments compaction rewrote per replica",
            m.compaction_segments.clone(),
        );
        registry.register(
            "compaction_corrupt_records_dropped",
            "Records compaction dropped because their data failed its checksum",
            m.compaction_corrupt_dropped.clone(),
        );
        registry.register(
            "compaction_live_bytes_copied",
            "Bytes of live records compaction copied forward per replica",
            m.compaction_live_bytes_copied.clone(),
        );
        registry.register(
            "compaction_tombstones_dropped",
            "Tombstones compaction dropped per replica (past every replica and the retention)",
            m.compaction_tombstones_dropped.clone(),
        );
        registry.register(
            "compaction_bytes_read",
            "Bytes of sealed segments compaction read and verified to decide what to rewrite",
            m.compaction_bytes_read.clone(),
        );
        registry.register(
            "compaction_garbage_ratio",
            "Garbage over the bytes of a replica's sealed segments, as the last pass measured",
            m.compaction_garbage_ratio.clone(),
        );
        registry.register(
            "compaction_garbage_bytes",
            "Garbage bytes the last pass left in a replica's sealed segments",
            m.compaction_garbage_bytes.clone(),
        );
        registry.register(
            "compaction_lag_seconds",
            "Seconds since the last completed compaction pass over a replica (or the node's start)",
            m.compaction_lag_seconds.clone(),
        );
        registry.register(
            "compaction_yielded_seconds",
            "Time compaction paused for foreground requests",
            m.compaction_yielded_seconds.clone(),
        );
        registry.register(
            "bytes_on_disk",
            "Segment bytes per replica",
            m.bytes_on_disk.clone(),
        );
        registry.register(
            "corrupt_records_found",
            "Records that failed their checksum per replica",
            m.corrupt_records.clone(),
        );
        registry.register(
            "read_budget_held_bytes",
            "Bytes of pieces blob reads hold now (or a waiting read has gathered), against [limits] read_budget",
            m.read_budget_held_bytes.clone(),
        );
        registry.register(
            "read_budget_refusals",
            "Blob reads answered 503 because the read budget stayed spent for read_budget_wait",
            m.read_budget_refusals.clone(),
        );
        registry.register(
            "large_read_bytes",
            "Bytes of large records read, from the page cache or from the disk past it",
            m.large_read_bytes.clone(),
        );
        registry.register(
            "disk_fdatasyncs",
            "fdatasync calls of each disk's commit thread, by what was synced",
            m.disk_fdatasyncs.clone(),
        );
        registry.register(
            "disk_sync_seconds",
            "Time each disk's commit rounds spent syncing (their writers wait for it)",
            m.disk_sync_seconds.clone(),
        );
        registry.register(
            "disk_syncs_during_compaction_writeback",
            "Commit round syncs that started while compaction write-back was in flight on the disk",
            m.disk_syncs_during_writeback.clone(),
        );
        registry.register(
            "disk_refusing_writes",
            "1 while the disk refuses writes (an fdatasync failed; GET /internal/v1/health says why)",
            m.disk_refusing_writes.clone(),
        );
        registry.register(
            "disk_unjournaled_rounds",
            "Commit rounds whose journal append failed (a full disk), made durable by syncing their segments",
            m.disk_unjournaled_rounds.clone(),
        );
        registry.register(
            "disk_compaction_writeback_bytes_during_syncs",
            "Compaction write-back bytes in flight when a commit round sync started, summed",
            m.disk_writeback_bytes_during_syncs.clone(),
        );
        registry.register(
            "certificate_reloads",
            "Certificate reloads (SIGHUP) of [tls] and [pool.tls], by result",
            m.certificate_reloads.clone(),
        );
        registry.register(
            "auto_replace_nodes_down",
            "Nodes of the map the deciding node (map authority) cannot reach now",
            m.auto_replace.nodes_down.clone(),
        );
        registry.register(
            "auto_replace_blocked",
            "Nodes down past auto_replace_after whose replicas cannot be rebuilt on distinct other nodes",
            m.auto_replace.blocked.clone(),
        );
        registry.register(
            "auto_replace_plans",
            "Plans that rebuilt a dead node's replicas on the other nodes",
            m.auto_replace.plans.clone(),
        );
        registry.register(
            "rebuilds",
            "Replicas found behind tombstones their peers dropped, and rebuilt from them",
            m.rebuilds.clone(),
        );
        registry.register(
            "replicas_rebuilding",
            "Replicas being rebuilt from their peers now (they serve no data request)",
            m.replicas_rebuilding.clone(),
        );
        registry.register(
            "bootstraps_in_progress",
            "Bulk bootstraps of new replicas copying now",
            m.bootstraps_in_progress.clone(),
        );
        registry.register(
            "bootstrap_copied_bytes",
            "Bytes bulk bootstraps made durable on this node",
            m.bootstrap_bytes.clone(),
        );
        registry.register(
            "bootstrap_copied_records",
            "Records bulk bootstraps made durable on this node",
            m.bootstrap_records.clone(),
        );
        registry.register(
            "bootstrap_seconds_left",
            "Estimated seconds until the running bulk bootstraps are done",
            m.bootstrap_seconds_left.clone(),
        );
        registry.register(
            "export_corrupt_skipped",
            "Records an export to a new replica left out because they failed their checksum",
            m.export_corrupt_skipped.clone(),
        );
        StorageMetrics { registry, ..m }
    }

    /// Brings the disk's sync counters up to its stats (the store keeps the totals), and its
    /// refusing-writes gauge up to date. The label is
    /// the disk directory's name, which is the disk's name in the cluster map.
    fn record_disk(&self, root: &std::path::Path, disk: &larder_store::Disk) {
        let stats = disk.stats();
        let refusing = disk.refusing_writes().is_some();
        let disk = root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for (kind, total) in [
            ("journal", stats.journal_syncs),
            ("segment", stats.segment_syncs),
        ] {
            let counter = self.disk_fdatasyncs.get_or_create(&DiskSyncLabels {
                disk: disk.clone(),
                kind,
            });
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        let labels = DiskLabels { disk };
        self.disk_refusing_writes
            .get_or_create(&labels)
            .set(i64::from(refusing));
        let seconds = self.disk_sync_seconds.get_or_create(&labels);
        let total = stats.sync_time.as_secs_f64();
        if total > seconds.get() {
            seconds.inc_by(total - seconds.get());
        }
        for (family, total) in [
            (
                &self.disk_syncs_during_writeback,
                stats.syncs_during_writeback,
            ),
            (
                &self.disk_writeback_bytes_during_syncs,
                stats.writeback_bytes_during_syncs,
            ),
            (&self.disk_unjournaled_rounds, stats.unjournaled_rounds),
        ] {
            let counter = family.get_or_create(&labels);
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    pub fn certificate_reloaded(&self, certificate: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.certificate_reloads
            .get_or_create(&ReloadLabels {
                certificate,
                result,
            })
            .inc();
    }

    pub fn auth_refused(&self, reason: &'static str) {
        self.internal_auth_refusals
            .get_or_create(&AuthRefusalLabels { reason })
            .inc();
    }

    /// Counts what one compaction of `partition` did.
    pub fn record_compaction(&self, partition: PartitionId, report: &larder_store::CompactReport) {
        let labels = PartitionLabels {
            partition: partition.to_string(),
        };
        self.compaction_bytes_reclaimed
            .get_or_create(&labels)
            .inc_by(report.bytes_reclaimed);
        self.compaction_segments
            .get_or_create(&labels)
            .inc_by(report.segments_compacted);
        self.compaction_corrupt_dropped
            .get_or_create(&labels)
            .inc_by(report.corrupt_records_dropped);
        self.compaction_live_bytes_copied
            .get_or_create(&labels)
            .inc_by(report.live_bytes_copied);
        self.compaction_tombstones_dropped
            .get_or_create(&labels)
            .inc_by(report.tombstones_dropped);
        self.compaction_bytes_read
            .get_or_create(&labels)
            .inc_by(report.bytes_read);
        let ratio = match report.sealed_bytes {
            0 => 0.0,
            sealed => report.garbage_bytes as f64 / sealed as f64,
        };
        self.compaction_garbage_ratio
            .get_or_create(&labels)
            .set(ratio);
        self.compaction_garbage_bytes
            .get_or_create(&labels)
            .set(i64::try_from(report.garbage_bytes).unwrap_or(i64::MAX));
    }

    /// Refreshes the store gauges and renders the text exposition.
    pub fn encode<'a>(
        &self,
        partitions: impl Iterator<Item = (&'a PartitionId, &'a Store)>,
        compaction: &crate::compaction::Compaction,
        bootstrap_seconds_left: f64,
    ) -> String {
        self.bootstrap_seconds_left.set(bootstrap_seconds_left);
        let yielded = compaction.foreground.yielded().as_secs_f64();
        let counted = self.compaction_yielded_seconds.get();
        if yielded > counted {
            self.compaction_yielded_seconds.inc_by(yielded - counted);
        }
        let mut disks_seen: Vec<std::path::PathBuf> = Vec::new();
        let (mut from_cache, mut from_disk) = (0u64, 0u64);
        for (partition, store) in partitions {
            let labels = PartitionLabels {
                partition: partition.to_string(),
            };
            let stats = store.stats();
            let root = store.disk().root();
            if !disks_seen.iter().any(|seen| seen == root) {
                disks_seen.push(root.to_path_buf());
                self.record_disk(root, store.disk());
            }
            self.live_keys
                .get_or_create(&labels)
                .set(stats.live_keys as i64);
            self.bytes_on_disk
                .get_or_create(&labels)
                .set(stats.bytes_on_disk as i64);
            self.corrupt_records
                .get_or_create(&labels)
                .set(stats.corrupt_records_found as i64);
            from_cache = from_cache.saturating_add(stats.large_read_bytes_cached);
            from_disk = from_disk.saturating_add(stats.large_read_bytes_direct);
            self.compaction_lag_seconds
                .get_or_create(&labels)
                .set(compaction.lag(*partition).as_secs_f64());
        }
        // Summed over the replicas open now: one that moved away takes its count with it, and
        // the counters then hold until the others pass it again.
        for (source, total) in [("page_cache", from_cache), ("disk", from_disk)] {
            let counter = self
                .large_read_bytes
                .get_or_create(&ReadSourceLabels { source });
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdatasyncs_are_counted_per_disk() {
        let root = tempfile::tempdir().unwrap();
        let disk_dir = root.path().join("disk0");
        let disk = larder_store::Disk::open(&disk_dir, Default::default()).unwrap();
        let options = larder_store::Options::default();
        let stores: Vec<(PartitionId, Store)> = (0..3)
            .map(|p| {
                let dir = disk_dir.join(format!("p{p}"));
                (p, Store::open_on(&disk, dir, options.clone()).unwrap())
            })
            .collect();
        for (p, store) in &stores {
            store.delete_blob(format!("k{p}").as_bytes(), 1).unwrap();
        }
        let metrics = StorageMetrics::new();
        let compaction = crate::compaction::Compaction::new(&Default::default());
        let text = metrics.encode(stores.iter().map(|(p, s)| (p, s)), &compaction, 0.0);
        let journal = disk.stats().journal_syncs;
        assert!(journal >= 1);
        let line = format!(
            "larder_storage_disk_fdatasyncs_total{{disk=\"disk0\",kind=\"journal\"}} {journal}"
        );
        assert!(text.contains(&line), "{text}");
        // Counted once per disk, not once per store on it.
        let again = metrics.encode(stores.iter().map(|(p, s)| (p, s)), &compaction, 0.0);
        assert!(again.contains(&line), "{again}");
    }
}
