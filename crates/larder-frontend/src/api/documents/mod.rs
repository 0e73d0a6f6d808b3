//! `/document/v1`: Vespa's document API, compatible enough that the real `vespa-feed-client`
//! feeds Larder unchanged. POST puts, PUT updates (read-modify-write: read here, including the
//! partition's primary, applied here, and written through the primary, which refuses the write
//! if another read-modify-write came first, so updates through any frontends are never lost;
//! one at a time per document within a frontend: `locks`),
//! DELETE removes (a versioned tombstone), GET gets. Every write carries a version from the
//! router's hybrid logical clock; replicas keep the newest (see `larder_router::DocRouter`).

mod body;
mod bounds;
mod config;
mod continuation;
#[doc(hidden)]
pub mod fuzzing;
mod locks;
mod params;
mod path;
mod reply;
mod update;
mod visit;
mod work;

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response};
use hyper::body::Incoming;
use larder_router::{DocError, DocState, Written};
use larder_select::{Document, Selection};
use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

pub use config::DocumentsConfig;
pub use locks::DocLocks;
pub use work::DocWork;

use crate::body::Body;
use crate::body_budget::{BodyBudget, Reservation};
use crate::state::AppState;
use params::Params;
use path::{DocPath, Target};
use reply::Failure;
use update::Fields;

/// How often a write is redone when it lost to a concurrent newer version (see `Written`).
const WRITE_ATTEMPTS: usize = 3;

/// How often a read-modify-write is redone when the primary refused its write because another
/// one (from another frontend: this one's lock serialises its own) came first. Each refusal
/// means another read-modify-write of the document was applied, so this bounds the wait of
/// one contender among many; the deadline bounds it too.
const READ_MODIFY_WRITE_ATTEMPTS: usize = 64;

fn attempts(read_modify_write: bool) -> usize {
    match read_modify_write {
        true => READ_MODIFY_WRITE_ATTEMPTS,
        false => WRITE_ATTEMPTS,
    }
}

pub async fn handle(state: &Arc<AppState>, req: Request<Incoming>) -> Response<Body> {
    let (parts, incoming) = req.into_parts();
    let path_id = parts.uri.path().to_owned();
    // The body is read before anything can fail, so that every answer (even a 400 for the path)
    // reaches clients that are still sending: an unread HTTP/2 body ends in a reset stream.
    let max = state.config.documents.max_document_size.as_u64();
    let stall = state.config.limits.body_read_timeout;
    let body = body::read(
        incoming,
        &parts.headers,
        max,
        stall,
        reservation(state, &parts),
    )
    .await;
    let doc = match path::parse(&path_id) {
        Ok(Target::Document(doc)) => doc,
        Ok(Target::Collection(scope)) => {
            return visiting(state, &path_id, scope, &parts, body).await;
        }
        Err(message) => return reply::failure(&path_id, None, Failure::BadRequest(message)),
    };
    let result = match body {
        // The reservation is held until the answer is built: the body lives that long.
        Ok((body, _reservation)) => serve(state, &path_id, &doc, &parts, body).await,
        Err(failure) => Err(failure),
    };
    result.unwrap_or_else(|failure| reply::failure(&path_id, Some(&doc.id), failure))
}

/// A visit (`GET`), update-where (`PUT`) or delete-where (`DELETE`) of the documents of `scope`.
async fn visiting(
    state: &Arc<AppState>,
    path_id: &str,
    scope: path::Scope,
    parts: &http::request::Parts,
    body: Result<(Bytes, Reservation), Failure>,
) -> Response<Body> {
    let result = async {
        // The reservation is held until the answer is built: the body lives that long.
        let (body, _reservation) = body?;
        let params = params::parse(parts.uri.query().unwrap_or("")).map_err(Failure::BadRequest)?;
        if !matches!(parts.method, Method::GET | Method::PUT | Method::DELETE) {
            return Err(Failure::MethodNotAllowed(format!(
                "method {} is not allowed on a document selection; use GET, PUT or DELETE",
                parts.method
            )));
        }
        let partitions = state.documents.partition_count();
        let plan = visit::Visit::plan(&params, scope, partitions, &parts.method)?;
        let permit = state.visits.clone().try_acquire_owned().map_err(|_| {
            Failure::Overloaded("too many visits in progress on this frontend".into())
        })?;
        match parts.method {
            Method::GET => visit::get(state, path_id, plan, params.stream, permit).await,
            ref method => {
                let _permit = permit;
                visit::write(state, path_id, plan, &params, method.clone(), body).await
            }
        }
    }
    .await;
    result.unwrap_or_else(|failure| reply::failure(path_id, None, failure))
}

/// A reservation against this request's connection budget (put there by the connection) and
/// the process's.
fn reservation(state: &AppState, parts: &http::request::Parts) -> Reservation {
    let connection = parts
        .extensions
        .get::<BodyBudget>()
        .cloned()
        .unwrap_or_else(|| {
            BodyBudget::new(
                state.config.limits.buffered_bodies_per_connection,
                "connection",
            )
        });
    Reservation::new(connection, state.body_budget.clone())
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
    /// Runs a CPU-heavy step (see `work`) off the async workers.
    async fn off_worker<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, Failure> + Send + 'static,
    ) -> Result<T, Failure> {
        self.state.document_work.run(work).await
    }

    /// The condition of the query string, or else the body's: parsed within `bounds`' limits.
    fn condition(&self, from_body: Option<&str>) -> Result<Option<Arc<Selection>>, Failure> {
        let text = self.params.condition.as_deref().or(from_body);
        text.map(|t| {
            Selection::parse(t)
                .map(Arc::new)
                .map_err(|e| Failure::BadRequest(format!("bad condition: {e}")))
        })
        .transpose()
    }

    /// Reads the document and fails with 412 unless `condition` holds for it.
    async fn check(&self, condition: &Arc<Selection>) -> Result<DocState, Failure> {
        let current = self.read_for_update().await?;
        let json = match &current {
            DocState::Found { json, .. } => Some(json.clone()),
            _ => None,
        };
        // A conditional write with create=true goes ahead when the document does not exist.
        if json.is_none() && self.params.create {
            return Ok(current);
        }
        let (condition, id, doctype) = (
            condition.clone(),
            self.doc.id.clone(),
            self.doc.doctype.clone(),
        );
        let holds = self
            .off_worker(move || {
                let fields = json.as_deref().map(parse_fields).transpose()?;
                let doc = Document {
                    id: &id,
                    doctype: &doctype,
                    fields: fields.as_ref(),
                };
                Ok(condition.matches(&doc))
            })
            .await?;
        if !holds {
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

    /// The read of a read-modify-write: its primary's answer included (see `DocRouter`).
    async fn read_for_update(&self) -> Result<DocState, Failure> {
        Ok(self
            .state
            .documents
            .get_for_update(&self.doc.id, self.deadline)
            .await?)
    }

    /// Writes `json` (None: a tombstone) as the result of a read of version `seen`, through the
    /// partition's primary (see `DocRouter::write_serialised`).
    async fn write_after_read(&self, seen: u64, json: Option<Bytes>) -> Result<Written, Failure> {
        let docs = &self.state.documents;
        let version = docs.next_version(seen)?;
        Ok(docs
            .write_serialised(&self.doc.id, seen, version, json, self.deadline)
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
        let parsed = self.off_worker(move || body::put(&body)).await?;
        let condition = self.condition(parsed.condition.as_deref())?;
        // A conditional put is a read-check-write: no other one may write in between.
        let _serialised = self.serialise_if(condition.is_some()).await;
        let docs = &self.state.documents;
        let mut seen = 0;
        for _ in 0..attempts(condition.is_some()) {
            let written = match &condition {
                Some(condition) => {
                    seen = self.check(condition).await?.version();
                    let fields = Some(parsed.fields.clone());
                    self.write_after_read(seen, fields).await?
                }
                None => {
                    let version = docs.next_version(seen)?;
                    let fields = parsed.fields.clone();
                    docs.put(&self.doc.id, version, fields, self.deadline)
                        .await?
                }
            };
            match written {
                Written::Applied => return Ok(reply::ok(path_id, &self.doc.id, None)),
                Written::Superseded(newer) => seen = newer,
            }
        }
        Err(DocError::Superseded { newest: seen }.into())
    }

    async fn update(&self, path_id: &str, body: Bytes) -> Result<Response<Body>, Failure> {
        let parsed = self.off_worker(move || body::update(&body)).await?;
        let create = self.params.create || parsed.create;
        let updates = Arc::new(parsed.fields);
        let condition = self.condition(parsed.condition.as_deref())?;
        if self.params.dry_run {
            return Ok(reply::ok(path_id, &self.doc.id, None));
        }
        let _serialised = self.state.document_locks.lock(&self.doc.id).await;
        let mut newest = 0;
        for _ in 0..attempts(true) {
            let current = match &condition {
                Some(condition) => self.check(condition).await?,
                None => self.read_for_update().await?,
            };
            let stored = match &current {
                DocState::Found { json, .. } => Some(json.clone()),
                _ if create => None,
                // Vespa answers 200 to an update of a document that does not exist.
                _ => {
                    let message = "document does not exist; update ignored (use create=true)";
                    return Ok(reply::ok(path_id, &self.doc.id, Some(message)));
                }
            };
            let json = self
                .off_worker({
                    let updates = updates.clone();
                    move || updated(stored.as_deref(), &updates)
                })
                .await?;
            // A concurrent newer write means our read was stale: read and apply again.
            match self.write_after_read(current.version(), Some(json)).await? {
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
        for _ in 0..attempts(condition.is_some()) {
            let written = match &condition {
                Some(condition) => match self.check(condition).await? {
                    DocState::Found { version, .. } => {
                        seen = version;
                        self.write_after_read(seen, None).await?
                    }
                    _ => return Err(Failure::ConditionNotMet("document does not exist".into())),
                },
                None => {
                    let version = docs.next_version(seen)?;
                    docs.remove(&self.doc.id, version, self.deadline).await?
                }
            };
            match written {
                Written::Applied => return Ok(reply::ok(path_id, &self.doc.id, None)),
                Written::Superseded(newer) => seen = newer,
            }
        }
        Err(DocError::Superseded { newest: seen }.into())
    }
}

/// The stored document (or an empty one) with `updates` applied, encoded; refused if the result
/// would nest deeper than documents may (see `bounds`).
fn updated(stored: Option<&[u8]>, updates: &Fields) -> Result<Bytes, Failure> {
    let mut fields = stored.map(parse_fields).transpose()?.unwrap_or_default();
    update::apply(&mut fields, updates).map_err(Failure::BadRequest)?;
    let json = serde_json::to_vec(&fields).expect("JSON values serialise");
    bounds::check_nesting(&json, bounds::MAX_NESTING, "updated document")
        .map_err(Failure::BadRequest)?;
    Ok(Bytes::from(json))
}

fn parse_fields(json: &[u8]) -> Result<Fields, Failure> {
    serde_json::from_slice(json)
        .map_err(|e| Failure::Internal(format!("stored document is not a JSON object: {e}")))
}
