//! Turning SIGTERM and SIGINT into a shutdown future.

use tokio::signal::unix::{signal, SignalKind};

/// Resolves on the first SIGTERM or SIGINT.
pub fn terminate() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    Box::pin(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    })
}
