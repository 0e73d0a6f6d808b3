//! A found blob's bytes as a replica sent them: streamed in its own answer, or whole within a
//! batch's answer (`get_batch.rs`). Either is a body of `Bytes` failing with hyper's error, so
//! every reader of a blob (resuming, parking, the APIs) takes both alike.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

#[derive(Debug)]
pub enum BlobBody {
    /// The body of the replica's own answer.
    Streamed(Incoming),
    /// Bytes already here (`None` once handed on).
    Inline(Option<Bytes>),
}

impl BlobBody {
    pub fn inline(bytes: Bytes) -> BlobBody {
        BlobBody::Inline((!bytes.is_empty()).then_some(bytes))
    }
}

impl Body for BlobBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            BlobBody::Streamed(body) => Pin::new(body).poll_frame(cx),
            BlobBody::Inline(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            BlobBody::Streamed(body) => body.is_end_stream(),
            BlobBody::Inline(bytes) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            BlobBody::Streamed(body) => body.size_hint(),
            BlobBody::Inline(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn inline_bytes_come_once_then_the_end() {
        let mut body = BlobBody::inline(Bytes::from_static(b"abc"));
        assert_eq!(body.size_hint().exact(), Some(3));
        assert!(!body.is_end_stream());
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "abc");
        assert!(body.is_end_stream());
        assert!(body.frame().await.is_none());
        assert!(BlobBody::inline(Bytes::new()).is_end_stream());
    }
}
