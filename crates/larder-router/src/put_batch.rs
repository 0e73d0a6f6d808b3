//! Small PUTs to one storage node gathered into one request while others are on the way.
//!
//! Every HTTP/2 exchange costs both sides more CPU than a 1 KiB body does (the frontend's
//! client side about 7 µs, the node's server side about 10 µs here:
//! `benchmarks/cpu-per-request/CLIENT-EXCHANGE.md`), and a PUT is one exchange per replica. So
//! a small blob's PUT to a node goes out alone only while fewer than
//! `put_requests_in_flight` requests to that node are on the way; past that it waits, and the
//! next request to finish takes every waiting blob (up to [`MAX_ITEMS`] and [`MAX_BYTES`]) to the
//! node in one batch (`larder-proto`'s `batch.rs`), or, once [`FULL_ENOUGH`] wait, they go at
//! once in a batch of their own. Nothing waits on a timer: a light load sends every PUT alone at
//! once, as before, and under load a blob waits at most one request's time (which the node's
//! commit round would have made it wait anyway), less while many come.
//!
//! Each blob of a batch gets the status a PUT of it alone would have got, and counts for its
//! quorum exactly as that PUT would. A batch that fails whole fails each of its blobs. A node
//! that does not know batches (an earlier release: `404`) is sent its blobs one by one, then and
//! from then on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http::{header, Method, Request, StatusCode, Uri};
use larder_proto::{ItemAnswer, PutItem};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::Router;

/// Most blobs in one batch.
const MAX_ITEMS: usize = 256;
/// Blobs waiting that make a batch go at once, in a request slot past the limit: under a
/// stall (a sync the disk holds up) blobs keep reaching the node's next commit round instead
/// of all waiting for the stalled requests, and a batch this size still costs the node a
/// thirty-second of their requests alone.
const FULL_ENOUGH: usize = 32;
/// Largest batch body (a blob that alone is past it still goes, alone in its batch).
const MAX_BYTES: usize = 1 << 20;
/// Largest answer a batch of [`MAX_ITEMS`] can have: a status and a message of at most
/// 1 KiB each.
const MAX_ANSWER: usize = 1 + MAX_ITEMS * (4 + 1024);

/// The batching state of every storage node this frontend writes to.
#[derive(Default)]
pub(crate) struct PutBatches {
    nodes: Mutex<HashMap<String, Arc<NodeBatch>>>,
}

/// One node's requests in flight and the blobs waiting for the next batch.
#[derive(Default)]
struct NodeBatch {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    in_flight: usize,
    waiting: Vec<Waiting>,
    /// The node answered `404` to a batch: it predates them.
    unsupported: bool,
}

struct Waiting {
    item: Arc<PutItem>,
    answer: oneshot::Sender<Result<StatusCode, String>>,
}

/// Refuses settings `put_batch` cannot work with.
pub(crate) fn check_config(config: &crate::RouterConfig) -> Result<(), String> {
    if config.batch_puts_up_to.as_u64() > larder_proto::BATCH_MAX_ITEM_DATA as u64 {
        return Err(format!(
            "[router] batch_puts_up_to is at most {} bytes",
            larder_proto::BATCH_MAX_ITEM_DATA
        ));
    }
    if config.put_requests_in_flight == 0 {
        return Err("[router] put_requests_in_flight is at least 1".to_owned());
    }
    Ok(())
}

impl PutBatches {
    fn node(&self, node: &str) -> Arc<NodeBatch> {
        let mut nodes = lock(&self.nodes);
        if let Some(batch) = nodes.get(node) {
            return batch.clone();
        }
        nodes.entry(node.to_owned()).or_default().clone()
    }
}

impl NodeBatch {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Blobs for the next batch when some are waiting (the caller's request slot goes on to
    /// carry them); otherwise the slot is given back.
    fn next_or_leave(&self) -> Option<Vec<Waiting>> {
        let mut state = self.state();
        if state.waiting.is_empty() {
            state.in_flight -= 1;
            return None;
        }
        let (mut count, mut bytes) = (0, 0);
        for waiting in &state.waiting {
            bytes += waiting.item.encoded_len();
            if count > 0 && (count == MAX_ITEMS || bytes > MAX_BYTES) {
                break;
            }
            count += 1;
        }
        Some(state.waiting.drain(..count).collect())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// One of a node's `put_requests_in_flight` request slots, held by a PUT sent alone or by a
/// batch. Whoever drops it (the request done, or its caller gone) hands the blobs waiting by
/// then to a new batch in the same slot, so no blob waits for a request that will not come.
pub(crate) struct Slot {
    router: Arc<Router>,
    node: String,
    batch: Arc<NodeBatch>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(items) = self.batch.next_or_leave() else {
            return;
        };
        let slot = Slot {
            router: self.router.clone(),
            node: std::mem::take(&mut self.node),
            batch: self.batch.clone(),
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(send_batch(slot, items))),
            // Only while the runtime itself shuts down: the waiting callers are gone too.
            Err(_) => drop((slot, items)),
        }
    }
}

impl Router {
    /// Whether a blob of `len` bytes with `props_len` bytes of properties is written through
    /// `enter_batch` (properties past a batch's limit, possible only with a raised
    /// `max_header_list_size`, go alone).
    pub(crate) fn batches_puts_of(&self, len: usize, props_len: usize) -> bool {
        let up_to = self.config.batch_puts_up_to.as_u64();
        up_to > 0 && len as u64 <= up_to && props_len <= larder_proto::BATCH_MAX_PROPS
    }

    /// Puts `item` in `node`'s next batch, or gives it a request slot of its own (`None`
    /// when the node predates batches): decided at once, so that the caller knows whether its
    /// reply needs driving ([`Router::put_in_slot`]) or only waiting for
    /// ([`await_batched`]).
    pub(crate) fn enter_batch(self: &Arc<Self>, node: &str, item: &Arc<PutItem>) -> Entered {
        let batch = self.batches.node(node);
        let mut state = batch.state();
        if state.unsupported {
            return Entered::Alone(None);
        }
        if state.in_flight < self.config.put_requests_in_flight && state.waiting.is_empty() {
            state.in_flight += 1;
            drop(state);
            return Entered::Alone(Some(self.slot(node, batch)));
        }
        let (answer, queued) = oneshot::channel();
        let item = item.clone();
        state.waiting.push(Waiting { item, answer });
        // Enough for a batch of its own: it goes now, in a slot past the limit, rather than
        // wait for a request that may be slow (a sync the disk stalls).
        if state.waiting.len() >= FULL_ENOUGH {
            state.in_flight += 1;
            let items = std::mem::take(&mut state.waiting);
            drop(state);
            tokio::spawn(send_batch(self.slot(node, batch), items));
        }
        Entered::Queued(queued)
    }

    fn slot(self: &Arc<Self>, node: &str, batch: Arc<NodeBatch>) -> Slot {
        Slot {
            router: self.clone(),
            node: node.to_owned(),
            batch,
        }
    }

    /// `item` alone, holding `slot` (if any) until the answer came or the caller went away.
    pub(crate) async fn put_in_slot(
        &self,
        slot: Option<Slot>,
        node: &str,
        item: &PutItem,
        deadline: Instant,
    ) -> Result<StatusCode, String> {
        let _slot = slot;
        self.put_alone(node, item, Some(deadline)).await
    }

    /// `item` in a PUT of its own.
    async fn put_alone(
        &self,
        node: &str,
        item: &PutItem,
        deadline: Option<Instant>,
    ) -> Result<StatusCode, String> {
        let uri: Uri = larder_proto::blob_path(item.partition, &item.key)
            .parse()
            .map_err(|e| format!("blob path: {e}"))?;
        let props = http::HeaderValue::from_maybe_shared(item.props.clone())
            .map_err(|e| format!("properties: {e}"))?;
        let request = crate::write::put_request(uri, item.data.clone(), item.crc32c, props);
        Ok(self.send_by(node, request, deadline).await?.status())
    }

    /// The answers of `items` written to `node` in one request.
    async fn send_put_batch(
        &self,
        node: &str,
        items: &[Waiting],
    ) -> Result<Vec<ItemAnswer>, BatchFailed> {
        use http_body_util::BodyExt;
        let refs: Vec<&PutItem> = items.iter().map(|w| &*w.item).collect();
        let body = larder_proto::encode_put_batch(&refs);
        let mut request = Request::new(larder_pool::full(body.clone()));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = Uri::from_static(larder_proto::PUT_BATCH_PATH);
        request
            .headers_mut()
            .insert(header::CONTENT_LENGTH, body.len().into());
        let response = self
            .send_by(node, request, None)
            .await
            .map_err(BatchFailed::Other)?;
        let until = Instant::now() + self.config.request_timeout;
        match response.status() {
            StatusCode::OK => {}
            // Batches answer every other failure blob by blob: only a node that does not know
            // the path answers 404 to one.
            StatusCode::NOT_FOUND => return Err(BatchFailed::Unsupported),
            _ => {
                let refusal = crate::router::refusal_message(response, until);
                return Err(BatchFailed::Other(refusal.await));
            }
        }
        let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER).collect();
        let body: Bytes = match tokio::time::timeout_at(until, body).await {
            Ok(Ok(body)) => body.to_bytes(),
            Ok(Err(e)) => return Err(BatchFailed::Other(format!("reading its answer: {e}"))),
            Err(_) => return Err(BatchFailed::Other("its answer stalled".to_owned())),
        };
        larder_proto::decode_answers(&body, items.len())
            .map_err(|e| BatchFailed::Other(format!("its answer: {e}")))
    }
}

/// Where [`Router::enter_batch`] put a blob.
pub(crate) enum Entered {
    /// In the node's next batch: its answer comes by [`await_batched`]. The batch is sent
    /// whether or not anyone waits for it, so this reply need not be driven to its end.
    Queued(oneshot::Receiver<Result<StatusCode, String>>),
    /// In a PUT of its own, in this slot.
    Alone(Option<Slot>),
}

/// A batched blob's status, or why there is none by `deadline`.
pub(crate) async fn await_batched(
    queued: oneshot::Receiver<Result<StatusCode, String>>,
    deadline: Instant,
) -> Result<StatusCode, String> {
    match tokio::time::timeout_at(deadline, queued).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err("its batch was dropped".to_owned()),
        Err(_) => Err(crate::router::DEADLINE_PASSED.to_owned()),
    }
}

enum BatchFailed {
    /// The node predates batches.
    Unsupported,
    Other(String),
}

/// Sends `items` as one batch in `slot` and gives each its answer; dropping the slot then sends
/// whatever waits by now.
async fn send_batch(slot: Slot, items: Vec<Waiting>) {
    let router = &slot.router;
    router.metrics.put_batches.inc();
    router.metrics.put_batched_blobs.inc_by(items.len() as u64);
    match router.send_put_batch(&slot.node, &items).await {
        Ok(answers) => {
            for (waiting, answer) in items.into_iter().zip(answers) {
                let _ = waiting.answer.send(Ok(answer.status));
            }
        }
        Err(BatchFailed::Unsupported) => {
            tracing::info!(node = %slot.node, "storage node predates batched PUTs; sending them one by one");
            slot.batch.state().unsupported = true;
            let node = slot.node.as_str();
            let alone = items.into_iter().map(|waiting| async move {
                let answer = router.put_alone(node, &waiting.item, None).await;
                let _ = waiting.answer.send(answer);
            });
            futures_util::future::join_all(alone).await;
        }
        Err(BatchFailed::Other(err)) => {
            for waiting in items {
                let _ = waiting.answer.send(Err(format!("batch: {err}")));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_with(
        batch: &NodeBatch,
        data_len: usize,
    ) -> oneshot::Receiver<Result<StatusCode, String>> {
        let (answer, queued) = oneshot::channel();
        let item = Arc::new(PutItem {
            partition: 0,
            key: "k".to_owned(),
            props: Bytes::new(),
            crc32c: 0,
            data: Bytes::from(vec![0; data_len]),
        });
        batch.state().waiting.push(Waiting { item, answer });
        queued
    }

    /// A slot given back takes at most one batch's worth of what waits, in order, and is
    /// freed only once nothing waits.
    #[test]
    fn a_slot_given_back_takes_at_most_a_batch_and_leaves_when_none_wait() {
        let batch = NodeBatch::default();
        batch.state().in_flight = 1;
        let _answers: Vec<_> = (0..300).map(|_| wait_with(&batch, 10)).collect();
        assert_eq!(batch.next_or_leave().map(|b| b.len()), Some(MAX_ITEMS));
        assert_eq!(
            batch.next_or_leave().map(|b| b.len()),
            Some(300 - MAX_ITEMS)
        );
        assert_eq!(batch.state().in_flight, 1, "the slot carried both batches");
        assert!(batch.next_or_leave().is_none());
        assert_eq!(batch.state().in_flight, 0);

        batch.state().in_flight = 1;
        let _large: Vec<_> = [600 << 10, 600 << 10, 2 << 20, 1]
            .into_iter()
            .map(|len| wait_with(&batch, len))
            .collect();
        let sizes = |b: Vec<Waiting>| b.iter().map(|w| w.item.data.len()).collect::<Vec<_>>();
        assert_eq!(batch.next_or_leave().map(sizes), Some(vec![600 << 10]));
        assert_eq!(batch.next_or_leave().map(sizes), Some(vec![600 << 10]));
        assert_eq!(
            batch.next_or_leave().map(sizes),
            Some(vec![2 << 20]),
            "alone, past the limit"
        );
        assert_eq!(batch.next_or_leave().map(sizes), Some(vec![1]));
        assert!(batch.next_or_leave().is_none());
    }

    #[test]
    fn settings_it_cannot_work_with_are_refused() {
        let mut config = crate::RouterConfig::default();
        assert!(check_config(&config).is_ok());
        config.batch_puts_up_to =
            bytesize::ByteSize::b(larder_proto::BATCH_MAX_ITEM_DATA as u64 + 1);
        assert!(check_config(&config)
            .unwrap_err()
            .contains("batch_puts_up_to"));
        config.batch_puts_up_to = bytesize::ByteSize::b(0);
        assert!(check_config(&config).is_ok(), "0: batching off");
        config.put_requests_in_flight = 0;
        assert!(check_config(&config)
            .unwrap_err()
            .contains("put_requests_in_flight"));
    }
}
