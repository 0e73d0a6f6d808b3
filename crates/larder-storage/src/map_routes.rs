//! `/internal/v1/map`: `GET` the node's map (TOML), `PUT` a new one. `PUT` without a query is a
//! distribution of an accepted revision (any newer valid map is taken); `PUT ?change` asks the
//! map authority for a change (taken only as the next revision: compare-and-set). Either way a
//! refused map leaves the current one in place and the answer says why; every answer carries
//! the node's revision in `larder-map-revision`.

use std::time::Duration;

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use larder_cluster::{ClusterMap, MapError, Offer, MAX_MAP_BYTES};

use crate::error::{Error, Result};
use crate::map_state::OfferKind;
use crate::reply::{self, Body};
use crate::StorageNode;

/// A map body that has not fully arrived by then is refused.
const MAP_BODY_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) async fn handle(node: &StorageNode, req: Request<Incoming>) -> Result<Response<Body>> {
    match *req.method() {
        Method::GET | Method::HEAD => Ok(current(node)),
        Method::PUT => offer(node, req).await,
        _ => Err(Error::MethodNotAllowed("GET or PUT")),
    }
}

fn current(node: &StorageNode) -> Response<Body> {
    let mut response = reply::body_response(node.maps.current().to_toml());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/toml"),
    );
    response
}

async fn offer(node: &StorageNode, req: Request<Incoming>) -> Result<Response<Body>> {
    let kind = match req.uri().query() {
        Some("change") => OfferKind::Change,
        None | Some("") => OfferKind::Distribution,
        Some(_) => {
            return Err(Error::BadQuery(
                "the only query of PUT /internal/v1/map is ?change",
            ))
        }
    };
    let limit = usize::try_from(MAX_MAP_BYTES).unwrap_or(usize::MAX);
    let body = http_body_util::Limited::new(req.into_body(), limit).collect();
    let body = tokio::time::timeout(MAP_BODY_TIMEOUT, body)
        .await
        .map_err(|_| Error::BodyTimeout(MAP_BODY_TIMEOUT))?
        .map_err(Error::Body)?
        .to_bytes();
    let text =
        std::str::from_utf8(&body).map_err(|_| MapError::Syntax("the map is not UTF-8".into()))?;
    let map = ClusterMap::from_toml(text)?;
    let maps = node.maps.clone();
    let offer = tokio::task::spawn_blocking(move || maps.offer(map, kind))
        .await
        .map_err(|e| Error::Map(MapError::Invalid(format!("offer failed: {e}"))))??;
    let status = match offer {
        Offer::Newer => StatusCode::OK,
        Offer::Same => StatusCode::OK,
    };
    Ok(reply::json(
        status,
        &serde_json::json!({"revision": node.maps.revision(), "changed": offer == Offer::Newer}),
    ))
}
