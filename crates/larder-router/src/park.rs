//! Parking the download of a client that stopped reading.
//!
//! A replica sends a download as fast as the HTTP/2 windows of the frontend's pool connection
//! allow, and what the frontend cannot pass on to a client that does not read stays in that
//! connection's receive window, which all its streams share. 300 clients that asked for a
//! 4 MB blob and read nothing filled every pool connection's window, and every other download
//! on them stopped (`benchmarks/stalled-readers/RESULTS.md`). So a download the frontend has
//! answered with data and not been asked for more for `[router] park_stalled_reads_after` lets
//! go of its replica's stream (a reset gives its window back), keeping only what it already
//! took from it (what hyper and the sockets hold, and the rest of the last frame, which
//! `resume.rs` hands on in slices); when the client reads again, the rest is read anew from
//! where that ends, which a blob's unchanging bytes make exact.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming};
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

/// Downloads with more than this left to send are watched; smaller ones fit in the buffers
/// between the pool and the client (the frontend's and the sockets').
pub(crate) const WATCH_FROM: u64 = 1 << 20;

/// `Slot::answered_ms` while the body waits on its replica, not on its client.
const WAITING: u64 = u64::MAX;

/// One replica's stream of a download, which the watch may take away.
pub(crate) struct Slot {
    body: Mutex<Option<Incoming>>,
    born: Instant,
    /// When the body last answered (ms after `born`), or `WAITING`.
    answered_ms: AtomicU64,
}

/// What polling the slot gave.
pub(crate) enum Polled {
    Frame(Option<Result<Frame<Bytes>, hyper::Error>>),
    /// The watch took the stream: the rest is to be read anew.
    Parked,
}

impl Slot {
    pub(crate) fn new(body: Incoming) -> Arc<Slot> {
        Arc::new(Slot {
            body: Mutex::new(Some(body)),
            born: Instant::now(),
            answered_ms: AtomicU64::new(0),
        })
    }

    /// Puts a new stream in (after a read anew), as just answered: the watch gives it a whole
    /// period before it may take it.
    pub(crate) fn refill(&self, body: Incoming) {
        let mut held = self.body.lock().expect("no panic holds the slot");
        self.answered();
        *held = Some(body);
    }

    /// The body answered (a frame from this slot or one it kept back): its client reads.
    pub(crate) fn answered(&self) {
        let ms = self.born.elapsed().as_millis() as u64;
        self.answered_ms.store(ms, Ordering::Release);
    }

    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<Polled> {
        let mut held = self.body.lock().expect("no panic holds the slot");
        let Some(body) = held.as_mut() else {
            return Poll::Ready(Polled::Parked);
        };
        match std::pin::Pin::new(body).poll_frame(cx) {
            Poll::Pending => {
                self.answered_ms.store(WAITING, Ordering::Release);
                Poll::Pending
            }
            Poll::Ready(frame) => {
                self.answered();
                Poll::Ready(Polled::Frame(frame))
            }
        }
    }

    /// Takes the stream away if the body answered and was not asked again for `after`. Judged
    /// under the lock that `poll` holds while it waits on the stream (and stores `WAITING`):
    /// a body that waits on its stream has a waker there, and is never parked.
    fn park_if_stalled(&self, after: Duration) -> bool {
        let mut held = self.body.lock().expect("no panic holds the slot");
        let answered = self.answered_ms.load(Ordering::Acquire);
        let idle = (self.born.elapsed().as_millis() as u64).saturating_sub(answered);
        if answered == WAITING || idle < after.as_millis() as u64 {
            return false;
        }
        held.take().is_some()
    }
}

/// Watches `slot` until its body is dropped, parking it whenever its client stalls.
pub(crate) fn watch(slot: &Arc<Slot>, after: Duration, parked: Counter) {
    let slot: Weak<Slot> = Arc::downgrade(slot);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(after).await;
            let Some(slot) = slot.upgrade() else { return };
            if slot.park_if_stalled(after) {
                parked.inc();
            }
        }
    });
}
