//! Credentials of Larder's internal API (frontend → storage node, storage node → storage node)
//! when it runs without mutual TLS: the cluster secret file, a holder of the secrets that SIGHUP
//! reloads, and the mutual challenge-response handshake each connection runs before its first
//! HTTP byte (`crates/larder-proto/INTERNAL_API.md`, "Authentication").
//!
//! The handshake authenticates both peers of a connection with a shared secret; it neither
//! encrypts nor protects against an on-path attacker. Hostile networks need `[tls]`.

mod credentials;
mod handshake;
mod secret;

pub use credentials::Credentials;
pub use handshake::{accept, connect, HANDSHAKE_TIMEOUT, MAGIC};
pub use secret::{generate_secret_file, parse_secrets, Secret, Secrets};

/// Why loading a secret file or a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cluster secret file {path}: {detail}")]
    SecretFile { path: String, detail: String },
    #[error("the peer did not finish the handshake within {0:?}")]
    Timeout(std::time::Duration),
    #[error("the peer does not speak the internal API's handshake (bad magic)")]
    BadMagic,
    #[error("the peer's proof matches no accepted cluster secret")]
    Refused,
    #[error("handshake I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl AuthError {
    /// A short fixed name for metrics labels and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            AuthError::SecretFile { .. } => "secret_file",
            AuthError::Timeout(_) => "timeout",
            AuthError::BadMagic => "bad_magic",
            AuthError::Refused => "refused",
            AuthError::Io(_) => "io",
        }
    }
}
