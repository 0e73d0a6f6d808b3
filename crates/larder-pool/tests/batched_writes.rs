//! `BatchedWrites`: the answers an HTTP/2 connection's task produces in one turn leave in one
//! write, not one each; nothing waits forever in its buffer; HTTP/1.1 is written through.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use larder_pool::{empty, BatchedWrites, PoolConfig, StoragePool};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// A socket that counts the writes that reach it (each one a system call).
struct Counted {
    inner: TcpStream,
    writes: Arc<AtomicUsize>,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if result.is_ready() {
            self.writes.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if result.is_ready() {
            self.writes.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A server answering every request with 1 KiB (or, for `/big`, 1 MiB), HTTP/1.1 or HTTP/2, as
/// a storage node serves: `BatchedWrites::after_h2_preface`. Returns its address and the count
/// of writes to its sockets.
async fn server() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let writes = Arc::new(AtomicUsize::new(0));
    let counter = writes.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            stream.set_nodelay(true).unwrap();
            let io = Counted {
                inner: stream,
                writes: counter.clone(),
            };
            let service = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                let size = if req.uri().path() == "/big" {
                    1 << 20
                } else {
                    1024
                };
                Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(Bytes::from(
                    vec![7u8; size],
                ))))
            });
            tokio::spawn(async move {
                let io = TokioIo::new(BatchedWrites::after_h2_preface(io));
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    (addr, writes)
}

async fn get(pool: &StoragePool, path: &str) -> usize {
    let request = http::Request::get(path).body(empty()).unwrap();
    let response = pool.send("s1", request).await.unwrap();
    assert_eq!(response.status(), 200);
    response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_of_one_turn_leave_in_one_write() {
    let (addr, writes) = server().await;
    let config = PoolConfig {
        connections_per_node: 1,
        ..PoolConfig::default()
    };
    let pool = StoragePool::new([("s1".to_owned(), addr)], config, None).unwrap();
    assert_eq!(get(&pool, "/").await, 1024); // connected
    let before = writes.load(Ordering::Relaxed);
    const REQUESTS: usize = 1000;
    let all = async {
        let mut tasks = Vec::new();
        for _ in 0..REQUESTS {
            let pool = pool.clone();
            tasks.push(tokio::spawn(async move { get(&pool, "/").await }));
        }
        for task in tasks {
            assert_eq!(task.await.unwrap(), 1024);
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all)
        .await
        .expect("every answer arrives: nothing waits in a buffer");
    let used = writes.load(Ordering::Relaxed) - before;
    // Written one by one, each answer is a write of its own (at least REQUESTS).
    assert!(
        used * 4 < REQUESTS,
        "{used} writes for {REQUESTS} answers of 1 KiB"
    );
    // Large bodies are written through, and arrive whole.
    let big = async { get(&pool, "/big").await };
    let got = tokio::time::timeout(Duration::from_secs(30), big).await;
    assert_eq!(got.expect("a 1 MiB answer arrives"), 1 << 20);
}

#[tokio::test]
async fn http1_is_written_through() {
    let (addr, _) = server().await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let exchange = async {
        for path in ["/", "/big", "/"] {
            let request = http::Request::get(path)
                .header("host", "test")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let response = sender.send_request(request).await.unwrap();
            assert_eq!(response.status(), 200);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body.len(), if path == "/big" { 1 << 20 } else { 1024 });
        }
    };
    tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .expect("HTTP/1.1 answers arrive");
}
