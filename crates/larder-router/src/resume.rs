//! A blob's body that survives its replica breaking off: when the bytes from one replica stop
//! with an error (the node died, or found a damaged piece past the first and reset the stream:
//! `larder-storage/src/streamed.rs`), the rest of the range is read again from the replicas,
//! hedged and failed over as any read (`read.rs`), and the body goes on from where it stopped.
//! A blob's bytes never change under its ID, so the client gets exactly the bytes it asked
//! for, or an error if no replica can give the rest; never a torn or repeated byte. The same
//! read of the rest takes up a download parked while its client did not read (`park.rs`).

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Method;
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use larder_cluster::BlobId;
use larder_proto::ByteRange;

use sync_wrapper::SyncWrapper;

use crate::download_budget::Share;
use crate::park::{self, Polled, Slot};
use crate::{FoundBlob, GetAnswer, Router, RouterError};

/// Bodies of at most this many bytes are relayed as they come, not resumed: a storage node
/// reads and verifies a read this small whole before it answers, so it breaks off only if the
/// node dies in that instant, and the client's retry covers that. Resumed, a 1 KiB GET cost
/// the frontend 1.11–1.18× the CPU of the build before (four A/B pairs of `h2load`, 1 × 256
/// streams, release builds); relayed as they come, 0.80–1.12× (three pairs): this machine's
/// noise.
const RESUMED_FROM: u64 = 64 << 10;

/// Times a body goes on from another read after breaking off: a blob has three replicas, and
/// a read that keeps breaking off is better failed than retried for ever.
const MAX_RESUMES: u32 = 2;

/// A new read of what is left, as a task: its handle is `Sync`, as response bodies must be.
type Reread = tokio::task::JoinHandle<Result<GetAnswer, RouterError>>;

/// The error of a body for a client: a replica's or the router's.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

enum Source {
    /// A replica's stream, which the watch may park (`park.rs`).
    Body(Arc<Slot>),
    /// The rest read anew, into this slot.
    Rereading(Reread, Arc<Slot>),
    Done,
}

/// The most handed on at once. A replica's DATA frames are up to 1 MiB, and hyper asks for more
/// only once its write buffer (~400 KiB for HTTP/1.1) has room: handed on whole, one frame kept
/// a slow client from asking for as long as it took to read the frame and the buffer, and the
/// watch took it for stalled sooner (`park.rs`). In slices, the gap is the buffer's: a client
/// reading less than about 400 KiB per `park_stalled_reads_after` (5 s: 80 KiB/s) is parked
/// each period, and its download costs a new read per ~400 KiB (measured with a client at
/// 1.6 MiB/s against a 200 ms period: parked 9 times in 12 MB).
const SLICE: usize = 64 << 10;

/// What one frame of a replica's stream comes to.
enum Step {
    Answer(Poll<Option<Result<Frame<Bytes>, RouterError>>>),
    /// Data kept to hand on, or not data (trailers): on to the next step.
    Next,
    /// The stream broke off, for this reason.
    BrokeOff(String),
}

/// The bytes `selected` of blob `id`, from `body` and, if it breaks off, from new reads of
/// what is left.
pub struct ResumingBody {
    router: Arc<Router>,
    id: BlobId,
    /// The bytes still to hand on, within the blob (the first of them, from the replica's
    /// last frame, kept in its slot and handed on in `SLICE`s).
    left: Range<u64>,
    source: Source,
    /// The replica sending the bytes now.
    current: String,
    /// The replicas whose bytes broke off: a read of the rest asks none of them again.
    broke_off: Vec<String>,
    /// The share of the download budget for the next frame, taken before it is polled
    /// (`download_budget.rs`).
    share: Option<Share>,
    /// The wait for that share, while the budget is spent.
    waiting: Option<SyncWrapper<Pin<Box<dyn Future<Output = Share> + Send>>>>,
}

impl Router {
    /// `found`'s body, the bytes it selected of blob `id`, for a client: as the replica sends
    /// it up to `RESUMED_FROM` bytes, else continued from the others if it breaks off, each
    /// frame counted in the download budget. `DownloadBudgetSpent` if the budget stays spent
    /// (`download_budget.rs`).
    pub async fn blob_body(
        self: &Arc<Self>,
        id: BlobId,
        found: FoundBlob,
    ) -> Result<BoxBody<Bytes, BoxError>, RouterError> {
        match found.selected.end - found.selected.start {
            len if len <= RESUMED_FROM => Ok(found.body.map_err(Into::into).boxed()),
            len => {
                let first = self.admit_download(len.min(self.frame)).await?;
                Ok(self.resuming(id, found, first).map_err(Into::into).boxed())
            }
        }
    }

    /// `found`'s body, the bytes it selected of blob `id` from one replica, continued from
    /// the others if it breaks off; `first` is its share for the first frame.
    fn resuming(self: &Arc<Self>, id: BlobId, found: FoundBlob, first: Share) -> ResumingBody {
        let slot = Slot::new(found.body);
        let after = self.config.park_stalled_reads_after;
        let len = found.selected.end - found.selected.start;
        if !after.is_zero() && len > park::WATCH_FROM {
            let counters = park::WatchCounters {
                parked: self.metrics.reads_parked.clone(),
                pressure: self.metrics.read_pressure.clone(),
            };
            park::watch(&slot, after, self.pressure.clone(), counters);
        }
        ResumingBody {
            router: self.clone(),
            id,
            left: found.selected,
            source: Source::Body(slot),
            current: found.replica,
            broke_off: Vec::new(),
            share: Some(first),
            waiting: None,
        }
    }
}

impl ResumingBody {
    /// After `why` broke the body off: a new read of what is left, from a replica that has
    /// not broken off, or the error to end with.
    fn reread(&mut self, why: String, slot: Arc<Slot>) -> Result<(), RouterError> {
        self.broke_off.push(self.current.clone());
        let resumes = self.broke_off.len() as u32;
        if resumes > MAX_RESUMES {
            return Err(RouterError::Unavailable(format!(
                "blob {}: the read broke off {resumes} times, the last at byte {}: {why}",
                self.id, self.left.start
            )));
        }
        self.router.metrics.reads_resumed.inc();
        tracing::warn!(blob = %self.id, at = self.left.start, replica = %self.current, error = %why, "a read broke off; reading the rest from another replica");
        self.read_rest(slot);
        Ok(())
    }

    /// Reads what is left anew, into `slot`, from any replica that has not broken off.
    fn read_rest(&mut self, slot: Arc<Slot>) {
        let (router, id, avoid) = (self.router.clone(), self.id, self.broke_off.clone());
        let range = ByteRange::FromTo(self.left.start, self.left.end - 1);
        let task = tokio::spawn(async move {
            router
                .get_blob_avoiding(&id, Method::GET, Some(range), &avoid)
                .await
        });
        self.source = Source::Rereading(task, slot);
    }

    /// Keeps a replica's frame of `data` in `slot` to hand on, if it is within what is left,
    /// carrying its share of the download budget.
    fn keep(&mut self, slot: &Slot, data: Bytes) -> Result<(), RouterError> {
        let len = data.len() as u64;
        match self.left.start.checked_add(len) {
            Some(end) if end <= self.left.end => {
                let data = match self.share.take() {
                    Some(share) => share.attach(data, len as usize),
                    None => data,
                };
                slot.keep(data);
                Ok(())
            }
            _ => Err(RouterError::Unavailable(format!(
                "blob {}: a replica sent more bytes than asked for",
                self.id
            ))),
        }
    }

    /// The next slice of the bytes `slot` keeps, counted off what is left (the watch hears
    /// that the client reads); `None` when it keeps none (or was parked meanwhile).
    fn hand_on(&mut self, slot: &Slot) -> Option<Frame<Bytes>> {
        let slice = slot.next_kept(SLICE)?;
        self.left.start += slice.len() as u64;
        // A view of the replica's frame, not a copy: while hyper holds it for a stalled client
        // it keeps the frame's whole buffer alive, so parking frees that frame only when no
        // slice of it waits in hyper. Copies cost 1.11-1.43x the frontend's CPU per 4 MB GET
        // and did not show a clear saving (`benchmarks/stalled-readers/RESULTS-copied-slices.md`).
        Some(Frame::data(slice))
    }

    /// What a replica's frame means for the client.
    fn take(&mut self, slot: &Slot, frame: Option<Result<Frame<Bytes>, hyper::Error>>) -> Step {
        match frame {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => match self.keep(slot, data) {
                    Ok(()) => Step::Next,
                    Err(err) => Step::Answer(self.fail(err)),
                },
                // Trailers: none on the internal hop; passed over.
                Err(_) => Step::Next,
            },
            // Every byte handed on: whatever the stream does after, the body is whole.
            _ if self.left.is_empty() => {
                self.source = Source::Done;
                Step::Answer(Poll::Ready(None))
            }
            Some(Err(err)) => Step::BrokeOff(format!("body: {err}")),
            None => Step::BrokeOff(format!(
                "the body ended {} bytes early",
                self.left.end - self.left.start
            )),
        }
    }

    /// Ready once the body holds a share for its next frame: the most a replica sends in one
    /// frame, or what is left if less. A frame waits in the pool connection's window meanwhile.
    fn poll_share(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.share.is_some() {
            return Poll::Ready(());
        }
        let waiting = match &mut self.waiting {
            Some(waiting) => waiting,
            None => {
                let bytes = (self.left.end - self.left.start).min(self.router.frame);
                // Most frames find room: no future to box for them.
                if let Some(share) = self.router.downloads.try_take(bytes) {
                    self.share = Some(share);
                    return Poll::Ready(());
                }
                self.waiting
                    .insert(SyncWrapper::new(self.router.download_share(bytes)))
            }
        };
        let share = std::task::ready!(waiting.get_mut().as_mut().poll(cx));
        self.waiting = None;
        self.share = Some(share);
        Poll::Ready(())
    }

    fn fail(&mut self, err: RouterError) -> Poll<Option<Result<Frame<Bytes>, RouterError>>> {
        self.source = Source::Done;
        Poll::Ready(Some(Err(err)))
    }
}

impl Body for ResumingBody {
    type Data = Bytes;
    type Error = RouterError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RouterError>>> {
        loop {
            let (why, slot) = match &mut self.source {
                Source::Done => return Poll::Ready(None),
                Source::Body(slot) => {
                    let slot = slot.clone();
                    if let Some(slice) = self.hand_on(&slot) {
                        return Poll::Ready(Some(Ok(slice)));
                    }
                    std::task::ready!(self.poll_share(cx));
                    let frame = match std::task::ready!(slot.poll(cx)) {
                        Polled::Frame(frame) => frame,
                        Polled::Parked if self.left.is_empty() => {
                            self.source = Source::Done;
                            return Poll::Ready(None);
                        }
                        Polled::Parked => {
                            // The client stalled and came back: the rest, from anywhere.
                            self.read_rest(slot);
                            continue;
                        }
                    };
                    match self.take(&slot, frame) {
                        Step::Answer(answer) => return answer,
                        Step::Next => continue,
                        Step::BrokeOff(why) => (why, slot),
                    }
                }
                Source::Rereading(reread, slot) => {
                    let slot = slot.clone();
                    let answer = std::task::ready!(Pin::new(reread).poll(cx)).unwrap_or_else(|e| {
                        Err(RouterError::Unavailable(format!("the read task: {e}")))
                    });
                    match answer {
                        Ok(GetAnswer::Found(found)) if found.selected == self.left => {
                            self.current = found.replica;
                            slot.refill(found.body);
                            self.source = Source::Body(slot);
                            continue;
                        }
                        Ok(GetAnswer::Found(found)) => {
                            let err = RouterError::Unavailable(format!(
                                "blob {}: asked for bytes {:?}, a replica sent {:?}",
                                self.id, self.left, found.selected
                            ));
                            return self.fail(err);
                        }
                        Ok(GetAnswer::Missing(missing)) => {
                            let err = RouterError::Unavailable(format!(
                                "blob {}: gone while it was being read ({missing:?})",
                                self.id
                            ));
                            return self.fail(err);
                        }
                        Err(err) => return self.fail(err),
                    }
                }
            };
            if let Err(err) = self.reread(why, slot) {
                return self.fail(err);
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.source, Source::Done) || self.left.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left.end - self.left.start)
    }
}

impl Drop for ResumingBody {
    /// A client gone while the rest was being read again: that read is not needed.
    fn drop(&mut self) {
        if let Source::Rereading(reread, _) = &self.source {
            reread.abort();
        }
    }
}
