//! A few HTTP/2 connections (TLS with ALPN h2, or prior knowledge) to one endpoint, each carrying
//! many streams.
//! Requests go to the connection with the fewest in flight; a broken connection is replaced on
//! its next use.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;

/// An answer: status and body.
pub type Answer = (http::StatusCode, Bytes);

struct Connection {
    sender: Mutex<Option<SendRequest<Full<Bytes>>>>,
    inflight: AtomicUsize,
}

/// Where the connections go.
pub struct Target {
    /// Tried in order.
    pub addrs: Vec<SocketAddr>,
    /// The name the server's certificate must carry (with TLS).
    pub host: String,
    /// TLS settings for an `https` endpoint; `None` for HTTP/2 with prior knowledge.
    pub tls: Option<Arc<larder_tls::rustls::ClientConfig>>,
}

pub struct Transport {
    target: Target,
    connections: Vec<Connection>,
    max_streams: u32,
}

impl Transport {
    /// Opens `connections` connections to `target`; fails if the first cannot be opened.
    pub async fn connect(
        target: Target,
        connections: usize,
        max_streams: u32,
    ) -> Result<Transport, String> {
        let transport = Transport {
            target,
            connections: (0..connections.max(1))
                .map(|_| Connection {
                    sender: Mutex::new(None),
                    inflight: AtomicUsize::new(0),
                })
                .collect(),
            max_streams,
        };
        for connection in &transport.connections {
            let sender = transport.open().await?;
            *connection.sender.lock() = Some(sender);
        }
        Ok(transport)
    }

    async fn open(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let addrs = &self.target.addrs[..];
        let stream = tokio::net::TcpStream::connect(addrs)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", list(addrs)))?;
        let addr = stream.peer_addr().map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        match &self.target.tls {
            None => self.handshake(stream).await,
            Some(tls) => {
                let stream = larder_tls::connect_h2(tls.clone(), &self.target.host, stream)
                    .await
                    .map_err(|e| format!("TLS with {} ({addr}) failed: {e}", self.target.host))?;
                self.handshake(stream).await
            }
        }
    }

    async fn handshake<S>(&self, stream: S) -> Result<SendRequest<Full<Bytes>>, String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(1 << 20)
            .initial_connection_window_size(16 << 20)
            .max_concurrent_reset_streams(self.max_streams as usize)
            .keep_alive_interval(Duration::from_secs(10))
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP/2 handshake with {} failed: {e}", self.target.host))?;
        tokio::spawn(connection);
        Ok(sender)
    }

    /// Sends one request on the least loaded connection and reads the whole answer.
    pub async fn send(&self, request: Request<Full<Bytes>>) -> Result<Answer, String> {
        let connection = self
            .connections
            .iter()
            .min_by_key(|c| c.inflight.load(Ordering::Relaxed))
            .expect("at least one connection");
        connection.inflight.fetch_add(1, Ordering::Relaxed);
        let result = self.send_on(connection, request).await;
        connection.inflight.fetch_sub(1, Ordering::Relaxed);
        result
    }

    async fn send_on(
        &self,
        connection: &Connection,
        request: Request<Full<Bytes>>,
    ) -> Result<Answer, String> {
        let response = self.response_on(connection, request).await?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the answer failed: {e}"))?
            .to_bytes();
        Ok((status, body))
    }

    /// Sends one request on the least loaded connection; the answer's body is left to the
    /// caller to read as it arrives (the connection counts as loaded until then).
    pub async fn send_streaming(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<Streaming<'_>, String> {
        let connection = self
            .connections
            .iter()
            .min_by_key(|c| c.inflight.load(Ordering::Relaxed))
            .expect("at least one connection");
        connection.inflight.fetch_add(1, Ordering::Relaxed);
        let response = self.response_on(connection, request).await;
        let inflight = Inflight(&connection.inflight);
        Ok(Streaming {
            response: response?,
            _inflight: inflight,
        })
    }

    async fn response_on(
        &self,
        connection: &Connection,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<hyper::body::Incoming>, String> {
        let current = connection
            .sender
            .lock()
            .as_ref()
            .filter(|s| !s.is_closed())
            .cloned();
        let mut sender = match current {
            Some(sender) => sender,
            None => {
                // Requests that find the connection broken at the same moment may each open one;
                // the last stays, the others close when their requests finish.
                let sender = self.open().await?;
                *connection.sender.lock() = Some(sender.clone());
                sender
            }
        };
        sender
            .send_request(request)
            .await
            .map_err(|e| format!("request failed: {}", larder_tls::error_chain(&e)))
    }
}

/// An answer whose body is still arriving, and the load it puts on its connection.
pub struct Streaming<'a> {
    pub response: Response<hyper::body::Incoming>,
    _inflight: Inflight<'a>,
}

/// One request in flight on a connection, until dropped.
struct Inflight<'a>(&'a AtomicUsize);

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `a`, or `a or b`: the addresses tried, as a user would write them.
fn list(addrs: &[std::net::SocketAddr]) -> String {
    let names: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    names.join(" or ")
}
