//! Reads: one replica at a time in read order, hedged. If the replica asked has not answered
//! within the hedge delay (a percentile of recent latency in its datacenter), the next one is
//! asked as well; the first good answer wins and the others are dropped, which resets their
//! HTTP/2 streams so the storage nodes stop working on them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use http::{header, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use larder_cluster::{BlobId, BlobKind, ClusterMap};
use larder_proto::{blob_path, header as h, header_name as hn, BlobProperties, ByteRange};
use tokio::time::Instant;

use crate::config::RouterConfig;
use crate::order::{count_in, read_order};
use crate::router::{refusal_message, refuses_the_request};
use crate::{BlobBody, FoundBlob, GetAnswer, GoneReason, Missing, Router, RouterError};

/// One replica's answer, its bytes streamed or whole (from a batch: `get_batch.rs`).
type BodyResult = Result<Response<BlobBody>, String>;
type Attempt<'a> = Pin<Box<dyn Future<Output = (&'a str, bool, BodyResult)> + Send + 'a>>;

impl Router {
    /// Reads blob `id` (GET: bytes too; HEAD: properties only), or `range` of it, from the first
    /// replica that answers definitely. A replica whose answer cannot be decoded counts as failed.
    /// When no replica could answer and a storage node showed a newer map than ours (a 421
    /// from a node that no longer holds the partition), the read is tried once more on it.
    pub async fn get_blob(
        self: &Arc<Self>,
        id: &BlobId,
        method: Method,
        range: Option<ByteRange>,
    ) -> Result<GetAnswer, RouterError> {
        self.get_blob_avoiding(id, method, range, &[]).await
    }

    /// `get_blob`, asking none of the replicas in `avoid` (those whose bytes broke off:
    /// `resume.rs`).
    pub(crate) async fn get_blob_avoiding(
        self: &Arc<Self>,
        id: &BlobId,
        method: Method,
        range: Option<ByteRange>,
        avoid: &[String],
    ) -> Result<GetAnswer, RouterError> {
        let map = self.maps.get();
        let answer = self
            .get_blob_in(&map, id, (method.clone(), range), avoid)
            .await;
        if answer.is_err() && self.maps.behind() {
            // Boxed: rare, and inline its future would size (and be copied with) every read's.
            Box::pin(self.maps.catch_up()).await;
            let map = self.maps.get();
            return self.get_blob_in(&map, id, (method, range), avoid).await;
        }
        answer
    }

    async fn get_blob_in<'a>(
        self: &'a Arc<Self>,
        map: &'a ClusterMap,
        id: &BlobId,
        (method, range): (Method, Option<ByteRange>),
        avoid: &[String],
    ) -> Result<GetAnswer, RouterError> {
        let partition = map
            .partition(id.partition)
            .ok_or(RouterError::UnknownPartition(id.partition))?;
        let origin = map.datacenter_by_id(id.datacenter).map(|d| d.name.as_str());
        let places = (self.datacenter.as_str(), origin);
        let mut remaining = read_order(map, partition, places, &self.health, avoid);
        // The write quorum was reached in the blob's datacenter of origin (its ID says which);
        // only those replicas' "not found" can prove that no acknowledged write exists.
        let quorum_dc = origin.unwrap_or(&self.datacenter);
        let in_quorum_dc = count_in(map, partition, quorum_dc);
        // A delete through this datacenter reached a quorum of its replicas: a "found" from a
        // replica still catching up stands once enough of them answered without a tombstone.
        let mut confirm = Confirmation::new(
            count_in(map, partition, &self.datacenter),
            self.config.write_quorum,
        );
        let deadline = Instant::now() + self.config.operation_timeout;
        let range_header = range.map(|r| {
            HeaderValue::try_from(r.to_header()).expect("a byte range is ASCII digits and signs")
        });
        let ask = Ask {
            method: method.clone(),
            id: *id,
            range: range_header,
        };
        // Whole-blob GETs may share a request with others to the same node (`get_batch.rs`).
        // Not chunks: they are large (a chunk size each but the last) and would only be sent
        // back to be asked alone.
        let batched = method == Method::GET
            && range.is_none()
            && id.kind != BlobKind::Chunk
            && self.batches_get_of(id);
        let id = *id;
        let attempt = |node: &'a str, hedge: bool| -> Attempt<'a> {
            // The operation's deadline ends the request too: no timer of its own for it.
            if batched {
                let ask = ask.clone();
                return Box::pin(async move {
                    let request = move || ask.request();
                    let result = self.get_maybe_batched(node, id, request, deadline).await;
                    (node, hedge, result)
                });
            }
            let request = ask.request();
            Box::pin(async move {
                let result = self.send_by(node, request, Some(deadline)).await;
                (node, hedge, result.map(|r| r.map(BlobBody::Streamed)))
            })
        };

        let mut in_flight = FuturesUnordered::new();
        let (mut not_found, mut errors) = (0, Vec::new());
        // Local replicas that failed to answer, asked again while a held answer needs them.
        let mut reask = Reask::new(&self.config, deadline);
        let mut last_asked = "";
        // Replicas asked that have not answered yet (at most the replica count).
        let mut pending: Vec<&str> = Vec::new();
        // One timer for the whole read: the next hedge while one can be due, otherwise the
        // deadline (so a batched read needs no timer of its own).
        let timer = tokio::time::sleep_until(deadline);
        tokio::pin!(timer);
        let is_local = |node: &str| map.datacenter_of(node) == Some(self.datacenter.as_str());
        loop {
            if confirm.holds_caught_up() && !pending.iter().any(|n| is_local(n)) {
                // Another datacenter's caught-up replica found it, and no local replica is
                // still to answer: it is served, as a failover read always was.
                if let Some(held) = confirm.take() {
                    return Ok(held);
                }
            }
            if in_flight.is_empty() {
                // Nothing pending: ask the next replica now (first try, or failover); once all
                // were asked, again a local one that failed, if a held answer waits for it.
                let node = match remaining.next() {
                    Some(node) => node,
                    None => match reask.next(confirm.held.is_some()).await {
                        Some(node) => node,
                        None => break,
                    },
                };
                last_asked = node;
                pending.push(node);
                in_flight.push(attempt(node, false));
            }
            let hedge_at = self.next_hedge(last_asked, remaining.len(), deadline);
            if hedge_at.is_some_and(|at| at <= Instant::now()) {
                // A zero delay hedges at once, without a timer: even a zero-length sleep would
                // wait for the timer's next tick (1 ms), long enough for most reads to finish.
                let node = remaining.next().expect("next_hedge checked");
                self.hedge(node, &mut last_asked, &mut pending);
                in_flight.push(attempt(node, true));
                continue;
            }
            let wake_at = hedge_at.unwrap_or(deadline);
            if timer.deadline() != wake_at {
                timer.as_mut().reset(wake_at);
            }
            tokio::select! {
                Some((node, hedged, result)) = in_flight.next() => {
                    pending.retain(|n| *n != node);
                    if Instant::now() >= deadline {
                        return Err(RouterError::Timeout(self.config.operation_timeout));
                    }
                    let answer = match result {
                        Ok(response) => decode((node, response), range, deadline).await,
                        Err(err) => Err(Undecoded::Failed(err)),
                    };
                    let local = is_local(node);
                    match answer {
                    Err(Undecoded::NotFound) => {
                        confirm.no_tombstone(local);
                        // A replica elsewhere may just not have pulled the blob yet.
                        if map.datacenter_of(node) == Some(quorum_dc) {
                            not_found += 1;
                        }
                        if let Some(held) = confirm.release() {
                            return Ok(held);
                        }
                    }
                    Err(Undecoded::Failed(err)) => {
                        errors.push(format!("{node}: {err}"));
                        if local {
                            reask.failed(node);
                        }
                    }
                    Err(Undecoded::NotYet(err)) => {
                        errors.push(format!("{node}: {err}"));
                        reask.not_yet(node);
                    }
                    Err(Undecoded::BudgetSpent(err)) => {
                        self.pressure.raise(&self.metrics.read_pressure);
                        errors.push(format!("{node}: {err}"));
                        reask.not_yet(node);
                    }
                    Err(Undecoded::Refused(message)) => {
                        return Err(RouterError::Rejected(format!("{node}: {message}")));
                    }
                    // A replica catching up may lack a tombstone; so may another datacenter's
                    // while a replica here, which may hold one, has not answered yet.
                    Ok(GetAnswer::Found(found))
                        if found.catching_up
                            || (!local && pending.iter().any(|n| is_local(n))) =>
                    {
                        confirm.hold(local, found);
                        if let Some(held) = confirm.release() {
                            return Ok(held);
                        }
                    }
                    Ok(answer) => {
                        if hedged {
                            self.metrics.hedges_won.inc();
                            // Replicas still silent after losing the race get a health check.
                            for slow in &pending {
                                self.check_slow_replica(slow);
                            }
                        }
                        return Ok(answer);
                    }
                }},
                _ = &mut timer => {
                    if hedge_at.is_none() {
                        return Err(RouterError::Timeout(self.config.operation_timeout));
                    }
                    let node = remaining.next().expect("next_hedge checked");
                    self.hedge(node, &mut last_asked, &mut pending);
                    in_flight.push(attempt(node, true));
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(RouterError::Timeout(self.config.operation_timeout));
        }
        if confirm.holds_caught_up() {
            if let Some(held) = confirm.take() {
                return Ok(held);
            }
        }
        if confirm.held.is_some() {
            // Found only by replicas catching up, and not enough local ones answered to rule
            // out a delete acknowledged here: the blob may be deleted, so no answer.
            return Err(RouterError::Unavailable(format!(
                "only replicas still catching up found it ({})",
                errors.join("; ")
            )));
        }
        // A quorum write reached `write_quorum` replicas in its datacenter, so once more than
        // the rest of them say "not found", no acknowledged write can exist.
        let quorum = self.config.write_quorum.clamp(1, in_quorum_dc.max(1));
        if not_found > in_quorum_dc.saturating_sub(quorum) {
            return Ok(GetAnswer::Missing(Missing::NotFound));
        }
        Err(RouterError::Unavailable(format!(
            "no replica could answer ({})",
            errors.join("; ")
        )))
    }

    /// When to ask the next replica too, after asking `last_asked`: `None` when no hedge can be
    /// due (hedging off, no replica left to ask, or not before the operation's deadline).
    fn next_hedge(&self, last_asked: &str, left: usize, deadline: Instant) -> Option<Instant> {
        if !self.config.hedging || left == 0 {
            return None;
        }
        let at = Instant::now().checked_add(self.hedge_delay(last_asked))?;
        (at < deadline).then_some(at)
    }

    /// Records a hedge sent to `node`.
    fn hedge<'a>(&self, node: &'a str, last_asked: &mut &'a str, pending: &mut Vec<&'a str>) {
        *last_asked = node;
        self.metrics.hedges_sent.inc();
        pending.push(node);
    }

    /// How long to wait for `node` before asking the next replica too: the configured percentile
    /// of recent latency in its datacenter, or a fixed delay until there are enough samples.
    pub(crate) fn hedge_delay(&self, node: &str) -> Duration {
        let observed = self.with_datacenter_of(node, |dc| self.latency.percentile(dc));
        let delay = observed
            .unwrap_or(self.config.hedge_fallback_delay)
            .max(self.config.hedge_min_delay);
        self.config
            .hedge_max_delay
            .map_or(delay, |max| delay.min(max))
    }
}

/// What a read asks each replica alone (a batched read, most of them, never builds it).
#[derive(Clone)]
struct Ask {
    method: Method,
    id: BlobId,
    range: Option<HeaderValue>,
}

impl Ask {
    fn request(&self) -> Request<larder_pool::Body> {
        let path = blob_path(self.id.partition, &self.id.to_string());
        let mut request = Request::new(larder_pool::empty());
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = Uri::try_from(path).expect("a blob path is digits, base64url and '/'");
        if let Some(range) = &self.range {
            request.headers_mut().insert(header::RANGE, range.clone());
        }
        request
    }
}

/// A "found" from a replica that is catching up (`x-larder-catching-up`: it has not reached
/// every local peer's feed head recently, so it may lack a tombstone) is held until enough
/// replicas of this datacenter answered without a tombstone that a delete acknowledged here
/// (at a quorum of them) cannot exist; a 410 or a found from a caught-up local replica wins
/// over it, and with no confirmation the read fails. A caught-up replica of another datacenter
/// vouches for its own datacenter only: its "found" waits for the local replicas still asked
/// (a 410 from one wins), and is served once none is left to answer. When every replica is
/// caught up and the first one asked is local, nothing is held and no extra request is sent.
struct Confirmation {
    /// Answers without a tombstone (found or 404) from this datacenter's replicas.
    local_clear: usize,
    /// More local answers than this without a tombstone rule out a delete acknowledged here.
    enough: usize,
    held: Option<FoundBlob>,
}

impl Confirmation {
    fn new(local_replicas: usize, write_quorum: usize) -> Confirmation {
        let quorum = write_quorum.clamp(1, local_replicas.max(1));
        Confirmation {
            local_clear: 0,
            enough: local_replicas.saturating_sub(quorum),
            held: None,
        }
    }

    /// A replica answered without a tombstone (found or not found).
    fn no_tombstone(&mut self, local: bool) {
        if local {
            self.local_clear += 1;
        }
    }

    /// Holds `found` until confirmed; a caught-up replica's answer replaces one catching up.
    fn hold(&mut self, local: bool, found: FoundBlob) {
        self.no_tombstone(local);
        match &self.held {
            Some(held) if found.catching_up || !held.catching_up => {}
            _ => self.held = Some(found),
        }
    }

    /// Whether the answer held is a caught-up replica's (another datacenter's).
    fn holds_caught_up(&self) -> bool {
        self.held.as_ref().is_some_and(|h| !h.catching_up)
    }

    fn take(&mut self) -> Option<GetAnswer> {
        self.held.take().map(GetAnswer::Found)
    }

    /// The held answer, once enough local answers rule out a delete acknowledged here.
    fn release(&mut self) -> Option<GetAnswer> {
        if self.local_clear > self.enough {
            return self.take();
        }
        None
    }
}

/// Replicas to ask again. Two kinds:
///
/// - Local replicas that failed to answer a read which holds a catching-up replica's "found".
///   A node just restarted is often the only confirmation there is (its peers restarted with
///   it), and the pool refuses to connect to it until its reconnect backoff ends: failing the
///   read at once would answer 503 for seconds after every node is back. They are asked again
///   for `[router] confirm_retry_for`, and only while an answer is held.
/// - Replicas that said "not yet" (503 with `Retry-After`: a replica not checked against its
///   peers since its process started, a busy one). After a whole cluster restarts, every
///   replica says so until its first replication round is answered: reads would answer 503
///   although every blob is there. They are asked again for `[router] not_yet_retry_for`,
///   whether or not an answer is held.
///
/// Either way after a pause doubling from 50 ms (to 200 ms), and never past the deadline.
struct Reask<'a> {
    failed: Vec<&'a str>,
    not_yet: Vec<&'a str>,
    failed_until: Instant,
    not_yet_until: Instant,
    pause: Duration,
}

impl<'a> Reask<'a> {
    fn new(config: &RouterConfig, deadline: Instant) -> Reask<'a> {
        let until = |retry_for: Duration| {
            Instant::now()
                .checked_add(retry_for)
                .map_or(deadline, |at| at.min(deadline))
        };
        Reask {
            failed: Vec::new(),
            not_yet: Vec::new(),
            failed_until: until(config.confirm_retry_for),
            not_yet_until: until(config.not_yet_retry_for),
            pause: Duration::from_millis(50),
        }
    }

    fn failed(&mut self, node: &'a str) {
        if !self.failed.contains(&node) && !self.not_yet.contains(&node) {
            self.failed.push(node);
        }
    }

    fn not_yet(&mut self, node: &'a str) {
        self.failed.retain(|n| *n != node);
        if !self.not_yet.contains(&node) {
            self.not_yet.push(node);
        }
    }

    /// After a pause, the replica to ask again (a failed one only while `holding` an answer
    /// that waits for confirmation); `None` once there is none or no time left.
    async fn next(&mut self, holding: bool) -> Option<&'a str> {
        let at = Instant::now().checked_add(self.pause)?;
        let list = if !self.not_yet.is_empty() && at < self.not_yet_until {
            &mut self.not_yet
        } else if holding && !self.failed.is_empty() && at < self.failed_until {
            &mut self.failed
        } else {
            return None;
        };
        let node = list.remove(0);
        tokio::time::sleep_until(at).await;
        self.pause = (self.pause * 2).min(Duration::from_millis(200));
        Some(node)
    }
}

/// Why a replica's answer is not a `GetAnswer`.
#[derive(Debug)]
pub(crate) enum Undecoded {
    /// 404: this replica does not have the blob.
    NotFound,
    /// Not a definite answer (5xx, transport error, headers that do not decode): ask another.
    Failed(String),
    /// 503 with `Retry-After`: this replica will answer soon (not checked against its peers
    /// since it started, busy); ask it again (`Reask`).
    NotYet(String),
    /// `NotYet` because the replica's read budget is spent (`x-larder-read-budget-spent`):
    /// ask it again, and park stalled downloads sooner (`park::Pressure`).
    BudgetSpent(String),
    /// The replica refused the request itself (see `refuses_the_request`), with its message.
    Refused(String),
}

/// Turns a replica's answer into what it means, from its status and headers (the body of a
/// found blob is passed on unread).
pub(crate) async fn decode(
    (node, response): (&str, Response<BlobBody>),
    range: Option<ByteRange>,
    deadline: Instant,
) -> Result<GetAnswer, Undecoded> {
    let failed = |what: &str| Undecoded::Failed(format!("{what} (status {})", response.status()));
    let size = number(&response, hn::BLOB_SIZE);
    match response.status() {
        StatusCode::OK | StatusCode::PARTIAL_CONTENT => {
            let size = size.ok_or_else(|| failed("no blob size"))?;
            let properties = BlobProperties::from_internal_answer(response.headers())
                .map_err(|e| Undecoded::Failed(format!("bad properties: {e}")))?;
            let partial = response.status() == StatusCode::PARTIAL_CONTENT;
            let catching_up = response.headers().contains_key(hn::CATCHING_UP);
            let selected = match (partial, range) {
                (false, _) => 0..size,
                (true, Some(range)) => range
                    .resolve(size)
                    .map_err(|_| failed("a range outside the blob"))?,
                (true, None) => return Err(failed("a range nobody asked for")),
            };
            // A body sent whole (from a batch) is checked here, as h2 checks a streamed one
            // against its content-length.
            if let BlobBody::Inline(bytes) = response.body() {
                let len = bytes.as_ref().map_or(0, |b| b.len() as u64);
                if len != selected.end - selected.start {
                    return Err(failed("a body of the wrong length"));
                }
            }
            Ok(GetAnswer::Found(FoundBlob {
                properties,
                size,
                selected,
                partial,
                catching_up,
                body: response.into_body(),
                replica: node.to_owned(),
            }))
        }
        StatusCode::GONE => {
            let expired = response
                .headers()
                .get(hn::GONE_REASON)
                .is_some_and(|v| v.as_bytes() == b"expired");
            let reason = if expired {
                GoneReason::Expired
            } else {
                GoneReason::Deleted
            };
            let time_ms = number(&response, hn::TIME_MS);
            Ok(GetAnswer::Missing(Missing::Gone { reason, time_ms }))
        }
        StatusCode::RANGE_NOT_SATISFIABLE => {
            let size = size.ok_or_else(|| failed("no blob size"))?;
            Ok(GetAnswer::Missing(Missing::RangeNotSatisfiable { size }))
        }
        StatusCode::NOT_FOUND => Err(Undecoded::NotFound),
        status if refuses_the_request(status) => Err(Undecoded::Refused(
            // Boxed: an error answer is rare, and its future would size every read's.
            Box::pin(refusal_message(response, deadline)).await,
        )),
        StatusCode::SERVICE_UNAVAILABLE if response.headers().contains_key(header::RETRY_AFTER) => {
            let why = format!("status {}, retry later", response.status());
            match response.headers().contains_key(h::READ_BUDGET_SPENT) {
                true => Err(Undecoded::BudgetSpent(format!("{why}: read budget spent"))),
                false => Err(Undecoded::NotYet(why)),
            }
        }
        status => Err(Undecoded::Failed(format!("status {status}"))),
    }
}

fn number(response: &Response<BlobBody>, name: HeaderName) -> Option<u64> {
    response
        .headers()
        .get(name)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(confirm: Duration, not_yet: Duration) -> RouterConfig {
        RouterConfig {
            confirm_retry_for: confirm,
            not_yet_retry_for: not_yet,
            ..RouterConfig::default()
        }
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[tokio::test]
    async fn a_replica_not_yet_checked_is_asked_again_with_nothing_held() {
        let long = Duration::from_secs(10);
        let mut reask = Reask::new(&config(long, long), far());
        reask.failed("s1");
        assert_eq!(
            reask.next(false).await,
            None,
            "a failure waits only for a held answer"
        );
        reask.not_yet("s2");
        assert_eq!(reask.next(false).await, Some("s2"));
        assert_eq!(reask.next(true).await, Some("s1"));
        assert_eq!(reask.next(true).await, None);
    }

    #[tokio::test]
    async fn a_replica_that_said_not_yet_is_not_also_asked_as_failed() {
        let long = Duration::from_secs(10);
        let mut reask = Reask::new(&config(long, long), far());
        reask.failed("s1");
        reask.not_yet("s1");
        reask.failed("s1");
        assert_eq!(reask.next(true).await, Some("s1"));
        assert_eq!(reask.next(true).await, None);
    }

    #[tokio::test]
    async fn asking_again_ends_with_its_window_or_the_deadline() {
        let long = Duration::from_secs(10);
        let mut reask = Reask::new(&config(long, Duration::ZERO), far());
        reask.not_yet("s1");
        assert_eq!(reask.next(true).await, None, "past not_yet_retry_for");
        let mut reask = Reask::new(&config(long, long), Instant::now());
        reask.not_yet("s1");
        reask.failed("s2");
        assert_eq!(reask.next(true).await, None, "past the deadline");
    }
}
