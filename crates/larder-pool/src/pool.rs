//! Per-node connection pools and round-robin dispatch.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper::client::conn::TrySendError;
use larder_auth::Credentials;
use larder_tls::rustls::ClientConfig;
use larder_tls::Reloading;
use tokio::sync::Mutex;

use crate::connection::connect;
use crate::http1::Http1Pool;
use crate::{Body, PoolConfig, PoolProtocol};

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("pool TLS configuration: {0}")]
    Tls(#[from] larder_tls::TlsError),
    #[error("unknown storage node {0:?}")]
    UnknownNode(String),
    #[error("cannot connect to {addr}: {detail}")]
    Connect { addr: SocketAddr, detail: String },
    #[error("not reconnecting to {addr} for another {retry_in:?} after failures")]
    Backoff {
        addr: SocketAddr,
        retry_in: Duration,
    },
    /// The connection the request used was closed under it (GOAWAY, reset, I/O error).
    #[error("connection to {addr} lost: {source}")]
    ConnectionLost {
        addr: SocketAddr,
        source: hyper::Error,
    },
    #[error("request to {addr} failed: {source}")]
    Request {
        addr: SocketAddr,
        source: hyper::Error,
    },
}

/// The pool's mutual-TLS config, shared by every node's pool so that one reload reaches all.
type ClientTls = Arc<Reloading<ClientConfig>>;

/// Pools for every storage node, by node id.
#[derive(Clone)]
pub struct StoragePool {
    /// Replaced whole when the cluster map changes (`set_nodes`); read once per request.
    nodes: Arc<std::sync::RwLock<Arc<NodePools>>>,
    cfg: Arc<PoolConfig>,
    tls: Option<ClientTls>,
    credentials: Option<Arc<Credentials>>,
}

type NodePools = HashMap<String, Arc<NodePool>>;

impl StoragePool {
    /// Fails only when `cfg.tls` names unreadable or mismatched certificate files.
    /// `credentials`: the cluster secret that cleartext connections prove (`larder-auth`'s
    /// handshake); unused with `cfg.tls` (mutual TLS authenticates), and absent only to reach
    /// nodes in insecure mode.
    pub fn new(
        nodes: impl IntoIterator<Item = (String, SocketAddr)>,
        cfg: PoolConfig,
        credentials: Option<Arc<Credentials>>,
    ) -> Result<StoragePool, PoolError> {
        let tls = match &cfg.tls {
            Some(files) => Some(Arc::new(larder_tls::mutual_client(files)?)),
            None => None,
        };
        let pool = StoragePool {
            nodes: Default::default(),
            cfg: Arc::new(cfg),
            tls,
            credentials,
        };
        pool.set_nodes(nodes);
        Ok(pool)
    }

    /// The largest frame a storage node sends on this pool's connections (`max_frame_size`).
    pub fn max_frame_size(&self) -> u64 {
        self.cfg.max_frame_size.as_u64()
    }

    /// Makes `nodes` the nodes this pool reaches (a new cluster map): a node already known at
    /// the same address keeps its connections; a new node or a new address gets a new pool;
    /// nodes not listed are forgotten (their connections close once idle).
    pub fn set_nodes(&self, nodes: impl IntoIterator<Item = (String, SocketAddr)>) {
        let old = self.current();
        let next: NodePools = nodes
            .into_iter()
            .map(|(id, addr)| {
                let pool = match old.get(&id) {
                    Some(pool) if pool.addr == addr => pool.clone(),
                    _ => Arc::new(NodePool::new(
                        addr,
                        self.cfg.clone(),
                        self.tls.clone(),
                        self.credentials.clone(),
                    )),
                };
                (id, pool)
            })
            .collect();
        *self.nodes.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
    }

    fn current(&self) -> Arc<NodePools> {
        self.nodes.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Re-reads the cluster secret file; `None` without one. Connections opened from now on
    /// prove the new first secret; open ones stay authenticated. On error the old secrets stay.
    pub fn reload_secret(&self) -> Option<Result<(), larder_auth::AuthError>> {
        self.credentials.as_ref().map(|c| c.reload())
    }

    /// Re-reads `[pool.tls]` (certificate, key and CA); `None` without TLS. Connections opened
    /// from now on present the new certificate; open ones keep the one they were opened with
    /// until they close. On error the old files stay in use.
    pub fn reload_tls(&self) -> Option<Result<(), larder_tls::TlsError>> {
        self.tls.as_ref().map(|tls| tls.reload())
    }

    pub fn node(&self, id: &str) -> Option<Arc<NodePool>> {
        self.current().get(id).cloned()
    }

    /// Sends `req` (whose URI is a path and query) to `node` on the next connection in turn.
    pub async fn send(
        &self,
        node: &str,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, PoolError> {
        let pool = self
            .node(node)
            .ok_or_else(|| PoolError::UnknownNode(node.to_owned()))?;
        pool.send(req).await
    }

    /// Open connections per node (for metrics and `/v1/cluster`).
    pub async fn open_connections(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for (id, pool) in self.current().iter() {
            out.insert(id.clone(), pool.open_connections().await);
        }
        out
    }
}

/// N connections to one storage node.
pub struct NodePool {
    addr: SocketAddr,
    cfg: Arc<PoolConfig>,
    tls: Option<ClientTls>,
    credentials: Option<Arc<Credentials>>,
    slots: Vec<Mutex<Slot>>,
    next: AtomicUsize,
    scheme: Scheme,
    authority: Authority,
    /// Set in `http1-for-comparison` mode, which then carries every request.
    http1: Option<Http1Pool>,
}

#[derive(Default)]
struct Slot {
    sender: Option<SendRequest<Body>>,
    /// Consecutive failed connection attempts; drives the backoff.
    failures: u32,
    retry_at: Option<Instant>,
}

impl NodePool {
    fn new(
        addr: SocketAddr,
        cfg: Arc<PoolConfig>,
        tls: Option<ClientTls>,
        credentials: Option<Arc<Credentials>>,
    ) -> NodePool {
        let slots = (0..cfg.connections_per_node)
            .map(|_| Mutex::new(Slot::default()))
            .collect();
        let http1 = (cfg.protocol == PoolProtocol::Http1ForComparison)
            .then(|| Http1Pool::new(addr, cfg.clone(), credentials.clone()));
        let scheme = if tls.is_some() {
            Scheme::HTTPS
        } else {
            Scheme::HTTP
        };
        let authority =
            Authority::try_from(addr.to_string()).expect("a socket address is a valid authority");
        NodePool {
            addr,
            cfg,
            scheme,
            authority,
            tls,
            credentials,
            slots,
            next: AtomicUsize::new(0),
            http1,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub async fn send(&self, mut req: Request<Body>) -> Result<Response<Incoming>, PoolError> {
        if let Some(http1) = &self.http1 {
            // Boxed, like `connect` below: an async fn is as large as its largest state, and
            // this future is moved into a box for every replica of every request.
            return Box::pin(http1.send(req)).await;
        }
        *req.uri_mut() = self.absolute(std::mem::take(req.uri_mut()));
        let index = self.next_index();
        let mut sender = self.sender(index).await?;
        if self.slots.len() == 1 {
            return match sender.send_request(req).await {
                Ok(response) => Ok(response),
                Err(source) => Err(Box::pin(self.request_error(index, &sender, source)).await),
            };
        }
        match sender.try_send_request(req).await {
            Ok(response) => Ok(response),
            // The rare path is boxed: inline, its states (the request handed back, the
            // error, the retries' futures) made this future 1,848 bytes, copied at every
            // await that holds it, for every replica of every request.
            Err(failed) => Box::pin(self.send_again(index, sender, failed)).await,
        }
    }

    /// After the first connection tried failed `failed`: a request that never left this
    /// process (its connection had just closed: a GOAWAY, a reset) is handed back by hyper and
    /// goes out on the next connection in turn, so one lost connection costs no request; one
    /// that may have left is answered with the error. Every connection is tried at most once.
    async fn send_again(
        &self,
        mut index: usize,
        mut sender: SendRequest<Body>,
        mut failed: TrySendError<Request<Body>>,
    ) -> Result<Response<Incoming>, PoolError> {
        for _ in 2..self.slots.len() {
            let Some(unsent) = failed.take_message() else {
                return Err(self
                    .request_error(index, &sender, failed.into_error())
                    .await);
            };
            self.forget_if_closed(index, &sender).await;
            index = self.next_index();
            sender = self.sender(index).await?;
            match sender.try_send_request(unsent).await {
                Ok(response) => return Ok(response),
                Err(again) => failed = again,
            }
        }
        let Some(unsent) = failed.take_message() else {
            return Err(self
                .request_error(index, &sender, failed.into_error())
                .await);
        };
        self.forget_if_closed(index, &sender).await;
        let index = self.next_index();
        let mut sender = self.sender(index).await?;
        match sender.send_request(unsent).await {
            Ok(response) => Ok(response),
            Err(source) => Err(self.request_error(index, &sender, source).await),
        }
    }

    /// The connection the next request goes out on (round-robin).
    fn next_index(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len()
    }

    /// Classifies a failed request: when its connection is gone (closed by the peer, GOAWAY,
    /// I/O error) the slot reconnects on next use and the error says the connection was lost,
    /// which is not by itself a verdict on the node (its other connections may be fine).
    async fn request_error(
        &self,
        index: usize,
        sender: &SendRequest<Body>,
        source: hyper::Error,
    ) -> PoolError {
        let lost = sender.is_closed() || connection_level(&source);
        self.forget_if_closed(index, sender).await;
        let addr = self.addr;
        if lost {
            PoolError::ConnectionLost { addr, source }
        } else {
            PoolError::Request { addr, source }
        }
    }

    async fn forget_if_closed(&self, index: usize, sender: &SendRequest<Body>) {
        if sender.is_closed() {
            let mut slot = self.slots[index].lock().await;
            // Only if the slot still holds this connection: another request may have reconnected.
            if slot.sender.as_ref().is_some_and(|s| s.is_closed()) {
                slot.sender = None;
            }
        }
    }

    /// `uri` (a path and query) made absolute with this node's scheme and address. The parts
    /// are made once per node and shared: no formatting or parsing per request.
    fn absolute(&self, uri: Uri) -> Uri {
        let mut parts = uri.into_parts();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        if parts.path_and_query.is_none() {
            parts.path_and_query = Some(PathAndQuery::from_static("/"));
        }
        Uri::from_parts(parts).expect("a scheme, an authority and a path make a valid URI")
    }

    /// A ready sender for slot `index`, connecting if it has none. The slot's lock is held while
    /// connecting so that a burst of requests opens one connection, not one each.
    async fn sender(&self, index: usize) -> Result<SendRequest<Body>, PoolError> {
        let mut slot = self.slots[index].lock().await;
        if let Some(sender) = &slot.sender {
            if !sender.is_closed() {
                return Ok(sender.clone());
            }
        }
        slot.sender = None;
        if let Some(retry_at) = slot.retry_at {
            let now = Instant::now();
            if now < retry_at {
                return Err(PoolError::Backoff {
                    addr: self.addr,
                    retry_in: retry_at - now,
                });
            }
        }
        let connector = self.tls.as_ref().map(|tls| tls.connector());
        let secrets = self.credentials.as_ref().map(|c| c.current());
        // Boxed: connecting (TCP, TLS, HTTP/2 handshakes) is rare, and inline its state would
        // make every request's future several kilobytes, copied when each is boxed.
        let connecting = Box::pin(connect(
            self.addr,
            &self.cfg,
            connector.as_ref(),
            secrets.as_deref(),
        ));
        match connecting.await {
            Ok(sender) => {
                slot.failures = 0;
                slot.retry_at = None;
                slot.sender = Some(sender.clone());
                Ok(sender)
            }
            Err(err) => {
                // Refused: the host answered at once (nothing listens yet: a node restarting),
                // so trying again costs a round trip and the node is often back in moments;
                // keep the shortest backoff. Timeouts and failed handshakes cost far more per
                // try: back off, doubling.
                slot.failures = if err.kind() == std::io::ErrorKind::ConnectionRefused {
                    1
                } else {
                    slot.failures.saturating_add(1)
                };
                slot.retry_at = Some(Instant::now() + self.backoff(slot.failures));
                Err(PoolError::Connect {
                    addr: self.addr,
                    detail: err.to_string(),
                })
            }
        }
    }

    fn backoff(&self, failures: u32) -> Duration {
        let doubled = self
            .cfg
            .reconnect_backoff_min
            .saturating_mul(1 << failures.min(16).saturating_sub(1));
        doubled.min(self.cfg.reconnect_backoff_max)
    }

    pub async fn open_connections(&self) -> usize {
        if let Some(http1) = &self.http1 {
            return http1.open_connections();
        }
        let mut open = 0;
        for slot in &self.slots {
            if slot
                .lock()
                .await
                .sender
                .as_ref()
                .is_some_and(|s| !s.is_closed())
            {
                open += 1;
            }
        }
        open
    }
}

impl PoolError {
    /// True when the node could not be reached at all.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, PoolError::Connect { .. } | PoolError::Backoff { .. })
    }

    /// Whether this error counts against the node's health. A connection lost under a request
    /// does not: the node may have closed that one connection on purpose (GOAWAY), and if the
    /// node is really gone the reconnect that follows fails and counts.
    pub fn counts_against_node(&self) -> bool {
        !matches!(self, PoolError::ConnectionLost { .. })
    }
}

/// An error of the whole connection rather than of this one stream: a GOAWAY, or the
/// connection's I/O failing.
fn connection_level(error: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(err) = source {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.is_go_away()
                || h2.is_io()
                || h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        if err.is::<std::io::Error>() {
            return true;
        }
        source = err.source();
    }
    false
}
