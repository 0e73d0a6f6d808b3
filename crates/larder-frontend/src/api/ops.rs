//! Operations endpoints: `/healthz`, `/readyz`, `/v1/cluster`, `/metrics`, and the two that
//! Vespa's tools probe: `/status.html` and `/`.

use http::{header, HeaderValue, Response, StatusCode};
use larder_router::NodeState;
use std::sync::Arc;

use crate::body::{full, Body};
use crate::metrics::NodeLabels;
use crate::state::AppState;

fn json(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    let mut response = Response::new(full(value.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Alive: the process answers.
pub fn healthz() -> Response<Body> {
    json(StatusCode::OK, serde_json::json!({"status": "ok"}))
}

/// Ready: the map is loaded and a write quorum of local storage nodes answers its health check.
pub async fn readyz(state: &Arc<AppState>) -> Response<Body> {
    let readiness = state.router.ready().await;
    let status = if readiness.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(
        status,
        serde_json::json!({"ready": readiness.is_ready(),
            "reachable_local_nodes": readiness.reachable_local_nodes, "needed": readiness.needed}),
    )
}

/// Vespa's container status page, which `vespa status` and every `vespa … -w` poll until it
/// answers 200: here, 200 exactly when `/readyz` would (a write quorum of local storage nodes
/// answers), else 503, so that waiting on it waits for a cluster that can take documents.
pub async fn status_html(state: &Arc<AppState>) -> Response<Body> {
    let (status, text) = match state.router.ready().await.is_ready() {
        true => (StatusCode::OK, "OK"),
        false => (StatusCode::SERVICE_UNAVAILABLE, "not ready"),
    };
    let mut response = Response::new(full(format!("<html><body>{text}</body></html>\n")));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html"));
    response
}

/// The handler list a Vespa container serves at `/`, in its shape: `vespa visit` looks there
/// for a handler whose class ends in `DocumentV1ApiHandler` bound to `/document/v1/` before it
/// visits. Only the APIs Larder serves are listed, under Larder's own names.
pub fn handlers() -> Response<Body> {
    let handler = |id: &str, class: &str, binding: &str| {
        serde_json::json!({"id": id, "class": class, "bundle": "larder",
            "serverBindings": [format!("http://*{binding}"), format!("https://*{binding}")]})
    };
    json(
        StatusCode::OK,
        serde_json::json!({"handlers": [
            handler("document-v1", "larder.DocumentV1ApiHandler", "/document/v1/*"),
            handler("blobs-v1", "larder.BlobsV1ApiHandler", "/v1/blobs/*"),
        ]}),
    )
}

/// The cluster as this frontend sees it: nodes with health and connections, partitions. Not the
/// nodes' internal addresses: the public port has no business mapping the internal network.
pub async fn cluster(state: &Arc<AppState>) -> Response<Body> {
    let router = &state.router;
    let map = router.map();
    let connections = router.pool().open_connections().await;
    let health = router.health().snapshot();
    let nodes: Vec<_> = health
        .iter()
        .map(|(id, node_state, failures, changes)| {
            // Health follows the map; a node may leave between the two reads.
            let datacenter = map.node(id).map(|n| n.datacenter.as_str()).unwrap_or("");
            serde_json::json!({"id": id, "datacenter": datacenter,
                "state": node_state, "consecutive_failures": failures, "state_changes": changes,
                "open_connections": connections.get(id).copied().unwrap_or(0)})
        })
        .collect();
    let partitions: Vec<_> = map
        .partitions
        .iter()
        .map(|p| serde_json::json!({"id": p.id, "state": p.state, "replicas": p.replicas.iter().map(|r| &r.node).collect::<Vec<_>>()}))
        .collect();
    json(
        StatusCode::OK,
        serde_json::json!({"datacenter": router.datacenter(), "map_revision": map.revision,
            "nodes": nodes, "partitions": partitions}),
    )
}

/// Prometheus text exposition.
pub async fn metrics(state: &Arc<AppState>) -> Response<Body> {
    let m = &state.metrics;
    let connections = state.router.pool().open_connections().await;
    state.router.observe_download_budget();
    for (id, node_state, _, changes) in state.router.health().snapshot() {
        let labels = NodeLabels { node: id.clone() };
        m.node_up
            .get_or_create(&labels)
            .set(i64::from(node_state == NodeState::Up));
        m.node_state_changes
            .get_or_create(&labels)
            .set(changes as i64);
        m.open_connections
            .get_or_create(&labels)
            .set(connections.get(&id).copied().unwrap_or(0) as i64);
    }
    let mut response = Response::new(full(m.encode()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}
