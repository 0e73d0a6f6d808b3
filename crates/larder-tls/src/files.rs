//! The `[tls]` section shared by the storage node and the storage client.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Mutual TLS between frontends and storage nodes: this side's certificate and key, and the
/// cluster CA that the other side's certificate must chain to.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MutualTls {
    /// PEM file with the cluster CA certificate(s): the only roots trusted on the internal hop.
    pub ca: PathBuf,
    /// PEM file with this side's certificate chain (leaf first).
    pub cert: PathBuf,
    /// PEM file with this side's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl MutualTls {
    /// Resolves relative paths against `base` (the directory of the config file).
    pub fn relative_to(&mut self, base: &Path) {
        for path in [&mut self.ca, &mut self.cert, &mut self.key] {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        }
    }
}
