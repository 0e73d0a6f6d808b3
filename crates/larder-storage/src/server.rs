//! Accepting HTTP/2 connections and shutting down cleanly.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use larder_cluster::ClusterMap;
use tokio::net::TcpListener;

use crate::config::Http2Settings;
use crate::reply::{Body, BoxError};
use crate::{handlers, StorageConfig, StorageNode};

/// Resolves when the node should stop (SIGTERM in the binary; a channel in tests).
pub type ShutdownSignal = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Opens the replicas and serves the internal API on `listener` until `shutdown` resolves; then
/// stops accepting, lets in-flight requests finish (up to the grace period), syncs and
/// checkpoints every store.
pub async fn serve(
    config: StorageConfig,
    map: ClusterMap,
    listener: TcpListener,
    mut shutdown: ShutdownSignal,
) -> Result<(), String> {
    let open_config = config.clone();
    let map_for_replication = map.clone();
    let node = tokio::task::spawn_blocking(move || StorageNode::open(&open_config, &map))
        .await
        .map_err(|e| e.to_string())??;
    let node = Arc::new(node);
    let (stop_replication, stop) = tokio::sync::watch::channel(false);
    let replicators = start_replication(&node, &map_for_replication, &config, stop);
    let max_body = config.store.max_record_size.as_u64();
    let builder = http2_builder(&config.http2);
    let graceful = GracefulShutdown::new();
    tracing::info!(addr = %listener.local_addr().map_err(|e| e.to_string())?, "storage node serving");
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _peer)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let node = node.clone();
                let service = service_fn(move |req| {
                    let node = node.clone();
                    async move { Ok::<_, Infallible>(handlers::handle(node, req, max_body).await) }
                });
                let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move {
                    if let Err(err) = connection.await {
                        tracing::debug!(%err, "internal connection ended");
                    }
                });
            }
            _ = &mut shutdown => break,
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

fn start_replication(
    node: &Arc<StorageNode>,
    map: &ClusterMap,
    config: &StorageConfig,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let peers = map
        .nodes
        .iter()
        .filter(|n| n.id != config.node_id)
        .map(|n| (n.id.clone(), n.address));
    let pool = larder_pool::StoragePool::new(peers, config.pool.clone());
    let dir = config.data_dir.join("replication");
    if let Err(err) = std::fs::create_dir_all(&dir) {
        tracing::error!(%err, "cannot create the replication directory; replication is off");
        return Vec::new();
    }
    crate::replication::start(
        node.clone(),
        map,
        pool,
        config.replication.clone(),
        &dir,
        stop,
    )
}

fn http2_builder(s: &Http2Settings) -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(s.max_concurrent_streams)
        .initial_stream_window_size(s.stream_window.as_u64() as u32)
        .initial_connection_window_size(s.connection_window.as_u64() as u32)
        .max_frame_size(s.max_frame_size.as_u64() as u32)
        .max_send_buf_size(s.max_send_buffer.as_u64() as usize)
        .max_header_list_size(s.max_header_list_size.as_u64() as u32);
    builder
}

/// A response body made of already-verified chunks, sent as they are (no concatenation).
pub fn chunks_body(chunks: Vec<Bytes>) -> Body {
    use http_body_util::BodyExt;
    ChunksBody(chunks.into()).boxed()
}

struct ChunksBody(VecDeque<Bytes>);

impl http_body::Body for ChunksBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.0.pop_front().map(|chunk| Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.iter().map(|c| c.len() as u64).sum())
    }
}
