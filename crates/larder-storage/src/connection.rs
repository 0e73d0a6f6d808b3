//! How the internal port speaks HTTP on one accepted connection: HTTP/2 (prior knowledge) with
//! the tuned settings, and HTTP/1.1 on the same port for the B4 comparison mode.

use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;

use crate::config::Http2Settings;

/// Longest wait for an HTTP/1.1 request's headers.
const HTTP1_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A builder for one connection. `trusted` is for a connection known to come from a peer
/// (mutual TLS, or a proven cluster secret): the frontend's pool cancels every hedged read that
/// lost its race with RST_STREAM, often before this node has accepted the stream, and h2's
/// defaults (meant to stop rapid-reset floods) would close such a connection with
/// ENHANCE_YOUR_CALM under ordinary heavy reads. Any other connection keeps h2's defaults.
///
/// HTTP/1.1 is accepted only so that the frontend's `pool.protocol = "http1-for-comparison"`
/// mode can measure what HTTP/2 buys.
pub fn connection_builder(s: &Http2Settings, trusted: bool) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HTTP1_HEADER_READ_TIMEOUT)
        .max_buf_size(s.max_header_list_size.as_u64().max(8192) as usize);
    let mut http2 = builder.http2();
    http2
        .timer(TokioTimer::new())
        .max_concurrent_streams(s.max_concurrent_streams)
        .initial_stream_window_size(s.stream_window.as_u64() as u32)
        .initial_connection_window_size(s.connection_window.as_u64() as u32)
        .max_frame_size(s.max_frame_size.as_u64() as u32)
        .max_send_buf_size(s.max_send_buffer.as_u64() as usize)
        .max_header_list_size(s.max_header_list_size.as_u64() as u32);
    if trusted {
        http2
            .max_pending_accept_reset_streams(s.trusted_max_pending_accept_reset_streams)
            .max_local_error_reset_streams(s.trusted_max_local_error_reset_streams);
    }
    builder
}

#[cfg(test)]
mod tests;
