//! The body of a large blob read, streamed in verified pieces (`store.read_piece_size`).
//!
//! Why: read whole before answering, a record of up to 16 MiB sat in the node's memory for as
//! long as its reader took, and a frontend's readers that stopped reading (hundreds of stalled
//! downloads) held hundreds of megabytes on every node they asked. Streamed, a read holds the
//! piece h2 is sending and the one read ahead of it, and a reader that does not read stops the
//! reading: h2 asks this body for more only when the stream has window to send it.
//!
//! The first piece is read and verified before the status is sent (`blobs::serve`), so a
//! replica whose damage is there answers 500 and the frontend asks another. A later piece that
//! fails its checksum ends the body with an error: hyper resets the stream, and the frontend
//! continues from another replica where the bytes stopped (`larder-router/src/resume.rs`).
//! Never is an unverified byte sent.
//!
//! Each piece is counted in the node's read budget from before it is read until h2 asks for
//! the next one (`read_budget.rs`): a read whose next share is not free waits for it, in a
//! task, and goes on when readers of other blobs have taken their bytes.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use larder_store::BlobReader;
use tokio::task::JoinHandle;

use crate::read_budget::{Held, ReadBudget};
use crate::reply::BoxError;

/// The next piece of a reader (`None` once it is done), the reader, and the piece's share of
/// the read budget (`None` only if the budget was closed), back from the blocking pool.
type Next = (
    Option<larder_store::Result<Bytes>>,
    BlobReader,
    Option<Held>,
);

/// A blob's bytes, piece by piece, one piece read ahead of the one being sent, each piece's
/// bytes counted in the node's read budget (`read_budget.rs`) from before it is read until h2
/// asks for the piece after it.
pub(crate) struct Streamed {
    /// The next piece to send, read and verified.
    ready: Option<Bytes>,
    /// The share of the piece in `ready`, or of the piece h2 was last given.
    held: Option<Held>,
    /// The read of the piece after it: on the blocking pool, or first waiting for its share.
    reading: Option<JoinHandle<Next>>,
    /// The reader, while no read is under way and it is not done.
    reader: Option<BlobReader>,
    /// Bytes not yet sent.
    left: u64,
    budget: ReadBudget,
}

impl Streamed {
    /// The body of `len` bytes starting with `first` (already verified, its share `held`), the
    /// rest from `reader`.
    pub(crate) fn new(
        first: Bytes,
        held: Held,
        reader: BlobReader,
        len: u64,
        budget: ReadBudget,
    ) -> Streamed {
        Streamed {
            ready: Some(first),
            held: Some(held),
            reading: None,
            reader: Some(reader),
            left: len,
            budget,
        }
    }

    /// Starts reading the next piece, if there is a reader and no read under way: at once
    /// when its share of the budget is free, else after a task has waited for it.
    fn read_ahead(&mut self) {
        if self.left == 0 || self.reading.is_some() {
            return;
        }
        let Some(mut reader) = self.reader.take() else {
            return;
        };
        let share = self.budget.share(self.left);
        let reading = match self.budget.try_take(share) {
            Some(held) => tokio::task::spawn_blocking(move || (reader.next(), reader, Some(held))),
            None => {
                let budget = self.budget.clone();
                tokio::spawn(async move {
                    let held = budget.take_in_time(share).await;
                    let read = tokio::task::spawn_blocking(move || (reader.next(), reader)).await;
                    match read {
                        Ok((piece, reader)) => (piece, reader, held),
                        Err(err) => std::panic::resume_unwind(err.into_panic()),
                    }
                })
            }
        };
        self.reading = Some(reading);
    }

    fn send(&mut self, piece: Bytes) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let len = piece.len() as u64;
        let Some(left) = self.left.checked_sub(len) else {
            return Poll::Ready(Some(Err("the store gave more bytes than asked for".into())));
        };
        self.left = left;
        self.read_ahead();
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }
}

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(piece) = self.ready.take() {
            return self.send(piece);
        }
        // h2 asks for more only once it has room for it: the piece before has (mostly) left.
        self.held = None;
        self.read_ahead();
        let Some(reading) = self.reading.as_mut() else {
            return Poll::Ready(None);
        };
        let joined = std::task::ready!(Pin::new(reading).poll(cx));
        self.reading = None;
        match joined {
            Ok((Some(Ok(piece)), reader, held)) => {
                self.reader = Some(reader);
                self.held = held;
                self.send(piece)
            }
            Ok((Some(Err(err)), _, _)) => {
                tracing::error!(error = %err, "a blob read failed after its first piece was sent; resetting the stream");
                Poll::Ready(Some(Err(err.into())))
            }
            Ok((None, _, _)) if self.left == 0 => Poll::Ready(None),
            Ok((None, _, _)) => Poll::Ready(Some(Err("the store's read ended early".into()))),
            Err(err) => Poll::Ready(Some(Err(format!("a blob read task failed: {err}").into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0 && self.ready.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

impl Drop for Streamed {
    /// A read still waiting for its share stops waiting (one already on the blocking pool
    /// finishes, and its share is given back with its piece).
    fn drop(&mut self) {
        if let Some(reading) = &self.reading {
            reading.abort();
        }
    }
}
