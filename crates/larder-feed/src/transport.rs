//! A few HTTP/2 (prior knowledge) connections to one endpoint, each carrying many streams.
//! Requests go to the connection with the fewest in flight; a broken connection is replaced on
//! its next use.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
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

pub struct Transport {
    addr: SocketAddr,
    connections: Vec<Connection>,
    max_streams: u32,
}

impl Transport {
    /// Opens `connections` connections to `addr`; fails if the first cannot be opened.
    pub async fn connect(
        addr: SocketAddr,
        connections: usize,
        max_streams: u32,
    ) -> Result<Transport, String> {
        let transport = Transport {
            addr,
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
        let stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.addr))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(1 << 20)
            .initial_connection_window_size(16 << 20)
            .max_concurrent_reset_streams(self.max_streams as usize)
            .keep_alive_interval(Duration::from_secs(10))
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP/2 handshake with {} failed: {e}", self.addr))?;
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
        let response: Response<_> = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the answer failed: {e}"))?
            .to_bytes();
        Ok((status, body))
    }
}
