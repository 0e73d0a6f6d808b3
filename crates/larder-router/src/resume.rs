//! A blob's body that survives its replica breaking off: when the bytes from one replica stop
//! with an error (the node died, or found a damaged piece past the first and reset the stream:
//! `larder-storage/src/streamed.rs`), the rest of the range is read again from the replicas,
//! hedged and failed over as any read (`read.rs`), and the body goes on from where it stopped.
//! A blob's bytes never change under its ID, so the client gets exactly the bytes it asked
//! for, or an error if no replica can give the rest; never a torn or repeated byte.

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Method;
use hyper::body::Incoming;
use hyper::body::{Body, Frame, SizeHint};
use larder_cluster::BlobId;
use larder_proto::ByteRange;

use crate::{FoundBlob, GetAnswer, Router, RouterError};

/// Times a body goes on from another read after breaking off: a blob has three replicas, and
/// a read that keeps breaking off is better failed than retried for ever.
const MAX_RESUMES: u32 = 2;

/// A new read of what is left, as a task: its handle is `Sync`, as response bodies must be.
type Reread = tokio::task::JoinHandle<Result<GetAnswer, RouterError>>;

enum Source {
    Body(Incoming),
    Rereading(Reread),
    Done,
}

/// The bytes `selected` of blob `id`, from `body` and, if it breaks off, from new reads of
/// what is left.
pub struct ResumingBody {
    router: Arc<Router>,
    id: BlobId,
    /// The bytes still to come, within the blob.
    left: Range<u64>,
    source: Source,
    /// The replicas this body's bytes came from, the one sending them now last: a read of
    /// the rest asks none of them again.
    used: Vec<String>,
}

impl Router {
    /// `found`'s body, the bytes it selected of blob `id` from one replica, continued from
    /// the others if it breaks off.
    pub fn resuming(self: &Arc<Self>, id: BlobId, found: FoundBlob) -> ResumingBody {
        ResumingBody {
            router: self.clone(),
            id,
            left: found.selected,
            source: Source::Body(found.body),
            used: vec![found.replica],
        }
    }
}

impl ResumingBody {
    /// After `why` broke the body off: a new read of what is left, or the error to end with.
    fn reread(&mut self, why: String) -> Result<(), RouterError> {
        let resumes = self.used.len() as u32 - 1;
        if resumes >= MAX_RESUMES {
            return Err(RouterError::Unavailable(format!(
                "blob {}: the read broke off {} times, the last at byte {}: {why}",
                self.id,
                resumes + 1,
                self.left.start
            )));
        }
        self.router.metrics.reads_resumed.inc();
        tracing::warn!(blob = %self.id, at = self.left.start, replica = ?self.used.last(), error = %why, "a read broke off; reading the rest from another replica");
        let (router, id, avoid) = (self.router.clone(), self.id, self.used.clone());
        let range = ByteRange::FromTo(self.left.start, self.left.end - 1);
        self.source = Source::Rereading(tokio::spawn(async move {
            router
                .get_blob_avoiding(&id, Method::GET, Some(range), &avoid)
                .await
        }));
        Ok(())
    }

    /// A data frame of `data`: counted off what is left.
    fn data(&mut self, data: Bytes) -> Result<Frame<Bytes>, RouterError> {
        let len = data.len() as u64;
        match self
            .left
            .start
            .checked_add(len)
            .filter(|end| *end <= self.left.end)
        {
            Some(start) => {
                self.left.start = start;
                Ok(Frame::data(data))
            }
            None => Err(RouterError::Unavailable(format!(
                "blob {}: a replica sent more bytes than asked for",
                self.id
            ))),
        }
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
            let why = match &mut self.source {
                Source::Done => return Poll::Ready(None),
                Source::Body(body) => match std::task::ready!(Pin::new(body).poll_frame(cx)) {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => {
                            let frame = self.data(data);
                            return match frame {
                                Ok(frame) => Poll::Ready(Some(Ok(frame))),
                                Err(err) => self.fail(err),
                            };
                        }
                        // Trailers: none on the internal hop; passed over.
                        Err(_) => continue,
                    },
                    Some(Err(err)) => format!("body: {err}"),
                    None if self.left.is_empty() => {
                        self.source = Source::Done;
                        return Poll::Ready(None);
                    }
                    None => format!(
                        "the body ended {} bytes early",
                        self.left.end - self.left.start
                    ),
                },
                Source::Rereading(reread) => match std::task::ready!(Pin::new(reread).poll(cx))
                    .unwrap_or_else(|e| {
                        Err(RouterError::Unavailable(format!("the read task: {e}")))
                    }) {
                    Ok(GetAnswer::Found(found)) if found.selected == self.left => {
                        self.used.push(found.replica);
                        self.source = Source::Body(found.body);
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
                },
            };
            if let Err(err) = self.reread(why) {
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
        if let Source::Rereading(reread) = &self.source {
            reread.abort();
        }
    }
}
