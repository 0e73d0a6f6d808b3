//! The S3 listener: HTTP/1.1 and h2c prior knowledge on one port (hyper-util's auto builder),
//! s3s as the service, graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use larder_router::Router;
use s3s::service::{S3Service, S3ServiceBuilder};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth::{Gate, Keys};
use crate::blobs::BlobLimits;
use crate::service::Larder;
use crate::store::Records;
use crate::S3Config;

/// Streams one client connection may have open (HTTP/2).
const MAX_STREAMS: u32 = 256;
/// Largest request header block (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE and HTTP/1.1's buffer).
const MAX_HEADERS: usize = 64 * 1024;
/// How long a client has to send its request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves S3 on `listener` until `stop` changes or closes, then lets requests in flight finish.
pub async fn serve(
    listener: TcpListener,
    router: Arc<Router>,
    limits: BlobLimits,
    config: S3Config,
    mut stop: watch::Receiver<()>,
) {
    let records = Arc::new(Records::new(router));
    let service = service(records.clone(), limits, &config);
    let sweeper = tokio::spawn(crate::objects::sweep_forever(
        records,
        config.sweep_interval,
    ));
    let builder = builder();
    let graceful = GracefulShutdown::new();
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "S3 API serving HTTP/1.1 and h2c");
    }
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let connection = builder
                        .serve_connection(TokioIo::new(stream), service.clone())
                        .into_owned();
                    let connection = graceful.watch(connection);
                    tokio::spawn(async move {
                        if let Err(err) = connection.await {
                            tracing::debug!(%err, "S3 connection ended with an error");
                        }
                    });
                }
                Err(err) => {
                    tracing::warn!(%err, "S3 accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    sweeper.abort();
    graceful.shutdown().await;
}

fn builder() -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .max_buf_size(MAX_HEADERS)
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .timer(hyper_util::rt::TokioTimer::new());
    builder
        .http2()
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADERS as u32)
        .timer(hyper_util::rt::TokioTimer::new());
    builder
}

/// The s3s service over Larder.
fn service(records: Arc<Records>, limits: BlobLimits, config: &S3Config) -> S3Service {
    let keys = Arc::new(Keys::new(records.clone()));
    let larder = Larder {
        records,
        keys: keys.clone(),
        limits,
        grace: config.replaced_blob_grace,
    };
    let mut builder = S3ServiceBuilder::new(larder);
    builder.set_auth(Gate(keys.clone()));
    builder.set_access(Gate(keys));
    builder.build()
}
