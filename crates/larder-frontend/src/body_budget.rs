//! Budgets for request bodies buffered whole in memory (document bodies, up to
//! `documents.max_document_size` each): one per connection and one for the process
//! (`limits.buffered_bodies_per_connection`, `limits.buffered_bodies_per_process`). Without them,
//! 120 streams of one HTTP/2 connection could each buffer 10 MiB. Bytes are reserved as they
//! arrive, so a slow upload holds only what it has sent; a request whose next chunk does not fit
//! is answered 429 with `Retry-After` (Vespa's overload status); a reservation is released when
//! the request that holds it is dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytesize::ByteSize;

/// A count of buffered bytes against a limit, shared by everything it covers.
#[derive(Clone, Debug)]
pub struct BodyBudget {
    used: Arc<AtomicU64>,
    limit: u64,
    scope: &'static str,
}

/// A reservation would pass a budget's limit.
#[derive(Debug, thiserror::Error)]
#[error("the {scope} budget for buffered request bodies ({limit}) is in use; retry later")]
pub struct Exhausted {
    scope: &'static str,
    limit: ByteSize,
}

impl BodyBudget {
    /// `scope` names the budget in messages: "connection" or "process".
    pub fn new(limit: ByteSize, scope: &'static str) -> BodyBudget {
        BodyBudget {
            used: Arc::new(AtomicU64::new(0)),
            limit: limit.as_u64(),
            scope,
        }
    }

    fn take(&self, bytes: u64) -> Result<(), Exhausted> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .map(|_| ())
            .map_err(|_| Exhausted {
                scope: self.scope,
                limit: ByteSize::b(self.limit),
            })
    }

    fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    #[cfg(test)]
    fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

/// The bytes one request buffers, held against its connection's and the process's budgets
/// until dropped.
#[derive(Debug)]
pub struct Reservation {
    budgets: [BodyBudget; 2],
    bytes: u64,
}

impl Reservation {
    pub fn new(connection: BodyBudget, process: BodyBudget) -> Reservation {
        Reservation {
            budgets: [connection, process],
            bytes: 0,
        }
    }

    /// Reserves `bytes` more, from both budgets or neither.
    pub fn grow(&mut self, bytes: u64) -> Result<(), Exhausted> {
        let [connection, process] = &self.budgets;
        connection.take(bytes)?;
        if let Err(exhausted) = process.take(bytes) {
            connection.give_back(bytes);
            return Err(exhausted);
        }
        self.bytes += bytes;
        Ok(())
    }

    /// Releases `bytes` of what is reserved (a buffer that was dropped early).
    pub fn shrink(&mut self, bytes: u64) {
        let bytes = bytes.min(self.bytes);
        for budget in &self.budgets {
            budget.give_back(bytes);
        }
        self.bytes -= bytes;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.shrink(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_from_both_or_neither_and_releases_on_drop() {
        let connection = BodyBudget::new(ByteSize::b(100), "connection");
        let process = BodyBudget::new(ByteSize::b(150), "process");
        let mut a = Reservation::new(connection.clone(), process.clone());
        a.grow(60).unwrap();
        let other_connection = BodyBudget::new(ByteSize::b(100), "connection");
        let mut b = Reservation::new(other_connection.clone(), process.clone());
        b.grow(80).unwrap();
        // The process budget refuses: the connection's share is given back.
        let err = a.grow(20).unwrap_err();
        assert!(err.to_string().contains("process"), "{err}");
        assert_eq!((connection.used(), process.used()), (60, 140));
        assert!(a.grow(41).is_err(), "connection budget");
        drop(b);
        assert_eq!((other_connection.used(), process.used()), (0, 60));
        a.shrink(10);
        drop(a);
        assert_eq!((connection.used(), process.used()), (0, 0));
    }
}
