//! The feed loop: read operations on a blocking thread, keep them in per-document queues, send
//! the head of each queue under the throttle, retry what is retryable, count what finished.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Write};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Request, StatusCode};
use http_body_util::Full;
use parking_lot::Mutex;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::stats::{Progress, Stats};
use crate::transport::{Target, Transport};
use crate::{FeedConfig, FeedError, FeedReader, Operation, Summary, Throttle};

/// Operations read ahead of those in flight, per possible in-flight slot: bounds memory while
/// keeping enough distinct documents at hand to fill the throttle's limit.
const READ_AHEAD_FACTOR: usize = 4;
const BACKOFF_FIRST: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

type Queued = (Operation, OwnedSemaphorePermit);

struct Engine {
    config: FeedConfig,
    transport: Transport,
    throttle: Throttle,
    stats: Arc<Stats>,
    /// For each document with an operation in flight, the operations waiting behind it.
    waiting: Mutex<HashMap<Arc<str>, VecDeque<Queued>>>,
}

/// Feeds every operation in `input` and returns the summary once each has a final outcome.
pub async fn feed<R: BufRead + Send + 'static>(
    config: FeedConfig,
    input: R,
) -> Result<Summary, FeedError> {
    let max_inflight = config.connections.max(1) * config.max_streams_per_connection.max(1);
    let tls = match config.scheme {
        "https" => Some(
            config
                .tls
                .config()
                .map_err(|e| FeedError::Connect(e.to_string()))?,
        ),
        _ => None,
    };
    let target = Target {
        addrs: config.addrs.clone(),
        host: config.host.clone(),
        tls,
    };
    let transport = Transport::connect(
        target,
        config.connections,
        config.max_streams_per_connection as u32,
    )
    .await
    .map_err(FeedError::Connect)?;
    let engine = Arc::new(Engine {
        throttle: Throttle::new(config.connections.max(1), max_inflight),
        transport,
        stats: Arc::new(Stats::default()),
        waiting: Mutex::new(HashMap::new()),
        config,
    });
    let started = Instant::now();
    let progress = engine.config.progress.then(|| {
        let e = engine.clone();
        Progress::start(engine.stats.clone(), move || {
            (e.throttle.inflight(), e.throttle.limit())
        })
    });
    let (tx, mut rx) = mpsc::channel(1024);
    let reader = tokio::task::spawn_blocking(move || {
        for item in FeedReader::new(input) {
            if tx.blocking_send(item).is_err() {
                break;
            }
        }
    });
    let read_ahead = max_inflight * READ_AHEAD_FACTOR;
    let pending = Arc::new(Semaphore::new(read_ahead));
    while let Some(item) = rx.recv().await {
        match item {
            Ok(op) => {
                let permit = pending.clone().acquire_owned().await.expect("never closed");
                engine.enqueue(op, permit);
            }
            Err(malformed) => {
                engine.stats.malformed.fetch_add(1, Relaxed);
                engine.report(malformed.to_string());
            }
        }
    }
    let _ = reader.await;
    // Every permit back means every operation has its final outcome.
    let _all = pending
        .acquire_many(read_ahead as u32)
        .await
        .expect("never closed");
    drop(progress);
    Ok(engine.stats.summary(started.elapsed()))
}

impl Engine {
    fn report(&self, message: String) {
        if let Some(on_error) = &self.config.on_error {
            on_error(&message);
        }
        self.stats.error(message);
    }

    /// Sends `op` now, or queues it behind the operation on the same document in flight.
    fn enqueue(self: &Arc<Self>, op: Operation, permit: OwnedSemaphorePermit) {
        let mut waiting = self.waiting.lock();
        if let Some(queue) = waiting.get_mut(&op.id) {
            queue.push_back((op, permit));
            return;
        }
        waiting.insert(op.id.clone(), VecDeque::new());
        drop(waiting);
        tokio::spawn(self.clone().run_document(op, permit));
    }

    /// Runs the operations of one document one after the other, each to its final outcome.
    async fn run_document(self: Arc<Self>, first: Operation, permit: OwnedSemaphorePermit) {
        let mut next = Some((first, permit));
        while let Some((op, permit)) = next {
            self.execute(&op).await;
            drop(permit);
            let mut waiting = self.waiting.lock();
            let queue = waiting
                .get_mut(&op.id)
                .expect("a running document has a queue");
            next = queue.pop_front();
            if next.is_none() {
                waiting.remove(&op.id);
            }
        }
    }

    /// Sends one operation until it has a final outcome: an answer that is not 429 or 503, or
    /// retries exhausted, or its deadline passed.
    async fn execute(&self, op: &Operation) {
        // Latency and the deadline count from the first request, not from the wait for a slot.
        let mut first_sent = None;
        let mut attempt = 0u32;
        // Compressed once, however often it is sent.
        let body = self.encode(&op.body);
        loop {
            let outcome = {
                let _slot = self.throttle.acquire().await;
                let started = *first_sent.get_or_insert_with(Instant::now);
                let deadline = started + self.config.timeout;
                let remaining = deadline.saturating_duration_since(Instant::now());
                let request = self.request(op, &body, remaining);
                self.stats
                    .bytes_sent
                    .fetch_add(body.bytes.len() as u64, Relaxed);
                let answer = tokio::time::timeout(remaining, self.transport.send(request)).await;
                (started, deadline, answer)
            };
            let (started, deadline, outcome) = outcome;
            let retry_reason = match outcome {
                Ok(Ok((status, body))) => {
                    self.stats
                        .bytes_received
                        .fetch_add(body.len() as u64, Relaxed);
                    let overloaded = matches!(status.as_u16(), 429 | 503);
                    self.throttle.completed(overloaded);
                    if !overloaded {
                        return self.finish(op, status, &body, started);
                    }
                    status.as_u16().to_string()
                }
                Ok(Err(transport_error)) => {
                    self.throttle.completed(false);
                    format!("transport: {transport_error}")
                }
                Err(_) => {
                    self.stats.finish("timeout", false, started.elapsed());
                    return self.report(format!("{}: no answer within the timeout", op.id));
                }
            };
            attempt += 1;
            let now = Instant::now();
            let out_of_retries = attempt > self.config.max_retries && retry_reason != "429";
            if out_of_retries || now >= deadline {
                let outcome = if retry_reason.starts_with("transport") {
                    "transport"
                } else {
                    &retry_reason
                };
                self.stats.finish(outcome, false, started.elapsed());
                return self.report(format!(
                    "{}: gave up after {attempt} attempts: {retry_reason}",
                    op.id
                ));
            }
            self.stats.retries.fetch_add(1, Relaxed);
            tokio::time::sleep(backoff(attempt).min(deadline - now)).await;
        }
    }

    fn finish(&self, op: &Operation, status: StatusCode, body: &Bytes, started: Instant) {
        // 412 is a result (the condition was not met), as in Vespa, not a failure.
        let ok = matches!(status.as_u16(), 200 | 412);
        self.stats.finish(status.as_str(), ok, started.elapsed());
        if !ok {
            let message = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
            self.report(format!(
                "{} (line {}): status {status}: {message}",
                op.id, op.line
            ));
        }
    }

    /// The body as it goes on the wire: gzipped when `compression` says so.
    fn encode(&self, json: &Bytes) -> Encoded {
        if !self.config.compression.applies_to(json.len()) {
            return Encoded {
                bytes: json.clone(),
                gzipped: false,
            };
        }
        let mut gz = flate2::write::GzEncoder::new(
            Vec::with_capacity(json.len() / 2),
            flate2::Compression::fast(),
        );
        gz.write_all(json).expect("writing to a Vec does not fail");
        Encoded {
            bytes: gz.finish().expect("writing to a Vec does not fail").into(),
            gzipped: true,
        }
    }

    fn request(&self, op: &Operation, body: &Encoded, remaining: Duration) -> Request<Full<Bytes>> {
        let separator = if op.path_and_query.contains('?') {
            '&'
        } else {
            '?'
        };
        let uri = format!(
            "{}://{}{}{}{separator}timeout={}ms",
            self.config.scheme,
            self.config.authority,
            self.config.base_path,
            op.path_and_query,
            remaining.as_millis().max(1)
        );
        let mut request = Request::builder()
            .method(op.method())
            .uri(uri)
            .body(Full::new(body.bytes.clone()))
            .expect("operations make valid requests");
        let headers = request.headers_mut();
        if body.gzipped {
            headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        if !op.body.is_empty() {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        for (name, value) in &self.config.headers {
            headers.append(name.clone(), value.clone());
        }
        request
    }
}

/// Exponential backoff with jitter: a random wait between half and all of
/// `BACKOFF_FIRST * 2^(attempt-1)`, at most `BACKOFF_MAX`.
fn backoff(attempt: u32) -> Duration {
    let ceiling = BACKOFF_FIRST
        .saturating_mul(1 << attempt.saturating_sub(1).min(16))
        .min(BACKOFF_MAX);
    ceiling.mul_f64(rand::random_range(0.5..=1.0))
}

/// A request body as sent.
struct Encoded {
    bytes: Bytes,
    gzipped: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_a_ceiling() {
        for attempt in 1..30 {
            let b = backoff(attempt);
            let ceiling = BACKOFF_FIRST
                .saturating_mul(1 << (attempt - 1).min(16))
                .min(BACKOFF_MAX);
            assert!(b <= ceiling && b >= ceiling / 2, "{attempt}: {b:?}");
        }
    }
}
