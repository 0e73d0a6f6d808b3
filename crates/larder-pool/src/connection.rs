//! Opening one tuned HTTP/2 connection to a storage node.

use std::io;
use std::net::SocketAddr;

use hyper::client::conn::http2::{Builder, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use larder_auth::Secrets;
use larder_tls::rustls::pki_types::ServerName;
use larder_tls::TlsConnector;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpSocket, TcpStream};

use crate::{BatchedWrites, Body, PoolConfig};

/// Connects (TLS when `tls` is set; else the secret handshake when `secrets` is set), applies
/// the socket and HTTP/2 settings and spawns the connection's driver task. The returned sender
/// multiplexes any number of concurrent requests (up to the peer's limit).
pub(crate) async fn connect(
    addr: SocketAddr,
    cfg: &PoolConfig,
    tls: Option<&TlsConnector>,
    secrets: Option<&Secrets>,
) -> io::Result<SendRequest<Body>> {
    let mut stream = tcp_connect(addr, cfg).await?;
    match tls {
        None => {
            authenticate(&mut stream, addr, cfg, secrets).await?;
            handshake(stream, addr, cfg).await
        }
        Some(connector) => {
            // Storage nodes are addressed by IP in the cluster map, so their certificates name
            // that IP address. Mutual TLS authenticates both sides: no secret handshake.
            let name = ServerName::IpAddress(addr.ip().into());
            let stream = tokio::time::timeout(cfg.connect_timeout, connector.connect(name, stream))
                .await
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("TLS handshake with {addr} timed out"),
                    )
                })??;
            handshake(stream, addr, cfg).await
        }
    }
}

/// Over cleartext: proves this side holds the cluster secret and checks that the node does
/// (`larder-auth`), before the first HTTP byte. Without a secret (a node in insecure mode)
/// nothing is exchanged.
pub(crate) async fn authenticate(
    stream: &mut TcpStream,
    addr: SocketAddr,
    cfg: &PoolConfig,
    secrets: Option<&Secrets>,
) -> io::Result<()> {
    let Some(secrets) = secrets else {
        return Ok(());
    };
    larder_auth::connect(stream, secrets, cfg.connect_timeout)
        .await
        .map_err(|err| io::Error::other(format!("authenticating to {addr}: {err}")))
}

/// A TCP connection with the pool's socket settings, within `connect_timeout`.
pub(crate) async fn tcp_connect(addr: SocketAddr, cfg: &PoolConfig) -> io::Result<TcpStream> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(size) = cfg.tcp_send_buffer {
        socket.set_send_buffer_size(size.as_u64() as u32)?;
    }
    if let Some(size) = cfg.tcp_recv_buffer {
        socket.set_recv_buffer_size(size.as_u64() as u32)?;
    }
    let stream = tokio::time::timeout(cfg.connect_timeout, socket.connect(addr))
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connect to {addr} timed out"),
            )
        })??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Reset streams remembered per connection (for h2's 30 s), so late frames for them are
/// dropped quietly: about 1,000 cancels in flight at once, some hundred KiB at most.
const REMEMBERED_RESET_STREAMS: usize = 1024;

async fn handshake<T>(
    stream: T,
    addr: SocketAddr,
    cfg: &PoolConfig,
) -> io::Result<SendRequest<Body>>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .initial_stream_window_size(cfg.stream_window.as_u64() as u32)
        .initial_connection_window_size(cfg.connection_window.as_u64() as u32)
        .max_frame_size(cfg.max_frame_size.as_u64() as u32)
        .max_send_buf_size(cfg.max_send_buffer.as_u64() as usize)
        .max_header_list_size(64 * 1024)
        .keep_alive_interval(cfg.keepalive_interval)
        .keep_alive_timeout(cfg.keepalive_timeout)
        .keep_alive_while_idle(true)
        // Cancelled requests (hedge losers, clients gone) reset their streams while the node's
        // frames for them are in flight. h2 remembers only 10 reset streams by default; a frame
        // for a forgotten one counts as the peer's protocol error, and 1,024 of those over the
        // connection's life close it, failing every request on it (tests/cancelled_streams.rs).
        // Remember more, and never hold it against a storage node: it proved the cluster secret
        // (or mutual TLS) before any request, so it is no attacker flooding us with resets.
        .max_concurrent_reset_streams(REMEMBERED_RESET_STREAMS)
        .max_local_error_reset_streams(None)
        .handshake(TokioIo::new(BatchedWrites::new(stream)))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::debug!(%addr, %err, "storage connection ended");
        }
    });
    Ok(sender)
}
