//! Where the CPU-heavy steps of a document request run: parsing a body or a stored document,
//! evaluating a condition, applying an update and encoding the result take tens of milliseconds
//! for a 10 MiB document, so they run on the blocking pool, not on the async workers (which
//! keep serving `/healthz` and everything else meanwhile). A semaphore bounds how many run at
//! once, which bounds both the threads they occupy and the memory of the parsed documents they
//! hold (a parsed JSON value is several times its text).

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::reply::Failure;

/// The permits for document work: twice the cores, so a step waiting on memory or a page fault
/// does not idle a core, and no more.
pub struct DocWork(Arc<Semaphore>);

impl Default for DocWork {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        DocWork(Arc::new(Semaphore::new(cores * 2)))
    }
}

impl DocWork {
    /// Runs `work` on the blocking pool once a permit is free (the request's deadline bounds
    /// the wait).
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, Failure> + Send + 'static,
    ) -> Result<T, Failure> {
        let permit = self
            .0
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Failure::Unavailable("the frontend is shutting down".into()))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
        .map_err(|e| Failure::Internal(format!("document work failed: {e}")))?
    }
}
