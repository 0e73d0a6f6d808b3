//! Visiting: `GET` on a path without a document ID returns the documents of its scope, a chunk
//! at a time, in Vespa's shape: `{"pathId","documents":[{"id","fields"}],"documentCount",
//! "continuation"}` (no continuation once the visit is finished).
//!
//! A visit is of one slice (`slices` + `sliceId`, or the whole corpus): a contiguous range of
//! the document order's hash (`continuation::slice_range`). It goes through the partitions in
//! turn, each in `(h, key)` order, one merged page of `write_quorum` replicas at a time
//! (`DocRouter::visit_page`), so every document present for the whole visit is returned exactly
//! once, by whichever frontends the requests of a visit go to, and N slices visited at once
//! return each document once between them. The selection is evaluated by the storage nodes,
//! where the documents are (`larder-select`; documents it does not match come back without
//! their fields); scope and field set are applied to each page on the blocking pool (`work`),
//! never on the async workers.
//!
//! With `stream=true` the answer starts at once and each page's documents are written as they
//! arrive (bounded by a small channel, so a slow client slows the visit, not the memory); a
//! chunk then ends at `wantedDocumentCount` documents (unbounded by default) or `timeChunk`.
//! Without it, a chunk ends at `wantedDocumentCount` (at most 1024, the default), at
//! [`BUFFERED_BYTES`] of answer, or at `timeChunk`.
//!
//! `PUT` and `DELETE` on such a path (update-where, delete-where) run the same visit and apply
//! the update, or a remove, to every document the selection matches, through the ordinary
//! per-document path with the selection as its condition (so a document changed meanwhile to
//! no longer match is left alone). They answer `{"pathId","documentCount"}` (the documents
//! changed), with a continuation when `timeChunk` cut them short.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{header, HeaderValue, Method, Response, StatusCode};
use larder_router::{PageRequest, VisitedDoc};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use larder_select::Selection;

use super::continuation::{slice_range, Position};
use super::params::Params;
use super::path::{doctype_of, DocPath, Scope};
use super::reply::{self, Failure};
use super::update::Fields;
use super::Operation;
use crate::body::Body;
use crate::state::AppState;

/// The most documents a buffered chunk holds (Vespa's limit for `wantedDocumentCount`).
const MAX_BUFFERED_DOCUMENTS: u64 = 1024;
/// A buffered chunk stops after the page that takes it past this many bytes.
pub const BUFFERED_BYTES: usize = 16 << 20;
/// The name of Larder's one content cluster, as a visit of `cluster=*` lists it: Vespa's
/// command-line tool visits every cluster named in that answer.
pub const CONTENT_CLUSTER: &str = "larder";
/// Vespa's default `timeChunk`.
const DEFAULT_TIME_CHUNK: Duration = Duration::from_secs(60);
/// Pages of rendered documents a streamed answer buffers ahead of a slow client.
const STREAM_CHANNEL: usize = 4;
/// Document writes an update-where or delete-where has in flight at once.
const WRITES_IN_FLIGHT: usize = 16;

/// Which of a document's fields an answer shows (`fieldSet`).
#[derive(Clone, Debug, PartialEq)]
enum FieldSet {
    /// `[all]`, `[document]`, `<type>:[document]` (the default): every stored field.
    All,
    /// `[id]`, `[none]`: no field.
    IdOnly,
    /// `<type>:a,b,c`: these fields.
    Named(Vec<String>),
}

fn field_set(text: Option<&str>) -> Result<FieldSet, String> {
    let Some(text) = text else {
        return Ok(FieldSet::All);
    };
    let (_, spec) = text.rsplit_once(':').unwrap_or(("", text));
    Ok(match spec {
        "[all]" | "[document]" => FieldSet::All,
        "[id]" | "[none]" => FieldSet::IdOnly,
        names if !names.is_empty() && !names.contains('[') && names.len() <= 4096 => {
            FieldSet::Named(names.split(',').map(|n| n.trim().to_owned()).collect())
        }
        _ => return Err(format!("fieldSet {text:?} is not [all], [id], [document], <type>:[document] or <type>:<field>,…")),
    })
}

/// What a visit keeps of each document the storage nodes selected: scope and field set.
struct Filter {
    scope: Scope,
    fields: FieldSet,
}

/// A document a visit returns: its position, ID and rendered `{"id","fields"}` object.
struct Matched {
    h: u64,
    id: String,
    rendered: Bytes,
}

impl Filter {
    /// Whether some documents of a page may be left out (so pages should be larger).
    fn narrows(&self) -> bool {
        self.scope != Scope::default()
    }

    /// The page's documents this filter keeps, rendered. CPU work: runs on the blocking pool.
    fn apply(&self, docs: Vec<VisitedDoc>) -> Result<Vec<Matched>, Failure> {
        let mut out = Vec::with_capacity(docs.len());
        for doc in docs {
            if !self.scope.covers(&doc.id) {
                continue;
            }
            let parsed: Option<Fields> = match self.fields {
                FieldSet::Named(_) => Some(serde_json::from_slice(&doc.fields).map_err(|e| {
                    Failure::Internal(format!("stored document is not a JSON object: {e}"))
                })?),
                _ => None,
            };
            let mut rendered = format!("{{\"id\":{},\"fields\":", quoted(&doc.id)).into_bytes();
            match (&self.fields, &parsed) {
                (FieldSet::All, _) => rendered.extend_from_slice(&doc.fields),
                (FieldSet::IdOnly, _) => rendered.extend_from_slice(b"{}"),
                (FieldSet::Named(names), Some(fields)) => {
                    let kept: serde_json::Map<String, Value> = names
                        .iter()
                        .filter_map(|n| fields.get(n).map(|v| (n.clone(), v.clone())))
                        .collect();
                    serde_json::to_writer(&mut rendered, &kept).expect("JSON values serialise");
                }
                (FieldSet::Named(_), None) => unreachable!("named field sets parse the document"),
            }
            rendered.push(b'}');
            out.push(Matched {
                h: doc.h,
                id: doc.id,
                rendered: rendered.into(),
            });
        }
        Ok(out)
    }
}

fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("strings serialise")
}

/// One chunk of a visit: where it starts, what it keeps, when it stops.
pub(super) struct Visit {
    filter: Arc<Filter>,
    /// The selection's text, checked here, evaluated by the storage nodes.
    selection: Option<String>,
    first: u64,
    last: u64,
    position: Position,
    wanted: u64,
    time_chunk: Duration,
    prefetch: Prefetch,
}

/// Partitions whose first pages a visit fetches at once when the request names no
/// `concurrency`: one ahead of the one being read hides a round trip per partition.
const DEFAULT_CONCURRENCY: u32 = 2;
/// The most pages in flight for one visit, whatever `concurrency` asks (each may hold 4 MiB).
const MAX_CONCURRENCY: u32 = 8;

/// `concurrency`: while one partition is read, the first pages of the next ones are fetched.
/// Documents still come partition after partition, so order and continuations are those of a
/// visit without it; pages fetched for partitions the chunk does not reach are dropped (their
/// requests cancelled).
struct Prefetch {
    ahead: u32,
    /// In partition order, each the first page (no `after`) of its partition.
    pages: std::collections::VecDeque<(u32, PageTask)>,
}

type PageResult = Result<larder_router::PartitionPage, Failure>;

/// A page being fetched by a task of its own; dropping it cancels the fetch.
struct PageTask(tokio::task::JoinHandle<PageResult>);

impl Drop for PageTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl PageTask {
    async fn await_page(mut self) -> PageResult {
        (&mut self.0)
            .await
            .unwrap_or_else(|e| Err(Failure::Internal(format!("a visit page task failed: {e}"))))
    }
}

impl Prefetch {
    fn new(concurrency: Option<u32>) -> Prefetch {
        let wanted = concurrency
            .unwrap_or(DEFAULT_CONCURRENCY)
            .clamp(1, MAX_CONCURRENCY);
        Prefetch {
            ahead: wanted - 1,
            pages: Default::default(),
        }
    }

    /// The page `request` asks for, if it was fetched ahead.
    fn take(&mut self, request: &PageRequest) -> Option<PageTask> {
        if request.after.is_some() {
            return None;
        }
        while let Some((partition, _)) = self.pages.front() {
            if *partition >= request.partition {
                break;
            }
            self.pages.pop_front();
        }
        match self.pages.front() {
            Some((partition, _)) if *partition == request.partition => {
                self.pages.pop_front().map(|(_, task)| task)
            }
            _ => None,
        }
    }

    /// Starts the first pages of the partitions after `current`'s, up to `ahead` of them.
    fn fill(&mut self, state: &Arc<AppState>, current: &PageRequest, partitions: u32) {
        let last = current
            .partition
            .saturating_add(self.ahead)
            .min(partitions.saturating_sub(1));
        let next = self
            .pages
            .back()
            .map_or(current.partition + 1, |(p, _)| p + 1)
            .max(current.partition + 1);
        for partition in next..=last {
            let request = PageRequest {
                partition,
                after: None,
                ..current.clone()
            };
            let task = tokio::spawn(fetch_page(state.clone(), request));
            self.pages.push_back((partition, PageTask(task)));
        }
    }
}

async fn fetch_page(state: Arc<AppState>, request: PageRequest) -> PageResult {
    let deadline = Instant::now() + state.router.config().operation_timeout;
    Ok(state.documents.visit_page(&request, deadline).await?)
}

impl Visit {
    /// The visit a request asks for, checked: slices, continuation, selection, field set.
    pub(super) fn plan(
        params: &Params,
        scope: Scope,
        partitions: u32,
        method: &Method,
    ) -> Result<Visit, Failure> {
        let bad = Failure::BadRequest;
        if params.cluster.as_deref() == Some("*") {
            // Vespa's answer, word for word: `vespa visit` reads the cluster names out of it.
            return Err(bad(format!(
                "Your Vespa deployment has no content cluster '*', only '{CONTENT_CLUSTER}'"
            )));
        }
        // Every document is in the default bucket space; the global one (documents Vespa
        // copies to every node) is empty.
        let global = match params.bucket_space.as_deref() {
            None | Some("default") => false,
            Some("global") => true,
            Some(other) => {
                return Err(bad(format!(
                    "bucketSpace must be default or global, not {other:?}"
                )))
            }
        };
        let (slices, slice_id) = match (params.slices, params.slice_id) {
            (None, None) => (1, 0),
            (Some(s), Some(id)) if id < s => (s, id),
            (Some(s), Some(id)) => {
                return Err(bad(format!("sliceId {id} must be below slices {s}")))
            }
            _ => return Err(bad("slices and sliceId go together".into())),
        };
        let position = match &params.continuation {
            None => Position {
                slices,
                slice_id,
                partitions,
                partition: 0,
                after: None,
            },
            Some(token) => {
                let position = Position::decode(token).map_err(bad)?;
                if (position.slices, position.slice_id) != (slices, slice_id) {
                    return Err(bad(
                        "the continuation belongs to another slice (send the same slices and sliceId)".into(),
                    ));
                }
                if position.partitions != partitions {
                    return Err(bad(format!(
                        "the continuation was made for {} partitions; this cluster has {partitions}",
                        position.partitions
                    )));
                }
                position
            }
        };
        if let Some(text) = &params.selection {
            // Checked here too, so a bad one is a 400 with its position, not a storage error.
            Selection::parse(text).map_err(|e| bad(format!("bad selection: {e}")))?;
        }
        let selection = params.selection.clone();
        if *method != Method::GET {
            if params.cluster.is_none() {
                return Err(bad(format!(
                    "{method} of a document selection needs the cluster parameter"
                )));
            }
            if selection.is_none() {
                return Err(bad(format!(
                    "{method} of a document selection needs a selection"
                )));
            }
        }
        let fields = field_set(params.field_set.as_deref()).map_err(bad)?;
        let wanted = match (params.stream, params.wanted_document_count) {
            (_, Some(n)) if !params.stream => n.min(MAX_BUFFERED_DOCUMENTS),
            (_, Some(n)) => n,
            (false, None) => MAX_BUFFERED_DOCUMENTS,
            (true, None) => u64::MAX,
        };
        let time_chunk = params.time_chunk.unwrap_or(DEFAULT_TIME_CHUNK);
        let time_chunk = params.timeout.map_or(time_chunk, |t| t.min(time_chunk));
        let (first, last) = slice_range(slices, slice_id);
        let mut position = position;
        if global {
            position.partition = partitions;
        }
        Ok(Visit {
            filter: Arc::new(Filter { scope, fields }),
            selection,
            first,
            last,
            position,
            wanted: if *method == Method::GET {
                wanted
            } else {
                u64::MAX
            },
            time_chunk,
            prefetch: Prefetch::new(params.concurrency),
        })
    }

    /// Runs the chunk into `sink`. Returns the continuation, or `None` when the visit is done.
    async fn run<S: Sink>(
        &mut self,
        state: &Arc<AppState>,
        sink: &mut S,
    ) -> Result<Option<String>, Failure> {
        let started = Instant::now();
        let mut count = 0u64;
        loop {
            let position = &mut self.position;
            if position.partition >= position.partitions {
                return Ok(None);
            }
            if count >= self.wanted || started.elapsed() >= self.time_chunk || sink.full() {
                return Ok(Some(position.encode()));
            }
            let remaining = self.wanted - count;
            let limit = match self.filter.narrows() || self.selection.is_some() {
                true => larder_proto::VISIT_MAX_LIMIT,
                false => remaining.min(larder_proto::VISIT_MAX_LIMIT as u64) as usize,
            };
            let request = PageRequest {
                partition: position.partition,
                first: self.first,
                last: self.last,
                after: position.after.clone(),
                limit,
                selection: self.selection.clone(),
            };
            let page = self.prefetch.take(&request).unwrap_or_else(|| {
                PageTask(tokio::spawn(fetch_page(state.clone(), request.clone())))
            });
            self.prefetch.fill(state, &request, position.partitions);
            let page = page.await_page().await?;
            let filter = self.filter.clone();
            let docs = page.docs;
            let mut matched = state.document_work.run(move || filter.apply(docs)).await?;
            if matched.len() as u64 > remaining {
                // Stop after the last document taken; the rest of the page comes next time.
                matched.truncate(remaining as usize);
                let last = matched.last().expect("remaining is positive");
                position.after = Some((last.h, last.id.clone()));
            } else if let Some(next) = page.next {
                position.after = Some(next);
            } else {
                position.partition += 1;
                position.after = None;
            }
            count += matched.len() as u64;
            sink.take(matched).await?;
        }
    }
}

/// Where a visit's documents go.
trait Sink: Send {
    /// Takes one page's documents, in order.
    async fn take(&mut self, docs: Vec<Matched>) -> Result<(), Failure>;
    /// Whether the chunk should end now (a buffered answer is large enough).
    fn full(&self) -> bool {
        false
    }
}

/// The `documents` array of an answer, buffered or streamed.
struct Documents {
    count: u64,
    buffer: Vec<u8>,
    /// Streamed: each page's bytes go to the client through this channel.
    stream: Option<mpsc::Sender<Bytes>>,
}

impl Sink for Documents {
    async fn take(&mut self, docs: Vec<Matched>) -> Result<(), Failure> {
        for doc in docs {
            if self.count > 0 {
                self.buffer.push(b',');
            }
            self.buffer.extend_from_slice(&doc.rendered);
            self.count += 1;
        }
        if let Some(stream) = &self.stream {
            if !self.buffer.is_empty() {
                let page = Bytes::from(std::mem::take(&mut self.buffer));
                stream
                    .send(page)
                    .await
                    .map_err(|_| Failure::Unavailable("the client went away".into()))?;
            }
        }
        Ok(())
    }

    fn full(&self) -> bool {
        self.buffer.len() >= BUFFERED_BYTES
    }
}

fn head(path_id: &str) -> String {
    format!("{{\"pathId\":{},\"documents\":[", quoted(path_id))
}

fn tail(count: u64, continuation: Option<&str>, message: Option<&str>) -> String {
    let mut out = format!("],\"documentCount\":{count}");
    if let Some(token) = continuation {
        out.push_str(&format!(",\"continuation\":{}", quoted(token)));
    }
    if let Some(message) = message {
        out.push_str(&format!(",\"message\":{}", quoted(message)));
    }
    out.push('}');
    out
}

fn json_response(body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Answers a visit `GET`: buffered, or streamed from a task of its own.
pub(super) async fn get(
    state: &Arc<AppState>,
    path_id: &str,
    mut visit: Visit,
    stream: bool,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Result<Response<Body>, Failure> {
    if !stream {
        let mut docs = Documents {
            count: 0,
            buffer: Vec::new(),
            stream: None,
        };
        let continuation = visit.run(state, &mut docs).await?;
        drop(permit);
        let mut body = head(path_id).into_bytes();
        body.extend_from_slice(&docs.buffer);
        body.extend_from_slice(tail(docs.count, continuation.as_deref(), None).as_bytes());
        return Ok(json_response(crate::body::full(body)));
    }
    let (tx, rx) = mpsc::channel(STREAM_CHANNEL);
    let (state, head) = (state.clone(), head(path_id));
    tokio::spawn(async move {
        let _permit = permit;
        if tx.send(Bytes::from(head)).await.is_err() {
            return;
        }
        let mut docs = Documents {
            count: 0,
            buffer: Vec::new(),
            stream: Some(tx.clone()),
        };
        let end = match visit.run(&state, &mut docs).await {
            Ok(continuation) => tail(docs.count, continuation.as_deref(), None),
            // Status and documents are sent already: end the JSON with where to go on from.
            Err(failure) => {
                let from = visit.position.encode();
                tail(docs.count, Some(&from), Some(&reply::message_of(&failure)))
            }
        };
        let _ = tx.send(Bytes::from(end)).await;
    });
    Ok(json_response(ChannelBody(rx).boxed_body()))
}

/// A response body fed by a channel: each message is one DATA frame.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl ChannelBody {
    fn boxed_body(self) -> Body {
        use http_body_util::BodyExt;
        self.boxed()
    }
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = crate::body::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(http_body::Frame::data(c))))
    }
}

/// Applies an update-where's update, or a delete-where's remove, to each document it takes.
struct Writes<'a> {
    state: &'a Arc<AppState>,
    method: Method,
    body: Bytes,
    selection: String,
    dry_run: bool,
    changed: u64,
}

impl Sink for Writes<'_> {
    async fn take(&mut self, docs: Vec<Matched>) -> Result<(), Failure> {
        let mut writes = futures_util::stream::iter(docs)
            .map(|doc| self.write(doc.id))
            .buffer_unordered(WRITES_IN_FLIGHT);
        let mut changed = 0;
        while let Some(result) = writes.next().await {
            match result {
                Ok(true) => changed += 1,
                Ok(false) | Err(Failure::ConditionNotMet(_)) | Err(Failure::NotFound) => {}
                Err(other) => return Err(other),
            }
        }
        drop(writes);
        self.changed += changed;
        Ok(())
    }
}

impl Writes<'_> {
    /// One document's update or remove, conditional on the selection. Whether it changed it.
    async fn write(&self, id: String) -> Result<bool, Failure> {
        let path = DocPath {
            namespace: id.split(':').nth(1).unwrap_or("").to_owned(),
            doctype: doctype_of(&id).to_owned(),
            id,
        };
        let params = Params {
            condition: Some(self.selection.clone()),
            dry_run: self.dry_run,
            ..Params::default()
        };
        let op = Operation {
            state: self.state,
            doc: &path,
            params: &params,
            deadline: Instant::now() + self.state.router.config().operation_timeout,
        };
        let response = match self.method {
            Method::PUT => op.update("", self.body.clone()).await?,
            _ => op.remove("").await?,
        };
        Ok(response.status() == StatusCode::OK)
    }
}

/// Answers an update-where (`PUT`) or delete-where (`DELETE`).
pub(super) async fn write(
    state: &Arc<AppState>,
    path_id: &str,
    mut visit: Visit,
    params: &Params,
    method: Method,
    body: Bytes,
) -> Result<Response<Body>, Failure> {
    if method == Method::PUT {
        // A bad update is the request's fault once, not one failure per matching document.
        let check = body.clone();
        state
            .document_work
            .run(move || super::body::update(&check).map(drop))
            .await?;
    }
    let mut writes = Writes {
        state,
        method,
        body,
        selection: params.selection.clone().unwrap_or_default(),
        dry_run: params.dry_run,
        changed: 0,
    };
    let continuation = visit.run(state, &mut writes).await?;
    let mut out = format!(
        "{{\"pathId\":{},\"documentCount\":{}",
        quoted(path_id),
        writes.changed
    );
    if let Some(token) = continuation {
        out.push_str(&format!(",\"continuation\":{}", quoted(&token)));
    }
    out.push('}');
    Ok(json_response(crate::body::full(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_sets() {
        assert_eq!(field_set(None), Ok(FieldSet::All));
        assert_eq!(field_set(Some("[all]")), Ok(FieldSet::All));
        assert_eq!(field_set(Some("music:[document]")), Ok(FieldSet::All));
        assert_eq!(field_set(Some("[id]")), Ok(FieldSet::IdOnly));
        assert_eq!(
            field_set(Some("music:title,year")),
            Ok(FieldSet::Named(vec!["title".into(), "year".into()]))
        );
        assert!(field_set(Some("music:[bogus")).is_err());
    }
}
