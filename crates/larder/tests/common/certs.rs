//! Test certificates made with rcgen: a cluster CA, the leaves a TLS cluster needs, and a second
//! CA to play the stranger.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM text.
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    pub fn leaf(&self, names: &[&str], common_name: &str) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer).unwrap().pem();
        Leaf {
            cert,
            key: key.serialize_pem(),
        }
    }
}

impl Leaf {
    /// Writes `<name>.pem` and `<name>-key.pem` into `dir`; returns both paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}-key.pem"));
        std::fs::write(&cert, &self.cert).unwrap();
        std::fs::write(&key, &self.key).unwrap();
        (cert, key)
    }
}

/// The files of a TLS cluster, all under `<dir>/tls/`.
pub struct ClusterCerts {
    pub ca: Ca,
    pub dir: PathBuf,
}

impl ClusterCerts {
    pub fn write(root: &Path) -> ClusterCerts {
        let dir = root.join("tls");
        std::fs::create_dir_all(&dir).unwrap();
        let ca = Ca::new("Larder test CA");
        std::fs::write(dir.join("ca.pem"), &ca.pem).unwrap();
        ca.leaf(&["localhost", "127.0.0.1"], "frontend")
            .write(&dir, "frontend");
        ca.leaf(&["larder-frontend"], "frontend-client")
            .write(&dir, "frontend-client");
        ca.leaf(&["127.0.0.1"], "storage").write(&dir, "storage");
        ClusterCerts { ca, dir }
    }

    pub fn ca_path(&self) -> String {
        self.dir.join("ca.pem").display().to_string()
    }
}

/// The config sections that turn TLS on, with paths relative to the config files.
pub const STORAGE_TLS: &str =
    "\n[tls]\nca = \"tls/ca.pem\"\ncert = \"tls/storage.pem\"\nkey = \"tls/storage-key.pem\"\n";
pub const STORAGE_POOL_TLS: &str = "\n[pool.tls]\nca = \"tls/ca.pem\"\ncert = \"tls/storage.pem\"\nkey = \"tls/storage-key.pem\"\n";
pub const POOL_TLS: &str = "\n[pool.tls]\nca = \"tls/ca.pem\"\ncert = \"tls/frontend-client.pem\"\nkey = \"tls/frontend-client-key.pem\"\n";

pub fn frontend_tls(listen: std::net::SocketAddr) -> String {
    format!("\n[tls]\nlisten = \"{listen}\"\ncert = \"tls/frontend.pem\"\nkey = \"tls/frontend-key.pem\"\n")
}
