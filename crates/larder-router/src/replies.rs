//! The answers of one operation's replicas. They are awaited in the operation's own task: a
//! task per replica (and a channel between them) cost a spawn, a cross-thread wake-up and an
//! allocation each per request. Requests still pending when the operation is done with them
//! (a quorum answered, or the caller went away) must still finish, so that every replica
//! gets the write and their answers count for node health: `Drop` hands them to one background
//! task. A PUT that answers at its quorum thus spawns one task for its straggler, not one per
//! replica; none when its straggler only waits for a batch (`push_detached`: the batch is
//! sent, and its answers counted for node health, by the batch's own task).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use futures_util::stream::{FuturesUnordered, StreamExt};

use hyper::body::Incoming;

/// One replica's answer: a response (or, for a batched PUT, its blob's status), or why none came.
type Reply<T> = Pin<Box<dyn Future<Output = (String, Result<T, String>)> + Send>>;

pub(crate) struct Replies<T: Send + 'static = http::Response<Incoming>> {
    pending: FuturesUnordered<Reply<T>>,
    /// Replies that only wait for work done elsewhere (a batched PUT's answer: the batch goes
    /// whether or not anyone waits), dropped with the operation rather than driven on.
    detached: FuturesUnordered<Reply<T>>,
}

impl<T: Send + 'static> Replies<T> {
    pub(crate) fn new() -> Replies<T> {
        Replies {
            pending: FuturesUnordered::new(),
            detached: FuturesUnordered::new(),
        }
    }

    pub(crate) fn push(
        &mut self,
        reply: impl Future<Output = (String, Result<T, String>)> + Send + 'static,
    ) {
        self.pending.push(Box::pin(reply));
    }

    /// Like `push`, for a reply that need not run on once the operation is done with it.
    pub(crate) fn push_detached(
        &mut self,
        reply: impl Future<Output = (String, Result<T, String>)> + Send + 'static,
    ) {
        self.detached.push(Box::pin(reply));
    }

    /// The next answer, `None` once every replica answered.
    pub(crate) async fn next(&mut self) -> Option<(String, Result<T, String>)> {
        std::future::poll_fn(|cx| {
            if let Poll::Ready(Some(answer)) = self.pending.poll_next_unpin(cx) {
                return Poll::Ready(Some(answer));
            }
            if let Poll::Ready(Some(answer)) = self.detached.poll_next_unpin(cx) {
                return Poll::Ready(Some(answer));
            }
            if self.pending.is_empty() && self.detached.is_empty() {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await
    }
}

impl<T: Send + 'static> Drop for Replies<T> {
    fn drop(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut stragglers = std::mem::take(&mut self.pending);
        // Dropped outside a runtime only when the runtime itself is going away.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { while stragglers.next().await.is_some() {} });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// A caller that stops at its quorum drops the replies still pending: they must still run to
    /// their end (every replica gets the write), in the background.
    #[tokio::test]
    async fn stragglers_finish_after_the_caller_is_done() {
        let finished = Arc::new(AtomicUsize::new(0));
        let mut replies = Replies::<()>::new();
        for (node, delay_ms) in [("fast", 0), ("quick", 1), ("slow", 50)] {
            let finished = finished.clone();
            replies.push(async move {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                finished.fetch_add(1, Ordering::SeqCst);
                (node.to_owned(), Err("done".to_owned()))
            });
        }
        for _ in 0..2 {
            let _answer = replies.next().await.expect("an answer");
        }
        drop(replies);
        assert_eq!(finished.load(Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(finished.load(Ordering::SeqCst), 3, "the straggler ran on");
    }

    /// Detached replies answer like the others, and are dropped, not driven on, with their
    /// operation.
    #[tokio::test]
    async fn detached_replies_answer_and_are_not_driven_on() {
        let finished = Arc::new(AtomicUsize::new(0));
        let mut replies = Replies::<()>::new();
        for (node, delay_ms, detached) in [
            ("batched", 0, true),
            ("alone", 1, false),
            ("late", 50, true),
        ] {
            let finished = finished.clone();
            let reply = async move {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                finished.fetch_add(1, Ordering::SeqCst);
                (node.to_owned(), Ok(()))
            };
            if detached {
                replies.push_detached(reply);
            } else {
                replies.push(reply);
            }
        }
        let mut seen = Vec::new();
        for _ in 0..2 {
            seen.push(replies.next().await.expect("an answer").0);
        }
        seen.sort();
        assert_eq!(seen, ["alone", "batched"]);
        drop(replies);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            finished.load(Ordering::SeqCst),
            2,
            "the detached straggler was dropped"
        );
    }
}
