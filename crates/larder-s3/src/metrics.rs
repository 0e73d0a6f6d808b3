//! The S3 API's Prometheus metrics, registered in the frontend's registry (prefix
//! `larder_frontend_s3_`). Labels come from fixed sets only: the operation is the name s3s's
//! routing table gave the request (a fixed list of S3 operation names; `unrouted` when the
//! request was refused before it was routed, e.g. a bad signature), the status its class.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The operation label of requests refused before s3s routed them.
pub const UNROUTED: &str = "unrouted";

/// Longest operation name taken as a label (s3s's longest is under 50 bytes).
const MAX_OPERATION: usize = 64;

/// How a read of one of this frontend's caches went (`outcome`: each cache's own fixed set,
/// documented where it counts them: `record_cache.rs`, `body_cache.rs`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReadLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub operation: String,
    /// `1xx` to `5xx`.
    pub status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation: String,
}

/// Where the access check writes the routed operation's name, for the metrics of the request
/// it belongs to (a request extension: s3s hands the access check the request's extensions).
#[derive(Clone, Default)]
pub struct OperationSlot(Arc<OnceLock<String>>);

impl OperationSlot {
    pub fn set(&self, name: &str) {
        // Names are s3s's, so always short identifiers; anything else would be a bug there.
        let fits = name.len() <= MAX_OPERATION && name.bytes().all(|b| b.is_ascii_alphanumeric());
        let _ = self.0.set(if fits { name } else { "other" }.to_owned());
    }

    pub fn get(&self) -> &str {
        self.0.get().map_or(UNROUTED, String::as_str)
    }
}

pub struct S3Metrics {
    requests: Family<RequestLabels, Counter>,
    latency: Family<OperationLabels, Histogram, fn() -> Histogram>,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 18))
}

impl S3Metrics {
    pub fn register(registry: &mut Registry) -> S3Metrics {
        let registry = registry.sub_registry_with_prefix("s3");
        let metrics = S3Metrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
        };
        registry.register(
            "requests",
            "S3 requests answered, by operation (unrouted: refused before routing) and status \
             class",
            metrics.requests.clone(),
        );
        registry.register(
            "request_seconds",
            "Time to S3 response headers, by operation",
            metrics.latency.clone(),
        );
        metrics
    }

    pub fn observe(&self, operation: &str, status: http::StatusCode, elapsed: Duration) {
        let labels = RequestLabels {
            operation: operation.to_owned(),
            status: status_class(status),
        };
        self.requests.get_or_create(&labels).inc();
        let labels = OperationLabels {
            operation: operation.to_owned(),
        };
        self.latency
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }
}

fn status_class(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_short_identifiers_become_labels() {
        let slot = OperationSlot::default();
        assert_eq!(slot.get(), UNROUTED);
        slot.set("GetObject");
        assert_eq!(slot.get(), "GetObject");
        let odd = OperationSlot::default();
        odd.set("Get Object\n");
        assert_eq!(odd.get(), "other");
    }

    #[test]
    fn statuses_fall_into_five_classes() {
        assert_eq!(status_class(http::StatusCode::NOT_MODIFIED), "3xx");
        assert_eq!(status_class(http::StatusCode::PRECONDITION_FAILED), "4xx");
        assert_eq!(
            status_class(http::StatusCode::from_u16(599).unwrap()),
            "5xx"
        );
    }
}
