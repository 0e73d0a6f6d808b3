//! A hybrid logical clock: versions for document writes that follow wall-clock time closely, yet
//! never go backwards and are always newer than any version this frontend has seen.
//!
//! A version is `(milliseconds since the Unix epoch) << 16 | counter`. The counter orders writes
//! within one millisecond (65,536 of them; past that the clock borrows from the next millisecond,
//! which only moves it ahead of the wall clock, never behind).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

const COUNTER_BITS: u32 = 16;

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
    pub fn next(&self, at_least: u64) -> u64 {
        let wall = wall_ms() << COUNTER_BITS;
        let mut last = self.last.load(Ordering::Relaxed);
        loop {
            let next = wall.max(last + 1).max(at_least + 1);
            match self
                .last
                .compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return next,
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
        .map(|d| d.as_millis() as u64)
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
            let v = clock.next(0);
            assert!(v > previous);
            previous = v;
        }
        let far = (wall_ms() + 60_000) << COUNTER_BITS;
        assert_eq!(
            clock.next(far),
            far + 1,
            "a version seen elsewhere moves the clock"
        );
        assert!(clock.next(0) > far + 1);
        assert!(Hlc::millis(clock.next(0)) >= wall_ms());
    }
}
