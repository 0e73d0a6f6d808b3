//! The node's budget for the bytes its blob reads hold at once (`[limits] read_budget`).
//!
//! Why: a streamed read holds a few pieces (`streamed.rs`), but nothing bounded how many reads
//! a node serves at once beyond the streams its peers may open: a thousand readers of large
//! blobs held gigabytes. Every read past `INLINE_READ_MAX` takes its share here before its
//! first piece is read, waiting at most `[limits] read_budget_wait` (then 503 `ReadBudgetSpent` with
//! `Retry-After` and `x-larder-read-budget-spent`: the frontend asks another replica, or this
//! one again, and parks its stalled downloads sooner: `larder-router/src/park.rs`), and each read-ahead
//! piece takes its share before it is read, waiting as long as it must: a read under way is
//! never failed for want of budget, it only slows down. A share rides in its piece's `Bytes`
//! and is given back when the last view of them is dropped: once h2 has written them to the
//! socket, or the read ended, however it ended. A stalled read holds three pieces: the one h2
//! could not send, the next one hyper keeps ready for it, and the one read ahead.
//!
//! A share is the bytes asked for; the store reads whole checksummed blocks (64 KiB), so the
//! first piece of a range that starts mid-block holds up to one block more than it counts.
//!
//! Reads of at most `INLINE_READ_MAX` (64 KiB) are read in place on the async worker and are not
//! counted: they are bounded by the streams a peer may open, at 64 KiB each.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use bytesize::ByteSize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::ConfigError;
use crate::error::{Error, Result};

/// The budget: a semaphore of bytes, and how long a new read may wait for its share.
#[derive(Clone)]
pub struct ReadBudget {
    bytes: Arc<Semaphore>,
    limit: u64,
    wait: Duration,
    piece: u64,
}

/// One read's share of the budget, given back when dropped.
pub(crate) struct Held(#[allow(dead_code)] OwnedSemaphorePermit);

impl Held {
    /// `piece`, carrying this share: it is given back when the last view of the piece's bytes
    /// is dropped (h2 drops a DATA frame's bytes once it has written them to the socket).
    pub(crate) fn attach(self, piece: Bytes) -> Bytes {
        Bytes::from_owner(Counted { piece, _held: self })
    }
}

/// A piece and its share of the budget.
struct Counted {
    piece: Bytes,
    _held: Held,
}

impl AsRef<[u8]> for Counted {
    fn as_ref(&self) -> &[u8] {
        &self.piece
    }
}

impl ReadBudget {
    /// A budget of `limit` bytes for reads in pieces of `piece` bytes. Refused when a stalled
    /// read's three pieces would not fit, or when the limit is past what a semaphore counts
    /// (the budget is counted in bytes).
    pub fn new(
        limit: ByteSize,
        wait: Duration,
        piece: ByteSize,
    ) -> std::result::Result<ReadBudget, ConfigError> {
        let (limit, piece) = (limit.as_u64(), piece.as_u64());
        let max = Semaphore::MAX_PERMITS.min(1 << 40) as u64;
        let least = piece.saturating_mul(3);
        if !(least..=max).contains(&limit) {
            return Err(ConfigError::ReadBudget {
                limit: ByteSize::b(limit),
                least: ByteSize::b(least),
            });
        }
        Ok(ReadBudget {
            bytes: Arc::new(Semaphore::new(limit as usize)),
            limit,
            wait,
            piece,
        })
    }

    /// The share a read takes for its next piece when `left` bytes of it are still to read.
    pub(crate) fn share(&self, left: u64) -> u32 {
        // A piece is at most 16 MiB (`store.read_piece_size`), so this always fits.
        u32::try_from(left.min(self.piece)).unwrap_or(u32::MAX)
    }

    /// Takes `bytes` for a read about to start, waiting at most `read_budget_wait`.
    pub(crate) async fn take(&self, bytes: u32) -> Result<Held> {
        let acquire = self.bytes.clone().acquire_many_owned(bytes);
        match tokio::time::timeout(self.wait, acquire).await {
            Ok(Ok(permit)) => Ok(Held(permit)),
            Ok(Err(_closed)) => Err(Error::Busy("the node is shutting down")),
            Err(_) => Err(Error::ReadBudgetSpent),
        }
    }

    /// Takes `bytes` now, if that many are free.
    pub(crate) fn try_take(&self, bytes: u32) -> Option<Held> {
        self.bytes
            .clone()
            .try_acquire_many_owned(bytes)
            .ok()
            .map(Held)
    }

    /// Takes `bytes`, waiting as long as it takes (`None` only if the budget was closed).
    pub(crate) async fn take_in_time(self, bytes: u32) -> Option<Held> {
        self.bytes.acquire_many_owned(bytes).await.ok().map(Held)
    }

    /// Bytes held by reads now.
    pub fn used(&self) -> u64 {
        self.limit
            .saturating_sub(self.bytes.available_permits() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(limit: u64, piece: u64) -> ReadBudget {
        ReadBudget::new(
            ByteSize::b(limit),
            Duration::from_millis(50),
            ByteSize::b(piece),
        )
        .unwrap()
    }

    #[test]
    fn a_budget_must_hold_the_three_pieces_of_a_stalled_read() {
        let wait = Duration::from_secs(1);
        let mib = ByteSize::mib(1);
        assert!(ReadBudget::new(ByteSize::mib(3), wait, mib).is_ok());
        assert!(ReadBudget::new(ByteSize::b((3 << 20) - 1), wait, mib).is_err());
        assert!(ReadBudget::new(ByteSize::b(u64::MAX), wait, mib).is_err());
    }

    #[test]
    fn a_share_is_a_piece_at_most() {
        let budget = budget(10 << 20, 1 << 20);
        assert_eq!(budget.share(100), 100);
        assert_eq!(budget.share(5 << 20), 1 << 20);
        assert_eq!(budget.share(u64::MAX), 1 << 20);
    }

    #[tokio::test]
    async fn shares_come_back_when_dropped_and_a_spent_budget_answers_busy() {
        let budget = budget(3 << 20, 1 << 20);
        let first = budget.take(1 << 20).await.unwrap();
        let second = budget.try_take(2 << 20).unwrap();
        assert_eq!(budget.used(), 3 << 20);
        assert!(budget.try_take(1).is_none());
        assert!(matches!(budget.take(1).await, Err(Error::ReadBudgetSpent)));
        drop(first);
        assert_eq!(budget.used(), 2 << 20);
        let waiting = tokio::spawn(budget.clone().take_in_time(3 << 20));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(second);
        let all = waiting.await.unwrap().unwrap();
        assert_eq!(budget.used(), 3 << 20);
        drop(all);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_share_attached_to_a_piece_lives_as_long_as_any_view_of_it() {
        let budget = budget(3 << 20, 1 << 20);
        let piece = budget
            .try_take(1 << 20)
            .unwrap()
            .attach(Bytes::from(vec![7u8; 1 << 20]));
        let mut rest = piece.clone();
        let sent = rest.split_to(1000);
        drop(piece);
        assert_eq!(budget.used(), 1 << 20);
        drop(sent);
        assert_eq!(budget.used(), 1 << 20, "a view is left");
        assert_eq!(rest.len(), (1 << 20) - 1000);
        drop(rest);
        assert_eq!(budget.used(), 0);
    }
}
