//! Streaming clients for large-blob tests: uploads generated on the fly (no file, no buffer of
//! the whole blob), with or without Content-Length, over HTTP/1.1 or HTTP/2; downloads hashed as
//! they arrive. Also the memory readings of a process from /proc.
#![allow(dead_code)]

use std::net::SocketAddr;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::{Digest, Sha256};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;

/// Deterministic pseudo-random content: piece `i` of a blob is a function of (seed, i), so a
/// test can regenerate any part of it without keeping it.
pub struct Pattern {
    pub seed: u64,
    pub size: u64,
}

pub const PIECE: usize = 256 * 1024;

impl Pattern {
    pub fn piece(&self, index: u64) -> Bytes {
        let start = index * PIECE as u64;
        let len = (self.size - start).min(PIECE as u64) as usize;
        let mut state = self.seed ^ (index.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            // xorshift64*: fast, and different for every piece.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        out.truncate(len);
        out.into()
    }

    pub fn pieces(&self) -> u64 {
        self.size.div_ceil(PIECE as u64)
    }

    /// The bytes `range` of the blob (for small ranges: builds them in memory).
    pub fn bytes(&self, range: std::ops::Range<u64>) -> Vec<u8> {
        let mut out = Vec::new();
        let first = range.start / PIECE as u64;
        let last = (range.end.max(1) - 1) / PIECE as u64;
        for i in first..=last.min(self.pieces().saturating_sub(1)) {
            let piece = self.piece(i);
            let base = i * PIECE as u64;
            let a = range.start.max(base) - base;
            let b = range.end.min(base + piece.len() as u64) - base;
            if a < b {
                out.extend_from_slice(&piece[a as usize..b as usize]);
            }
        }
        out
    }

    pub fn sha256(&self) -> String {
        let mut hasher = Sha256::new();
        for i in 0..self.pieces() {
            hasher.update(self.piece(i));
        }
        hex(&hasher.finalize())
    }

    /// The blob as a streaming request body with no size hint (so: chunked HTTP/1.1, or HTTP/2
    /// DATA frames without Content-Length).
    pub fn body(&self) -> Body {
        let pattern = Pattern {
            seed: self.seed,
            size: self.size,
        };
        let stream = futures_util::stream::iter(0..pattern.pieces())
            .map(move |i| Ok::<_, BoxError>(Frame::data(pattern.piece(i))));
        BodyExt::boxed(StreamBody::new(stream))
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// One client connection, HTTP/1.1 or HTTP/2 prior knowledge.
pub enum Conn {
    H1(hyper::client::conn::http1::SendRequest<Body>),
    H2(hyper::client::conn::http2::SendRequest<Body>),
}

impl Conn {
    pub async fn connect(addr: SocketAddr, http2: bool) -> Conn {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let io = TokioIo::new(stream);
        if http2 {
            let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .initial_stream_window_size(4 << 20)
                .initial_connection_window_size(8 << 20)
                .max_frame_size(1 << 20)
                .handshake(io)
                .await
                .unwrap();
            tokio::spawn(conn);
            Conn::H2(sender)
        } else {
            let (sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            Conn::H1(sender)
        }
    }

    pub async fn send(
        &mut self,
        request: Request<Body>,
    ) -> hyper::Result<http::Response<Incoming>> {
        match self {
            Conn::H1(s) => {
                s.ready().await?;
                s.send_request(request).await
            }
            Conn::H2(s) => s.send_request(request).await,
        }
    }
}

/// Uploads `body` to `/v1/blobs`; returns the status and the JSON answer.
pub async fn upload(
    addr: SocketAddr,
    http2: bool,
    body: Body,
    content_length: Option<u64>,
) -> (StatusCode, serde_json::Value) {
    let mut conn = Conn::connect(addr, http2).await;
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{addr}/v1/blobs"));
    if let Some(length) = content_length {
        request = request.header(http::header::CONTENT_LENGTH, length);
    }
    let response = conn.send(request.body(body).unwrap()).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, json)
}

/// What a streamed download saw: status, headers, byte count and SHA-256 of the body.
pub struct Downloaded {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub len: u64,
    pub sha256: String,
}

pub async fn download(
    addr: SocketAddr,
    http2: bool,
    path: &str,
    range: Option<&str>,
) -> Downloaded {
    let mut conn = Conn::connect(addr, http2).await;
    let mut request = Request::builder().uri(format!("http://{addr}{path}"));
    if let Some(range) = range {
        request = request.header(http::header::RANGE, range);
    }
    let response = conn.send(request.body(empty()).unwrap()).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let mut body = response.into_body();
    let (mut hasher, mut len) = (Sha256::new(), 0u64);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            len += data.len() as u64;
            hasher.update(&data);
        }
    }
    Downloaded {
        status,
        headers,
        len,
        sha256: hex(&hasher.finalize()),
    }
}

/// A field of /proc/<pid>/status in bytes (`VmHWM` = peak RSS, `VmRSS` = current RSS).
pub fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Resets a process's peak RSS (VmHWM) to its current RSS (Linux: write 5 to clear_refs).
pub fn reset_peak_rss(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
}
