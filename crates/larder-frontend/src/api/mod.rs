//! Routing of public requests to handlers.

mod blobs;
mod documents;
mod large;
mod ops;

use std::sync::Arc;
use std::time::Instant;

use http::{Method, Request, Response};
use hyper::body::Incoming;

use crate::body::Body;
use crate::error::ApiError;
use crate::state::AppState;

pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    let method = req.method().clone();
    let (route, result) = dispatch(&state, req).await;
    let mut response = result.unwrap_or_else(ApiError::into_response);
    if method == Method::HEAD {
        // hyper's HTTP/2 server would send a HEAD response's body (a protocol error for the
        // client); answer with the headers alone, whatever the handler built.
        *response.body_mut() = crate::body::empty();
    }
    state
        .metrics
        .observe(route, &method, response.status(), started.elapsed());
    response
}

/// Largest request body read and dropped before answering a route that needs none (see
/// `body::drain`); bigger ones are reset.
const DRAIN_BUDGET: u64 = 1 << 20;

async fn dispatch(
    state: &Arc<AppState>,
    req: Request<Incoming>,
) -> (&'static str, Result<Response<Body>, ApiError>) {
    let method = req.method().clone();
    // The handlers' futures are boxed: inline, every request's future (which hyper moves into
    // a task per stream, and copies again when it ends) would be as large as the largest
    // handler's, documents and uploads included, whatever the route.
    if req.uri().path() == "/v1/blobs" && method == Method::POST {
        return ("blobs", Box::pin(blobs::upload(state, req)).await);
    }
    if req.uri().path().starts_with("/document/v1/") {
        return (
            "document",
            Ok(Box::pin(documents::handle(state, req)).await),
        );
    }
    // No other route reads a body.
    let (parts, mut body) = req.into_parts();
    let path = parts.uri.path();
    let timeout = state.config.limits.body_read_timeout;
    crate::body::drain(&mut body, DRAIN_BUDGET, timeout).await;
    let read_only = |allow| {
        if method == Method::GET || method == Method::HEAD {
            Ok(())
        } else {
            Err(not_allowed(&method, allow))
        }
    };
    match path {
        "/v1/blobs" => ("blobs", Err(not_allowed(&method, "POST"))),
        "/healthz" => ("healthz", read_only("GET, HEAD").map(|_| ops::healthz())),
        "/readyz" => (
            "readyz",
            match read_only("GET, HEAD") {
                Ok(()) => Ok(ops::readyz(state).await),
                Err(e) => Err(e),
            },
        ),
        "/v1/cluster" => (
            "cluster",
            match read_only("GET, HEAD") {
                Ok(()) => Ok(ops::cluster(state).await),
                Err(e) => Err(e),
            },
        ),
        "/metrics" => (
            "metrics",
            match read_only("GET, HEAD") {
                Ok(()) => Ok(ops::metrics(state).await),
                Err(e) => Err(e),
            },
        ),
        // What Vespa's tools ask a container first: `vespa status` and every `-w` poll
        // `/status.html`; `vespa visit` reads `/` for a document API handler.
        "/status.html" => (
            "status",
            match read_only("GET, HEAD") {
                Ok(()) => Ok(ops::status_html(state).await),
                Err(e) => Err(e),
            },
        ),
        "/" => ("root", read_only("GET, HEAD").map(|_| ops::handlers())),
        _ => match path.strip_prefix("/v1/blobs/") {
            Some(id) => ("blob", Box::pin(blobs::by_id(state, id, &parts)).await),
            None => (
                "other",
                Err(ApiError::NotFound(format!("no API at {path}"))),
            ),
        },
    }
}

fn not_allowed(method: &Method, allow: &'static str) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        allow,
    }
}

pub use documents::{fuzzing, DocLocks, DocWork, DocumentsConfig};
