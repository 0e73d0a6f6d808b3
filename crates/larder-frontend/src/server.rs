//! The public listener: HTTP/1.1 and h2c prior knowledge on one cleartext port, graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use larder_cluster::ClusterMap;
use larder_pool::StoragePool;
use larder_router::Router;
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::state::AppState;
use crate::{api, FrontendConfig};

/// Resolves when the frontend should stop.
pub type ShutdownSignal = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Serves the public API on `listener` until `shutdown` resolves; then sends GOAWAY / closes
/// idle HTTP/1.1 connections, and waits (up to the grace period) for in-flight requests.
pub async fn serve(
    config: FrontendConfig,
    map: ClusterMap,
    listener: TcpListener,
    mut shutdown: ShutdownSignal,
) -> Result<(), String> {
    config.validate()?;
    let nodes = map.nodes.iter().map(|n| (n.id.clone(), n.address));
    let pool = StoragePool::new(nodes, config.pool.clone());
    let router = Arc::new(Router::new(
        Arc::new(map),
        pool,
        config.router.clone(),
        &config.datacenter,
    )?);
    let builder = connection_builder(&config);
    let grace = config.shutdown_grace;
    let metrics = Metrics::new(router.metrics());
    config.documents.validate()?;
    let state = Arc::new(AppState {
        config,
        documents: larder_router::DocRouter::new(router.clone()),
        router,
        metrics,
    });
    let graceful = GracefulShutdown::new();
    tracing::info!(addr = %listener.local_addr().map_err(|e| e.to_string())?, "frontend serving");
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _peer)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                let service = service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(api::handle(state, req).await) }
                });
                let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service).into_owned());
                tokio::spawn(async move {
                    if let Err(err) = connection.await {
                        tracing::debug!(%err, "client connection ended");
                    }
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(grace) => tracing::warn!("grace period over; closing anyway"),
    }
    Ok(())
}

fn connection_builder(config: &FrontendConfig) -> auto::Builder<TokioExecutor> {
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
        .max_frame_size(config.pool.max_frame_size.as_u64() as u32)
        .initial_stream_window_size(config.pool.stream_window.as_u64() as u32)
        .initial_connection_window_size(config.pool.connection_window.as_u64() as u32)
        .max_send_buf_size(config.pool.max_send_buffer.as_u64() as usize);
    builder
}
