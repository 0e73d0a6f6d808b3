//! The secrets a process uses now, re-read from their file on SIGHUP.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::{AuthError, Secrets};

/// The cluster secrets loaded from one file. Each handshake uses the secrets current when it
/// starts; established connections stay authenticated.
#[derive(Debug)]
pub struct Credentials {
    path: PathBuf,
    current: RwLock<Arc<Secrets>>,
}

impl Credentials {
    /// Loads the file now; fails if it is missing or malformed.
    pub fn load(path: &Path) -> Result<Credentials, AuthError> {
        Ok(Credentials {
            path: path.to_path_buf(),
            current: RwLock::new(Arc::new(Secrets::load(path)?)),
        })
    }

    /// Fixed secrets (tests and tools).
    pub fn fixed(secrets: Secrets) -> Credentials {
        Credentials {
            path: PathBuf::new(),
            current: RwLock::new(Arc::new(secrets)),
        }
    }

    /// Re-reads the file. On any error the old secrets stay in use, so a half-edited file
    /// during a rotation never locks the cluster out.
    pub fn reload(&self) -> Result<(), AuthError> {
        let fresh = Arc::new(Secrets::load(&self.path)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    /// The secrets new handshakes use.
    pub fn current(&self) -> Arc<Secrets> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_file_keeps_the_old_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        let (a, b) = ("11".repeat(32), "22".repeat(32));
        std::fs::write(&path, format!("{a}\n")).unwrap();
        let credentials = Credentials::load(&path).unwrap();
        std::fs::write(&path, "not hex\n").unwrap();
        assert!(credentials.reload().is_err());
        assert_eq!(credentials.current().signing().to_hex(), a);
        std::fs::write(&path, format!("{b}\n{a}\n")).unwrap();
        credentials.reload().unwrap();
        assert_eq!(credentials.current().signing().to_hex(), b);
        assert_eq!(credentials.current().accepted().len(), 2);
    }
}
