//! `/document/v1`: Vespa's document API, compatible enough that the real `vespa-feed-client`
//! feeds Larder unchanged. POST puts, PUT updates (read-modify-write here, at the frontend, one
//! at a time per document: `locks`),
//! DELETE removes (a versioned tombstone), GET gets. Every write carries a version from the
//! router's hybrid logical clock; replicas keep the newest (see `larder_router::DocRouter`).

mod body;
mod condition;
mod config;
mod locks;
mod params;
mod path;
mod reply;
mod update;

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response};
use hyper::body::Incoming;
use larder_router::{DocError, DocState, Written};
use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

pub use config::DocumentsConfig;
pub use locks::DocLocks;

use crate::body::Body;
use crate::state::AppState;
use condition::{Condition, Subject};
use params::Params;
use path::{DocPath, Target};
use reply::Failure;
use update::Fields;

/// How often a write is redone when it lost to a concurrent newer version (see `Written`).
const WRITE_ATTEMPTS: usize = 3;

pub async fn handle(state: &Arc<AppState>, req: Request<Incoming>) -> Response<Body> {
    let (parts, incoming) = req.into_parts();
    let path_id = parts.uri.path().to_owned();
    // The body is read before anything can fail, so that every answer (even a 400 for the path)
    // reaches clients that are still sending: an unread HTTP/2 body ends in a reset stream.
    let max = state.config.documents.max_document_size.as_u64();
    let stall = state.config.limits.body_read_timeout;
    let body = body::read(incoming, &parts.headers, max, stall).await;
    let doc = match path::parse(&path_id) {
        Ok(Target::Document(doc)) => doc,
        Ok(Target::Collection) => {
            let message = "visiting (a path without a document ID) is not supported yet";
            return reply::failure(&path_id, None, Failure::BadRequest(message.into()));
        }
        Err(message) => return reply::failure(&path_id, None, Failure::BadRequest(message)),
    };
    let result = match body {
        Ok(body) => serve(state, &path_id, &doc, &parts, body).await,
        Err(failure) => Err(failure),
    };
    result.unwrap_or_else(|failure| reply::failure(&path_id, Some(&doc.id), failure))
}

async fn serve(
    state: &Arc<AppState>,
    path_id: &str,
    doc: &DocPath,
    parts: &http::request::Parts,
    body: Bytes,
) -> Result<Response<Body>, Failure> {
    let config = &state.config.documents;
    let params = params::parse(parts.uri.query().unwrap_or("")).map_err(Failure::BadRequest)?;
    if config.testing_reject_ratio > 0.0 && rand::random_bool(config.testing_reject_ratio) {
        return Err(injected_fault());
    }
    let limit = state.router.config().operation_timeout;
    let timeout = params.timeout.map_or(limit, |t| t.min(limit));
    let deadline = Instant::now() + timeout;
    let op = Operation {
        state,
        doc,
        params: &params,
        deadline,
    };
    let work = async {
        match parts.method {
            Method::GET => op.get(path_id).await,
            Method::POST => op.put(path_id, body).await,
            Method::PUT => op.update(path_id, body).await,
            Method::DELETE => op.remove(path_id).await,
            ref other => Err(Failure::MethodNotAllowed(format!(
                "method {other} is not allowed; use GET, POST, PUT or DELETE"
            ))),
        }
    };
    match tokio::time::timeout_at(deadline, work).await {
        Ok(result) => result,
        Err(_) => Err(Failure::Timeout(format!(
            "operation timed out after {timeout:?}"
        ))),
    }
}

/// What the test-only fault injector answers: 429 or 503, as a loaded Vespa would.
fn injected_fault() -> Failure {
    if rand::random_bool(0.5) {
        Failure::Overloaded("rejected by testing_reject_ratio (test fault injection)".into())
    } else {
        Failure::Unavailable("rejected by testing_reject_ratio (test fault injection)".into())
    }
}

/// One document operation and what it needs.
struct Operation<'a> {
    state: &'a Arc<AppState>,
    doc: &'a DocPath,
    params: &'a Params,
    deadline: Instant,
}

impl Operation<'_> {
    fn condition(&self, from_body: Option<&str>) -> Result<Option<Condition>, Failure> {
        let text = self.params.condition.as_deref().or(from_body);
        text.map(|t| {
            condition::parse(t).map_err(|e| Failure::BadRequest(format!("bad condition: {e}")))
        })
        .transpose()
    }

    /// Reads the document and fails with 412 unless `condition` holds for it.
    async fn check(&self, condition: &Condition) -> Result<DocState, Failure> {
        let current = self.read().await?;
        let fields = match &current {
            DocState::Found { json, .. } => Some(parse_fields(json)?),
            _ => None,
        };
        let subject = Subject {
            id: &self.doc.id,
            doctype: &self.doc.doctype,
            fields: fields.as_ref(),
        };
        // A conditional write with create=true goes ahead when the document does not exist.
        let absent_and_create = fields.is_none() && self.params.create;
        if !absent_and_create && !condition.matches(&subject) {
            return Err(Failure::ConditionNotMet(
                "condition not met for the document's current state".into(),
            ));
        }
        Ok(current)
    }

    /// Holds this document's lock (see `locks`) when the operation reads before it writes.
    async fn serialise_if(&self, reads_first: bool) -> Option<OwnedMutexGuard<()>> {
        match reads_first {
            true => Some(self.state.document_locks.lock(&self.doc.id).await),
            false => None,
        }
    }

    async fn read(&self) -> Result<DocState, Failure> {
        Ok(self
            .state
            .documents
            .get(&self.doc.id, self.deadline)
            .await?)
    }

    async fn get(&self, path_id: &str) -> Result<Response<Body>, Failure> {
        match self.read().await? {
            DocState::Found { json, .. } => Ok(reply::found(path_id, &self.doc.id, &json)),
            DocState::Removed { .. } | DocState::NotFound => Err(Failure::NotFound),
        }
    }

    async fn put(&self, path_id: &str, body: Bytes) -> Result<Response<Body>, Failure> {
        if self.params.dry_run {
            // The feed client's handshake is a dry-run put without a body: it must answer 200.
            return Ok(reply::ok(path_id, &self.doc.id, None));
        }
        let parsed = body::put(&body)?;
        let condition = self.condition(parsed.condition.as_deref())?;
        // A conditional put is a read-check-write: no other one may write in between.
        let _serialised = self.serialise_if(condition.is_some()).await;
        let docs = &self.state.documents;
        let mut seen = 0;
        for _ in 0..WRITE_ATTEMPTS {
            if let Some(condition) = &condition {
                seen = self.check(condition).await?.version();
            }
            let version = docs.next_version(seen)?;
            match docs
                .put(&self.doc.id, version, parsed.fields.clone(), self.deadline)
                .await?
            {
                Written::Applied => return Ok(reply::ok(path_id, &self.doc.id, None)),
                Written::Superseded(newer) => seen = newer,
            }
        }
        Err(DocError::Superseded { newest: seen }.into())
    }

    async fn update(&self, path_id: &str, body: Bytes) -> Result<Response<Body>, Failure> {
        let parsed = body::update(&body)?;
        let create = self.params.create || parsed.create;
        let condition = self.condition(parsed.condition.as_deref())?;
        if self.params.dry_run {
            return Ok(reply::ok(path_id, &self.doc.id, None));
        }
        let _serialised = self.state.document_locks.lock(&self.doc.id).await;
        let docs = &self.state.documents;
        let mut newest = 0;
        for _ in 0..WRITE_ATTEMPTS {
            let current = match &condition {
                Some(condition) => self.check(condition).await?,
                None => self.read().await?,
            };
            let mut fields = match &current {
                DocState::Found { json, .. } => parse_fields(json)?,
                _ if create => Fields::new(),
                // Vespa answers 200 to an update of a document that does not exist.
                _ => {
                    let message = "document does not exist; update ignored (use create=true)";
                    return Ok(reply::ok(path_id, &self.doc.id, Some(message)));
                }
            };
            update::apply(&mut fields, &parsed.fields).map_err(Failure::BadRequest)?;
            let json = Bytes::from(serde_json::to_vec(&fields).expect("JSON values serialise"));
            let version = docs.next_version(current.version())?;
            // A concurrent newer write means our read was stale: read and apply again.
            match docs.put(&self.doc.id, version, json, self.deadline).await? {
                Written::Applied => return Ok(reply::ok(path_id, &self.doc.id, None)),
                Written::Superseded(newer) => newest = newer,
            }
        }
        Err(DocError::Superseded { newest }.into())
    }

    async fn remove(&self, path_id: &str) -> Result<Response<Body>, Failure> {
        let condition = self.condition(None)?;
        if self.params.dry_run {
            return Ok(reply::ok(path_id, &self.doc.id, None));
        }
        let _serialised = self.serialise_if(condition.is_some()).await;
        let docs = &self.state.documents;
        let mut seen = 0;
        for _ in 0..WRITE_ATTEMPTS {
            if let Some(condition) = &condition {
                match self.check(condition).await? {
                    DocState::Found { version, .. } => seen = version,
                    _ => return Err(Failure::ConditionNotMet("document does not exist".into())),
                }
            }
            let version = docs.next_version(seen)?;
            match docs.remove(&self.doc.id, version, self.deadline).await? {
                Written::Applied => return Ok(reply::ok(path_id, &self.doc.id, None)),
                Written::Superseded(newer) => seen = newer,
            }
        }
        Err(DocError::Superseded { newest: seen }.into())
    }
}

fn parse_fields(json: &[u8]) -> Result<Fields, Failure> {
    serde_json::from_slice(json)
        .map_err(|e| Failure::Internal(format!("stored document is not a JSON object: {e}")))
}
