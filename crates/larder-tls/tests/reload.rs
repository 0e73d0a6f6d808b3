//! Reloading mutual-TLS configs from their files: handshakes over an in-memory pipe see the new
//! certificates and CA at once, and a broken file keeps the old config working.

use std::path::Path;

use larder_tls::rustls::pki_types::{CertificateDer, ServerName};
use larder_tls::rustls::{ClientConfig, ServerConfig};
use larder_tls::{load_certs, mutual_client, mutual_server, MutualTls, Reloading};
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};

struct Ca(Issuer<'static, KeyPair>, String);

impl Ca {
    fn new() -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let pem = params.self_signed(&key).unwrap().pem();
        Ca(Issuer::new(params, key), pem)
    }

    /// Writes `<name>.pem` and `<name>-key.pem`: a leaf for 127.0.0.1, client and server use.
    fn leaf(&self, dir: &Path, name: &str) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.0).unwrap().pem();
        std::fs::write(dir.join(format!("{name}.pem")), cert).unwrap();
        std::fs::write(dir.join(format!("{name}-key.pem")), key.serialize_pem()).unwrap();
    }
}

fn files(dir: &Path, ca: &str, name: &str) -> MutualTls {
    MutualTls {
        ca: dir.join(ca),
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}-key.pem")),
    }
}

/// One handshake: the certificate each side saw from the other, or why it failed.
fn handshake(
    server: &Reloading<ServerConfig>,
    client: &Reloading<ClientConfig>,
) -> Result<(CertificateDer<'static>, CertificateDer<'static>), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (a, b) = tokio::io::duplex(64 * 1024);
    let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    rt.block_on(async {
        let (served, connected) = tokio::join!(
            server.acceptor().accept(a),
            client.connector().connect(name, b)
        );
        let served = served.map_err(|e| format!("server: {e}"))?;
        let connected = connected.map_err(|e| format!("client: {e}"))?;
        let client_cert = served.get_ref().1.peer_certificates().unwrap()[0].clone();
        let server_cert = connected.get_ref().1.peer_certificates().unwrap()[0].clone();
        Ok((server_cert, client_cert))
    })
}

fn first_cert(path: &Path) -> CertificateDer<'static> {
    load_certs(path).unwrap().remove(0)
}

#[test]
fn reload_serves_new_certificates_and_keeps_the_old_config_when_files_are_broken() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let ca = Ca::new();
    std::fs::write(dir.join("ca.pem"), &ca.1).unwrap();
    ca.leaf(dir, "server");
    ca.leaf(dir, "client");
    let server = mutual_server(&files(dir, "ca.pem", "server")).unwrap();
    let client = mutual_client(&files(dir, "ca.pem", "client")).unwrap();
    let (old_server, old_client) = handshake(&server, &client).unwrap();

    std::fs::write(dir.join("server.pem"), "not a certificate").unwrap();
    std::fs::write(dir.join("client-key.pem"), "not a key").unwrap();
    assert!(server.reload().is_err());
    assert!(client.reload().is_err());
    assert_eq!(
        handshake(&server, &client).unwrap(),
        (old_server.clone(), old_client.clone()),
        "a failed reload keeps the old configs"
    );

    ca.leaf(dir, "server");
    ca.leaf(dir, "client");
    server.reload().unwrap();
    client.reload().unwrap();
    let (new_server, new_client) = handshake(&server, &client).unwrap();
    assert_eq!(new_server, first_cert(&dir.join("server.pem")));
    assert_eq!(new_client, first_cert(&dir.join("client.pem")));
    assert_ne!(new_server, old_server);
    assert_ne!(new_client, old_client);
}

#[test]
fn a_reloaded_ca_decides_which_clients_are_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (old_ca, new_ca) = (Ca::new(), Ca::new());
    std::fs::write(dir.join("old-ca.pem"), &old_ca.1).unwrap();
    std::fs::write(dir.join("server-ca.pem"), &old_ca.1).unwrap();
    old_ca.leaf(dir, "server");
    new_ca.leaf(dir, "client");
    let server = mutual_server(&files(dir, "server-ca.pem", "server")).unwrap();
    let client = mutual_client(&files(dir, "old-ca.pem", "client")).unwrap();
    assert!(
        handshake(&server, &client).is_err(),
        "a client from a CA the server does not trust is refused"
    );
    // Trust both CAs during the rotation: the new client is admitted without a restart.
    std::fs::write(
        dir.join("server-ca.pem"),
        format!("{}{}", old_ca.1, new_ca.1),
    )
    .unwrap();
    server.reload().unwrap();
    handshake(&server, &client).unwrap();
}
