//! Counters, a latency histogram and the final summary of a feed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

/// Log-linear histogram of microseconds: 32 buckets per power of two (about 2 % resolution),
/// constant memory whatever the number of operations.
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
}

const PER_OCTAVE: f64 = 32.0;

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; 64 * PER_OCTAVE as usize],
            total: 0,
            max: 0,
        }
    }
}

impl Histogram {
    pub fn record(&mut self, micros: u64) {
        let index = ((micros.max(1) as f64).log2() * PER_OCTAVE) as usize;
        let last = self.counts.len() - 1;
        self.counts[index.min(last)] += 1;
        self.total += 1;
        self.max = self.max.max(micros);
    }

    /// The value below which `q` (0..=1) of the samples fall, in microseconds.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((self.total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let upper = 2f64.powf((index + 1) as f64 / PER_OCTAVE);
                return (upper as u64).min(self.max);
            }
        }
        self.max
    }
}

/// Live counters, shared by every task of a feed.
#[derive(Default)]
pub struct Stats {
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    pub retries: AtomicU64,
    pub malformed: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    statuses: Mutex<BTreeMap<String, u64>>,
    latency: Mutex<Histogram>,
    errors: Mutex<Vec<String>>,
}

/// How many error messages a summary keeps.
const KEPT_ERRORS: usize = 20;

impl Stats {
    /// Records an operation's final outcome; `outcome` is a status code or `transport`.
    pub fn finish(&self, outcome: &str, ok: bool, latency: Duration) {
        if ok {
            self.succeeded.fetch_add(1, Relaxed);
        } else {
            self.failed.fetch_add(1, Relaxed);
        }
        let mut statuses = self.statuses.lock();
        match statuses.get_mut(outcome) {
            Some(count) => *count += 1,
            None => {
                statuses.insert(outcome.to_owned(), 1);
            }
        }
        drop(statuses);
        self.latency.lock().record(latency.as_micros() as u64);
    }

    /// Keeps an error message for the summary (the first few only).
    pub fn error(&self, message: String) {
        let mut errors = self.errors.lock();
        if errors.len() < KEPT_ERRORS {
            errors.push(message);
        }
    }

    pub fn done(&self) -> u64 {
        self.succeeded.load(Relaxed) + self.failed.load(Relaxed)
    }

    pub fn summary(&self, elapsed: Duration) -> Summary {
        let latency = self.latency.lock();
        let ms = |micros: u64| micros as f64 / 1000.0;
        let operations = self.done();
        let seconds = elapsed.as_secs_f64();
        Summary {
            operations,
            succeeded: self.succeeded.load(Relaxed),
            failed: self.failed.load(Relaxed),
            malformed: self.malformed.load(Relaxed),
            retries: self.retries.load(Relaxed),
            seconds,
            ops_per_second: if seconds > 0.0 {
                operations as f64 / seconds
            } else {
                0.0
            },
            bytes_sent: self.bytes_sent.load(Relaxed),
            bytes_received: self.bytes_received.load(Relaxed),
            latency_ms: Latency {
                p50: ms(latency.quantile(0.50)),
                p95: ms(latency.quantile(0.95)),
                p99: ms(latency.quantile(0.99)),
                max: ms(latency.max),
            },
            statuses: self.statuses.lock().clone(),
            errors: self.errors.lock().clone(),
        }
    }
}

/// The result of a feed, as `larder feed` prints it (text or `--json`).
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Operations that reached a final outcome.
    pub operations: u64,
    /// Answered 200, or 412 (condition not met: a result, not an error, as in Vespa).
    pub succeeded: u64,
    pub failed: u64,
    /// Input that was not an operation (reported with line numbers, never sent).
    pub malformed: u64,
    pub retries: u64,
    pub seconds: f64,
    pub ops_per_second: f64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Per operation, from its first request to its final answer (retries included).
    pub latency_ms: Latency,
    /// Final outcomes by HTTP status (`transport` for connection failures).
    pub statuses: BTreeMap<String, u64>,
    /// The first few error messages.
    pub errors: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} operations in {:.2} s: {:.0} ops/s; {} succeeded, {} failed, {} malformed, {} retries",
            self.operations,
            self.seconds,
            self.ops_per_second,
            self.succeeded,
            self.failed,
            self.malformed,
            self.retries
        )?;
        writeln!(
            f,
            "latency ms: p50 {:.2}, p95 {:.2}, p99 {:.2}, max {:.2}",
            self.latency_ms.p50, self.latency_ms.p95, self.latency_ms.p99, self.latency_ms.max
        )?;
        writeln!(
            f,
            "bytes: {} sent, {} received",
            self.bytes_sent, self.bytes_received
        )?;
        let statuses: Vec<String> = self
            .statuses
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect();
        write!(f, "outcomes: {}", statuses.join(", "))?;
        for error in &self.errors {
            write!(f, "\nerror: {error}")?;
        }
        Ok(())
    }
}

/// Prints a progress line to stderr every second until dropped.
pub struct Progress {
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    pub fn start(
        stats: std::sync::Arc<Stats>,
        inflight: impl Fn() -> (usize, usize) + Send + 'static,
    ) -> Progress {
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let done = stats.done();
                let (now, limit) = inflight();
                eprint!(
                    "\r{done} ops, {:.0} ops/s, {now} in flight (limit {limit}), {} failed, {} retries   ",
                    done as f64 / started.elapsed().as_secs_f64(),
                    stats.failed.load(Relaxed),
                    stats.retries.load(Relaxed)
                );
            }
        });
        Progress { task }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.task.abort();
        eprintln!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_a_few_percent() {
        let mut h = Histogram::default();
        for v in 1..=10_000u64 {
            h.record(v);
        }
        for (q, expected) in [(0.5, 5_000.0), (0.95, 9_500.0), (0.99, 9_900.0)] {
            let got = h.quantile(q) as f64;
            assert!((got - expected).abs() / expected < 0.03, "q{q}: {got}");
        }
        assert_eq!(h.quantile(1.0), 10_000);
        assert_eq!(Histogram::default().quantile(0.5), 0);
    }
}
