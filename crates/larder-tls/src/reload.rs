//! TLS configs that are rebuilt from their files while the process runs (SIGHUP in the binary).

use std::fmt;
use std::sync::{Arc, RwLock};

use rustls::{ClientConfig, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::TlsError;

type Build<C> = Box<dyn Fn() -> Result<C, TlsError> + Send + Sync>;

/// A rustls config built from PEM files, rebuilt from them by [`Reloading::reload`]. Each
/// handshake uses the config current when it starts; established connections keep theirs.
///
/// The whole config is rebuilt, not only the certificate, for two reasons. The CA files can
/// change too (a CA rotation). And a config owns its TLS session cache: a resumed TLS 1.3 session
/// presents no certificate and keeps the identity it was first established with, so with the old
/// cache a client would go on presenting its old certificate on "new" connections, and a server
/// would go on admitting a client whose CA it no longer trusts. A fresh config resumes nothing.
pub struct Reloading<C> {
    build: Build<C>,
    current: RwLock<Arc<C>>,
}

impl<C> Reloading<C> {
    /// Builds the config now; fails if a file is unreadable or a key does not match.
    pub(crate) fn new(
        build: impl Fn() -> Result<C, TlsError> + Send + Sync + 'static,
    ) -> Result<Reloading<C>, TlsError> {
        let current = RwLock::new(Arc::new(build()?));
        Ok(Reloading {
            build: Box::new(build),
            current,
        })
    }

    /// Reads the files again. On any error the previous config stays in use, so a half-written
    /// file during a rotation never takes a listener or a pool down.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = Arc::new((self.build)()?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    /// The config new handshakes use.
    pub fn current(&self) -> Arc<C> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Reloading<ServerConfig> {
    /// An acceptor for one new connection (cheap: the config is shared).
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current())
    }
}

impl Reloading<ClientConfig> {
    /// A connector for one new connection (cheap: the config is shared).
    pub fn connector(&self) -> TlsConnector {
        TlsConnector::from(self.current())
    }
}

impl<C> fmt::Debug for Reloading<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading").finish_non_exhaustive()
    }
}
