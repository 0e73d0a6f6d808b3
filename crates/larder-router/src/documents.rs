//! Document operations across replicas. A document lives on the partition its ID hashes to; every
//! write carries a version from this frontend's hybrid logical clock and every replica applies it
//! only if it is newer than what it holds (last writer wins, removes are versioned tombstones), so
//! replicas converge whatever order writes and replication deliver them in.
//!
//! Writes go to every local replica in parallel and succeed at `write_quorum` answers. Reads ask
//! every local replica, take the newest of the first `write_quorum` definite answers (which must
//! overlap any acknowledged write), and repair the replicas that answered with something older.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use larder_cluster::{partition_for_key, PartitionId};
use larder_pool::Body;
use larder_proto::{doc_header, doc_path, header as h};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::order::{caught_up_in, replicas_in};
use crate::router::{refusal, refusal_message, refuses_the_request};
use crate::{Hlc, Router};

/// Why a document operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DocError {
    /// Not enough replicas answered (503).
    #[error("{0}")]
    Unavailable(String),
    /// The operation's deadline passed (504).
    #[error("operation timed out")]
    Timeout,
    /// A replica's disk is full (507).
    #[error("{0}")]
    OutOfSpace(String),
    /// The document is larger than a replica accepts (413).
    #[error("{0}")]
    TooLarge(String),
    /// A replica refused the request itself (400, 413, 414 or 431, e.g. a key that is too long),
    /// with the replica's message. Asking again cannot help, so this stays a 4xx for the client.
    #[error("{0}")]
    Rejected(String),
    /// Every attempt of a write lost to a newer version written concurrently (see `Written`):
    /// nothing was applied. Trying again later can succeed.
    #[error("the write lost to concurrent newer writes of this document (version {newest}) on every attempt; nothing was applied")]
    Superseded { newest: u64 },
    /// The document's version is the last one (u64::MAX): no newer write can be ordered after it.
    #[error("{0}")]
    NoNewerVersion(#[from] crate::hlc::VersionExhausted),
}

/// The newest state of a document a read quorum knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DocState {
    Found { version: u64, json: Bytes },
    Removed { version: u64 },
    NotFound,
}

/// A read of a document the reader holds in full at some version (`DocRouter::get_checking`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked {
    /// No replica of the quorum holds anything newer: the reader's copy is the newest state.
    Unchanged,
    /// The newest state, which is not the reader's.
    Changed(DocState),
}

/// What a quorum write achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// A quorum holds the write's version (or, after a retry, exactly it).
    Applied,
    /// A replica that acknowledged already held this newer version, so the write lost under
    /// last-writer-wins. A frontend whose clock lags another's sees this; it can retry with a
    /// version after the one returned.
    Superseded(u64),
}

impl DocState {
    pub fn version(&self) -> u64 {
        match self {
            DocState::Found { version, .. } | DocState::Removed { version } => *version,
            DocState::NotFound => 0,
        }
    }
}

/// Routes document operations; owns the version clock.
pub struct DocRouter {
    pub(crate) router: Arc<Router>,
    clock: Hlc,
}

type Answer = Result<Response<Incoming>, String>;

impl DocRouter {
    pub fn new(router: Arc<Router>) -> DocRouter {
        DocRouter {
            router,
            clock: Hlc::new(),
        }
    }

    /// A version for a new write that must supersede `seen` (the version a read returned).
    pub fn next_version(&self, seen: u64) -> Result<u64, DocError> {
        Ok(self.clock.next(seen)?)
    }

    pub fn partition_of(&self, id: &str) -> PartitionId {
        partition_for_key(id.as_bytes(), self.router.map().partitions.len() as u32)
    }

    /// The caught-up local replicas of `partition` (live or leaving): the ones reads ask and
    /// quorums count.
    pub(crate) fn local_replicas(&self, partition: PartitionId) -> Vec<String> {
        let map = self.router.map();
        map.partition(partition)
            .map(|p| caught_up_in(&map, p, self.router.datacenter()))
            .unwrap_or_default()
    }

    /// Every local replica of `partition`, bootstrapping ones too: where writes go.
    pub(crate) fn write_targets(&self, partition: PartitionId) -> Vec<String> {
        let map = self.router.map();
        map.partition(partition)
            .map(|p| replicas_in(&map, p, self.router.datacenter()))
            .unwrap_or_default()
    }

    pub(crate) fn quorum(&self, replicas: usize) -> usize {
        self.router.config().write_quorum.clamp(1, replicas.max(1))
    }

    /// Stores `json` as document `id` at `version` on a quorum of local replicas.
    pub async fn put(
        &self,
        id: &str,
        version: u64,
        json: Bytes,
        deadline: Instant,
    ) -> Result<Written, DocError> {
        self.write(id, version, Some(json), deadline).await
    }

    /// Writes a tombstone for `id` at `version` on a quorum of local replicas.
    pub async fn remove(
        &self,
        id: &str,
        version: u64,
        deadline: Instant,
    ) -> Result<Written, DocError> {
        self.write(id, version, None, deadline).await
    }

    async fn write(
        &self,
        id: &str,
        version: u64,
        json: Option<Bytes>,
        deadline: Instant,
    ) -> Result<Written, DocError> {
        let partition = self.partition_of(id);
        let replicas = self.local_replicas(partition);
        let quorum = self.quorum(replicas.len());
        let path = doc_path(partition, id);
        let answers = self.fan_out(&self.write_targets(partition), deadline, |node| {
            write_request(&path, version, json.clone(), &node)
        });
        let acks = Acks {
            acks: 0,
            quorum,
            counted: replicas,
            version,
        };
        acks.collect(answers, deadline).await
    }

    /// The write of a read-modify-write based on the read of `expect` (see `get_for_update`):
    /// applied first at the partition's primary, which refuses it if it holds a newer version
    /// (then `Written::Superseded`: read again) or if it is not the primary at this frontend's
    /// map, then written to the other local replicas; acknowledged at `write_quorum` replicas
    /// counting the primary. While the primary does not answer, this is a 503: moving the
    /// primary is a map change (DESIGN 6.1). `json` None writes a tombstone.
    pub async fn write_serialised(
        &self,
        id: &str,
        expect: u64,
        version: u64,
        json: Option<Bytes>,
        deadline: Instant,
    ) -> Result<Written, DocError> {
        let partition = self.partition_of(id);
        let (primary, fence) = self.primary(partition)?;
        let replicas = self.local_replicas(partition);
        let quorum = self.quorum(replicas.len());
        let path = doc_path(partition, id);
        let mut request = write_request(&path, version, json.clone(), &primary);
        let headers = request.headers_mut();
        let fence = http::HeaderValue::from_str(&fence).map_err(|_| {
            DocError::Unavailable(format!("primary fence {fence:?} is not header text"))
        })?;
        headers.insert(doc_header::PRIMARY, fence);
        headers.insert(doc_header::EXPECT, expect.into());
        let answer = tokio::time::timeout_at(deadline, send(&self.router, &primary, request))
            .await
            .map_err(|_| DocError::Timeout)?;
        let unavailable = |why: String| {
            DocError::Unavailable(format!(
                "the primary {primary} of partition {partition} {why}; read-modify-writes of \
                 the partition wait for it (plain puts and removes go on)"
            ))
        };
        let response = answer.map_err(|e| unavailable(format!("is unreachable ({e})")))?;
        match response.status() {
            StatusCode::OK => {}
            StatusCode::CONFLICT => {
                let newer = version_header(&response).unwrap_or(expect.saturating_add(1));
                return Ok(Written::Superseded(newer));
            }
            StatusCode::MISDIRECTED_REQUEST => {
                let message = refusal_message(response, deadline).await;
                return Err(unavailable(format!(
                    "refused: not the primary at this frontend's map ({message})"
                )));
            }
            _ => {
                let failure = write_refusal(primary, response, deadline).await;
                return Err(write_failure(0, quorum, &[failure]));
            }
        }
        if let Some(newer) = version_header(&response).filter(|v| *v > version) {
            return Ok(Written::Superseded(newer));
        }
        let others: Vec<String> = self
            .write_targets(partition)
            .into_iter()
            .filter(|n| *n != primary)
            .collect();
        let acks = Acks {
            acks: 1,
            quorum,
            counted: replicas,
            version,
        };
        if acks.acks >= quorum {
            return Ok(Written::Applied);
        }
        let answers = self.fan_out(&others, deadline, |node| {
            write_request(&path, version, json.clone(), &node)
        });
        // The primary applied it: that is the read-modify-write's place in the document's
        // order. A replica holding a newer version holds a later write (another read-modify-
        // write, based on this one, or a plain put that replaces it), so this one is not
        // redone (that would apply it twice).
        match acks.collect(answers, deadline).await? {
            Written::Applied | Written::Superseded(_) => Ok(Written::Applied),
        }
    }

    /// The node holding the primary replica of `partition` in this frontend's datacenter, and
    /// the fence that names it at this frontend's map.
    fn primary(&self, partition: PartitionId) -> Result<(String, String), DocError> {
        let map = self.router.map();
        let dc = self.router.datacenter();
        match (
            map.primary_of(partition, dc),
            map.primary_fence(partition, dc),
        ) {
            (Some(node), Some(fence)) => Ok((node.to_owned(), fence)),
            _ => Err(DocError::Unavailable(format!(
                "partition {partition} has no replica in datacenter {dc}"
            ))),
        }
    }
}

/// Counts write acknowledgements until a quorum (or too many failures).
struct Acks {
    acks: usize,
    quorum: usize,
    /// The caught-up replicas, the acknowledged ones included: only their answers count (a
    /// bootstrapping replica is written to but counts for no quorum).
    counted: Vec<String>,
    version: u64,
}

impl Acks {
    async fn collect(
        self,
        mut answers: mpsc::Receiver<(String, Answer)>,
        deadline: Instant,
    ) -> Result<Written, DocError> {
        let Acks {
            mut acks,
            quorum,
            counted,
            version,
        } = self;
        let replicas = counted.len();
        let (mut failures, mut newest) = (Vec::new(), version);
        while let Some(answer) = recv_by(&mut answers, deadline).await? {
            if !counted.contains(&answer.0) {
                continue;
            }
            match answer {
                (_, Ok(r)) if r.status() == StatusCode::OK => {
                    acks += 1;
                    newest = newest.max(version_header(&r).unwrap_or(version));
                }
                (node, Ok(r)) => failures.push(write_refusal(node, r, deadline).await),
                (node, Err(e)) => failures.push((node, None, e)),
            }
            if acks >= quorum {
                return Ok(if newest > version {
                    Written::Superseded(newest)
                } else {
                    Written::Applied
                });
            }
            if failures.len() > replicas.saturating_sub(quorum) {
                break;
            }
        }
        if Instant::now() >= deadline {
            return Err(DocError::Timeout);
        }
        Err(write_failure(acks, quorum, &failures))
    }
}

impl DocRouter {
    /// Starts one request per node, each in its own task so that stragglers finish (and count
    /// against node health) after the caller has its quorum.
    pub(crate) fn fan_out(
        &self,
        nodes: &[String],
        deadline: Instant,
        request: impl Fn(String) -> Request<Body>,
    ) -> mpsc::Receiver<(String, Answer)> {
        let (tx, rx) = mpsc::channel(nodes.len().max(1));
        for node in nodes {
            let request = request(node.clone());
            let (tx, node, router) = (tx.clone(), node.clone(), self.router.clone());
            tokio::spawn(async move {
                let answer =
                    match tokio::time::timeout_at(deadline, send(&router, &node, request)).await {
                        Ok(answer) => answer,
                        Err(_) => Err("operation deadline passed".to_string()),
                    };
                let _ = tx.send((node, answer)).await;
            });
        }
        rx
    }

    /// The newest state of `id` among the first read-quorum definite answers of local replicas.
    pub async fn get(&self, id: &str, deadline: Instant) -> Result<DocState, DocError> {
        checked_state(self.read(id, None, None, deadline).await?)
    }

    /// `get` for a reader that holds version `known` of `id` in full: replicas holding exactly
    /// that version answer without the body (`304`), and `Unchanged` means no answer of the
    /// quorum is newer, so the reader's copy is the newest state (`INTERNAL_API.md`).
    pub async fn get_checking(
        &self,
        id: &str,
        known: u64,
        deadline: Instant,
    ) -> Result<Checked, DocError> {
        self.read(id, None, Some(known), deadline).await
    }

    /// The read of a read-modify-write: as `get`, but the partition's primary must be among the
    /// answers, so the version read is at least the one the primary holds and the serialised
    /// write (`write_serialised`) is refused only when another read-modify-write came between.
    pub async fn get_for_update(&self, id: &str, deadline: Instant) -> Result<DocState, DocError> {
        let (primary, _) = self.primary(self.partition_of(id))?;
        checked_state(self.read(id, Some(&primary), None, deadline).await?)
    }

    /// `get_for_update` for a reader that holds version `known` of `id` in full, as
    /// `get_checking`: `Unchanged` means no answer, the primary's among them, is newer.
    pub async fn get_for_update_checking(
        &self,
        id: &str,
        known: u64,
        deadline: Instant,
    ) -> Result<Checked, DocError> {
        let (primary, _) = self.primary(self.partition_of(id))?;
        self.read(id, Some(&primary), Some(known), deadline).await
    }

    async fn read(
        &self,
        id: &str,
        primary: Option<&str>,
        known: Option<u64>,
        deadline: Instant,
    ) -> Result<Checked, DocError> {
        let partition = self.partition_of(id);
        let replicas = self.local_replicas(partition);
        let quorum = self.quorum(replicas.len());
        let path = doc_path(partition, id);
        let mut answers = self.fan_out(&replicas, deadline, |_| {
            let request = Request::get(path.clone());
            let request = match known {
                Some(version) => request.header(doc_header::KNOWN, version),
                None => request,
            };
            request.body(larder_pool::empty()).expect("valid request")
        });
        let (mut states, mut failures) = (Vec::new(), Vec::new());
        let mut waits_for_primary = primary.is_some();
        while let Some((node, answer)) = recv_by(&mut answers, deadline).await? {
            let from_primary = primary == Some(node.as_str());
            match read_reply(answer, known, deadline).await {
                Ok(state) => {
                    waits_for_primary &= !from_primary;
                    states.push((node, state))
                }
                // The request itself is refused: every replica would say the same.
                Err(ReadFailure::Refused(message)) => {
                    return Err(DocError::Rejected(format!("{node}: {message}")))
                }
                Err(ReadFailure::Failed(err)) if from_primary => {
                    return Err(DocError::Unavailable(format!(
                        "the primary {node} of partition {partition} did not answer ({err}); \
                         read-modify-writes of the partition wait for it"
                    )))
                }
                Err(ReadFailure::Failed(err)) => failures.push(format!("{node}: {err}")),
            }
            if states.len() >= quorum && !waits_for_primary {
                break;
            }
            if failures.len() > replicas.len() - quorum {
                // Replicas that failed because the deadline passed make this a timeout.
                if Instant::now() >= deadline {
                    return Err(DocError::Timeout);
                }
                return Err(DocError::Unavailable(format!(
                    "{} of {quorum} replicas answered ({})",
                    states.len(),
                    failures.join("; ")
                )));
            }
        }
        if states.len() < quorum || waits_for_primary {
            return Err(DocError::Unavailable("too few replicas answered".into()));
        }
        let versions: Vec<(String, u64)> = states
            .iter()
            .map(|(node, reply)| (node.clone(), reply.version()))
            .collect();
        let newest = states
            .into_iter()
            .map(|(_, reply)| reply)
            .max_by_key(Reply::version);
        match newest {
            // The reader's copy is the newest: no body to repair an older replica with, so
            // that is left to replication.
            Some(Reply::Same(_)) => Ok(Checked::Unchanged),
            Some(Reply::State(newest)) => {
                self.repair(&path, &newest, &versions, &replicas, deadline);
                Ok(Checked::Changed(newest))
            }
            None => Ok(Checked::Changed(DocState::NotFound)),
        }
    }

    /// Writes the newest state to replicas that answered with an older one (read repair); the
    /// store's version check makes this safe against concurrent newer writes.
    fn repair(
        &self,
        path: &str,
        newest: &DocState,
        versions: &[(String, u64)],
        replicas: &[String],
        deadline: Instant,
    ) {
        let json = match newest {
            DocState::Found { json, .. } => Some(json.clone()),
            DocState::Removed { .. } => None,
            DocState::NotFound => return,
        };
        let version = newest.version();
        let stale: Vec<String> = versions
            .iter()
            .filter(|(_, v)| *v < version)
            .map(|(n, _)| n.clone())
            .filter(|n| replicas.contains(n))
            .collect();
        if !stale.is_empty() {
            tracing::debug!(path, replicas = ?stale, "repairing stale document replicas");
            let _ = self.fan_out(&stale, deadline, |node| {
                write_request(path, version, json.clone(), &node)
            });
        }
    }
}

fn write_request(path: &str, version: u64, json: Option<Bytes>, _node: &str) -> Request<Body> {
    let time_ms = Hlc::millis(version);
    let builder = Request::builder()
        .uri(path)
        .header(doc_header::VERSION, version)
        .header(h::TIME_MS, time_ms);
    match json {
        Some(json) => builder
            .method(Method::PUT)
            .header(http::header::CONTENT_LENGTH, json.len())
            .body(larder_pool::full(json)),
        None => builder.method(Method::DELETE).body(larder_pool::empty()),
    }
    .expect("valid request")
}

/// One request with the per-request timeout, recording the node's health (the blob path's
/// `Router::send`, so both paths judge nodes alike).
async fn send(router: &Router, node: &str, request: Request<Body>) -> Answer {
    router.send(node, request).await
}

pub(crate) async fn recv_by<T>(
    rx: &mut mpsc::Receiver<T>,
    deadline: Instant,
) -> Result<Option<T>, DocError> {
    let received = tokio::time::timeout_at(deadline, rx.recv())
        .await
        .map_err(|_| DocError::Timeout)?;
    // tokio's timeout polls the receiver before its timer, so an answer that came after the
    // deadline would still count (with a deadline of a microsecond, nearly always): the
    // operation did not finish in time, whatever the answer says.
    if Instant::now() > deadline {
        return Err(DocError::Timeout);
    }
    Ok(received)
}

fn version_header(response: &Response<Incoming>) -> Option<u64> {
    response
        .headers()
        .get(doc_header::VERSION)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Why a replica's GET answer is not a state.
enum ReadFailure {
    /// The replica refused the request itself (see `refuses_the_request`), with its message.
    Refused(String),
    /// Anything else that is not a definite answer: another replica may do better.
    Failed(String),
}

/// One replica's definite answer to a read.
enum Reply {
    State(DocState),
    /// It holds exactly the version the reader knows (`304`).
    Same(u64),
}

impl Reply {
    fn version(&self) -> u64 {
        match self {
            Reply::State(state) => state.version(),
            Reply::Same(version) => *version,
        }
    }
}

/// The state a read without a known version found (a `304` cannot answer it).
fn checked_state(checked: Checked) -> Result<DocState, DocError> {
    match checked {
        Checked::Changed(state) => Ok(state),
        Checked::Unchanged => Err(DocError::Unavailable(
            "a replica answered 304 to a read that named no version".into(),
        )),
    }
}

/// A replica's GET answer: a `304` is "the same" only for the version the reader named.
async fn read_reply(
    answer: Answer,
    known: Option<u64>,
    deadline: Instant,
) -> Result<Reply, ReadFailure> {
    match answer {
        Ok(response) if response.status() == StatusCode::NOT_MODIFIED => {
            // Only the version the reader named is "the same".
            match (version_header(&response), known) {
                (Some(version), Some(known)) if version == known => Ok(Reply::Same(version)),
                _ => Err(ReadFailure::Failed("a 304 for another version".into())),
            }
        }
        answer => read_state(answer, deadline).await.map(Reply::State),
    }
}

/// A replica's GET answer as a state.
async fn read_state(answer: Answer, deadline: Instant) -> Result<DocState, ReadFailure> {
    let failed = |what: &str| ReadFailure::Failed(what.to_owned());
    let response = answer.map_err(ReadFailure::Failed)?;
    match response.status() {
        StatusCode::OK => {
            let version = version_header(&response).ok_or(failed("answer without a version"))?;
            let json = response
                .into_body()
                .collect()
                .await
                .map_err(|e| ReadFailure::Failed(format!("reading the document: {e}")))?
                .to_bytes();
            Ok(DocState::Found { version, json })
        }
        StatusCode::GONE => Ok(DocState::Removed {
            version: version_header(&response).ok_or(failed("tombstone without a version"))?,
        }),
        StatusCode::NOT_FOUND => Ok(DocState::NotFound),
        status if refuses_the_request(status) => Err(ReadFailure::Refused(
            refusal_message(response, deadline).await,
        )),
        other => Err(ReadFailure::Failed(format!("status {other}"))),
    }
}

/// A replica's refusal of a write, as `write_failure` takes it. A refusal of this frontend's
/// clock carries no status: the request was fine, so the client gets a 503, not a 400.
async fn write_refusal(
    node: String,
    response: Response<Incoming>,
    deadline: Instant,
) -> (String, Option<StatusCode>, String) {
    let refusal = refusal(response, deadline).await;
    let status = (!refusal.clock_ahead).then_some(refusal.status);
    (node, status, refusal.message)
}

fn write_failure(
    acks: usize,
    quorum: usize,
    failures: &[(String, Option<StatusCode>, String)],
) -> DocError {
    let detail = failures
        .iter()
        .map(|(node, _, err)| format!("{node}: {err}"))
        .collect::<Vec<_>>()
        .join("; ");
    let message = format!("{acks} of {quorum} required acknowledgements ({detail})");
    let has = |code| failures.iter().any(|(_, s, _)| *s == Some(code));
    if has(StatusCode::INSUFFICIENT_STORAGE) {
        DocError::OutOfSpace(message)
    } else if has(StatusCode::PAYLOAD_TOO_LARGE) {
        DocError::TooLarge(message)
    } else if has(StatusCode::BAD_REQUEST) {
        DocError::Rejected(message)
    } else {
        DocError::Unavailable(message)
    }
}
