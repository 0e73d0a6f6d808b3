//! Larder's TLS policy in one place, so the public listener, the storage node and the storage
//! client cannot drift apart:
//!
//! - one crypto provider (aws-lc-rs), passed explicitly to every config (docs/STACK.md: rustls
//!   has no default provider once both of its provider features are enabled);
//! - TLS 1.3 and 1.2 only, and in 1.2 only the ECDHE + AEAD suites HTTP/2 allows (RFC 9113 §9.2);
//! - certificates, keys and CAs read from PEM files, reloadable at run time without a restart
//!   (every config is a [`Reloading`] one; the binary decides when: SIGHUP);
//! - mutual TLS for the internal hop: both sides present certificates from the cluster CA;
//! - the same policy for Larder's own command-line clients ([`ClientTls`]).

mod client;
mod files;
mod pem;
mod policy;
mod reload;

pub use client::{connect_h2, error_chain, ClientTls};
pub use files::MutualTls;
pub use pem::{load_certs, load_key, load_roots};
pub use policy::{mutual_client, mutual_server, provider, public_server, ALPN_H1, ALPN_H2};
pub use reload::Reloading;
pub use rustls;
pub use tokio_rustls::server::TlsStream;
pub use tokio_rustls::{TlsAcceptor, TlsConnector};

use std::path::PathBuf;

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {detail}")]
    Read { path: PathBuf, detail: String },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("certificate {cert} and key {key}: {detail}")]
    KeyMismatch {
        cert: PathBuf,
        key: PathBuf,
        detail: String,
    },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("client certificate verifier: {0}")]
    Verifier(String),
}
