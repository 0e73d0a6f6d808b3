//! The frontend's budget for the bytes its downloads hold at once (`[router] download_budget`).
//!
//! Why: a download holds what it has taken from its replica until its client has read it, and
//! a client that stops reading makes that last. Per download it is little (a pool frame of a
//! simple blob, 1 MiB: hyper keeps a slice of it to send, and a slice pins the frame it was cut
//! from; a chunk being sent and `read_ahead` more of a composite one, 4 MiB each), but nothing
//! bounded how many: 1,000 clients that read nothing of a 4 MB blob held 1.0-1.2 GiB of a
//! frontend (`benchmarks/stalled-readers`), and one HTTP/2 connection may ask for 1,024 at
//! once.
//!
//! Every download past `RESUMED_FROM` (64 KiB, `resume.rs`) takes its share here: before each
//! frame it takes from its replica (the frame waits in the pool connection's window, which
//! bounds what h2 buffers), and before each chunk of a composite blob is fetched. A share rides
//! in the bytes it counts (`Bytes::from_owner`) and is given back when the last view of them is
//! dropped: once hyper has written them, or the download ended, however it ended. A download
//! under way waits for its share as long as it must (it is slowed, never failed); a new one
//! waits at most `download_budget_wait` for its first, then 503 `DownloadBudgetSpent` with
//! `Retry-After`. Waiting for a share also raises the router's pressure (`park.rs`): stalled
//! downloads let go of their replicas and of the frame they kept.
//!
//! A share is at most the whole budget, so a frame or chunk larger than it still gets through,
//! one at a time.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use bytesize::ByteSize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget: a semaphore of bytes.
pub struct DownloadBudget {
    bytes: Arc<Semaphore>,
    limit: u64,
    wait: Duration,
}

/// A download's share of the budget, given back when dropped.
pub struct Share(OwnedSemaphorePermit);

/// Some bytes and the share that counts them.
struct Counted {
    data: Bytes,
    _share: Share,
}

impl AsRef<[u8]> for Counted {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Share {
    /// The bytes counted.
    pub fn len(&self) -> usize {
        self.0.num_permits()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `data`, carrying `len` bytes of this share (what it holds, if less): they are given back
    /// when the last view of `data` is dropped. What is left of the share is given back now.
    pub fn attach(mut self, data: Bytes, len: usize) -> Bytes {
        let counted = match self.0.split(len) {
            Some(part) => Share(part),
            None => self,
        };
        Bytes::from_owner(Counted {
            data,
            _share: counted,
        })
    }
}

/// The smallest budget: a few 1 MiB frames and a 4 MiB chunk, so that a download can go on.
const LEAST: u64 = 8 << 20;

/// The largest: what a semaphore counts, with room to spare.
const MOST: u64 = 1 << 40;

impl DownloadBudget {
    /// A budget of `limit` bytes whose new downloads wait at most `wait` for their first share.
    pub fn new(limit: ByteSize, wait: Duration) -> Result<DownloadBudget, String> {
        let limit = limit.as_u64();
        if !(LEAST..=MOST).contains(&limit) {
            return Err(format!(
                "router.download_budget must be between {} and {} (it is {})",
                ByteSize::b(LEAST),
                ByteSize::b(MOST),
                ByteSize::b(limit)
            ));
        }
        Ok(DownloadBudget {
            // `limit` fits: MOST is below `Semaphore::MAX_PERMITS` (usize::MAX >> 3).
            bytes: Arc::new(Semaphore::new(limit as usize)),
            limit,
            wait,
        })
    }

    /// The permits a share of `bytes` takes: at most the whole budget.
    fn permits(&self, bytes: u64) -> u32 {
        u32::try_from(bytes.min(self.limit)).unwrap_or(u32::MAX)
    }

    /// A share of `bytes` now, if the budget has them.
    pub fn try_take(&self, bytes: u64) -> Option<Share> {
        let permits = self.permits(bytes);
        self.bytes
            .clone()
            .try_acquire_many_owned(permits)
            .ok()
            .map(Share)
    }

    /// A share of `bytes`, waiting at most `download_budget_wait`; `None` if the wait ran out.
    pub async fn take_within_wait(&self, bytes: u64) -> Option<Share> {
        let acquire = self.bytes.clone().acquire_many_owned(self.permits(bytes));
        match tokio::time::timeout(self.wait, acquire).await {
            Ok(Ok(permit)) => Some(Share(permit)),
            Ok(Err(_)) | Err(_) => None,
        }
    }

    /// A share of `bytes`, waiting as long as it takes.
    pub fn take(self: &Arc<Self>, bytes: u64) -> impl std::future::Future<Output = Share> + Send {
        let acquire = self.bytes.clone().acquire_many_owned(self.permits(bytes));
        async move {
            // The semaphore is never closed.
            Share(acquire.await.expect("the download budget is never closed"))
        }
    }

    /// Bytes held by downloads now.
    pub fn held(&self) -> u64 {
        self.limit
            .saturating_sub(self.bytes.available_permits() as u64)
    }

    /// How long a new download waits for its first share.
    pub fn wait(&self) -> Duration {
        self.wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(limit: u64) -> Arc<DownloadBudget> {
        Arc::new(DownloadBudget::new(ByteSize::b(limit), Duration::from_millis(50)).unwrap())
    }

    #[test]
    fn a_budget_is_bounded_both_ways() {
        let wait = Duration::from_secs(1);
        assert!(DownloadBudget::new(ByteSize::mib(8), wait).is_ok());
        assert!(DownloadBudget::new(ByteSize::b(LEAST - 1), wait).is_err());
        assert!(DownloadBudget::new(ByteSize::b(u64::MAX), wait).is_err());
    }

    #[test]
    fn a_share_lives_as_long_as_any_view_of_its_bytes() {
        let budget = budget(LEAST);
        let share = budget.try_take(1 << 20).unwrap();
        assert_eq!(budget.held(), 1 << 20);
        // A frame of 600 KiB in a share of 1 MiB: the rest is given back at once.
        let frame = share.attach(Bytes::from(vec![7u8; 600 << 10]), 600 << 10);
        assert_eq!(budget.held(), 600 << 10);
        let slice = frame.slice(0..1000);
        drop(frame);
        assert_eq!(budget.held(), 600 << 10, "a slice still pins the frame");
        assert_eq!(slice[999], 7);
        drop(slice);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn a_share_is_the_whole_budget_at_most() {
        let budget = budget(LEAST);
        let share = budget.try_take(u64::MAX).unwrap();
        assert_eq!(share.len() as u64, LEAST);
        assert!(budget.try_take(1).is_none());
        drop(share);
        assert!(budget.try_take(LEAST).is_some());
    }

    #[tokio::test]
    async fn a_new_download_waits_a_while_then_gives_up_and_one_under_way_waits_on() {
        let budget = budget(LEAST);
        let all = budget.try_take(LEAST).unwrap();
        assert!(budget.take_within_wait(1).await.is_none(), "spent");
        let waiting = tokio::spawn(budget.take(1 << 20));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "a download under way waits");
        drop(all);
        let share = waiting.await.unwrap();
        assert_eq!(share.len(), 1 << 20);
        assert!(budget.take_within_wait(1 << 20).await.is_some());
    }
}
