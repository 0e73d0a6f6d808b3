//! Reading request bodies into memory, within a per-request limit, an idle timeout and the
//! node's budget for all bodies buffered at once (a declared length is reserved up front, the
//! rest as frames arrive). Bodies are buffered whole because a record is
//! appended in one piece after its checksum is verified; the budget is what keeps 40 unfinished
//! 15 MiB uploads from holding 600 MiB of a node's memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::error::{Error, Result};

/// Bytes of request bodies buffered by the whole process, against a fixed limit.
#[derive(Debug)]
pub struct BodyBudget {
    limit: u64,
    used: AtomicU64,
}

impl BodyBudget {
    pub fn new(limit: u64) -> Arc<BodyBudget> {
        Arc::new(BodyBudget {
            limit,
            used: AtomicU64::new(0),
        })
    }

    /// Bytes reserved right now (for tests and metrics).
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Reserves `bytes` more, or nothing when that would pass the limit.
    fn try_reserve(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }
}

/// What one buffered body holds of the budget; given back when dropped, whatever the outcome.
pub struct Reservation {
    budget: Arc<BodyBudget>,
    bytes: u64,
}

impl Reservation {
    fn new(budget: &Arc<BodyBudget>) -> Reservation {
        Reservation {
            budget: budget.clone(),
            bytes: 0,
        }
    }

    fn grow(&mut self, bytes: u64) -> Result<()> {
        if !self.budget.try_reserve(bytes) {
            return Err(Error::BodyBudgetSpent {
                limit: self.budget.limit,
            });
        }
        self.bytes += bytes;
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A body as the chunks that arrived (no copy into one buffer), with the share of the budget
/// it holds: keep it alive as long as the chunks.
pub struct Buffered {
    pub chunks: Vec<Bytes>,
    received: u64,
    pub reservation: Reservation,
}

impl Buffered {
    pub fn len(&self) -> u64 {
        self.received
    }

    /// The body in one piece (documents are stored as one value).
    pub fn concat(&self) -> Bytes {
        match self.chunks.as_slice() {
            [one] => one.clone(),
            many => many.concat().into(),
        }
    }
}

/// How request bodies are read on this node.
#[derive(Clone, Debug)]
pub struct Intake {
    pub budget: Arc<BodyBudget>,
    /// Largest body of one request (the store's record limit).
    pub max_body: u64,
    /// Longest wait for the next piece of a body.
    pub idle_timeout: Duration,
}

impl Intake {
    /// This intake with `max_body` bytes as its limit (a batch's, rather than a record's).
    pub fn bounded(&self, max_body: usize) -> Intake {
        Intake {
            max_body: max_body as u64,
            ..self.clone()
        }
    }

    /// Reads `body` whole within the budget. A declared length is reserved before anything is
    /// read, so that an upload admitted at the start is never turned away half-way; bytes past
    /// what was declared (or all of them, when nothing was) are reserved as they arrive.
    pub async fn read(&self, mut body: Incoming) -> Result<Buffered> {
        let declared = http_body::Body::size_hint(&body).exact();
        if declared.is_some_and(|length| length > self.max_body) {
            return Err(Error::BodyTooLarge { max: self.max_body });
        }
        let mut reservation = Reservation::new(&self.budget);
        reservation.grow(declared.unwrap_or(0))?;
        let mut buffered = Buffered {
            chunks: Vec::new(),
            received: 0,
            reservation,
        };
        loop {
            let frame = match tokio::time::timeout(self.idle_timeout, body.frame()).await {
                Err(_) => return Err(Error::BodyTimeout(self.idle_timeout)),
                Ok(None) => return Ok(buffered),
                Ok(Some(frame)) => frame.map_err(|e| Error::Body(e.into()))?,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buffered.received = buffered.received.saturating_add(data.len() as u64);
            if buffered.received > self.max_body {
                return Err(Error::BodyTooLarge { max: self.max_body });
            }
            let unreserved = buffered.received.saturating_sub(buffered.reservation.bytes);
            buffered.reservation.grow(unreserved)?;
            buffered.chunks.push(data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stay_within_the_limit_and_are_given_back() {
        let budget = BodyBudget::new(100);
        let mut first = Reservation::new(&budget);
        first.grow(60).unwrap();
        let mut second = Reservation::new(&budget);
        assert!(matches!(
            second.grow(41),
            Err(Error::BodyBudgetSpent { limit: 100 })
        ));
        second.grow(40).unwrap();
        assert_eq!(budget.used(), 100);
        drop(first);
        assert_eq!(budget.used(), 40);
        drop(second);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_huge_piece_cannot_wrap_the_count() {
        let budget = BodyBudget::new(u64::MAX);
        let mut first = Reservation::new(&budget);
        first.grow(u64::MAX).unwrap();
        assert!(!budget.try_reserve(1));
    }
}
