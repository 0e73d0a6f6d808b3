//! Prometheus metrics of one frontend. The registry is owned by the frontend's state, never a
//! global, so tests and several frontends in one process do not share counters.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: String,
    pub method: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<RouteLabels, Histogram, fn() -> Histogram>,
    pub bytes_received: Counter,
    pub node_up: Family<NodeLabels, Gauge>,
    pub node_state_changes: Family<NodeLabels, Gauge>,
    pub open_connections: Family<NodeLabels, Gauge>,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 18))
}

impl Metrics {
    pub fn new(router: &larder_router::RouterMetrics) -> Metrics {
        let mut registry = Registry::with_prefix("larder_frontend");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RouteLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        let bytes_received = Counter::default();
        let node_up = Family::<NodeLabels, Gauge>::default();
        let node_state_changes = Family::<NodeLabels, Gauge>::default();
        let open_connections = Family::<NodeLabels, Gauge>::default();
        registry.register(
            "requests",
            "Requests answered, by route, method and status",
            requests.clone(),
        );
        registry.register(
            "request_seconds",
            "Time to response headers, by route",
            latency.clone(),
        );
        registry.register(
            "received_bytes",
            "Blob bytes received in uploads",
            bytes_received.clone(),
        );
        registry.register(
            "storage_node_up",
            "1 when this frontend considers a storage node up",
            node_up.clone(),
        );
        registry.register(
            "storage_node_state_changes",
            "Up/down transitions seen per storage node",
            node_state_changes.clone(),
        );
        registry.register(
            "storage_connections",
            "Open HTTP/2 connections per storage node",
            open_connections.clone(),
        );
        registry.register(
            "hedges_sent",
            "Second replica requests sent because the first was slow",
            router.hedges_sent.clone(),
        );
        registry.register(
            "hedges_won",
            "Hedged requests whose answer was used",
            router.hedges_won.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            bytes_received,
            node_up,
            node_state_changes,
            open_connections,
        }
    }

    pub fn observe(&self, route: &str, method: &str, status: u16, elapsed: Duration) {
        let labels = RequestLabels {
            route: route.into(),
            method: method.into(),
            status: status.to_string(),
        };
        self.requests.get_or_create(&labels).inc();
        self.latency
            .get_or_create(&RouteLabels {
                route: route.into(),
            })
            .observe(elapsed.as_secs_f64());
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
