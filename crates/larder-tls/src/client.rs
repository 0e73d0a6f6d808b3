//! TLS for Larder's command-line clients (`larder feed`, `larder put/get/delete`) talking to a
//! frontend's HTTPS port: the servers' protocol policy, HTTP/2 chosen by ALPN.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::ClientConfig;
use rustls::pki_types::ServerName;
use rustls::RootCertStore;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::policy::{client_builder, key_mismatch};
use crate::{load_certs, load_key, load_roots, TlsError, ALPN_H2};

/// Whom a client trusts and how it proves who it is.
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    /// PEM file with the CA certificate(s) to trust instead of the system's roots (what
    /// `larder dev --tls` prints; vespa-feed-client's `--ca-certificates`).
    pub ca: Option<PathBuf>,
    /// PEM files with a client certificate chain and its key, for endpoints that ask for one
    /// (vespa-feed-client's `--certificate` and `--private-key`).
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl ClientTls {
    /// The rustls config: TLS 1.3/1.2 with HTTP/2-compliant suites, ALPN `h2` only.
    pub fn config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let roots = match &self.ca {
            Some(ca) => load_roots(ca)?,
            None => system_roots()?,
        };
        let builder = client_builder()?.with_root_certificates(roots);
        let mut config = match &self.identity {
            Some((cert, key)) => builder
                .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
                .map_err(|e| key_mismatch(cert, key, e))?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(Arc::new(config))
    }
}

/// The operating system's trusted roots (the Debian bundle here).
fn system_roots() -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(TlsError::Read {
            path: "the system's certificate store".into(),
            detail: format!("no usable CA certificate ({:?})", found.errors),
        });
    }
    Ok(roots)
}

/// Runs the TLS handshake over `stream` with the server named `host` (a DNS name or an IP
/// address, checked against its certificate) and insists that it chose HTTP/2.
pub async fn connect_h2<S>(
    config: Arc<ClientConfig>,
    host: &str,
    stream: S,
) -> io::Result<TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host:?}: {e}")))?;
    let tls = TlsConnector::from(config)
        .connect(name, stream)
        .await
        .map_err(explain)?;
    if tls.get_ref().1.alpn_protocol() != Some(ALPN_H2) {
        return Err(io::Error::other(
            "the server did not agree to HTTP/2 (ALPN h2)",
        ));
    }
    Ok(tls)
}

/// Says what to do about the most common failures: a server whose CA the client was not given,
/// and an `https://` endpoint that is a cleartext port.
fn explain(e: io::Error) -> io::Error {
    let hint = match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(_)) => {
            "is the server's CA certificate among those trusted? pass its PEM file with \
             --ca-certificates"
        }
        Some(rustls::Error::InvalidMessage(_)) => {
            "the server did not answer with TLS: is this a cleartext port (http://)?"
        }
        _ => return e,
    };
    io::Error::new(e.kind(), format!("{e} ({hint})"))
}

/// `error` and its causes, joined by ": ", without repeating a cause that its parent already
/// spelled out (hyper's own message says only "http2 error"). For the command-line clients'
/// one-line errors.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}
