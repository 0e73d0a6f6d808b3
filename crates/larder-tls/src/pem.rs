//! Reading certificates and keys from PEM files, with errors that name the file.

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;

use crate::TlsError;

fn read_error(path: &Path, detail: impl ToString) -> TlsError {
    TlsError::Read {
        path: path.to_path_buf(),
        detail: detail.to_string(),
    }
}

/// Every certificate in a PEM file, in order (leaf first for a chain).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| read_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read_error(path, e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The first private key in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| read_error(path, e))
}

/// A root store holding exactly the certificates of a CA file.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|e| read_error(path, e))?;
    }
    Ok(roots)
}
