//! Prometheus metrics of one frontend. The registry is owned by the frontend's state, never a
//! global, so tests and several frontends in one process do not share counters.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Every label comes from a fixed set, never from the client: a route name from the router's
/// table, a method from [`method_label`], a status the server chose.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: &'static str,
    pub method: &'static str,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: &'static str,
}

/// The label of a request's method: the standard methods by name, anything else `other`
/// (a client may send any token as a method; each would otherwise be a new series forever).
pub fn method_label(method: &http::Method) -> &'static str {
    use http::Method as M;
    match *method {
        M::GET => "GET",
        M::HEAD => "HEAD",
        M::POST => "POST",
        M::PUT => "PUT",
        M::DELETE => "DELETE",
        M::PATCH => "PATCH",
        M::OPTIONS => "OPTIONS",
        M::CONNECT => "CONNECT",
        M::TRACE => "TRACE",
        _ => "other",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
}

/// A client connection's protocol and transport, for the edge's gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionLabels {
    /// `h1` or `h2`.
    pub protocol: &'static str,
    /// `tls`, `cleartext`, `s3` or `s3_tls`: which port it came to.
    pub transport: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransportLabels {
    pub transport: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TimeoutLabels {
    pub timeout: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `public` (the TLS port's) or `pool` (what this frontend presents to storage nodes).
    pub certificate: &'static str,
    /// `ok` or `failed` (the old certificate stays in use).
    pub result: &'static str,
}

/// What happens to client connections at the edge (`connection.rs`). Every label combination is
/// created up front, so dashboards and alerts see zeros instead of missing series.
pub struct EdgeMetrics {
    pub open: Family<ConnectionLabels, Gauge>,
    pub accepted: Family<TransportLabels, Counter>,
    pub refused: Family<ReasonLabels, Counter>,
    pub tls_handshake_failures: Family<ReasonLabels, Counter>,
    pub timed_out: Family<TimeoutLabels, Counter>,
    pub certificate_reloads: Family<ReloadLabels, Counter>,
}

/// Decrements its gauge when the connection it counts ends, however it ends.
pub struct OpenConnection(Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl EdgeMetrics {
    fn register(registry: &mut Registry) -> EdgeMetrics {
        let m = EdgeMetrics {
            open: Family::default(),
            accepted: Family::default(),
            refused: Family::default(),
            tls_handshake_failures: Family::default(),
            timed_out: Family::default(),
            certificate_reloads: Family::default(),
        };
        for transport in ["tls", "cleartext", "s3", "s3_tls"] {
            let _ = m.accepted.get_or_create(&TransportLabels { transport });
            for protocol in ["h1", "h2"] {
                let _ = m.open.get_or_create(&ConnectionLabels {
                    protocol,
                    transport,
                });
            }
        }
        let _ = m.refused.get_or_create(&ReasonLabels {
            reason: "per_ip_limit",
        });
        for reason in ["error", "timeout"] {
            let _ = m
                .tls_handshake_failures
                .get_or_create(&ReasonLabels { reason });
        }
        for timeout in ["idle", "header_read", "stalled_send"] {
            let _ = m.timed_out.get_or_create(&TimeoutLabels { timeout });
        }
        for certificate in ["public", "pool"] {
            for result in ["ok", "failed"] {
                let labels = ReloadLabels {
                    certificate,
                    result,
                };
                let _ = m.certificate_reloads.get_or_create(&labels);
            }
        }
        registry.register(
            "client_connections",
            "Client connections being served (TLS handshake done, protocol known), by protocol \
             (h1, h2) and transport (tls, cleartext)",
            m.open.clone(),
        );
        registry.register(
            "client_connections_accepted",
            "Client connections accepted, by transport (including those refused right after)",
            m.accepted.clone(),
        );
        registry.register(
            "client_connections_refused",
            "Client connections closed right after accept (per_ip_limit: \
             limits.max_connections_per_ip)",
            m.refused.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes on the public port that failed (error; a client that closes before \
             finishing, like a TCP health check, is not counted) or did not finish within \
             limits.header_read_timeout (timeout)",
            m.tls_handshake_failures.clone(),
        );
        registry.register(
            "client_connections_timed_out",
            "Client connections closed by limits.idle_timeout (idle), \
             limits.header_read_timeout (header_read: request head or HTTP/2 preface too slow) or \
             limits.stalled_send_timeout (stalled_send: took nothing while reads were held up)",
            m.timed_out.clone(),
        );
        registry.register(
            "certificate_reloads",
            "Certificate reloads (SIGHUP) of the public port and of the storage pool, by result",
            m.certificate_reloads.clone(),
        );
        m
    }

    /// Counts a connection as open under `protocol` and `transport` until the guard is dropped.
    pub fn open(&self, protocol: &'static str, transport: &'static str) -> OpenConnection {
        let gauge = self
            .open
            .get_or_create(&ConnectionLabels {
                protocol,
                transport,
            })
            .clone();
        gauge.inc();
        OpenConnection(gauge)
    }

    pub fn accepted(&self, transport: &'static str) {
        self.accepted
            .get_or_create(&TransportLabels { transport })
            .inc();
    }

    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabels { reason }).inc();
    }

    pub fn tls_handshake_failed(&self, reason: &'static str) {
        self.tls_handshake_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn timed_out(&self, timeout: &'static str) {
        self.timed_out
            .get_or_create(&TimeoutLabels { timeout })
            .inc();
    }

    pub fn certificate_reloaded(&self, certificate: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.certificate_reloads
            .get_or_create(&ReloadLabels {
                certificate,
                result,
            })
            .inc();
    }
}

pub struct Metrics {
    registry: Registry,
    pub edge: EdgeMetrics,
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
        registry.register(
            "reads_resumed",
            "Blob reads that broke off mid-body and went on from another read",
            router.reads_resumed.clone(),
        );
        registry.register(
            "reads_parked",
            "Downloads that let go of their replica's stream while their client did not read",
            router.reads_parked.clone(),
        );
        registry.register(
            "read_pressure",
            "Times held-up reads (a node's spent read budget, a download waiting on its replica for a second) made the frontend park stalled downloads sooner",
            router.read_pressure.clone(),
        );
        registry.register(
            "download_budget_held_bytes",
            "Bytes this frontend's downloads hold (frames and chunks not yet read by their clients), against router.download_budget",
            router.download_budget_held_bytes.clone(),
        );
        registry.register(
            "download_budget_refusals",
            "New downloads answered 503 DownloadBudgetSpent because the download budget stayed spent",
            router.download_budget_refusals.clone(),
        );
        registry.register(
            "put_batches",
            "Requests that carried several small blobs to one storage node together (router.batch_puts_up_to)",
            router.put_batches.clone(),
        );
        registry.register(
            "put_batched_blobs",
            "Blob copies written to storage nodes within batches",
            router.put_batched_blobs.clone(),
        );
        registry.register(
            "get_batches",
            "Requests that read several blobs from one storage node together (router.batch_gets_up_to)",
            router.get_batches.clone(),
        );
        registry.register(
            "get_batched_blobs",
            "Blob reads sent to storage nodes within batches (answered inline or asked again alone)",
            router.get_batched_blobs.clone(),
        );
        let edge = EdgeMetrics::register(&mut registry);
        Metrics {
            registry,
            edge,
            requests,
            latency,
            bytes_received,
            node_up,
            node_state_changes,
            open_connections,
        }
    }

    pub fn observe(
        &self,
        route: &'static str,
        method: &http::Method,
        status: http::StatusCode,
        elapsed: Duration,
    ) {
        let labels = RequestLabels {
            route,
            method: method_label(method),
            status: status.as_u16(),
        };
        self.requests.get_or_create(&labels).inc();
        self.latency
            .get_or_create(&RouteLabels { route })
            .observe(elapsed.as_secs_f64());
    }

    /// The registry, for metrics defined elsewhere (the S3 API's).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_methods_share_one_series() {
        let metrics = Metrics::new(&larder_router::RouterMetrics::default());
        for i in 0..500 {
            let method = http::Method::from_bytes(format!("ODD{i}").as_bytes()).unwrap();
            metrics.observe("blob", &method, http::StatusCode::NOT_FOUND, Duration::ZERO);
        }
        let text = metrics.encode();
        assert!(!text.contains("ODD"));
        assert!(
            text.contains(r#"method="other",status="404"} 500"#),
            "{text}"
        );
    }
}
