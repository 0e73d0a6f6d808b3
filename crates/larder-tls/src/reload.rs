//! A server certificate that can be replaced while the server runs (SIGHUP in the binary).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::{load_certs, load_key, provider, TlsError};

/// Serves the certificate and key last read from two PEM files. Handshakes in progress keep the
/// key they started with; new handshakes see a reload at once.
#[derive(Debug)]
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl ReloadingCert {
    /// Reads both files now; fails if they are unreadable or the key does not match.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<ReloadingCert, TlsError> {
        let current = read(cert_path, key_path)?;
        Ok(ReloadingCert {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            current: RwLock::new(current),
        })
    }

    /// Reads the files again. On any error the previous certificate stays in use, so a
    /// half-written file during a rotation never takes the listener down.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = read(&self.cert_path, &self.key_path)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn read(cert_path: &Path, key_path: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = load_certs(cert_path)?;
    let key = load_key(key_path)?;
    // from_der also checks that the key belongs to the leaf certificate.
    let certified =
        CertifiedKey::from_der(chain, key, &provider()).map_err(|e| TlsError::KeyMismatch {
            cert: cert_path.to_path_buf(),
            key: key_path.to_path_buf(),
            detail: e.to_string(),
        })?;
    Ok(Arc::new(certified))
}
