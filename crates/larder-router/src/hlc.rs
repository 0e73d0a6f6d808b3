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

/// How far ahead of the wall clock the clock carries its last version. Beyond it (this
/// frontend's clock jumped forward, minted versions there, and was set back), storage nodes
/// with a right clock refuse every version minted from it (their `max_clock_skew`, 5 minutes by
/// default), so carrying it would refuse every document write for as long as the jump was.
/// Starting again from the wall clock is safe: a write whose version is older than one a
/// replica holds is told so and retried with a newer one (`Written::Superseded`).
const MAX_LEAD_MS: u64 = 5 * 60 * 1000;

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

    /// A version newer than `at_least`, not older than the wall clock, and newer than every
    /// version this clock minted while they are at most `MAX_LEAD_MS` ahead of the wall clock.
    pub fn next(&self, at_least: u64) -> Result<u64, VersionExhausted> {
        self.next_at(wall_ms(), at_least)
    }

    fn next_at(&self, wall_ms: u64, at_least: u64) -> Result<u64, VersionExhausted> {
        // A wall clock beyond what the version's 48 bits of milliseconds hold saturates: the
        // counter then carries the clock forward one version at a time.
        let wall = wall_ms.saturating_mul(1 << COUNTER_BITS);
        let lead_limit = wall_ms
            .saturating_add(MAX_LEAD_MS)
            .saturating_mul(1 << COUNTER_BITS);
        let after = |seen: u64| seen.checked_add(1).ok_or(VersionExhausted { seen });
        let newer_than_seen = after(at_least)?;
        let mut last = self.last.load(Ordering::Relaxed);
        loop {
            let carried = match last > lead_limit {
                true => wall,
                false => after(last)?,
            };
            let next = wall.max(carried).max(newer_than_seen);
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
        // Only that document's: the clock goes on from the wall clock for the others.
        assert!(Hlc::millis(clock.next(0).unwrap()) < wall_ms() + MAX_LEAD_MS);
    }

    #[test]
    fn a_lead_past_the_limit_is_dropped_and_a_smaller_one_kept() {
        let clock = Hlc::new();
        let now = 1_800_000_000_000;
        // Set forward an hour: versions follow it.
        let ahead = clock.next_at(now + 3_600_000, 0).unwrap();
        assert_eq!(Hlc::millis(ahead), now + 3_600_000);
        // Set back: the hour of lead is not carried, the wall clock is followed again.
        let back = clock.next_at(now, 0).unwrap();
        assert_eq!(back, now << COUNTER_BITS);
        // A lead within the limit (a small step back) is carried: still strictly increasing.
        let next = clock.next_at(now + 60_000, 0).unwrap();
        assert_eq!(clock.next_at(now, 0), Ok(next + 1));
        // What a read showed is always passed, however far ahead.
        let seen = (now + 3_600_000) << COUNTER_BITS;
        assert_eq!(clock.next_at(now, seen), Ok(seen + 1));
    }
}
