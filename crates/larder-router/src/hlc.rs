//! A hybrid logical clock: versions for document writes that follow wall-clock time closely, yet
//! never go backwards and are always newer than any version this frontend has seen.
//!
//! A version is `(milliseconds since the Unix epoch) << 16 | counter`. The counter orders writes
//! within one millisecond (65,536 of them; past that the clock borrows from the next millisecond,
//! which only moves it ahead of the wall clock, never behind).
//!
//! Every step is checked: a version seen at u64::MAX (or a wall clock past 2^48 ms, year 10889)
//! leaves no newer version to mint, and the clock says so with [`VersionExhausted`] instead of
//! wrapping to a small version that every replica would ignore.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

const COUNTER_BITS: u32 = 16;

/// No version newer than the one seen exists (it is u64::MAX).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("version {seen} leaves no room for a newer one")]
pub struct VersionExhausted {
    pub seen: u64,
}

pub struct Hlc {
    last: AtomicU64,
}

impl Default for Hlc {
    fn default() -> Self {
        Hlc::new()
    }
}

impl Hlc {
    pub fn new() -> Hlc {
        Hlc {
            last: AtomicU64::new(0),
        }
    }

    /// A version newer than every version this clock minted or was shown with `at_least`, and not
    /// older than the wall clock.
    pub fn next(&self, at_least: u64) -> Result<u64, VersionExhausted> {
        // A wall clock beyond what the version's 48 bits of milliseconds hold saturates: the
        // counter then carries the clock forward one version at a time.
        let wall = wall_ms().saturating_mul(1 << COUNTER_BITS);
        let after = |seen: u64| seen.checked_add(1).ok_or(VersionExhausted { seen });
        let newer_than_seen = after(at_least)?;
        let mut last = self.last.load(Ordering::Relaxed);
        loop {
            let next = wall.max(after(last)?).max(newer_than_seen);
            match self
                .last
                .compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Ok(next),
                Err(seen) => last = seen,
            }
        }
    }

    /// Milliseconds since the Unix epoch encoded in `version`.
    pub fn millis(version: u64) -> u64 {
        version >> COUNTER_BITS
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strictly_increasing_and_past_what_it_saw() {
        let clock = Hlc::new();
        let mut previous = 0;
        for _ in 0..100_000 {
            let v = clock.next(0).unwrap();
            assert!(v > previous);
            previous = v;
        }
        let far = (wall_ms() + 60_000) << COUNTER_BITS;
        assert_eq!(
            clock.next(far),
            Ok(far + 1),
            "a version seen elsewhere moves the clock"
        );
        assert!(clock.next(0).unwrap() > far + 1);
        assert!(Hlc::millis(clock.next(0).unwrap()) >= wall_ms());
    }

    #[test]
    fn the_last_version_is_an_error_not_a_wrap() {
        let clock = Hlc::new();
        let seen = u64::MAX;
        assert_eq!(clock.next(seen), Err(VersionExhausted { seen }));
        assert_eq!(clock.next(u64::MAX - 1), Ok(u64::MAX));
        // The clock itself reached the end: nothing newer, for anyone.
        assert_eq!(clock.next(0), Err(VersionExhausted { seen }));
    }
}
