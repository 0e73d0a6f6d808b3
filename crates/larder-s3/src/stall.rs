//! A request body with a stall clock: if the client sends nothing for the body-read timeout
//! while the server waits for it, the body fails with [`BodyStalled`]. Only time spent waiting
//! on the client counts (the clock starts when a poll finds nothing and stops at the next
//! frame), so backpressure while chunks are stored does not. Per stream: the connection's idle
//! timeout cannot catch one stalled upload on a busy HTTP/2 connection, and it holds a chunk
//! buffer while it waits.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Sleep;

/// Nothing arrived on a request body for the body-read timeout.
#[derive(Debug, thiserror::Error)]
#[error("request body stalled: nothing received for {0:?} (limits.body_read_timeout)")]
pub struct BodyStalled(pub Duration);

/// Set when a request's body stalled, for the handler that reads it: s3s wraps body errors in
/// its own, which do not expose their source, so the error alone cannot say so.
#[derive(Clone, Default)]
pub struct Stalled(Arc<AtomicBool>);

impl Stalled {
    pub fn happened(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

pub struct StallClock {
    body: Incoming,
    stalled: Stalled,
    timeout: Duration,
    /// Armed while the last poll found nothing.
    clock: Option<Pin<Box<Sleep>>>,
}

impl StallClock {
    pub fn new(body: Incoming, timeout: Duration, stalled: Stalled) -> StallClock {
        StallClock {
            body,
            stalled,
            timeout,
            clock: None,
        }
    }
}

impl Body for StallClock {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.clock = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let clock = this
                    .clock
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match clock.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.stalled.0.store(true, Ordering::Relaxed);
                        Poll::Ready(Some(Err(Box::new(BodyStalled(timeout)))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
