//! Small PUTs to one storage node gathered into one request while others are on the way
//! (`batch.rs` says when). Each blob of a batch gets the status a PUT of it alone would have
//! got, and counts for its quorum exactly as that PUT would. A batch that fails whole fails
//! each of its blobs.

use std::future::Future;
use std::sync::Arc;

use http::{StatusCode, Uri};
use larder_proto::{ItemAnswer, PutItem};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::batch::{BatchFailed, Batches, Kind, Slot, Waiting};
use crate::Router;

/// Largest answer a batch of [`Puts::MAX_ITEMS`] can have: a status and a message of at most
/// 1 KiB each.
const MAX_ANSWER: usize = 1 + Puts::MAX_ITEMS * (4 + 1024);

/// PUT batches (`larder-proto`'s `batch.rs`).
pub(crate) struct Puts;

impl Kind for Puts {
    type Item = Arc<PutItem>;
    type Answer = Result<StatusCode, String>;
    const MAX_ITEMS: usize = 256;
    const MAX_BYTES: usize = 1 << 20;
    const FULL_ENOUGH: usize = 32;

    fn weight(item: &Arc<PutItem>) -> usize {
        item.encoded_len()
    }

    fn batches(router: &Router) -> &Batches<Puts> {
        &router.put_batches
    }

    fn in_flight_limit(router: &Router) -> usize {
        router.config.put_requests_in_flight
    }

    fn send(slot: Slot<Puts>, items: Vec<Waiting<Puts>>) -> impl Future<Output = ()> + Send {
        send_batch(slot, items)
    }
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

impl Router {
    /// Whether a blob of `len` bytes with `props_len` bytes of properties is written through
    /// `enter_batch` (properties past a batch's limit, possible only with a raised
    /// `max_header_list_size`, go alone).
    pub(crate) fn batches_puts_of(&self, len: usize, props_len: usize) -> bool {
        let up_to = self.config.batch_puts_up_to.as_u64();
        up_to > 0 && len as u64 <= up_to && props_len <= larder_proto::BATCH_MAX_PROPS
    }

    /// `item` alone, holding `slot` (if any) until the answer came or the caller went away.
    pub(crate) async fn put_in_slot(
        &self,
        slot: Option<Slot<Puts>>,
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
        items: &[Waiting<Puts>],
    ) -> Result<Vec<ItemAnswer>, BatchFailed> {
        let refs: Vec<&PutItem> = items.iter().map(|w| &*w.item).collect();
        let body = larder_proto::encode_put_batch(&refs);
        let answer = self
            .send_batch_request(node, larder_proto::PUT_BATCH_PATH, body, MAX_ANSWER, true)
            .await?;
        larder_proto::decode_answers(&answer, items.len())
            .map_err(|e| BatchFailed::Other(format!("its answer: {e}")))
    }
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

/// Sends `items` as one batch in `slot` and gives each its answer; dropping the slot then sends
/// whatever waits by now.
async fn send_batch(slot: Slot<Puts>, items: Vec<Waiting<Puts>>) {
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
            slot.node_predates_batches();
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
