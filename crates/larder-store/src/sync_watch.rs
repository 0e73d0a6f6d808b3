//! [`SyncWatch`]: what compaction's write-back needs to know of a disk's foreground syncs, so
//! that it yields to them (`compact.rs`, `Pace`). Every `fdatasync` of a commit round is a
//! writer waiting for its acknowledgement; compaction's rewrite pages handed to the device just
//! before one go to the disk ahead of it, and the writer waits for them too.
//!
//! Kept per disk (shared by its stores), in atomics only: how many round syncs are in flight, a
//! fast moving average of their latency, and the same average over only the syncs that ran
//! while no compaction write-back was in flight (the disk's "idle" sync latency). Compaction
//! issues no write-back while a sync is in flight, and while the recent latency is above the
//! idle one it waits in proportion. The counters (syncs that met compaction write-back in
//! flight, and how many bytes of it) are what shows whether it works.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The recent average moves by 1/RECENT_WEIGHT of each sample: a few rounds.
const RECENT_WEIGHT: u64 = 8;
/// The idle average moves slower: a burst of slow syncs does not become the baseline.
const IDLE_WEIGHT: u64 = 32;

#[derive(Debug, Default)]
pub(crate) struct SyncWatch {
    syncs_in_flight: AtomicU64,
    /// Bytes of compaction write-back submitted and not yet known written.
    writeback_in_flight: AtomicU64,
    /// Moving averages of round sync latency, in microseconds (0: no sample yet).
    recent_us: AtomicU64,
    idle_us: AtomicU64,
    /// Counters (`DiskStats`).
    sync_us_total: AtomicU64,
    syncs_during_writeback: AtomicU64,
    writeback_bytes_during_syncs: AtomicU64,
}

/// A round's sync in flight, until dropped ([`SyncWatch::sync`]).
pub(crate) struct Syncing<'a> {
    watch: &'a SyncWatch,
    started: Instant,
    /// Compaction write-back was in flight when it started.
    met_writeback: bool,
}

impl Drop for Syncing<'_> {
    fn drop(&mut self) {
        let watch = self.watch;
        let us = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let met = self.met_writeback || watch.writeback_in_flight.load(Ordering::Acquire) > 0;
        watch.sync_us_total.fetch_add(us, Ordering::Relaxed);
        average(&watch.recent_us, us, RECENT_WEIGHT);
        if !met {
            average(&watch.idle_us, us, IDLE_WEIGHT);
        }
        watch.syncs_in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Moves `avg` toward `sample` by 1/`weight` (racing updates may lose one: it is an estimate).
fn average(avg: &AtomicU64, sample: u64, weight: u64) {
    let old = avg.load(Ordering::Relaxed);
    let new = match old {
        0 => sample,
        _ => old - old / weight + sample / weight,
    };
    avg.store(new.max(1), Ordering::Relaxed);
}

/// A compaction write-back in flight, until dropped ([`SyncWatch::writeback`]).
pub(crate) struct WritingBack<'a> {
    watch: &'a SyncWatch,
    bytes: u64,
}

impl Drop for WritingBack<'_> {
    fn drop(&mut self) {
        let in_flight = &self.watch.writeback_in_flight;
        in_flight.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl SyncWatch {
    /// Counts a round's sync in flight (and its latency) until the guard is dropped.
    pub(crate) fn sync(&self) -> Syncing<'_> {
        self.syncs_in_flight.fetch_add(1, Ordering::AcqRel);
        let writeback = self.writeback_in_flight.load(Ordering::Acquire);
        if writeback > 0 {
            self.syncs_during_writeback.fetch_add(1, Ordering::Relaxed);
            self.writeback_bytes_during_syncs
                .fetch_add(writeback, Ordering::Relaxed);
        }
        Syncing {
            watch: self,
            started: Instant::now(),
            met_writeback: writeback > 0,
        }
    }

    /// Counts `bytes` of compaction write-back in flight until the guard is dropped.
    pub(crate) fn writeback(&self, bytes: u64) -> WritingBack<'_> {
        self.writeback_in_flight.fetch_add(bytes, Ordering::AcqRel);
        WritingBack { watch: self, bytes }
    }

    pub(crate) fn syncing(&self) -> bool {
        self.syncs_in_flight.load(Ordering::Acquire) > 0
    }

    /// How much slower recent syncs are than idle ones, as a factor (1.0 when not, or unknown).
    pub(crate) fn slowdown(&self) -> f64 {
        let recent = self.recent_us.load(Ordering::Relaxed);
        let idle = self.idle_us.load(Ordering::Relaxed);
        match (recent, idle) {
            (0, _) | (_, 0) => 1.0,
            _ => (recent as f64 / idle as f64).max(1.0),
        }
    }

    /// Time spent in round syncs, syncs that started with compaction write-back in flight, and
    /// the write-back bytes they met.
    pub(crate) fn counters(&self) -> (Duration, u64, u64) {
        (
            Duration::from_micros(self.sync_us_total.load(Ordering::Relaxed)),
            self.syncs_during_writeback.load(Ordering::Relaxed),
            self.writeback_bytes_during_syncs.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syncs_met_by_writeback_are_counted_and_do_not_move_the_idle_latency() {
        let watch = SyncWatch::default();
        drop(watch.sync());
        assert!(!watch.syncing());
        let idle = watch.idle_us.load(Ordering::Relaxed);
        {
            let _wb = watch.writeback(4096);
            let _sync = watch.sync();
            assert!(watch.syncing());
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(watch.idle_us.load(Ordering::Relaxed), idle);
        let (_, met, bytes) = watch.counters();
        assert_eq!((met, bytes), (1, 4096));
        assert!(watch.slowdown() > 1.0);
        assert_eq!(watch.writeback_in_flight.load(Ordering::Relaxed), 0);
    }
}
