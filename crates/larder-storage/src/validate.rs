//! Checks on the times and versions a request or a peer asks this node to store. Peers are
//! trusted to be peers, not to be right: one version from the far future would make every later
//! write of that document stale, and an expiry past year 9999 cannot be served as an HTTP date.
//! All arithmetic here saturates or is checked; nothing wraps.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use larder_proto::{doc_header, header as h};

use crate::error::{Error, Result};

/// Latest expiry a blob may carry: 9999-12-31T23:59:59.999Z, the last instant an HTTP date
/// (four-digit year) can name.
pub const MAX_EXPIRES_MS: u64 = 253_402_300_799_999;

/// Bits of a document version below its millisecond time (`ms << 16 | counter`).
const VERSION_COUNTER_BITS: u32 = 16;

/// Milliseconds since the Unix epoch by this node's clock (0 before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// This node's clock and how far ahead of it a time may be.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    max_skew_ms: u64,
}

impl Clock {
    pub fn new(max_skew: Duration) -> Clock {
        Clock {
            max_skew_ms: u64::try_from(max_skew.as_millis()).unwrap_or(u64::MAX),
        }
    }

    fn latest_ms(&self) -> u64 {
        now_ms().saturating_add(self.max_skew_ms)
    }

    /// An operation time (`x-larder-time-ms`, a change's `time_ms`).
    pub fn check_time(&self, header: &'static str, time_ms: u64) -> Result<u64> {
        let limit = self.latest_ms();
        if time_ms > limit {
            return Err(future(header, time_ms, limit, time_ms - limit));
        }
        Ok(time_ms)
    }

    /// A document version: its time part must not be ahead of the clock by more than the skew.
    pub fn check_version(&self, version: u64) -> Result<u64> {
        let limit = self.latest_ms();
        if version >> VERSION_COUNTER_BITS > limit {
            let limit_version = limit.checked_shl(VERSION_COUNTER_BITS).unwrap_or(u64::MAX);
            let ahead_ms = (version >> VERSION_COUNTER_BITS).saturating_sub(limit);
            return Err(future(
                doc_header::VERSION,
                version,
                limit_version,
                ahead_ms,
            ));
        }
        Ok(version)
    }

    /// An expiry may be far ahead (a long TTL), but not past what an HTTP date can say.
    pub fn check_expiry(&self, expires_ms: Option<u64>) -> Result<Option<u64>> {
        match expires_ms {
            Some(ms) if ms > MAX_EXPIRES_MS => Err(future(
                h::EXPIRES_MS,
                ms,
                MAX_EXPIRES_MS,
                ms - MAX_EXPIRES_MS,
            )),
            other => Ok(other),
        }
    }
}

/// An optional decimal header; present but not a number is an error, not a default.
pub fn header_number(headers: &http::HeaderMap, name: &'static str) -> Result<Option<u64>> {
    match headers.get(name) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .map(Some)
            .ok_or_else(|| Error::BadHeader(format!("{name} is not a number"))),
    }
}

fn future(header: &'static str, value: u64, limit: u64, ahead_ms: u64) -> Error {
    tracing::warn!(
        header,
        value,
        limit,
        ahead_ms,
        "refused a time or version from the future"
    );
    Error::FromTheFuture {
        header,
        value,
        limit,
        ahead_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock() -> Clock {
        Clock::new(Duration::from_secs(300))
    }

    #[test]
    fn times_within_the_skew_pass_and_later_ones_do_not() {
        let now = now_ms();
        assert!(clock().check_time(h::TIME_MS, now + 60_000).is_ok());
        assert!(clock().check_time(h::TIME_MS, 0).is_ok());
        assert!(clock().check_time(h::TIME_MS, now + 3_600_000).is_err());
        assert!(clock().check_time(h::TIME_MS, u64::MAX).is_err());
    }

    #[test]
    fn versions_are_judged_by_their_time_part() {
        let now = now_ms();
        assert!(clock().check_version(now << 16 | 0xffff).is_ok());
        assert!(clock().check_version((now + 3_600_000) << 16).is_err());
        assert!(clock().check_version(u64::MAX).is_err());
        assert!(clock().check_version(1).is_ok());
    }

    #[test]
    fn expiries_stop_at_year_9999() {
        assert!(clock().check_expiry(Some(MAX_EXPIRES_MS)).is_ok());
        assert!(clock().check_expiry(Some(MAX_EXPIRES_MS + 1)).is_err());
        assert!(clock().check_expiry(None).is_ok());
    }

    #[test]
    fn a_huge_skew_saturates() {
        let clock = Clock::new(Duration::MAX);
        assert!(clock.check_time(h::TIME_MS, u64::MAX).is_ok());
        assert!(clock.check_version(u64::MAX).is_ok());
    }

    proptest::proptest! {
        /// Any header bytes: a number, a refusal, never a panic.
        #[test]
        fn header_numbers_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            let mut headers = http::HeaderMap::new();
            if let Ok(value) = http::HeaderValue::from_bytes(&bytes) {
                headers.insert(h::TIME_MS, value);
            }
            let _ = header_number(&headers, h::TIME_MS);
        }

        /// Any version, time, expiry and skew: a decision that agrees with the clock, no panic.
        #[test]
        fn checks_decide_by_the_clock(value: u64, skew_secs: u64) {
            let clock = Clock::new(Duration::from_secs(skew_secs));
            let before = now_ms();
            let time_ok = clock.check_time(h::TIME_MS, value).is_ok();
            let version_ok = clock.check_version(value).is_ok();
            let latest = now_ms().saturating_add(skew_secs.saturating_mul(1000));
            if value <= before.saturating_add(skew_secs.saturating_mul(1000)) {
                proptest::prop_assert!(time_ok);
            }
            if value > latest {
                proptest::prop_assert!(!time_ok);
            }
            if value >> 16 > latest {
                proptest::prop_assert!(!version_ok);
            }
            proptest::prop_assert_eq!(clock.check_expiry(Some(value)).is_ok(), value <= MAX_EXPIRES_MS);
        }
    }
}
