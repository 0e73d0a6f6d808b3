//! Who may use the internal API: mutual TLS (`[tls]`), the cluster secret's handshake
//! (`[auth] secret_file`), or, only when named so, anyone. Decided once at start; each
//! connection is admitted in its own task, before its first HTTP byte.

use std::net::SocketAddr;
use std::sync::Arc;

use larder_auth::{Credentials, Secrets};
use tokio::net::TcpStream;

use crate::metrics::StorageMetrics;
use crate::StorageConfig;

/// Shown when a node would otherwise serve anyone who can reach its port.
const UNAUTHENTICATED: &str = "the internal API would be open to anyone who can reach this port \
(they could list, read, delete and plant data): set [auth] secret_file to the cluster secret \
(`larder cluster init` and `larder dev` write one next to the cluster map) or configure [tls] \
(mutual TLS); only on a network nothing else can reach, set \
[auth] insecure_unauthenticated_internal_api = true";

/// The cluster secret, when configured: what this node's replication pool proves over
/// cleartext, and (without `[tls]`) what clients must prove. Refuses a config that would leave
/// the port open without saying so, and a secret file that cannot be read.
pub(crate) fn load_credentials(config: &StorageConfig) -> Result<Option<Arc<Credentials>>, String> {
    let credentials = match &config.auth.secret_file {
        Some(path) => Some(Arc::new(
            Credentials::load(path).map_err(|e| e.to_string())?,
        )),
        None => None,
    };
    if config.tls.is_none() && credentials.is_none() {
        if !config.auth.insecure_unauthenticated_internal_api {
            return Err(UNAUTHENTICATED.into());
        }
        tracing::warn!(
            "[auth] insecure_unauthenticated_internal_api = true: anyone who can reach the \
             internal port can read, delete and plant data"
        );
    }
    Ok(credentials)
}

/// Runs the server side of the handshake on a new cleartext connection. A refused or silent
/// peer is counted and logged at debug (a port scanner is not worth a warning); the caller
/// then drops the connection without a byte of HTTP.
pub(crate) async fn admit(
    stream: &mut TcpStream,
    peer: SocketAddr,
    secrets: &Secrets,
    metrics: &StorageMetrics,
) -> bool {
    match larder_auth::accept(stream, secrets, larder_auth::HANDSHAKE_TIMEOUT).await {
        Ok(()) => true,
        Err(err) => {
            tracing::debug!(%peer, %err, "internal connection refused: no valid credentials");
            metrics.auth_refused(err.kind());
            false
        }
    }
}
