//! Turning signals into what the servers understand: SIGTERM/SIGINT into a shutdown future,
//! SIGHUP into reloads of certificates and of the cluster secret.

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

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

/// One message per SIGHUP (must be called inside the runtime).
pub fn reload() -> mpsc::Receiver<()> {
    let mut hup = signal(SignalKind::hangup()).expect("installing a SIGHUP handler");
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading certificates and the cluster secret");
            // A reload already queued covers this one too.
            let _ = tx.try_send(());
        }
    });
    rx
}

/// What a frontend listens to: SIGTERM/SIGINT to stop, SIGHUP to reload its certificates and
/// the cluster secret.
pub fn frontend() -> larder_frontend::Signals {
    larder_frontend::Signals {
        shutdown: terminate(),
        reload: reload(),
    }
}

/// What a storage node listens to: SIGTERM/SIGINT to stop, SIGHUP to reload its certificates
/// and the cluster secret.
pub fn storage() -> larder_storage::Signals {
    larder_storage::Signals {
        shutdown: terminate(),
        reload: reload(),
    }
}
