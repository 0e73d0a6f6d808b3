//! Parking the download of a client that stopped reading.
//!
//! A replica sends a download as fast as the HTTP/2 windows of the frontend's pool connection
//! allow, and what the frontend cannot pass on to a client that does not read stays in that
//! connection's receive window, which all its streams share. 300 clients that asked for a
//! 4 MB blob and read nothing filled every pool connection's window, and every other download
//! on them stopped (`benchmarks/stalled-readers/RESULTS.md`). So a download the frontend has
//! answered with data and not been asked for more for `[router] park_stalled_reads_after` lets
//! go of its replica's stream (a reset gives its window back) and of the rest of its last
//! frame (`resume.rs` hands frames on in slices), keeping only what it already handed on
//! (what hyper and the sockets hold, and the frame buffers those slices are views of); when
//! the client reads again, the rest is read anew from where that ends, which a blob's
//! unchanging bytes make exact. Held-up reads make every watch look at once (`Pressure`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame};
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

/// Downloads with more than this left to send are watched; smaller ones fit in the buffers
/// between the pool and the client (the frontend's and the sockets').
pub(crate) const WATCH_FROM: u64 = 1 << 20;

/// `Slot::answered_ms` while the body waits on its replica, not on its client.
const WAITING: u64 = u64::MAX;

/// One replica's stream of a download, and the rest of its last frame, which the watch may
/// take away. (Generic over the stream only so that tests can hold one.)
pub(crate) struct Slot<B = crate::BlobBody> {
    held: Mutex<Held<B>>,
    born: Instant,
    /// When the body last answered (ms after `born`), or `WAITING`.
    answered_ms: AtomicU64,
    /// While `WAITING`: since when (ms after `born`).
    waiting_since_ms: AtomicU64,
}

/// What a slot holds for its download.
struct Held<B> {
    body: Option<B>,
    /// The bytes of the stream's last frame not handed on yet (`resume.rs` hands them on in
    /// slices). Parking drops them with the stream: the read anew starts where the bytes
    /// handed on end. (The frame's buffer stays alive as long as a slice handed on waits in
    /// hyper for the client: `resume.rs`, `hand_on`.)
    kept: Bytes,
}

/// What polling the slot gave.
pub(crate) enum Polled<E = hyper::Error> {
    Frame(Option<Result<Frame<Bytes>, E>>),
    /// The watch took the stream: the rest is to be read anew.
    Parked,
}

impl<B: Body<Data = Bytes> + Unpin> Slot<B> {
    pub(crate) fn new(body: B) -> Arc<Slot<B>> {
        Arc::new(Slot {
            held: Mutex::new(Held {
                body: Some(body),
                kept: Bytes::new(),
            }),
            born: Instant::now(),
            answered_ms: AtomicU64::new(0),
            waiting_since_ms: AtomicU64::new(0),
        })
    }

    /// Puts a new stream in (after a read anew), as just answered: the watch gives it a whole
    /// period before it may take it.
    pub(crate) fn refill(&self, body: B) {
        let mut held = self.lock();
        self.answered();
        held.body = Some(body);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held<B>> {
        self.held.lock().expect("no panic holds the slot")
    }

    /// Keeps the bytes of a frame to hand on.
    pub(crate) fn keep(&self, data: Bytes) {
        self.lock().kept = data;
    }

    /// The next at most `max` kept bytes, if any are (none once parked); the body answered.
    /// Marked under the lock the watch judges under, so a client that just asked again is
    /// never parked for its silence before.
    pub(crate) fn next_kept(&self, max: usize) -> Option<Bytes> {
        let mut held = self.lock();
        if held.kept.is_empty() {
            return None;
        }
        self.answered();
        let len = held.kept.len().min(max);
        Some(held.kept.split_to(len))
    }

    /// The body answered (a frame from this slot or one it kept back): its client reads.
    pub(crate) fn answered(&self) {
        let ms = self.born.elapsed().as_millis() as u64;
        self.answered_ms.store(ms, Ordering::Release);
    }

    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<Polled<B::Error>> {
        let mut held = self.lock();
        let Some(body) = held.body.as_mut() else {
            return Poll::Ready(Polled::Parked);
        };
        match std::pin::Pin::new(body).poll_frame(cx) {
            Poll::Pending => {
                if self.answered_ms.swap(WAITING, Ordering::AcqRel) != WAITING {
                    let ms = self.born.elapsed().as_millis() as u64;
                    self.waiting_since_ms.store(ms, Ordering::Release);
                }
                Poll::Pending
            }
            Poll::Ready(frame) => {
                self.answered();
                Poll::Ready(Polled::Frame(frame))
            }
        }
    }

    /// How long the body has waited on its replica, if it does.
    fn waiting_for(&self) -> Option<Duration> {
        if self.answered_ms.load(Ordering::Acquire) != WAITING {
            return None;
        }
        let since = self.waiting_since_ms.load(Ordering::Acquire);
        let now = self.born.elapsed().as_millis() as u64;
        Some(Duration::from_millis(now.saturating_sub(since)))
    }

    /// Takes the stream away if the body answered and was not asked again for `after`. Judged
    /// under the lock that `poll` holds while it waits on the stream (and stores `WAITING`):
    /// a body that waits on its stream has a waker there, and is never parked.
    fn park_if_stalled(&self, after: Duration) -> bool {
        let mut held = self.lock();
        let answered = self.answered_ms.load(Ordering::Acquire);
        let idle = (self.born.elapsed().as_millis() as u64).saturating_sub(answered);
        if answered == WAITING || idle < after.as_millis() as u64 {
            return false;
        }
        held.kept = Bytes::new();
        held.body.take().is_some()
    }
}

/// How long a download must have gone unasked to be parked at once when reads are held up
/// (`Pressure`); also how long a download waits on its replica before it says so.
const PRESSED_AFTER: Duration = Duration::from_secs(1);

/// How often pressure is raised at most: each raise wakes every watch.
const PRESSURE_EVERY_MS: u64 = 250;

/// Word that reads are held up: a storage node said its read budget is spent (a 503 with
/// `x-larder-read-budget-spent`), or a download has waited on its replica for `PRESSED_AFTER`
/// (a read under way waiting for a share of a node's budget, or for a pool connection's window).
/// What holds them up is mostly the bytes held for downloads whose clients stopped reading,
/// which the watch would park only after `park_stalled_reads_after`; so every watch looks at
/// once, and parks its download if it has gone unasked for `PRESSED_AFTER`. A node spent by
/// another frontend's stalled downloads is relieved only by that frontend's watches.
pub(crate) struct Pressure {
    raised: tokio::sync::Notify,
    born: Instant,
    /// When pressure was last raised (ms after `born`, plus one; 0: never).
    last_ms: AtomicU64,
}

impl Default for Pressure {
    fn default() -> Pressure {
        Pressure {
            raised: tokio::sync::Notify::new(),
            born: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
}

impl Pressure {
    /// Resolves at the next raise (registered when first polled).
    pub(crate) fn raised(&self) -> tokio::sync::futures::Notified<'_> {
        self.raised.notified()
    }

    /// Reads are held up: wakes every watch, unless that was done less than
    /// `PRESSURE_EVERY_MS` ago.
    pub(crate) fn raise(&self, raised: &Counter) {
        let now = self.born.elapsed().as_millis() as u64 + 1;
        let last = self.last_ms.load(Ordering::Acquire);
        if last != 0 && now.saturating_sub(last) < PRESSURE_EVERY_MS {
            return;
        }
        if self
            .last_ms
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            raised.inc();
            self.raised.notify_waiters();
        }
    }
}

/// What a watch counts.
#[derive(Clone)]
pub(crate) struct WatchCounters {
    pub(crate) parked: Counter,
    pub(crate) pressure: Counter,
}

/// Watches `slot` until its body is dropped, every `after` or `PRESSED_AFTER` if sooner:
/// parks it when its client has not asked for `after` (`PRESSED_AFTER` when `pressure` is
/// raised), and raises `pressure` when it has waited on its replica for `PRESSED_AFTER`.
pub(crate) fn watch<B>(
    slot: &Arc<Slot<B>>,
    after: Duration,
    pressure: Arc<Pressure>,
    counters: WatchCounters,
) where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
{
    let slot: Weak<Slot<B>> = Arc::downgrade(slot);
    let tick = after.min(PRESSED_AFTER);
    tokio::spawn(async move {
        // One registration kept across turns, so a raise while this watch is busy with its
        // own turn (every watch ticks on the same second) is not missed.
        let mut raised = std::pin::pin!(pressure.raised.notified());
        loop {
            let limit = tokio::select! {
                _ = tokio::time::sleep(tick) => after,
                _ = raised.as_mut() => {
                    raised.set(pressure.raised.notified());
                    tick
                }
            };
            let Some(slot) = slot.upgrade() else { return };
            if slot
                .waiting_for()
                .is_some_and(|waited| waited >= PRESSED_AFTER)
            {
                pressure.raise(&counters.pressure);
            }
            if slot.park_if_stalled(limit) {
                counters.parked.inc();
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::task::Waker;

    use http_body_util::channel::{Channel, Sender};

    use super::*;

    type Frames = Channel<Bytes, Infallible>;

    /// A slot whose stream sends what the test sends into the sender.
    fn slot() -> (Arc<Slot<Frames>>, Sender<Bytes, Infallible>) {
        let (tx, body) = Channel::new(4);
        (Slot::new(body), tx)
    }

    fn poll(slot: &Slot<Frames>) -> Poll<Polled<Infallible>> {
        slot.poll(&mut Context::from_waker(Waker::noop()))
    }

    const AFTER: Duration = Duration::from_millis(200);

    #[tokio::test]
    async fn a_parked_slot_lets_go_of_its_stream_and_of_the_bytes_it_kept() {
        let (slot, mut tx) = slot();
        tx.send_data(Bytes::from(vec![1u8; 1 << 20])).await.unwrap();
        let Poll::Ready(Polled::Frame(Some(Ok(frame)))) = poll(&slot) else {
            panic!("a frame");
        };
        slot.keep(frame.into_data().unwrap());
        assert_eq!(slot.next_kept(64 << 10).unwrap().len(), 64 << 10);
        assert!(
            !slot.park_if_stalled(AFTER),
            "asked for more within the period"
        );
        tokio::time::sleep(AFTER + AFTER / 2).await;
        assert!(slot.park_if_stalled(AFTER));
        assert!(
            slot.next_kept(64 << 10).is_none(),
            "the kept bytes went too"
        );
        assert!(matches!(poll(&slot), Poll::Ready(Polled::Parked)));
        let dropped = tx.send_data(Bytes::from_static(b"x")).await;
        assert!(dropped.is_err(), "the stream was dropped");
    }

    #[tokio::test]
    async fn raised_pressure_parks_a_download_unasked_for_a_second_long_before_its_period() {
        let (slot, mut tx) = slot();
        tx.send_data(Bytes::from_static(b"some")).await.unwrap();
        assert!(matches!(
            poll(&slot),
            Poll::Ready(Polled::Frame(Some(Ok(_))))
        ));
        let pressure = Arc::new(Pressure::default());
        let (parked, raised) = (Counter::default(), Counter::default());
        let counters = WatchCounters {
            parked: parked.clone(),
            pressure: raised.clone(),
        };
        watch(&slot, Duration::from_secs(600), pressure.clone(), counters);
        tokio::time::sleep(Duration::from_millis(200)).await;
        pressure.raise(&raised);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(parked.get(), 0, "asked for less than a second ago");
        tokio::time::sleep(PRESSED_AFTER).await;
        pressure.raise(&raised);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(parked.get(), 1);
        assert!(matches!(poll(&slot), Poll::Ready(Polled::Parked)));
        // Raised at most every PRESSURE_EVERY_MS: these two come too soon after the last.
        pressure.raise(&raised);
        pressure.raise(&raised);
        assert_eq!(raised.get(), 2);
    }

    #[tokio::test]
    async fn a_download_waiting_on_its_replica_for_a_second_parks_stalled_ones() {
        let (waiting, _waiting_tx) = slot();
        assert!(matches!(poll(&waiting), Poll::Pending));
        let (stalled, mut tx) = slot();
        tx.send_data(Bytes::from_static(b"some")).await.unwrap();
        assert!(matches!(poll(&stalled), Poll::Ready(Polled::Frame(_))));
        let pressure = Arc::new(Pressure::default());
        let (parked, raised) = (Counter::default(), Counter::default());
        let counters = WatchCounters {
            parked: parked.clone(),
            pressure: raised.clone(),
        };
        let after = Duration::from_secs(600);
        watch(&waiting, after, pressure.clone(), counters.clone());
        watch(&stalled, after, pressure, counters);
        tokio::time::sleep(PRESSED_AFTER * 3 + Duration::from_millis(500)).await;
        assert!(raised.get() >= 1, "the waiting download raised no pressure");
        assert_eq!(
            parked.get(),
            1,
            "the stalled one was parked, not the waiting one"
        );
        assert!(matches!(poll(&stalled), Poll::Ready(Polled::Parked)));
    }

    #[tokio::test]
    async fn a_slot_that_waits_on_its_stream_is_never_parked() {
        let (slot, mut tx) = slot();
        assert!(matches!(poll(&slot), Poll::Pending));
        tokio::time::sleep(AFTER * 2).await;
        assert!(!slot.park_if_stalled(AFTER), "its waker is in the stream");
        tx.send_data(Bytes::from_static(b"more")).await.unwrap();
        assert!(matches!(
            poll(&slot),
            Poll::Ready(Polled::Frame(Some(Ok(_))))
        ));
        // Answered now: a whole period before it may be parked.
        assert!(!slot.park_if_stalled(AFTER));
        tokio::time::sleep(AFTER + AFTER / 2).await;
        assert!(slot.park_if_stalled(AFTER));
    }
}
