//! Visiting: reading documents back out of `/document/v1` in bulk, the library behind
//! `larder visit`.
//!
//! A visit runs `slices` independent slices at once (Vespa's `slices` and `sliceId`: the server
//! splits the corpus so that the slices together return every document exactly once), each a
//! sequence of page requests that follows `continuation` until the server sends none. Pages are
//! asked for with `stream=true` by default, so the server starts answering before a page is
//! complete, and read as they stream in: each document is written to the output as one JSON line
//! (`{"id", "fields"}`, as the server sent it, compacted) as soon as it has arrived (`scanner`),
//! so memory is one document per slice, never a page. Lines never interleave (each chunk's
//! lines are written together). 429, 503 and transport errors before a page's answer starts are
//! retried with backoff until the per-page deadline; a page that breaks off once documents
//! have been written is an error (retrying it would write them twice).
//!
//! It speaks only the public wire format, so it visits Vespa too.

mod query;
mod scanner;
mod summary;

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use parking_lot::Mutex;

use crate::config::FeedConfig;
use crate::transport::{Streaming, Target, Transport};
use query::PageQuery;
use scanner::{PageScanner, Tail};
pub use summary::VisitSummary;
use summary::{Counters, Progress};

/// Why a visit could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum VisitError {
    #[error("bad visit settings: {0}")]
    Config(String),
    #[error("{0}")]
    Connect(String),
    /// The server refused a page (its status and message), or kept failing past the retries.
    #[error("slice {slice}: {message}")]
    Page { slice: u32, message: String },
    #[error("writing the documents failed: {0}")]
    Output(#[from] std::io::Error),
}

/// Settings of one visit. Build with [`VisitConfig::new`], then adjust the public fields.
#[derive(Clone)]
pub struct VisitConfig {
    /// Endpoint, TLS, headers, connections, timeout and retries, as for a feed.
    pub connection: FeedConfig,
    /// Independent slices visited at once (`--slices`); 1 visits without slicing.
    pub slices: u32,
    /// Visit only this one of the `slices` (`--slice-id`, Vespa's `sliceId`): N processes, on
    /// as many machines, each visiting one slice return every document exactly once together.
    pub slice_id: Option<u32>,
    /// A document selection (`--selection`), evaluated by the server.
    pub selection: Option<String>,
    /// Which fields to return (`--field-set`): `[all]`, `[id]`, `<type>:[document]`, `<type>:a,b`.
    pub field_set: Option<String>,
    /// Vespa's content cluster (`--cluster`); Larder accepts and ignores it.
    pub cluster: Option<String>,
    /// Documents per page the server is asked for.
    pub wanted_document_count: Option<u32>,
    /// Ask for streamed pages (`stream=true`, the default).
    pub stream: bool,
    /// Visit only `/document/v1/<namespace>/<type>/docid` (both, or neither for everything).
    pub scope: Option<(String, String)>,
}

impl VisitConfig {
    /// A config with defaults for `endpoint` (as [`FeedConfig::new`] takes it): 4 slices,
    /// streamed pages, every document.
    pub fn new(endpoint: &str) -> Result<VisitConfig, VisitError> {
        let connection =
            FeedConfig::new(endpoint).map_err(|e| VisitError::Config(e.to_string()))?;
        Ok(VisitConfig {
            connection,
            slices: 4,
            slice_id: None,
            selection: None,
            field_set: None,
            cluster: None,
            wanted_document_count: None,
            stream: true,
            scope: None,
        })
    }

    fn path(&self) -> String {
        let base = &self.connection.base_path;
        match &self.scope {
            Some((namespace, doctype)) => format!(
                "{base}/document/v1/{}/{}/docid",
                crate::operation::encode(namespace),
                crate::operation::encode(doctype)
            ),
            None => format!("{base}/document/v1/"),
        }
    }

    fn query(&self, slice: u32) -> PageQuery {
        PageQuery {
            selection: self.selection.clone(),
            field_set: self.field_set.clone(),
            cluster: self.cluster.clone(),
            wanted_document_count: self.wanted_document_count,
            stream: self.stream,
            slice: (self.slices > 1).then_some((self.slices, slice)),
        }
    }

    /// The slices this process visits: all of them, or the one `slice_id` names.
    fn own_slices(&self) -> Result<std::ops::Range<u32>, VisitError> {
        match self.slice_id {
            None => Ok(0..self.slices),
            Some(id) if id < self.slices => Ok(id..id + 1),
            Some(id) => Err(VisitError::Config(format!(
                "--slice-id {id} is not below --slices {}",
                self.slices
            ))),
        }
    }
}

/// Visits with `config`, writing every document to `output` as a JSON line; the summary when
/// every slice has finished (or the first error: the other slices stop too).
pub async fn visit<W: Write + Send + 'static>(
    config: VisitConfig,
    output: W,
) -> Result<VisitSummary, VisitError> {
    if config.slices == 0 {
        return Err(VisitError::Config("--slices must be at least 1".into()));
    }
    let own_slices = config.own_slices()?;
    let transport = Arc::new(connect(&config).await?);
    let visit = Arc::new(Visit {
        counters: Arc::new(Counters::default()),
        output: Mutex::new(Box::new(output)),
        path: config.path(),
        transport,
        config,
    });
    let started = Instant::now();
    let progress = visit
        .config
        .connection
        .progress
        .then(|| Progress::start(visit.counters.clone()));
    let slices: Vec<_> = own_slices
        .clone()
        .map(|slice| {
            let visit = visit.clone();
            tokio::spawn(async move { visit.slice(slice).await })
        })
        .collect();
    let mut first_error = None;
    for slice in slices {
        let result = slice.await.expect("a slice task never panics");
        if let (Err(e), None) = (result, &first_error) {
            first_error = Some(e);
        }
    }
    drop(progress);
    visit.output.lock().flush()?;
    match first_error {
        Some(e) => Err(e),
        None => Ok(visit
            .counters
            .summary(own_slices.len() as u32, started.elapsed())),
    }
}

async fn connect(config: &VisitConfig) -> Result<Transport, VisitError> {
    let connection = &config.connection;
    let tls = match connection.scheme {
        "https" => Some(
            connection
                .tls
                .config()
                .map_err(|e| VisitError::Connect(e.to_string()))?,
        ),
        _ => None,
    };
    let target = Target {
        addrs: connection.addrs.clone(),
        host: connection.host.clone(),
        tls,
    };
    // One request in flight per slice: more connections than slices would idle.
    let own = config.own_slices()?.len();
    let connections = connection.connections.clamp(1, own);
    Transport::connect(target, connections, own as u32)
        .await
        .map_err(VisitError::Connect)
}

struct Visit {
    config: VisitConfig,
    transport: Arc<Transport>,
    path: String,
    counters: Arc<Counters>,
    output: Mutex<Box<dyn Write + Send>>,
}

impl Visit {
    /// Visits one slice, page after page, until the server sends no continuation.
    async fn slice(&self, slice: u32) -> Result<(), VisitError> {
        let query = self.config.query(slice);
        let mut continuation: Option<String> = None;
        loop {
            if self.counters.failed() {
                return Ok(()); // another slice failed: the visit is over
            }
            let uri = format!("{}?{}", self.path, query.to_query(continuation.as_deref()));
            let tail = self.page(&uri).await.map_err(|message| {
                self.counters.fail();
                VisitError::Page { slice, message }
            })?;
            self.counters.page();
            match tail.next() {
                Some(next) => continuation = Some(next.to_owned()),
                None => return Ok(()),
            }
        }
    }

    /// One page, its documents written as they arrive; retries 429, 503 and transport errors
    /// (before the answer starts) with exponential backoff until the deadline or the retries
    /// run out.
    async fn page(&self, uri: &str) -> Result<Tail, String> {
        let connection = &self.config.connection;
        let deadline = Instant::now() + connection.timeout;
        let mut backoff = Duration::from_millis(50);
        let mut retries = 0;
        loop {
            let failure = match self.transport.send_streaming(self.request(uri)?).await {
                Ok(answer) if answer.response.status() == StatusCode::OK => {
                    return self.read_page(answer).await;
                }
                Ok(answer) => {
                    let (status, message) = refusal(answer).await;
                    if !retryable(status) {
                        return Err(format!("{status}: {message}"));
                    }
                    format!("{status}: {message}")
                }
                Err(transport) => transport,
            };
            retries += 1;
            let jitter =
                Duration::from_millis(rand::random_range(0..=backoff.as_millis() as u64 / 2));
            if retries > connection.max_retries || Instant::now() + backoff > deadline {
                return Err(format!("{failure} (after {retries} attempts)"));
            }
            self.counters.retry();
            tokio::time::sleep(backoff + jitter).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// Reads a page's body as it streams in, writing each chunk's documents as JSON lines.
    async fn read_page(&self, answer: Streaming<'_>) -> Result<Tail, String> {
        let mut body = answer.response.into_body();
        let mut scanner = PageScanner::default();
        let mut lines = Vec::new();
        let mut written = 0u64;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                format!("the page broke off after {written} of its documents were written: {e}")
            })?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            let mut documents = 0;
            scanner.feed(&data, &mut |document| {
                lines.extend_from_slice(document);
                lines.push(b'\n');
                documents += 1;
            })?;
            if !lines.is_empty() {
                self.output
                    .lock()
                    .write_all(&lines)
                    .map_err(|e| format!("writing the documents failed: {e}"))?;
                lines.clear();
            }
            written += documents;
            self.counters.read(documents, data.len() as u64);
        }
        scanner.finish()
    }

    fn request(&self, uri: &str) -> Result<Request<Full<Bytes>>, String> {
        let connection = &self.config.connection;
        let mut request = Request::builder()
            .method(Method::GET)
            .uri(format!(
                "{}://{}{uri}",
                connection.scheme, connection.authority
            ))
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("bad request URI {uri:?}: {e}"))?;
        for (name, value) in &connection.headers {
            request.headers_mut().append(name, value.clone());
        }
        Ok(request)
    }
}

/// An answer other than 200: its status and message (from at most 64 KiB of its body).
async fn refusal(answer: Streaming<'_>) -> (StatusCode, String) {
    let status = answer.response.status();
    let body = Limited::new(answer.response.into_body(), 64 << 10)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    (status, message(&body))
}

fn retryable(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE
}

/// The `message` of a JSON error answer, else the start of the body.
fn message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned())
}
