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

use crate::order::replicas_in;
use crate::router::{refusal_message, refuses_the_request};
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

    pub(crate) fn local_replicas(&self, partition: PartitionId) -> Vec<String> {
        let map = self.router.map();
        let partition = map
            .partitions
            .iter()
            .find(|p| p.id == partition)
            .expect("partition_of picks an existing partition");
        replicas_in(map, partition, self.router.datacenter())
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
        let mut answers = self.fan_out(&replicas, deadline, |node| {
            write_request(&path, version, json.clone(), &node)
        });
        let (mut acks, mut failures, mut newest) = (0, Vec::new(), version);
        while let Some(answer) = recv_by(&mut answers, deadline).await? {
            match answer {
                (_, Ok(r)) if r.status() == StatusCode::OK => {
                    acks += 1;
                    newest = newest.max(version_header(&r).unwrap_or(version));
                }
                (node, Ok(r)) => {
                    let status = r.status();
                    let message = refusal_message(r, deadline).await;
                    failures.push((node, Some(status), message));
                }
                (node, Err(e)) => failures.push((node, None, e)),
            }
            if acks >= quorum {
                return Ok(if newest > version {
                    Written::Superseded(newest)
                } else {
                    Written::Applied
                });
            }
            if failures.len() > replicas.len() - quorum {
                break;
            }
        }
        if Instant::now() >= deadline {
            return Err(DocError::Timeout);
        }
        Err(write_failure(acks, quorum, &failures))
    }

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
        let partition = self.partition_of(id);
        let replicas = self.local_replicas(partition);
        let quorum = self.quorum(replicas.len());
        let path = doc_path(partition, id);
        let mut answers = self.fan_out(&replicas, deadline, |_| {
            Request::get(path.clone())
                .body(larder_pool::empty())
                .expect("valid request")
        });
        let (mut states, mut failures) = (Vec::new(), Vec::new());
        while let Some((node, answer)) = recv_by(&mut answers, deadline).await? {
            match read_state(answer, deadline).await {
                Ok(state) => states.push((node, state)),
                // The request itself is refused: every replica would say the same.
                Err(ReadFailure::Refused(message)) => {
                    return Err(DocError::Rejected(format!("{node}: {message}")))
                }
                Err(ReadFailure::Failed(err)) => failures.push(format!("{node}: {err}")),
            }
            if states.len() >= quorum {
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
        if states.len() < quorum {
            return Err(DocError::Unavailable("too few replicas answered".into()));
        }
        let newest = states
            .iter()
            .map(|(_, s)| s)
            .max_by_key(|s| s.version())
            .cloned()
            .unwrap_or(DocState::NotFound);
        self.repair(&path, &newest, &states, &replicas, deadline);
        Ok(newest)
    }

    /// Writes the newest state to replicas that answered with an older one (read repair); the
    /// store's version check makes this safe against concurrent newer writes.
    fn repair(
        &self,
        path: &str,
        newest: &DocState,
        states: &[(String, DocState)],
        replicas: &[String],
        deadline: Instant,
    ) {
        let json = match newest {
            DocState::Found { json, .. } => Some(json.clone()),
            DocState::Removed { .. } => None,
            DocState::NotFound => return,
        };
        let version = newest.version();
        let stale: Vec<String> = states
            .iter()
            .filter(|(_, s)| s.version() < version)
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
