//! Protocol versions, cipher suites, ALPN and client authentication for every Larder TLS config.

use std::path::Path;
use std::sync::Arc;

use rustls::client::ClientConfig;
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::version::{TLS12, TLS13};
use rustls::{CipherSuite, SupportedCipherSuite};

use crate::{load_certs, load_key, load_roots, MutualTls, Reloading, TlsError};

/// ALPN protocol ids.
pub const ALPN_H2: &[u8] = b"h2";
pub const ALPN_H1: &[u8] = b"http/1.1";

/// TLS 1.2 suites HTTP/2 accepts: ephemeral key exchange with an AEAD cipher (RFC 9113 §9.2.2
/// and the RFC 7540 Appendix A block list). TLS 1.3 suites all qualify.
const HTTP2_TLS12_SUITES: [CipherSuite; 6] = [
    CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
];

fn http2_compliant(suite: &SupportedCipherSuite) -> bool {
    suite.version() == &TLS13 || HTTP2_TLS12_SUITES.contains(&suite.suite())
}

/// The aws-lc-rs provider restricted to HTTP/2-compliant suites. Every config is built from this
/// explicitly, so the process-wide default provider (ambiguous if a dependency enables ring too)
/// is never consulted.
pub fn provider() -> CryptoProvider {
    let mut provider = aws_lc_rs::default_provider();
    provider.cipher_suites.retain(http2_compliant);
    provider
}

fn server_builder() -> Result<rustls::ConfigBuilder<ServerConfig, rustls::WantsVerifier>, TlsError>
{
    Ok(ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_protocol_versions(&[&TLS13, &TLS12])?)
}

/// Every client config starts here: the provider and protocol versions of the servers.
pub(crate) fn client_builder(
) -> Result<rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier>, TlsError> {
    Ok(ClientConfig::builder_with_provider(Arc::new(provider()))
        .with_protocol_versions(&[&TLS13, &TLS12])?)
}

/// The public listener, reloadable: no client certificates; ALPN offers h2 first, then
/// http/1.1, so one port serves both and each client gets the best it speaks.
pub fn public_server(cert: &Path, key: &Path) -> Result<Reloading<ServerConfig>, TlsError> {
    let (cert, key) = (cert.to_path_buf(), key.to_path_buf());
    Reloading::new(move || {
        let mut config = server_builder()?
            .with_no_client_auth()
            .with_single_cert(load_certs(&cert)?, load_key(&key)?)
            .map_err(|e| key_mismatch(&cert, &key, e))?;
        config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_H1.to_vec()];
        Ok(config)
    })
}

/// The storage node, reloadable (certificate, key and CA): HTTP/2 only, and only clients whose
/// certificate chains to the cluster CA.
pub fn mutual_server(files: &MutualTls) -> Result<Reloading<ServerConfig>, TlsError> {
    let files = files.clone();
    Reloading::new(move || {
        let roots = Arc::new(load_roots(&files.ca)?);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, Arc::new(provider()))
            .build()
            .map_err(|e| TlsError::Verifier(e.to_string()))?;
        let mut config = server_builder()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(load_certs(&files.cert)?, load_key(&files.key)?)
            .map_err(|e| key_mismatch(&files.cert, &files.key, e))?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(config)
    })
}

/// The storage client (frontend → storage, and storage → storage for replication), reloadable
/// (certificate, key and CA): trusts only the cluster CA, presents its own certificate, and
/// speaks only h2.
pub fn mutual_client(files: &MutualTls) -> Result<Reloading<ClientConfig>, TlsError> {
    let files = files.clone();
    Reloading::new(move || {
        let roots = load_roots(&files.ca)?;
        let mut config = client_builder()?
            .with_root_certificates(roots)
            .with_client_auth_cert(load_certs(&files.cert)?, load_key(&files.key)?)
            .map_err(|e| key_mismatch(&files.cert, &files.key, e))?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(config)
    })
}

/// rustls checks that the key belongs to the leaf certificate when a config takes them.
pub(crate) fn key_mismatch(cert: &Path, key: &Path, err: rustls::Error) -> TlsError {
    TlsError::KeyMismatch {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        detail: err.to_string(),
    }
}
