//! Accepting HTTP/2 connections and shutting down cleanly.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use larder_auth::Credentials;
use larder_cluster::ClusterMap;
use larder_pool::StoragePool;
use larder_tls::rustls::ServerConfig;
use larder_tls::{Reloading, TlsStream};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::connection::connection_builder;
use crate::{internal_auth, routes, StorageConfig, StorageNode};
use larder_pool::BatchedWrites;

/// Resolves when the node should stop (SIGTERM in the binary; a channel in tests).
pub type ShutdownSignal = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What the process tells a running storage node.
pub struct Signals {
    /// Stop: finish in-flight requests, sync and checkpoint, return.
    pub shutdown: ShutdownSignal,
    /// Each message re-reads the certificate, key and CA files of `[tls]` and `[pool.tls]`,
    /// and the cluster secret file of `[auth]` (SIGHUP in the binary).
    pub reload: mpsc::Receiver<()>,
}

impl Signals {
    /// Stop when `shutdown` resolves; never reload.
    pub fn shutdown_only(shutdown: ShutdownSignal) -> Signals {
        let (_, reload) = mpsc::channel(1);
        Signals { shutdown, reload }
    }
}

/// Where a storage node listens: an address it binds once its replicas are open (the
/// binary), or a listener bound already (tests that must know the port first).
pub enum Listen {
    At(SocketAddr),
    Bound(TcpListener),
}

impl From<SocketAddr> for Listen {
    fn from(addr: SocketAddr) -> Listen {
        Listen::At(addr)
    }
}

impl From<TcpListener> for Listen {
    fn from(listener: TcpListener) -> Listen {
        Listen::Bound(listener)
    }
}

/// Opens the replicas, then binds `listen` and serves the internal API until
/// `signals.shutdown` resolves; then stops accepting, lets in-flight requests finish (up to the
/// grace period), syncs and checkpoints every store. The port is bound only once every
/// replica is open: a node that accepts connections can serve them (a client, or a harness
/// waiting for the port, never meets a node still replaying its journals).
pub async fn serve(
    config: StorageConfig,
    map: ClusterMap,
    listen: impl Into<Listen>,
    mut signals: Signals,
) -> Result<(), String> {
    let tls = match &config.tls {
        Some(files) => Some(Arc::new(
            larder_tls::mutual_server(files).map_err(|e| e.to_string())?,
        )),
        None => None,
    };
    let credentials = internal_auth::load_credentials(&config)?;
    // With mutual TLS the certificate authenticates clients; the secret (if any) only serves
    // this node's replication pool towards peers without `[pool.tls]`. One holder for both, so
    // one reload reaches both.
    let server_credentials = credentials.clone().filter(|_| tls.is_none());
    let trusted = tls.is_some() || server_credentials.is_some();
    // The map accepted before a restart, when it is newer than the configured one.
    let map = crate::map_state::newest(map, &config.data_dir);
    let open_config = config.clone();
    let map_for_replication = map.clone();
    let node = tokio::task::spawn_blocking(move || StorageNode::open(&open_config, &map))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let node = Arc::new(node);
    let listener = match listen.into() {
        Listen::Bound(listener) => listener,
        Listen::At(addr) => TcpListener::bind(addr)
            .await
            .map_err(|e| format!("binding {addr}: {e}"))?,
    };
    let (stop_replication, stop) = tokio::sync::watch::channel(false);
    let every_node = crate::map_state::node_addresses(&map_for_replication);
    let map_pool = StoragePool::new(every_node, config.pool.clone(), credentials.clone())
        .map_err(|e| e.to_string())?;
    node.maps.attach_peers(map_pool.clone());
    let auto = crate::auto_replace::AutoReplace::new(
        config.redistribution.auto_replace_after,
        node.metrics.auto_replace.clone(),
    );
    let map_task = crate::authority::start(
        node.maps.clone(),
        map_pool,
        config.cluster_map.clone(),
        auto,
        stop.clone(),
    );
    let peers = peer_pool(&map_for_replication, &config, credentials.clone())?;
    let peers = Arc::new(std::sync::Mutex::new(peers));
    let mut replicators: Vec<_> =
        crate::compaction::start(node.clone(), config.compaction.clone(), stop.clone())
            .into_iter()
            .collect();
    // Replication, bootstraps and retiring replicas follow the map (`membership.rs`).
    let follow = crate::membership::FollowContext {
        replication: config.replication.clone(),
        pool: config.pool.clone(),
        credentials,
        peers: peers.clone(),
        stop,
    };
    let following = crate::membership::follow_map(node.clone(), node.map.subscribe(), follow);
    replicators.push(tokio::spawn(following));
    replicators.push(map_task);
    // Every connection that passed mutual TLS or the secret handshake is a peer's.
    let builder = connection_builder(&config.http2, trusted);
    let graceful = GracefulShutdown::new();
    tracing::info!(addr = %listener.local_addr().map_err(|e| e.to_string())?, "storage node serving");
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else {
                    // Out of file descriptors and the like: back off briefly instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let admitted = node.clone();
                let node = node.clone();
                let service = service_fn(move |req| {
                    let node = node.clone();
                    async move { Ok::<_, Infallible>(routes::handle(node, req).await) }
                });
                // The config current now: a reload affects the next handshake.
                let acceptor = tls.as_ref().map(|tls| tls.acceptor());
                let secrets = server_credentials.as_ref().map(|c| c.current());
                let (builder, watcher) = (builder.clone(), graceful.watcher());
                tokio::spawn(async move {
                    let result = match acceptor {
                        None => {
                            let mut stream = stream;
                            // No HTTP byte before the peer proved it holds the cluster secret.
                            if let Some(secrets) = secrets {
                                if !internal_auth::admit(&mut stream, peer, &secrets, &admitted.metrics).await {
                                    return;
                                }
                            }
                            watcher.watch(builder.serve_connection(TokioIo::new(BatchedWrites::after_h2_preface(stream)), service)).await
                        }
                        Some(acceptor) => {
                            // A client without a certificate from the cluster CA fails here.
                            let Some(stream) = handshake(&acceptor, stream, peer).await else { return };
                            watcher.watch(builder.serve_connection(TokioIo::new(BatchedWrites::after_h2_preface(stream)), service)).await
                        }
                    };
                    if let Err(err) = result {
                        tracing::debug!(%err, "internal connection ended");
                    }
                });
            }
            Some(()) = signals.reload.recv() => {
                let peers = peers.lock().unwrap_or_else(|e| e.into_inner()).clone();
                reload(&node, tls.as_deref(), &peers);
                reload_secret(&peers);
            }
            _ = &mut signals.shutdown => break,
        }
    }
    drop(listener);
    let _ = stop_replication.send(true);
    for replicator in replicators {
        let _ = replicator.await;
    }
    tracing::info!("shutting down: finishing in-flight requests");
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(config.shutdown_grace) => tracing::warn!("grace period over; closing anyway"),
    }
    tokio::task::spawn_blocking(move || node.close())
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!("stores synced and checkpointed");
    Ok(())
}

/// Connections to the peer storage nodes, for replication. With `[pool.tls]` peers are reached
/// over mutual TLS like the frontend reaches them; otherwise this node proves the cluster secret.
fn peer_pool(
    map: &ClusterMap,
    config: &StorageConfig,
    credentials: Option<Arc<Credentials>>,
) -> Result<StoragePool, String> {
    let peers = map
        .nodes
        .iter()
        .filter(|n| n.id != config.node_id)
        .map(|n| (n.id.clone(), n.address));
    StoragePool::new(peers, config.pool.clone(), credentials).map_err(|e| e.to_string())
}

/// Re-reads `[tls]` (what this node serves and which clients it admits) and `[pool.tls]` (what
/// it presents to peers); each keeps its old files when the new ones are broken (logged and
/// counted in `larder_storage_certificate_reloads`).
fn reload(node: &StorageNode, server: Option<&Reloading<ServerConfig>>, peers: &StoragePool) {
    let results = [
        ("server", server.map(Reloading::reload)),
        ("pool", peers.reload_tls()),
    ];
    for (certificate, result) in results {
        match result {
            Some(Ok(())) => {
                tracing::info!(certificate, "TLS certificate reloaded");
                node.metrics.certificate_reloaded(certificate, true);
            }
            Some(Err(err)) => {
                tracing::error!(certificate, %err, "TLS certificate reload failed; keeping the old one");
                node.metrics.certificate_reloaded(certificate, false);
            }
            None => {}
        }
    }
}

/// Re-reads the cluster secret file. The accept loop and the replication pool share one
/// holder, so this reaches both. A broken file keeps the old secrets.
fn reload_secret(peers: &StoragePool) {
    match peers.reload_secret() {
        Some(Ok(())) => tracing::info!("cluster secret reloaded"),
        Some(Err(err)) => {
            tracing::error!(%err, "cluster secret reload failed; keeping the old secrets")
        }
        None => {}
    }
}

/// A peer that has not finished its handshake by then is dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

async fn handshake(
    acceptor: &larder_tls::TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
) -> Option<TlsStream<TcpStream>> {
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Some(stream),
        // A bare TCP probe (a readiness check) ends with EOF: not worth a warning.
        Ok(Err(err)) if err.kind() == std::io::ErrorKind::UnexpectedEof => {
            tracing::debug!(%peer, %err, "internal TLS handshake abandoned");
            None
        }
        Ok(Err(err)) => {
            tracing::warn!(%peer, %err, "internal TLS handshake refused");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "internal TLS handshake timed out");
            None
        }
    }
}
