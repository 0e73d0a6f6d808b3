//! Whole-blob GETs to one storage node gathered into one request while others are on the way
//! (`batch.rs` says when). The node answers each blob as a GET of it alone would have been
//! answered, status, headers and bytes, for blobs of at most `[router] batch_gets_up_to`; a
//! larger one it leaves to be asked alone, which the waiting read then does itself. So a
//! batched read is decoded, hedged, confirmed and failed over exactly as one sent alone: only
//! its bytes arrive whole (`BlobBody::Inline`). A batch that fails whole fails each of its
//! reads (the read asks another replica, as after any failed request).

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use bytesize::ByteSize;
use http::{Request, Response};
use larder_cluster::BlobId;
use larder_pool::Body;
use larder_proto::{GetItem, GetItemAnswer};
use tokio::time::Instant;

use crate::batch::{BatchFailed, Batches, Entered, Kind, Slot, Waiting};
use crate::{BlobBody, Router};

/// Most bytes of one blob a node answers inline (its reads of at most this size are done in
/// place, from the page cache).
const MAX_INLINE: u64 = 64 * 1024;

/// GET batches (`larder-proto`'s `get_batch.rs`).
pub(crate) struct Gets;

/// A read's answer from its batch.
pub(crate) enum Batched {
    /// The replica's answer, its bytes whole.
    Answer(Response<BlobBody>),
    /// The blob is larger than a batch carries: ask for it alone.
    Alone,
    /// The batch failed whole.
    Failed(String),
}

impl Kind for Gets {
    type Item = GetItem;
    type Answer = Batched;
    const MAX_ITEMS: usize = 256;
    const MAX_BYTES: usize = larder_proto::GET_BATCH_MAX_BODY;
    const FULL_ENOUGH: usize = 32;

    fn weight(item: &GetItem) -> usize {
        6 + item.key.len()
    }

    fn batches(router: &Router) -> &Batches<Gets> {
        &router.get_batches
    }

    fn in_flight_limit(router: &Router) -> usize {
        router.config.get_requests_in_flight
    }

    fn send(slot: Slot<Gets>, items: Vec<Waiting<Gets>>) -> impl Future<Output = ()> + Send {
        send_batch(slot, items)
    }
}

/// Refuses settings `get_batch` cannot work with.
pub(crate) fn check_config(config: &crate::RouterConfig) -> Result<(), String> {
    if config.batch_gets_up_to.as_u64() > MAX_INLINE {
        return Err(format!(
            "[router] batch_gets_up_to is at most {}",
            ByteSize::b(MAX_INLINE)
        ));
    }
    if config.get_requests_in_flight == 0 {
        return Err("[router] get_requests_in_flight is at least 1".to_owned());
    }
    Ok(())
}

/// Blobs known to be larger than a batch carries, which a read then asks for alone at once
/// rather than through a batch that would only send it back (a blob's bytes never change).
/// Bounded: emptied when full.
#[derive(Default)]
pub(crate) struct LargeBlobs(Mutex<HashSet<BlobId>>);

/// Most blob IDs [`LargeBlobs`] keeps (about 40 bytes each).
const LARGE_BLOBS_KEPT: usize = 16_384;

impl LargeBlobs {
    fn contains(&self, id: &BlobId) -> bool {
        self.lock().contains(id)
    }

    fn insert(&self, id: BlobId) {
        let mut ids = self.lock();
        if ids.len() >= LARGE_BLOBS_KEPT {
            ids.clear();
        }
        ids.insert(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<BlobId>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Router {
    /// Whether a whole-blob GET of `id` goes through batches: batching is on and the blob is
    /// not known to be too large for them.
    pub(crate) fn batches_get_of(&self, id: &BlobId) -> bool {
        self.config.batch_gets_up_to.as_u64() > 0 && !self.large_blobs.contains(id)
    }

    /// A GET of blob `id` at `node`: in the node's next batch while other GETs to it are on
    /// the way, otherwise (or when the blob is too large for a batch) `request` alone.
    pub(crate) async fn get_maybe_batched(
        self: &Arc<Self>,
        node: &str,
        id: BlobId,
        request: impl FnOnce() -> Request<Body>,
        deadline: Instant,
    ) -> Result<Response<BlobBody>, String> {
        let item = || GetItem {
            partition: id.partition,
            key: id.to_string(),
        };
        let queued = match self.enter_batch::<Gets>(node, item) {
            Entered::Alone(slot) => {
                // Boxed (here and below): inline, a read waiting in a batch would carry a
                // request's future too, and its boxed attempt would copy it in.
                let answer = Box::pin(self.get_alone(slot, node, request(), deadline)).await;
                if let Ok(response) = &answer {
                    self.note_size(id, response);
                }
                return answer;
            }
            Entered::Queued(queued) => queued,
        };
        // The read's own timer ends the wait at its deadline (`read.rs`): none here.
        match queued.await {
            Ok(Batched::Answer(response)) => Ok(response),
            Ok(Batched::Alone) => {
                self.large_blobs.insert(id);
                Box::pin(self.get_alone(None, node, request(), deadline)).await
            }
            Ok(Batched::Failed(err)) => Err(format!("batch: {err}")),
            Err(_) => Err("its batch was dropped".to_owned()),
        }
    }

    /// Keeps `id` among the large blobs when its answer says it is past what a batch carries.
    fn note_size(&self, id: BlobId, response: &Response<BlobBody>) {
        let size = response
            .headers()
            .get(larder_proto::header_name::BLOB_SIZE)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if size.is_some_and(|size| size > self.config.batch_gets_up_to.as_u64()) {
            self.large_blobs.insert(id);
        }
    }

    /// `request` alone, holding `slot` (if any) until its answer's head came.
    async fn get_alone(
        &self,
        slot: Option<Slot<Gets>>,
        node: &str,
        request: Request<Body>,
        deadline: Instant,
    ) -> Result<Response<BlobBody>, String> {
        let response = self.send_by(node, request, Some(deadline)).await;
        drop(slot);
        Ok(response?.map(BlobBody::Streamed))
    }
}

/// Sends `items` as one batch in `slot` and gives each its answer; dropping the slot then sends
/// whatever waits by now.
async fn send_batch(slot: Slot<Gets>, items: Vec<Waiting<Gets>>) {
    let router = &slot.router;
    router.metrics.get_batches.inc();
    router.metrics.get_batched_blobs.inc_by(items.len() as u64);
    let inline_up_to = u32::try_from(router.config.batch_gets_up_to.as_u64()).unwrap_or(0);
    let refs: Vec<&GetItem> = items.iter().map(|w| &w.item).collect();
    let body = larder_proto::encode_get_batch(inline_up_to, &refs);
    let answers = match router
        .send_batch_request(
            &slot.node,
            larder_proto::GET_BATCH_PATH,
            body,
            larder_proto::get_batch_max_answer(items.len()),
            false,
        )
        .await
    {
        Ok(answer) => larder_proto::decode_get_answers(&answer, items.len())
            .map_err(|e| BatchFailed::Other(format!("its answer: {e}"))),
        Err(failed) => Err(failed),
    };
    let answers = match answers {
        Ok(answers) => answers,
        Err(BatchFailed::Unsupported) => {
            tracing::info!(node = %slot.node, "storage node predates batched GETs; sending them one by one");
            slot.node_predates_batches();
            for waiting in items {
                let _ = waiting.answer.send(Batched::Alone);
            }
            return;
        }
        Err(BatchFailed::Other(err)) => {
            for waiting in items {
                let _ = waiting.answer.send(Batched::Failed(err.clone()));
            }
            return;
        }
    };
    for (waiting, answer) in items.into_iter().zip(answers) {
        let batched = match answer {
            GetItemAnswer::Alone => Batched::Alone,
            GetItemAnswer::Answered {
                status,
                headers,
                body,
            } => {
                // As a read alone: a sample unless the read went away first (a hedge won).
                if !status.is_server_error() && !waiting.answer.is_closed() {
                    router.record_latency(&slot.node, waiting.entered);
                }
                // Copied out (at most 64 KiB), so that a client that stalls on one small blob
                // does not hold the whole answer of its batch.
                let body = Bytes::copy_from_slice(&body);
                let mut response = Response::new(BlobBody::inline(body));
                *response.status_mut() = status;
                *response.headers_mut() = headers;
                Batched::Answer(response)
            }
        };
        let _ = waiting.answer.send(batched);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blobs_kept_are_bounded() {
        use larder_cluster::BlobKind;
        let large = LargeBlobs::default();
        let ids: Vec<BlobId> = (0..=LARGE_BLOBS_KEPT)
            .map(|_| BlobId::mint(BlobKind::Simple, 0, 1))
            .collect();
        for id in &ids {
            large.insert(*id);
        }
        assert!(large.lock().len() <= LARGE_BLOBS_KEPT);
        assert!(large.contains(ids.last().unwrap()));
        assert!(!large.contains(&ids[0]), "emptied when full");
    }

    #[test]
    fn settings_it_cannot_work_with_are_refused() {
        let mut config = crate::RouterConfig::default();
        assert!(check_config(&config).is_ok());
        config.batch_gets_up_to = ByteSize::b(MAX_INLINE + 1);
        assert!(check_config(&config)
            .unwrap_err()
            .contains("batch_gets_up_to"));
        config.batch_gets_up_to = ByteSize::b(0);
        assert!(check_config(&config).is_ok(), "0: batching off");
        config.get_requests_in_flight = 0;
        assert!(check_config(&config)
            .unwrap_err()
            .contains("get_requests_in_flight"));
    }
}
