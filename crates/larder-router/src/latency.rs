//! Recent request latency per datacenter, for the hedging delay: a ring of the last samples and a
//! cached percentile recomputed every few samples (cheap enough for every GET).

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;

const WINDOW: usize = 512;
const RECOMPUTE_EVERY: u64 = 32;

struct Ring {
    samples: Vec<u32>,
    next: usize,
    count: u64,
    cached: Option<Duration>,
}

pub struct LatencyTracker {
    per_dc: HashMap<String, Mutex<Ring>>,
    percentile: f64,
    min_samples: usize,
}

impl LatencyTracker {
    pub fn new(
        datacenters: impl IntoIterator<Item = String>,
        percentile: f64,
        min_samples: usize,
    ) -> LatencyTracker {
        let ring = || {
            Mutex::new(Ring {
                samples: Vec::with_capacity(WINDOW),
                next: 0,
                count: 0,
                cached: None,
            })
        };
        let per_dc = datacenters.into_iter().map(|dc| (dc, ring())).collect();
        LatencyTracker {
            per_dc,
            percentile: percentile.clamp(0.0, 1.0),
            min_samples: min_samples.clamp(1, WINDOW),
        }
    }

    pub fn record(&self, datacenter: &str, latency: Duration) {
        let Some(ring) = self.per_dc.get(datacenter) else {
            return;
        };
        let micros = latency.as_micros().min(u32::MAX as u128) as u32;
        let mut r = ring.lock();
        if r.samples.len() < WINDOW {
            r.samples.push(micros);
        } else {
            let at = r.next;
            r.samples[at] = micros;
        }
        r.next = (r.next + 1) % WINDOW;
        r.count += 1;
        if r.samples.len() >= self.min_samples
            && (r.cached.is_none() || r.count % RECOMPUTE_EVERY == 0)
        {
            let mut sorted = r.samples.clone();
            let rank = ((sorted.len() - 1) as f64 * self.percentile).round() as usize;
            let (_, value, _) = sorted.select_nth_unstable(rank);
            r.cached = Some(Duration::from_micros(u64::from(*value)));
        }
    }

    /// The configured percentile of recent latency, once there are enough samples.
    pub fn percentile(&self, datacenter: &str) -> Option<Duration> {
        self.per_dc.get(datacenter).and_then(|r| r.lock().cached)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_after_enough_samples() {
        let t = LatencyTracker::new(["dc1".to_string()], 0.95, 100);
        for i in 0..99 {
            t.record("dc1", Duration::from_micros(i));
        }
        assert_eq!(t.percentile("dc1"), None);
        for i in 99..200 {
            t.record("dc1", Duration::from_micros(i));
        }
        let p95 = t.percentile("dc1").unwrap();
        assert!(
            (Duration::from_micros(180)..=Duration::from_micros(195)).contains(&p95),
            "{p95:?}"
        );
        assert_eq!(t.percentile("elsewhere"), None);
    }
}
