//! HTTP/2 (prior knowledge) connections to a frontend's public port and, with the cluster secret,
//! to a storage node's internal port. One request at a time per caller, each under a deadline;
//! a broken connection is dropped and dialled again on the next request.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

/// Why there is no answer: the outcome of the operation is unknown, unless `sent` is false
/// (the connection could not be opened, so the request never left).
#[derive(Debug)]
pub struct NoAnswer {
    pub why: String,
    pub sent: bool,
}

impl NoAnswer {
    fn sent(why: String) -> NoAnswer {
        NoAnswer { why, sent: true }
    }
}

pub struct Connection {
    addr: SocketAddr,
    secret_file: Option<PathBuf>,
    sender: Option<SendRequest<Full<Bytes>>>,
    timeout: Duration,
    down: bool,
}

impl Connection {
    /// The last attempt could not connect.
    pub fn is_down(&self) -> bool {
        self.down
    }

    /// To a frontend's cleartext port.
    pub fn public(addr: SocketAddr, timeout: Duration) -> Connection {
        Connection {
            addr,
            secret_file: None,
            sender: None,
            timeout,
            down: false,
        }
    }

    /// To a storage node's internal port, proving the cluster secret first.
    pub fn internal(addr: SocketAddr, secret_file: PathBuf, timeout: Duration) -> Connection {
        Connection {
            addr,
            secret_file: Some(secret_file),
            sender: None,
            timeout,
            down: false,
        }
    }

    async fn dial(&self) -> Result<SendRequest<Full<Bytes>>, NoAnswer> {
        let err = |what: &str, e: &dyn std::fmt::Display| NoAnswer::sent(format!("{what}: {e}"));
        let mut stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| NoAnswer {
                why: format!("connect: {e}"),
                sent: false,
            })?;
        let _ = stream.set_nodelay(true);
        if let Some(file) = &self.secret_file {
            let secrets = larder_auth::Secrets::load(file).map_err(|e| err("secret", &e))?;
            larder_auth::connect(&mut stream, &secrets, larder_auth::HANDSHAKE_TIMEOUT)
                .await
                .map_err(|e| err("handshake", &e))?;
        }
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(4 << 20)
            .initial_connection_window_size(16 << 20)
            .max_frame_size(1 << 20)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| err("h2 handshake", &e))?;
        tokio::spawn(connection);
        Ok(sender)
    }

    /// One request and its whole answer, or why there is none (within the deadline).
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Answer, NoAnswer> {
        let deadline = self.timeout;
        let result = tokio::time::timeout(deadline, self.send_now(method, path, headers, body))
            .await
            .unwrap_or_else(|_| Err(NoAnswer::sent(format!("no answer within {deadline:?}"))));
        if result.is_err() {
            self.sender = None;
        }
        self.down = matches!(result, Err(NoAnswer { sent: false, .. }));
        result
    }

    async fn send_now(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Answer, NoAnswer> {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            self.sender = Some(self.dial().await?);
        }
        let sender = self.sender.as_mut().expect("dialled above");
        sender
            .ready()
            .await
            .map_err(|e| NoAnswer::sent(format!("connection: {e}")))?;
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| NoAnswer::sent(format!("request: {e}")))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| NoAnswer::sent(format!("request: {e}")))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| NoAnswer::sent(format!("body after {status}: {e}")))?
            .to_bytes();
        Ok(Answer { status, body })
    }
}
