//! A dynamic limit on operations in flight that searches for the limit with the best throughput.
//!
//! Too few requests in flight leave the server idle between round trips; too many only add
//! queueing (latency) and, past the server's capacity, overload answers. The throttle measures
//! throughput over windows of completions and climbs: it keeps moving the limit in the direction
//! that improved throughput and turns around when throughput drops, preferring the smaller limit
//! when throughput is flat (more in flight would only queue). Overload answers (429, 503) cut the
//! limit at once. The limit stays within `[min, max]`, where `max` is connections times
//! streams per connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

/// Step of one climb, as a fraction of the limit.
const STEP: f64 = 0.1;
/// Throughput gain that justifies more in flight, and loss that forbids fewer.
const GAIN: f64 = 0.03;
const LOSS: f64 = 0.05;
/// A window lasts at least this long (and at least as many completions as the limit).
const MIN_WINDOW: Duration = Duration::from_millis(100);

pub struct Throttle {
    limit: AtomicUsize,
    inflight: AtomicUsize,
    wakeup: Notify,
    min: usize,
    max: usize,
    climb: Mutex<Climb>,
}

struct Climb {
    window_start: Instant,
    completions: usize,
    overloaded: bool,
    previous_throughput: f64,
    direction: f64,
    /// The limit as a float, so that small steps accumulate.
    target: f64,
}

/// One operation's slot; frees it when dropped.
pub struct Slot<'a> {
    throttle: &'a Throttle,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.throttle.inflight.fetch_sub(1, Ordering::AcqRel);
        self.throttle.wakeup.notify_one();
    }
}

impl Throttle {
    pub fn new(min: usize, max: usize) -> Throttle {
        let max = max.max(1);
        let min = min.clamp(1, max);
        let start = (max / 4).clamp(min, max);
        Throttle {
            limit: AtomicUsize::new(start),
            inflight: AtomicUsize::new(0),
            wakeup: Notify::new(),
            min,
            max,
            climb: Mutex::new(Climb {
                window_start: Instant::now(),
                completions: 0,
                overloaded: false,
                previous_throughput: 0.0,
                direction: 1.0,
                target: start as f64,
            }),
        }
    }

    /// Waits for a free slot under the current limit.
    pub async fn acquire(&self) -> Slot<'_> {
        loop {
            let notified = self.wakeup.notified();
            let current = self.inflight.load(Ordering::Acquire);
            if current < self.limit.load(Ordering::Acquire)
                && self
                    .inflight
                    .compare_exchange(current, current + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                return Slot { throttle: self };
            }
            if current < self.limit.load(Ordering::Acquire) {
                continue;
            }
            notified.await;
        }
    }

    /// Records a completed request; `overloaded` when the server answered 429 or 503.
    pub fn completed(&self, overloaded: bool) {
        let mut climb = self.climb.lock();
        climb.completions += 1;
        climb.overloaded |= overloaded;
        let elapsed = climb.window_start.elapsed();
        let limit = self.limit.load(Ordering::Relaxed);
        if elapsed < MIN_WINDOW || climb.completions < limit {
            return;
        }
        let throughput = climb.completions as f64 / elapsed.as_secs_f64();
        if climb.overloaded {
            climb.direction = -1.0;
            climb.target *= 1.0 - 2.0 * STEP;
        } else {
            // Prefer fewer operations in flight when throughput does not care: more would only
            // queue at the server (latency, memory). Going up must pay off clearly; going down
            // continues until throughput clearly suffers.
            let previous = climb.previous_throughput;
            let turn = if climb.direction > 0.0 {
                throughput < previous * (1.0 + GAIN)
            } else {
                throughput < previous * (1.0 - LOSS)
            };
            if turn {
                climb.direction = -climb.direction;
            }
            climb.target *= 1.0 + STEP * climb.direction;
        }
        climb.target = climb.target.clamp(self.min as f64, self.max as f64);
        climb.previous_throughput = throughput;
        climb.completions = 0;
        climb.overloaded = false;
        climb.window_start = Instant::now();
        let new_limit = climb.target.round() as usize;
        if new_limit != limit {
            self.limit.store(new_limit, Ordering::Release);
            self.wakeup.notify_waiters();
        }
    }

    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn limits_and_moves() {
        let throttle = Throttle::new(2, 16);
        assert_eq!(throttle.limit(), 4);
        let slots: Vec<_> = futures_slots(&throttle, 4).await;
        assert_eq!(throttle.inflight(), 4);
        let blocked = tokio::time::timeout(Duration::from_millis(20), throttle.acquire()).await;
        assert!(blocked.is_err(), "a fifth slot waits");
        drop(slots);
        assert_eq!(throttle.inflight(), 0);
        // Overload answers push the limit down to the minimum, never below.
        for _ in 0..50 {
            tokio::time::sleep(MIN_WINDOW / 10).await;
            for _ in 0..20 {
                throttle.completed(true);
            }
        }
        assert_eq!(throttle.limit(), 2);
    }

    async fn futures_slots(throttle: &Throttle, n: usize) -> Vec<Slot<'_>> {
        let mut slots = Vec::new();
        for _ in 0..n {
            slots.push(throttle.acquire().await);
        }
        slots
    }
}
