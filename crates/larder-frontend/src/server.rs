//! The public listeners: HTTP/1.1 and h2c prior knowledge on the cleartext port, HTTP/1.1 and
//! HTTP/2 by ALPN on the optional TLS port; certificate reload; graceful shutdown.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use larder_cluster::ClusterMap;
use larder_pool::StoragePool;
use larder_router::Router;
use larder_tls::rustls::ServerConfig;
use larder_tls::Reloading;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::body_budget::BodyBudget;
use crate::connection::{Edge, Port};
use crate::metrics::Metrics;
use crate::state::AppState;
use crate::FrontendConfig;

/// Resolves when the frontend should stop.
pub type ShutdownSignal = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The sockets the frontend serves on, bound by the caller (so tests and `larder dev` can use
/// port 0 and learn the address).
pub struct Listeners {
    pub cleartext: TcpListener,
    /// Required when the config has a `[tls]` section.
    pub tls: Option<TcpListener>,
    /// The S3 API's port: required when the config has an `[s3]` section.
    pub s3: Option<TcpListener>,
    /// The S3 API's TLS port: required when the config has `[s3] tls_listen`.
    pub s3_tls: Option<TcpListener>,
}

/// What the process tells a running frontend.
pub struct Signals {
    /// Stop: GOAWAY / close idle HTTP/1.1 connections, finish in-flight requests, return.
    pub shutdown: ShutdownSignal,
    /// Each message re-reads the TLS port's certificate and key and the storage pool's
    /// certificate, key and CA (SIGHUP in the binary).
    pub reload: mpsc::Receiver<()>,
}

/// Serves the public API until `signals.shutdown` resolves; then stops accepting, sends GOAWAY /
/// closes idle HTTP/1.1 connections, and waits (up to the grace period) for in-flight requests.
pub async fn serve(
    config: FrontendConfig,
    map: ClusterMap,
    listeners: Listeners,
    mut signals: Signals,
) -> Result<(), String> {
    config.validate()?;
    let tls = match &config.tls {
        Some(tls) => Some(Arc::new(
            larder_tls::public_server(&tls.cert, &tls.key).map_err(|e| e.to_string())?,
        )),
        None => None,
    };
    if tls.is_some() != listeners.tls.is_some() {
        return Err("a TLS listener is needed exactly when the config has [tls]".into());
    }
    if config.s3.is_some() != listeners.s3.is_some() {
        return Err("an S3 listener is needed exactly when the config has [s3]".into());
    }
    let s3_tls = config.s3.as_ref().and_then(|s3| s3.tls_listen);
    if s3_tls.is_some() != listeners.s3_tls.is_some() {
        return Err("an S3 TLS listener is needed exactly when [s3] has tls_listen".into());
    }
    if s3_tls.is_some() && tls.is_none() {
        return Err("[s3] tls_listen serves the [tls] certificate: it needs [tls]".into());
    }
    let nodes = map.nodes.iter().map(|n| (n.id.clone(), n.address));
    let credentials = config.auth.credentials()?;
    let pool =
        StoragePool::new(nodes, config.pool.clone(), credentials).map_err(|e| e.to_string())?;
    let mut router = Router::new(
        Arc::new(map),
        pool,
        config.router.clone(),
        &config.datacenter,
    )?;
    if let Some(dir) = &config.upload_journal_dir {
        let journal = larder_router::UploadJournal::open(dir)
            .map_err(|e| format!("upload journal {}: {e}", dir.display()))?;
        router = router.with_upload_journal(journal);
    }
    let router = Arc::new(router);
    // Listed now, before serving: later entries are this run's own uploads.
    let unfinished = router
        .unfinished_uploads()
        .map_err(|e| format!("cannot read the upload journal: {e}"))?;
    // Entries held for S3 names, or reserved for them, are settled by the S3 API (their
    // bodies may be named).
    let (held, unfinished): (Vec<_>, Vec<_>) = unfinished
        .into_iter()
        .partition(|u| u.held_for.is_some() || u.reserved);
    tokio::spawn(router.clone().clean_up_uploads(unfinished));
    let follower = tokio::spawn(crate::map_follow::follow(
        router.clone(),
        config.cluster_map.clone(),
    ));
    let grace = config.shutdown_grace;
    let mut metrics = Metrics::new(router.metrics());
    let (stop_tx, stop_rx) = watch::channel(());
    let s3 = match config.s3.as_ref() {
        None => {
            if !held.is_empty() {
                tracing::warn!(
                    entries = held.len(),
                    "upload journal entries held for S3 names stay until [s3] is configured again"
                );
            }
            None
        }
        Some(s3) => {
            let limits = larder_s3::BlobLimits {
                chunking: config.chunking.clone(),
                max_object_size: config.max_blob_size.as_u64(),
                body_read_timeout: config.limits.body_read_timeout,
            };
            let registry = metrics.registry_mut();
            let api = larder_s3::S3Api::start(
                router.clone(),
                limits,
                s3,
                registry,
                (stop_rx.clone(), held),
            )?;
            Some(Arc::new(api))
        }
    };
    let signed_urls = match config.auth.require_signed_blob_urls {
        false => None,
        true => {
            let home = config
                .s3
                .as_ref()
                .and_then(|s3| s3.home_datacenter.as_deref());
            let records_router = larder_s3::records_router(&router, home)?;
            Some(larder_s3::SignedUrls::new(records_router))
        }
    };
    config.documents.validate()?;
    let body_budget = BodyBudget::new(config.limits.buffered_bodies_per_process, "process");
    let visits = Arc::new(tokio::sync::Semaphore::new(
        config.documents.max_concurrent_visits,
    ));
    let state = Arc::new(AppState {
        visits,
        config,
        body_budget,
        signed_urls,
        documents: larder_router::DocRouter::new(router.clone()),
        document_locks: Default::default(),
        document_work: Default::default(),
        router,
        metrics,
    });
    let edge = Arc::new(Edge::new(state.clone(), tls.clone(), s3));
    log_addresses(&listeners)?;
    loop {
        tokio::select! {
            accepted = listeners.cleartext.accept() => {
                spawn_connection(&edge, accepted, Port::Cleartext, &stop_rx).await;
            }
            accepted = accept_optional(&listeners.tls) => {
                spawn_connection(&edge, accepted, Port::Tls, &stop_rx).await;
            }
            accepted = accept_optional(&listeners.s3) => {
                spawn_connection(&edge, accepted, Port::S3, &stop_rx).await;
            }
            accepted = accept_optional(&listeners.s3_tls) => {
                spawn_connection(&edge, accepted, Port::S3Tls, &stop_rx).await;
            }
            Some(()) = signals.reload.recv() => reload(&state, tls.as_deref()),
            _ = &mut signals.shutdown => break,
        }
    }
    drop(listeners);
    follower.abort();
    // Every connection task holds a receiver: tell them, then wait until all have let go.
    drop(stop_rx);
    let _ = stop_tx.send(());
    tokio::select! {
        _ = stop_tx.closed() => {}
        _ = tokio::time::sleep(grace) => tracing::warn!("grace period over; closing anyway"),
    }
    state.router.release_reserved().await;
    Ok(())
}

async fn accept_optional(
    listener: &Option<TcpListener>,
) -> io::Result<(TcpStream, std::net::SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

async fn spawn_connection(
    edge: &Arc<Edge>,
    accepted: io::Result<(TcpStream, std::net::SocketAddr)>,
    port: Port,
    stop: &watch::Receiver<()>,
) {
    match accepted {
        Ok((stream, peer)) => {
            edge.accepted(port);
            tokio::spawn(edge.clone().run(stream, peer, port, stop.clone()));
        }
        Err(err) => {
            // Out of file descriptors and the like: back off briefly instead of spinning.
            tracing::warn!(%err, ?port, "accept failed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Re-reads the TLS port's certificate and the storage pool's; each keeps its old files when
/// the new ones are broken (logged and counted in `larder_frontend_certificate_reloads`).
fn reload(state: &AppState, public: Option<&Reloading<ServerConfig>>) {
    let edge = &state.metrics.edge;
    let pool = state.router.pool().reload_tls();
    for (certificate, result) in [("public", public.map(Reloading::reload)), ("pool", pool)] {
        match result {
            Some(Ok(())) => {
                tracing::info!(certificate, "TLS certificate reloaded");
                edge.certificate_reloaded(certificate, true);
            }
            Some(Err(err)) => {
                tracing::error!(certificate, %err, "TLS certificate reload failed; keeping the old one");
                edge.certificate_reloaded(certificate, false);
            }
            None => {}
        }
    }
    match state.router.pool().reload_secret() {
        Some(Ok(())) => tracing::info!("cluster secret reloaded"),
        Some(Err(err)) => {
            tracing::error!(%err, "cluster secret reload failed; keeping the old secrets")
        }
        None => {}
    }
}

fn log_addresses(listeners: &Listeners) -> Result<(), String> {
    let cleartext = listeners
        .cleartext
        .local_addr()
        .map_err(|e| e.to_string())?;
    tracing::info!(addr = %cleartext, "frontend serving HTTP/1.1 and h2c");
    if let Some(tls) = &listeners.tls {
        let addr = tls.local_addr().map_err(|e| e.to_string())?;
        tracing::info!(%addr, "frontend serving HTTPS (ALPN h2, http/1.1)");
    }
    if let Some(s3) = &listeners.s3 {
        let addr = s3.local_addr().map_err(|e| e.to_string())?;
        tracing::info!(%addr, "S3 API serving HTTP/1.1 and h2c");
    }
    if let Some(s3) = &listeners.s3_tls {
        let addr = s3.local_addr().map_err(|e| e.to_string())?;
        tracing::info!(%addr, "S3 API serving HTTPS (ALPN h2, http/1.1)");
    }
    Ok(())
}
