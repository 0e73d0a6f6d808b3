//! The response body type (boxed so that a relayed storage stream and a small JSON document
//! fit), and reading request bodies with a stall timeout.

use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};
use hyper::body::Incoming;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// Why a request body could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read request body: {0}")]
    Transport(#[from] hyper::Error),
    /// The client sent nothing for the whole body-read timeout. On HTTP/2 the connection's idle
    /// timeout cannot catch this while other streams are busy, and the stalled stream holds a
    /// chunk buffer, so each body gets its own clock.
    #[error("request body stalled: nothing received for {0:?} (limits.body_read_timeout)")]
    Stalled(Duration),
}

/// The next frame of a request body, `None` at its end; an error if the client sent nothing
/// for `timeout`.
pub async fn next_frame(
    body: &mut Incoming,
    timeout: Duration,
) -> Option<Result<Frame<Bytes>, ReadError>> {
    match tokio::time::timeout(timeout, body.frame()).await {
        Ok(frame) => frame.map(|f| f.map_err(ReadError::from)),
        Err(_) => Some(Err(ReadError::Stalled(timeout))),
    }
}

/// Reads and drops a request body nobody needs, up to `budget` bytes, before the request is
/// answered. Answering first would close our side of the stream while the client still sends:
/// HTTP/2 then ignores the client's later frames on it (flow-control errors included, which
/// h2spec 6.9.1 checks) and hyper resets the stream, which many clients report as a failure.
/// Past the budget, or on a stall, the answer goes out and the rest is reset.
pub async fn drain(body: &mut Incoming, budget: u64, timeout: Duration) {
    use http_body::Body as _;
    let mut seen = 0u64;
    while !body.is_end_stream() {
        match next_frame(body, timeout).await {
            Some(Ok(frame)) => seen += frame.data_ref().map_or(0, |d| d.len() as u64),
            _ => return,
        }
        if seen > budget {
            return;
        }
    }
}

/// Like `drain`, in the background, for requests refused before their body was read (413 for a
/// declared length over the limit): the answer goes out at once and the client, still sending,
/// reads it instead of a reset stream.
pub fn drain_in_background(mut body: Incoming, budget: u64, timeout: Duration) {
    use http_body::Body as _;
    if body.is_end_stream() {
        return;
    }
    tokio::spawn(async move { drain(&mut body, budget, timeout).await });
}
