//! Visiting: reading documents back out of `/document/v1` in bulk, the library behind
//! `larder visit`.
//!
//! A visit runs `slices` independent slices at once (Vespa's `slices` and `sliceId`: the server
//! splits the corpus so that the slices together return every document exactly once), each a
//! sequence of page requests that follows `continuation` until the server sends none. Pages are
//! asked for with `stream=true` by default, so the server starts answering before a page is
//! complete. Every document is written to the output as one JSON line (`{"id", "fields"}`, as
//! the server sent it); a page's lines are written together, so lines never interleave.
//! 429, 503 and transport errors are retried with backoff until the visit's per-page deadline.
//!
//! It speaks only the public wire format, so it visits Vespa too.

mod page;
mod summary;

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use parking_lot::Mutex;

use crate::config::FeedConfig;
use crate::transport::{Target, Transport};
use page::{Page, PageQuery};
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
    let slices: Vec<_> = (0..visit.config.slices)
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
            .summary(visit.config.slices, started.elapsed())),
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
    let connections = connection.connections.clamp(1, config.slices as usize);
    Transport::connect(target, connections, config.slices)
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
            let body = self.page(&uri).await.map_err(|message| {
                self.counters.fail();
                VisitError::Page { slice, message }
            })?;
            let page = Page::parse(&body).map_err(|message| {
                self.counters.fail();
                VisitError::Page { slice, message }
            })?;
            let mut lines = Vec::with_capacity(body.len());
            page.write_lines(&mut lines);
            self.output.lock().write_all(&lines)?;
            self.counters
                .page(page.documents.len() as u64, body.len() as u64);
            match page.next() {
                Some(next) => continuation = Some(next.to_owned()),
                None => return Ok(()),
            }
        }
    }

    /// One page's body, retrying 429, 503 and transport errors with exponential backoff until
    /// the deadline or the retries run out.
    async fn page(&self, uri: &str) -> Result<Bytes, String> {
        let connection = &self.config.connection;
        let deadline = Instant::now() + connection.timeout;
        let mut backoff = Duration::from_millis(50);
        let mut retries = 0;
        loop {
            let failure = match self.transport.send(self.request(uri)?).await {
                Ok((StatusCode::OK, body)) => return Ok(body),
                Ok((status, body)) if retryable(status) => format!("{status}: {}", message(&body)),
                Ok((status, body)) => return Err(format!("{status}: {}", message(&body))),
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
