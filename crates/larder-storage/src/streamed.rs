//! The body of a large blob read, streamed in verified pieces (`store.read_piece_size`).
//!
//! Why: read whole before answering, a record of up to 16 MiB sat in the node's memory for as
//! long as its reader took, and a frontend's readers that stopped reading (hundreds of stalled
//! downloads) held hundreds of megabytes on every node they asked. Streamed, a read holds a few
//! pieces (below), and a reader that does not read stops the reading: hyper asks this body for
//! more only once h2 has taken the piece before, which it does when the stream has window.
//!
//! The first piece is read and verified before the status is sent (`blobs::serve`), so a
//! replica whose damage is there answers 500 and the frontend asks another. A later piece that
//! fails its checksum ends the body with an error: hyper resets the stream, and the frontend
//! continues from another replica where the bytes stopped (`larder-router/src/resume.rs`).
//! Never is an unverified byte sent.
//!
//! Each piece is counted in the node's read budget (`read_budget.rs`) from before it is read
//! until the last view of its bytes is dropped, which h2 does once they are written to the
//! socket: the share rides in the piece's `Bytes`. A stalled read so holds, and counts, the
//! piece h2 could not send, the next one hyper keeps ready, and the one read ahead. A read
//! whose next share is not free waits for it, in a task, and goes on when bytes of any read
//! (its own included) have left.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use larder_store::BlobReader;
use tokio::task::JoinHandle;

use crate::read_budget::{Held, ReadBudget};
use crate::reply::BoxError;

/// The next piece of a reader (`None` once it is done) and the reader, back from the blocking
/// pool; an error if the read's task failed.
type Next = Result<(Option<larder_store::Result<Bytes>>, BlobReader), BoxError>;

/// A blob's bytes, piece by piece, one piece read ahead of the one being sent, each piece's
/// bytes counted in the node's read budget while they exist.
pub(crate) struct Streamed {
    /// The next piece to send, read and verified.
    ready: Option<Bytes>,
    /// The read of the piece after it: on the blocking pool, or first waiting for its share.
    reading: Option<JoinHandle<Next>>,
    /// The reader, while no read is under way and it is not done.
    reader: Option<BlobReader>,
    /// Bytes not yet sent.
    left: u64,
    budget: ReadBudget,
}

/// Reads the next piece of `reader`, carrying `held` (a share of the budget).
fn read_counted(
    mut reader: BlobReader,
    held: Option<Held>,
) -> (Option<larder_store::Result<Bytes>>, BlobReader) {
    let piece = reader.next().map(|read| {
        read.map(|piece| match held {
            Some(held) => held.attach(piece),
            None => piece,
        })
    });
    (piece, reader)
}

impl Streamed {
    /// The body of `len` bytes starting with `first` (already verified and counted), the rest
    /// from `reader`.
    pub(crate) fn new(first: Bytes, reader: BlobReader, len: u64, budget: ReadBudget) -> Streamed {
        Streamed {
            ready: Some(first),
            reading: None,
            reader: Some(reader),
            left: len,
            budget,
        }
    }

    /// Starts reading the next piece, if there is a reader and no read under way: at once
    /// when its share of the budget is free, else after a task has waited for it. The share
    /// goes into the blocking read, so it is counted for as long as that read runs, whether
    /// or not this body is still there to take its piece.
    fn read_ahead(&mut self) {
        if self.left == 0 || self.reading.is_some() {
            return;
        }
        let Some(reader) = self.reader.take() else {
            return;
        };
        let share = self.budget.share(self.left);
        let reading = match self.budget.try_take(share) {
            Some(held) => tokio::task::spawn_blocking(move || Ok(read_counted(reader, Some(held)))),
            None => {
                let budget = self.budget.clone();
                tokio::spawn(async move {
                    let held = budget.take_in_time(share).await;
                    tokio::task::spawn_blocking(move || read_counted(reader, held))
                        .await
                        .map_err(|err| format!("a blob read task failed: {err}").into())
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
        self.read_ahead();
        let Some(reading) = self.reading.as_mut() else {
            return Poll::Ready(None);
        };
        let joined = std::task::ready!(Pin::new(reading).poll(cx));
        self.reading = None;
        let joined = joined.unwrap_or_else(|err| Err(format!("a blob read task: {err}").into()));
        match joined {
            Ok((Some(Ok(piece)), reader)) => {
                self.reader = Some(reader);
                self.send(piece)
            }
            Ok((Some(Err(err)), _)) => {
                tracing::error!(error = %err, "a blob read failed after its first piece was sent; resetting the stream");
                Poll::Ready(Some(Err(err.into())))
            }
            Ok((None, _)) if self.left == 0 => Poll::Ready(None),
            Ok((None, _)) => Poll::Ready(Some(Err("the store's read ended early".into()))),
            Err(err) => Poll::Ready(Some(Err(err))),
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
    /// finishes, and its share goes with its piece).
    fn drop(&mut self) {
        if let Some(reading) = &self.reading {
            reading.abort();
        }
    }
}
