//! Requests to a storage node's internal port, as a peer sends them. Every test that talks to
//! the internal port directly opens its connections here: the one place that would present the
//! cluster's credentials.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;

/// One HTTP/2 connection to the internal port at `addr`, with windows like the frontend's pool,
/// after proving the cluster secret in `secret_file` (larder-auth's handshake).
pub async fn connect(secret_file: &Path, addr: SocketAddr) -> SendRequest<Body> {
    connect_with_window(secret_file, addr, 4 << 20).await
}

/// `connect`, with a stream window of `stream_window` bytes.
pub async fn connect_with_window(
    secret_file: &Path,
    addr: SocketAddr,
    stream_window: u32,
) -> SendRequest<Body> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let secrets = larder_auth::Secrets::load(secret_file).unwrap();
    larder_auth::connect(&mut stream, &secrets, larder_auth::HANDSHAKE_TIMEOUT)
        .await
        .unwrap();
    let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(stream_window)
        .initial_connection_window_size(16 << 20)
        .max_frame_size(1 << 20)
        .handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A request to `path` with `headers` and `body`, built for `connect`'s connections.
pub fn request(
    method: Method,
    path: &str,
    headers: &[(&str, String)],
    body: Body,
) -> Request<Body> {
    let mut request = Request::builder()
        .method(method)
        .uri(format!("http://storage{path}"));
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    request.body(body).unwrap()
}

/// Sends one request on a new connection and reads the whole answer.
pub async fn send(
    secret_file: &Path,
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, String)],
    body: Bytes,
) -> (StatusCode, HeaderMap, Bytes) {
    let mut sender = connect(secret_file, addr).await;
    let response = sender
        .send_request(request(method, path, headers, full(body)))
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, body)
}
