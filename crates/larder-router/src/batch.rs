//! Small requests of one kind to one storage node gathered into one request while others are
//! on the way: the machinery that PUT batches (`put_batch.rs`) and GET batches
//! (`get_batch.rs`) share.
//!
//! Every HTTP/2 exchange costs both sides more CPU than a 1 KiB body does (the frontend's
//! client side about 7 µs, the node's server side about 10 µs here:
//! `benchmarks/cpu-per-request/CLIENT-EXCHANGE.md`). So a small request to a node goes out
//! alone only while fewer than a kind's limit of requests to that node are on the way; past
//! that it waits, and the next request to finish takes every waiting item (up to the kind's
//! `MAX_ITEMS` and `MAX_BYTES`) to the node in one batch, or, once `FULL_ENOUGH` wait, they go
//! at once in a batch of their own. Nothing waits on a timer: a light load sends every request
//! alone at once, as before, and under load an item waits at most one request's time, less
//! while many come. A node that does not know a kind's batches (an earlier release: `404`) is
//! sent its items one by one, then and for the next minute, after which a batch tries again.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http::{header, Method, Request, StatusCode, Uri};
use http_body_util::BodyExt;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::Router;

/// A kind of batch: what an item is, what it is answered, and how a batch is sent.
pub(crate) trait Kind: Sized + Send + Sync + 'static {
    type Item: Send + Sync + 'static;
    type Answer: Send + 'static;
    /// Most items in one batch.
    const MAX_ITEMS: usize;
    /// Largest batch, in [`Kind::weight`]s (an item alone past it still goes, alone).
    const MAX_BYTES: usize;
    /// Items waiting that make a batch go at once, in a request slot past the limit: under a
    /// stall (a sync the disk holds up) items keep reaching the node instead of all waiting for
    /// the stalled requests, and a batch this size still costs the node a thirty-second of
    /// their requests alone.
    const FULL_ENOUGH: usize;

    /// What `item` adds to a batch, in bytes.
    fn weight(item: &Self::Item) -> usize;
    /// This kind's per-node state in `router`.
    fn batches(router: &Router) -> &Batches<Self>;
    /// Requests of this kind on the way to one node before items wait for a batch.
    fn in_flight_limit(router: &Router) -> usize;
    /// Sends `items` as one batch in `slot` and gives each its answer.
    fn send(slot: Slot<Self>, items: Vec<Waiting<Self>>) -> impl Future<Output = ()> + Send;
}

/// How long a node that answered `404` to a batch is sent its items alone before a batch is
/// tried again.
const RETRY_BATCHES_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// The batching state of every storage node this frontend sends a kind of request to.
pub(crate) struct Batches<K: Kind> {
    nodes: Mutex<HashMap<String, Arc<NodeBatch<K>>>>,
}

impl<K: Kind> Default for Batches<K> {
    fn default() -> Self {
        Batches {
            nodes: Mutex::default(),
        }
    }
}

/// One node's requests in flight and the items waiting for the next batch.
pub(crate) struct NodeBatch<K: Kind> {
    state: Mutex<State<K>>,
}

impl<K: Kind> Default for NodeBatch<K> {
    fn default() -> Self {
        NodeBatch {
            state: Mutex::new(State {
                in_flight: 0,
                waiting: Vec::new(),
                unsupported_until: None,
            }),
        }
    }
}

struct State<K: Kind> {
    in_flight: usize,
    waiting: Vec<Waiting<K>>,
    /// The node answered `404` to a batch (it predates them): its items go alone until then,
    /// when a batch tries again (the node may have been upgraded meanwhile).
    unsupported_until: Option<Instant>,
}

/// An item waiting for a batch, and where its answer goes.
pub(crate) struct Waiting<K: Kind> {
    pub item: K::Item,
    pub answer: oneshot::Sender<K::Answer>,
    /// When it began to wait: its answer's latency, for hedging, is counted from here.
    pub entered: Instant,
}

impl<K: Kind> Batches<K> {
    fn node(&self, node: &str) -> Arc<NodeBatch<K>> {
        let mut nodes = lock(&self.nodes);
        if let Some(batch) = nodes.get(node) {
            return batch.clone();
        }
        nodes.entry(node.to_owned()).or_default().clone()
    }
}

impl<K: Kind> NodeBatch<K> {
    fn state(&self) -> MutexGuard<'_, State<K>> {
        lock(&self.state)
    }

    /// Items for the next batch when some are waiting (the caller's request slot goes on to
    /// carry them); otherwise the slot is given back.
    fn next_or_leave(&self) -> Option<Vec<Waiting<K>>> {
        let mut state = self.state();
        if state.waiting.is_empty() {
            state.in_flight -= 1;
            return None;
        }
        let (mut count, mut bytes) = (0, 0);
        for waiting in &state.waiting {
            bytes += K::weight(&waiting.item);
            if count > 0 && (count == K::MAX_ITEMS || bytes > K::MAX_BYTES) {
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

/// One of a node's request slots, held by a request sent alone or by a batch. Whoever drops
/// it (the request done, or its caller gone) hands the items waiting by then to a new batch in
/// the same slot, so no item waits for a request that will not come.
pub(crate) struct Slot<K: Kind> {
    pub router: Arc<Router>,
    pub node: String,
    batch: Arc<NodeBatch<K>>,
}

impl<K: Kind> Slot<K> {
    /// The node answered `404` to a batch: for a while its items go alone.
    pub fn node_predates_batches(&self) {
        self.batch.state().unsupported_until = Instant::now().checked_add(RETRY_BATCHES_AFTER);
    }
}

impl<K: Kind> Drop for Slot<K> {
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
            Ok(runtime) => drop(runtime.spawn(K::send(slot, items))),
            // Only while the runtime itself shuts down: the waiting callers are gone too.
            Err(_) => drop((slot, items)),
        }
    }
}

/// Where [`Router::enter_batch`] put an item.
pub(crate) enum Entered<K: Kind> {
    /// In the node's next batch: its answer comes on this channel. The batch is sent whether
    /// or not anyone waits for it, so the caller need not be driven to its end.
    Queued(oneshot::Receiver<K::Answer>),
    /// In a request of its own, in this slot (`None`: the node predates batches).
    Alone(Option<Slot<K>>),
}

/// Why a batch got no answers of its items.
pub(crate) enum BatchFailed {
    /// The node predates batches (`404`).
    Unsupported,
    Other(String),
}

impl Router {
    /// Sends a batch's `body` to `node` at `path` and reads its answer (at most `max_answer`
    /// bytes, within the request timeout). Its latency is a sample for hedging only when
    /// `record`: a GET batch's items record their own, each from when it began to wait.
    pub(crate) async fn send_batch_request(
        &self,
        node: &str,
        path: &'static str,
        body: Bytes,
        max_answer: usize,
        record: bool,
    ) -> Result<Bytes, BatchFailed> {
        let mut request = Request::new(larder_pool::full(body.clone()));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = Uri::from_static(path);
        request
            .headers_mut()
            .insert(header::CONTENT_LENGTH, body.len().into());
        let response = self
            .send_timed(node, request, None, record)
            .await
            .map_err(BatchFailed::Other)?;
        let until = Instant::now() + self.config.request_timeout;
        match response.status() {
            StatusCode::OK => {}
            // Batches answer every other failure item by item: only a node that does not know
            // the path answers 404 to one.
            StatusCode::NOT_FOUND => return Err(BatchFailed::Unsupported),
            _ => {
                let refusal = crate::router::refusal_message(response, until);
                return Err(BatchFailed::Other(refusal.await));
            }
        }
        let body = http_body_util::Limited::new(response.into_body(), max_answer).collect();
        match tokio::time::timeout_at(until, body).await {
            Ok(Ok(body)) => Ok(body.to_bytes()),
            Ok(Err(e)) => Err(BatchFailed::Other(format!("reading its answer: {e}"))),
            Err(_) => Err(BatchFailed::Other("its answer stalled".to_owned())),
        }
    }

    /// Puts the item `make` builds in `node`'s next batch of its kind, or gives it a request
    /// slot of its own: decided at once, so that the caller knows whether its answer needs
    /// driving or only waiting for.
    pub(crate) fn enter_batch<K: Kind>(
        self: &Arc<Self>,
        node: &str,
        make: impl FnOnce() -> K::Item,
    ) -> Entered<K> {
        let batch = K::batches(self).node(node);
        let mut state = batch.state();
        if let Some(until) = state.unsupported_until {
            if Instant::now() < until {
                return Entered::Alone(None);
            }
            state.unsupported_until = None;
        }
        if state.in_flight < K::in_flight_limit(self) && state.waiting.is_empty() {
            state.in_flight += 1;
            drop(state);
            return Entered::Alone(Some(self.slot(node, batch)));
        }
        let (answer, queued) = oneshot::channel();
        state.waiting.push(Waiting {
            item: make(),
            answer,
            entered: Instant::now(),
        });
        // Enough for a batch of its own: it goes now, in a slot past the limit, rather than
        // wait for a request that may be slow (a sync the disk stalls).
        if state.waiting.len() >= K::FULL_ENOUGH {
            state.in_flight += 1;
            let items = std::mem::take(&mut state.waiting);
            drop(state);
            tokio::spawn(K::send(self.slot(node, batch), items));
        }
        Entered::Queued(queued)
    }

    fn slot<K: Kind>(self: &Arc<Self>, node: &str, batch: Arc<NodeBatch<K>>) -> Slot<K> {
        Slot {
            router: self.clone(),
            node: node.to_owned(),
            batch,
        }
    }
}

#[cfg(test)]
mod tests {
    use larder_proto::PutItem;

    use super::*;
    use crate::put_batch::Puts;

    fn wait_with(
        batch: &NodeBatch<Puts>,
        data_len: usize,
    ) -> oneshot::Receiver<<Puts as Kind>::Answer> {
        let (answer, queued) = oneshot::channel();
        let item = Arc::new(PutItem {
            partition: 0,
            key: "k".to_owned(),
            props: Bytes::new(),
            crc32c: 0,
            data: Bytes::from(vec![0; data_len]),
        });
        let entered = Instant::now();
        batch.state().waiting.push(Waiting {
            item,
            answer,
            entered,
        });
        queued
    }

    /// A slot given back takes at most one batch's worth of what waits, in order, and is
    /// freed only once nothing waits.
    #[test]
    fn a_slot_given_back_takes_at_most_a_batch_and_leaves_when_none_wait() {
        let batch = NodeBatch::<Puts>::default();
        batch.state().in_flight = 1;
        let _answers: Vec<_> = (0..300).map(|_| wait_with(&batch, 10)).collect();
        let max = Puts::MAX_ITEMS;
        assert_eq!(batch.next_or_leave().map(|b| b.len()), Some(max));
        assert_eq!(batch.next_or_leave().map(|b| b.len()), Some(300 - max));
        assert_eq!(batch.state().in_flight, 1, "the slot carried both batches");
        assert!(batch.next_or_leave().is_none());
        assert_eq!(batch.state().in_flight, 0);

        batch.state().in_flight = 1;
        let _large: Vec<_> = [600 << 10, 600 << 10, 2 << 20, 1]
            .into_iter()
            .map(|len| wait_with(&batch, len))
            .collect();
        let sizes = |b: Vec<Waiting<Puts>>| b.iter().map(|w| w.item.data.len()).collect::<Vec<_>>();
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
}
