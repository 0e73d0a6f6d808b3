//! What a visit counts as it goes, the progress line, and the summary at the end.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

#[derive(Default)]
pub(crate) struct Counters {
    documents: AtomicU64,
    pages: AtomicU64,
    bytes: AtomicU64,
    retries: AtomicU64,
    failed: AtomicBool,
}

impl Counters {
    /// Documents written and page bytes read, as they come.
    pub(crate) fn read(&self, documents: u64, bytes: u64) {
        self.documents.fetch_add(documents, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
    }

    pub(crate) fn page(&self) {
        self.pages.fetch_add(1, Relaxed);
    }

    pub(crate) fn retry(&self) {
        self.retries.fetch_add(1, Relaxed);
    }

    pub(crate) fn fail(&self) {
        self.failed.store(true, Relaxed);
    }

    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Relaxed)
    }

    pub(crate) fn summary(&self, slices: u32, elapsed: Duration) -> VisitSummary {
        VisitSummary {
            documents: self.documents.load(Relaxed),
            pages: self.pages.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            retries: self.retries.load(Relaxed),
            slices,
            seconds: elapsed.as_secs_f64(),
        }
    }
}

/// The outcome of a finished visit.
#[derive(Clone, Debug, Serialize)]
pub struct VisitSummary {
    /// Documents written.
    pub documents: u64,
    /// Pages read (requests answered 200).
    pub pages: u64,
    /// Bytes of page bodies read.
    pub bytes: u64,
    /// Requests retried after 429, 503 or a transport error.
    pub retries: u64,
    pub slices: u32,
    pub seconds: f64,
}

impl fmt::Display for VisitSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seconds = self.seconds.max(1e-9);
        write!(
            f,
            "visited {} documents in {} pages over {} slices in {:.2} s: {:.0} docs/s, {:.3} Gbps, {} retries",
            self.documents,
            self.pages,
            self.slices,
            self.seconds,
            self.documents as f64 / seconds,
            self.bytes as f64 * 8.0 / seconds / 1e9,
            self.retries
        )
    }
}

/// Prints a progress line to stderr every second until dropped.
pub(crate) struct Progress {
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    pub(crate) fn start(counters: Arc<Counters>) -> Progress {
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let documents = counters.documents.load(Relaxed);
                eprint!(
                    "\r{documents} documents, {:.0} docs/s, {} pages, {} retries   ",
                    documents as f64 / started.elapsed().as_secs_f64(),
                    counters.pages.load(Relaxed),
                    counters.retries.load(Relaxed)
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
