//! The response body type: boxed so that a relayed storage stream and a small JSON document fit.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};

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

/// Reads and drops what is left of a request body nobody will read, up to `budget` bytes and 10 s,
/// in the background. Answering before the body is read and then resetting the stream makes
/// many HTTP/2 clients (curl among them) report a transport error instead of the answer; draining
/// lets them read it. Past the budget the stream is reset after all.
pub fn drain_in_background(mut body: hyper::body::Incoming, budget: u64) {
    use http_body::Body as _;
    if body.is_end_stream() {
        return;
    }
    tokio::spawn(async move {
        let drain = async {
            let mut seen = 0u64;
            while let Some(Ok(frame)) = body.frame().await {
                seen += frame.data_ref().map_or(0, |d| d.len() as u64);
                if seen > budget {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), drain).await;
    });
}
