//! `pool.protocol = "http1-for-comparison"`: N HTTP/1.1 connections per storage node, each
//! carrying one request at a time, as Ambry's stack did before HTTP/2. It exists only so the
//! benchmarks can measure what multiplexing buys; a request waits while all N are busy.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{header, HeaderValue, Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::sync::Semaphore;

use larder_auth::Credentials;

use crate::connection::{authenticate, tcp_connect};
use crate::{Body, PoolConfig, PoolError};

pub(crate) struct Http1Pool {
    addr: SocketAddr,
    cfg: Arc<PoolConfig>,
    /// The cluster secret each new connection proves (absent: a node in insecure mode).
    credentials: Option<Arc<Credentials>>,
    /// One permit per connection: held from sending a request until its response is consumed.
    permits: Arc<Semaphore>,
    idle: Arc<std::sync::Mutex<Vec<SendRequest<Body>>>>,
}

impl Http1Pool {
    pub(crate) fn new(
        addr: SocketAddr,
        cfg: Arc<PoolConfig>,
        credentials: Option<Arc<Credentials>>,
    ) -> Http1Pool {
        Http1Pool {
            addr,
            credentials,
            permits: Arc::new(Semaphore::new(cfg.http1_connections_per_node)),
            cfg,
            idle: Arc::default(),
        }
    }

    pub(crate) async fn send(
        &self,
        mut req: Request<Body>,
    ) -> Result<Response<Incoming>, PoolError> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        // HTTP/1.1 wants origin-form and a Host header.
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        *req.uri_mut() = path.parse::<Uri>().expect("a path is a valid URI");
        let host = HeaderValue::from_str(&self.addr.to_string()).expect("an address is a header");
        req.headers_mut().insert(header::HOST, host);
        let mut sender = match self.take_idle() {
            Some(sender) => sender,
            None => self.connect().await?,
        };
        let response = sender
            .send_request(req)
            .await
            .map_err(|source| PoolError::Request {
                addr: self.addr,
                source,
            })?;
        // The connection is busy until the caller has read the whole response body; then it
        // goes back to the idle list (or is dropped, if the body was abandoned) and the permit
        // is released.
        let idle = self.idle.clone();
        tokio::spawn(async move {
            if sender.ready().await.is_ok() {
                idle.lock().expect("not poisoned").push(sender);
            }
            drop(permit);
        });
        Ok(response)
    }

    fn take_idle(&self) -> Option<SendRequest<Body>> {
        let mut idle = self.idle.lock().expect("not poisoned");
        while let Some(sender) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    async fn connect(&self) -> Result<SendRequest<Body>, PoolError> {
        let connect_error = |err: io::Error| PoolError::Connect {
            addr: self.addr,
            detail: err.to_string(),
        };
        let mut stream = tcp_connect(self.addr, &self.cfg)
            .await
            .map_err(connect_error)?;
        let secrets = self.credentials.as_ref().map(|c| c.current());
        authenticate(&mut stream, self.addr, &self.cfg, secrets.as_deref())
            .await
            .map_err(connect_error)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| connect_error(io::Error::other(e)))?;
        let addr = self.addr;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(%addr, %err, "storage HTTP/1.1 connection ended");
            }
        });
        Ok(sender)
    }

    /// Connections open now: idle ones plus those carrying a request.
    pub(crate) fn open_connections(&self) -> usize {
        let busy = self.cfg.http1_connections_per_node - self.permits.available_permits();
        busy + self.idle.lock().expect("not poisoned").len()
    }
}
