//! One client connection from accept to close: per-address limit, TLS handshake and ALPN,
//! protocol choice, idle timeout and graceful close.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use larder_pool::BatchedWrites;
use larder_tls::rustls::ServerConfig;
use larder_tls::{Reloading, ALPN_H1, ALPN_H2};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::activity::{Activity, Tracked};
use crate::body_budget::BodyBudget;
use crate::metrics::EdgeMetrics;
use crate::per_ip::PerIpLimit;
use crate::sniff::{sniff, Protocol};
use crate::state::AppState;
use crate::{api, expect, FrontendConfig, Limits};

/// Which listener a connection came from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Port {
    Cleartext,
    Tls,
    /// The S3 API's ports (`[s3] listen`, `[s3] tls_listen`): the same edge, the S3 handler.
    S3,
    S3Tls,
}

impl Port {
    fn transport(self) -> &'static str {
        match self {
            Port::Cleartext => "cleartext",
            Port::Tls => "tls",
            Port::S3 => "s3",
            Port::S3Tls => "s3_tls",
        }
    }
}

/// Everything connections share: the app, the protocol builders and the limits.
pub(crate) struct Edge {
    state: Arc<AppState>,
    /// One builder per protocol: the protocol is known before serving starts (ALPN, or the
    /// first bytes on the cleartext port and from TLS clients that negotiated none).
    h1: auto::Builder<TokioExecutor>,
    h2: auto::Builder<TokioExecutor>,
    tls: Option<Arc<Reloading<ServerConfig>>>,
    per_ip: Arc<PerIpLimit>,
    limits: Limits,
    s3: Option<Arc<larder_s3::S3Api>>,
}

impl Edge {
    pub(crate) fn new(
        state: Arc<AppState>,
        tls: Option<Arc<Reloading<ServerConfig>>>,
        s3: Option<Arc<larder_s3::S3Api>>,
    ) -> Edge {
        let both = builder(&state.config);
        Edge {
            h1: both.clone().http1_only(),
            h2: both.http2_only(),
            tls,
            per_ip: PerIpLimit::new(state.config.limits.max_connections_per_ip),
            limits: state.config.limits.clone(),
            state,
            s3,
        }
    }

    fn metrics(&self) -> &EdgeMetrics {
        &self.state.metrics.edge
    }

    /// Counts a connection the listener just accepted. Called in the accept loop, so the count
    /// follows the listener's order (a scrape that sees a later connection counted sees every
    /// earlier one too).
    pub(crate) fn accepted(&self, port: Port) {
        self.metrics().accepted(port.transport());
    }

    /// Serves one accepted connection until it ends, the server stops (`stop` changes or its
    /// sender is dropped), or it stays idle. Holding `stop` keeps the server's shutdown waiting.
    pub(crate) async fn run(
        self: Arc<Self>,
        stream: TcpStream,
        peer: SocketAddr,
        port: Port,
        stop: watch::Receiver<()>,
    ) {
        let Some(_permit) = self.per_ip.acquire(peer.ip()) else {
            self.metrics().refused("per_ip_limit");
            tracing::debug!(%peer, "too many connections from this address; closing");
            return;
        };
        let _ = stream.set_nodelay(true);
        let activity = Activity::new();
        let io = Tracked::new(stream, activity.clone());
        match (port, &self.tls) {
            (Port::Tls | Port::S3Tls, Some(tls)) => {
                // The config current now: a certificate reload affects the next handshake.
                // Boxed, like `drive` below: see `serve`.
                let handshake = Box::pin(tls.acceptor().accept(io));
                let tls =
                    match tokio::time::timeout(self.limits.header_read_timeout, handshake).await {
                        Ok(Ok(tls)) => tls,
                        // A TCP probe (a load balancer's health check) closes before saying
                        // anything: not a failure worth counting.
                        Ok(Err(err)) if err.kind() == std::io::ErrorKind::UnexpectedEof => {
                            return tracing::debug!(%peer, %err, "TLS handshake abandoned");
                        }
                        Ok(Err(err)) => {
                            self.metrics().tls_handshake_failed("error");
                            return tracing::debug!(%peer, %err, "TLS handshake failed");
                        }
                        Err(_) => {
                            self.metrics().tls_handshake_failed("timeout");
                            return tracing::debug!(%peer, "TLS handshake timed out");
                        }
                    };
                match tls.get_ref().1.alpn_protocol() {
                    Some(ALPN_H2) => self.serve(Protocol::H2, port, tls, activity, stop).await,
                    Some(ALPN_H1) => self.serve(Protocol::H1, port, tls, activity, stop).await,
                    _ => self.sniff_and_drive(port, tls, activity, stop).await,
                }
            }
            _ => self.sniff_and_drive(port, io, activity, stop).await,
        }
    }

    /// Learns the protocol from the first bytes, which must come within the header-read
    /// timeout (a client that connects and stays silent is a slowloris too).
    async fn sniff_and_drive<I>(
        &self,
        port: Port,
        io: I,
        activity: Activity,
        mut stop: watch::Receiver<()>,
    ) where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let first_bytes = tokio::time::timeout(self.limits.header_read_timeout, sniff(io));
        let sniffed = tokio::select! {
            sniffed = first_bytes => sniffed,
            _ = stop.changed() => return,
        };
        match sniffed {
            Ok(Ok(Some((protocol, io)))) => self.serve(protocol, port, io, activity, stop).await,
            // Closed (or broken) before saying anything.
            Ok(Ok(None)) | Ok(Err(_)) => {}
            Err(_) => {
                self.metrics().timed_out("header_read");
                tracing::debug!(?port, "no request bytes within the header-read timeout");
            }
        }
    }

    /// Serves the connection with hyper, whose connection state (buffers aside, several KiB)
    /// is boxed only now: the connection's task stays small while a client has not yet said
    /// anything, which is what most of a crowd of idle connections is doing (B6).
    async fn serve<I>(
        &self,
        protocol: Protocol,
        port: Port,
        io: I,
        activity: Activity,
        stop: watch::Receiver<()>,
    ) where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        Box::pin(self.drive(protocol, port, io, activity, stop)).await
    }

    async fn drive<I>(
        &self,
        protocol: Protocol,
        port: Port,
        io: I,
        activity: Activity,
        mut stop: watch::Receiver<()>,
    ) where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let _open = self.metrics().open(protocol.label(), port.transport());
        let builder = match protocol {
            Protocol::H1 => &self.h1,
            Protocol::H2 => &self.h2,
        };
        let state = self.state.clone();
        // Request bodies this connection buffers, summed over its streams (see `body_budget`).
        let limit = state.config.limits.buffered_bodies_per_connection;
        let budget = BodyBudget::new(limit, "connection");
        let s3 = match port {
            Port::S3 | Port::S3Tls => self.s3.clone(),
            Port::Cleartext | Port::Tls => None,
        };
        let service = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(budget.clone());
            let state = state.clone();
            let s3 = s3.clone();
            let withheld = expect::may_withhold_body(&req);
            async move {
                // The S3 handler's future is boxed: inline, it would make every stream's task
                // on the main port as large as S3's (4.7 KB, against 2.1 KB), and hyper moves
                // that task's whole future when it spawns it.
                let mut response = match s3 {
                    Some(s3) => Box::pin(s3.handle(req)).await,
                    None => api::handle(state, req).await,
                };
                expect::close_if_refused(withheld, &mut response);
                Ok::<_, Infallible>(response)
            }
        });
        // HTTP/2 answers of a turn of the connection's task go out in one write (`BatchedWrites`).
        let io = match protocol {
            Protocol::H1 => BatchedWrites::write_through(io),
            Protocol::H2 => BatchedWrites::new(io),
        };
        let connection = builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(connection);
        let mut closing = false;
        let stalled_send = self.limits.stalled_send_timeout;
        loop {
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(err) = result {
                        if is_header_timeout(&*err) {
                            self.metrics().timed_out("header_read");
                        }
                        tracing::debug!(%err, "client connection ended");
                    }
                    return;
                }
                // Server shutdown: GOAWAY (HTTP/2) or close after the current response (HTTP/1.1);
                // in-flight requests finish.
                _ = stop.changed(), if !closing => {
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
                // Idle: close gracefully; if still silent a period later (a client that holds
                // streams open and sends nothing), drop the connection and its streams. One
                // whose socket takes nothing the server has to write cannot close gracefully.
                _ = activity.idle_for(self.limits.idle_timeout) => {
                    if closing || activity.write_blocked_for().is_some() {
                        tracing::debug!("idle connection did not close; dropping it");
                        return;
                    }
                    self.metrics().timed_out("idle");
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
                // Reads are held up: a client that has taken nothing for stalled_send_timeout
                // pins what holds them up; its connection goes.
                _ = self.state.router.held_up(), if !stalled_send.is_zero() => {
                    if activity.write_blocked_for().is_some_and(|t| t >= stalled_send) {
                        self.metrics().timed_out("stalled_send");
                        tracing::debug!("a client that reads nothing while reads are held up; dropping its connection");
                        return;
                    }
                }
            }
        }
    }
}

/// hyper's HTTP/1.1 header-read timeout (a request head that did not arrive in time).
fn is_header_timeout(err: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    err.downcast_ref::<hyper::Error>()
        .is_some_and(hyper::Error::is_timeout)
}

/// The protocol settings of both public ports.
fn builder(config: &FrontendConfig) -> auto::Builder<TokioExecutor> {
    let limits = &config.limits;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_list_size.as_u64().max(8192) as usize);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(limits.max_header_list_size.as_u64() as u32)
        .max_pending_accept_reset_streams(limits.max_pending_accept_reset_streams)
        .max_local_error_reset_streams(limits.max_local_error_reset_streams)
        .max_frame_size(limits.max_frame_size.as_u64() as u32)
        .initial_stream_window_size(limits.stream_window.as_u64() as u32)
        .initial_connection_window_size(limits.connection_window.as_u64() as u32)
        .max_send_buf_size(limits.max_send_buffer.as_u64() as usize);
    builder
}
