//! A bare hyper server for the benchmarks' floor (`benchmarks/cpu-per-request`): what one HTTP
//! exchange costs on this machine with nothing of Larder's in it. HTTP/1.1 and h2c (prior
//! knowledge) on one port, a multi-threaded tokio runtime and mimalloc, as Larder's frontend.
//!
//! `GET /<n>` answers `n` bytes (at most 64 MiB) from one buffer made at start; any request with
//! a body (`POST`, `PUT`) is read to its end, dropped, and answered `201` with a short JSON body,
//! as an upload to Larder is.
//!
//! Usage: `cargo run --release -p larder --example hello_h2 -- 127.0.0.1:PORT`

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MAX_ANSWER: usize = 64 << 20;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8090".into())
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bytes = Bytes::from(vec![b'x'; MAX_ANSWER]);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let bytes = bytes.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| answer(request, bytes.clone()));
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder.http2().max_concurrent_streams(1024);
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(
    request: Request<Incoming>,
    bytes: Bytes,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.method() == Method::GET {
        let n = request
            .uri()
            .path()
            .trim_start_matches('/')
            .parse::<usize>()
            .unwrap_or(0);
        return Ok(Response::new(Full::new(bytes.slice(..n.min(MAX_ANSWER)))));
    }
    let mut body = request.into_body();
    let mut received = 0usize;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => received += frame.data_ref().map_or(0, |d| d.len()),
            Err(_) => break,
        }
    }
    let mut response = Response::new(Full::new(Bytes::from(format!(
        "{{\"received\":{received}}}"
    ))));
    *response.status_mut() = StatusCode::CREATED;
    Ok(response)
}
