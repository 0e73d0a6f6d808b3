//! The TLS port and the mutual-TLS internal hop, driven by curl and rustls clients against a real
//! cluster: ALPN picks the protocol, only HTTP/2-grade TLS is offered, plain TCP fails cleanly,
//! certificates reload on SIGHUP, and storage nodes serve only holders of a cluster certificate.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::certs::Ca;
use common::{curl, file_with, random_bytes, Cluster};
use larder_tls::rustls::pki_types::{CertificateDer, ServerName};
use larder_tls::rustls::{ClientConfig, RootCertStore};
use larder_tls::{load_certs, load_key, TlsConnector};

#[test]
fn https_port_serves_both_protocols_by_alpn_over_mutual_tls_storage() {
    let cluster = Cluster::start_tls(3, 8, "");
    let dir = cluster.dir.path();
    let ca = cluster.certs.as_ref().unwrap().ca_path();
    let data = random_bytes(100_000);
    let file = format!("@{}", file_with(dir, &data));
    // Upload over HTTPS (h2 by ALPN); the frontend writes to storage over mutual TLS.
    let put = curl(
        dir,
        &[
            "--cacert",
            &ca,
            "--http2",
            "--data-binary",
            &file,
            &cluster.https_url("/v1/blobs"),
        ],
    );
    assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
    assert_eq!(put.version, "HTTP/2");
    let id = put.json()["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/blobs/{id}");
    // curl --http1.1 offers only http/1.1 in ALPN and must get HTTP/1.1.
    for (flag, version) in [("--http2", "HTTP/2"), ("--http1.1", "HTTP/1.1")] {
        let get = curl(dir, &["--cacert", &ca, flag, &cluster.https_url(&path)]);
        assert_eq!(get.status, 200);
        assert_eq!(get.version, version, "{flag}");
        assert_eq!(get.body, data);
    }
    // The cleartext port keeps serving HTTP/1.1 and h2c prior knowledge.
    for (flag, version) in [
        ("--http2-prior-knowledge", "HTTP/2"),
        ("--http1.1", "HTTP/1.1"),
    ] {
        let get = curl(dir, &[flag, &cluster.url(&path)]);
        assert_eq!((get.status, get.version.as_str()), (200, version));
        assert_eq!(get.body, data);
    }
}

#[test]
fn alpn_choice_is_what_the_client_offered() {
    let cluster = Cluster::start_tls(3, 4, "");
    let ca = cluster.certs.as_ref().unwrap().ca_path();
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (offer, expected) in [
        (
            vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            Some(b"h2".to_vec()),
        ),
        (vec![b"http/1.1".to_vec()], Some(b"http/1.1".to_vec())),
        (vec![], None),
    ] {
        let config = client_config(&ca, offer.clone(), None);
        let addr = cluster.tls_addr.unwrap();
        let negotiated = rt.block_on(async {
            let tls = connect(config, addr).await.unwrap();
            tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec)
        });
        assert_eq!(negotiated, expected, "offered {offer:?}");
    }
}

#[test]
fn only_http2_grade_tls_is_accepted() {
    let cluster = Cluster::start_tls(3, 4, "");
    let ca = cluster.certs.as_ref().unwrap().ca_path();
    let url = cluster.https_url("/healthz");
    let ok = |args: &[&str]| {
        Command::new("curl")
            .args([
                "-sS",
                "-o",
                "/dev/null",
                "--max-time",
                "10",
                "--cacert",
                &ca,
            ])
            .args(args)
            .arg(&url)
            .status()
            .unwrap()
            .success()
    };
    assert!(ok(&["--tlsv1.3"]), "TLS 1.3");
    assert!(
        ok(&["--tlsv1.2", "--tls-max", "1.2"]),
        "TLS 1.2 with an ECDHE AEAD suite"
    );
    assert!(
        !ok(&["--tlsv1", "--tls-max", "1.1"]),
        "TLS 1.1 must be refused"
    );
    // A TLS 1.2 suite on HTTP/2's block list (no forward secrecy, CBC).
    assert!(
        !ok(&["--tls-max", "1.2", "--ciphers", "AES128-SHA"]),
        "blocked suite must be refused"
    );
}

#[test]
fn plain_tcp_on_the_tls_port_fails_fast_instead_of_hanging() {
    let cluster = Cluster::start_tls(3, 4, "");
    let mut stream = std::net::TcpStream::connect(cluster.tls_addr.unwrap()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let started = Instant::now();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    // The server answers with at most a TLS alert and closes: read ends with EOF (or a reset),
    // not with the 5 s timeout.
    let result = stream.read_to_end(&mut answer);
    if let Err(err) = &result {
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        !answer.starts_with(b"HTTP/"),
        "plaintext answer on the TLS port"
    );
    // curl sees a protocol failure too, and the server is still fine afterwards.
    let status = Command::new("curl")
        .args(["-sS", "--max-time", "5", "-o", "/dev/null"])
        .arg(format!("http://{}/healthz", cluster.tls_addr.unwrap()))
        .status()
        .unwrap();
    assert!(!status.success());
    let ca = cluster.certs.as_ref().unwrap().ca_path();
    let ok = curl(
        cluster.dir.path(),
        &["--cacert", &ca, &cluster.https_url("/healthz")],
    );
    assert_eq!(ok.status, 200);
}

#[test]
fn sighup_reloads_the_certificate_without_dropping_the_port() {
    let cluster = Cluster::start_tls(3, 4, "");
    let certs = cluster.certs.as_ref().unwrap();
    let ca = certs.ca_path();
    let addr = cluster.tls_addr.unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let served = |rt: &tokio::runtime::Runtime| -> CertificateDer<'static> {
        rt.block_on(async {
            let tls = connect(client_config(&ca, vec![b"h2".to_vec()], None), addr)
                .await
                .unwrap();
            tls.get_ref().1.peer_certificates().unwrap()[0]
                .clone()
                .into_owned()
        })
    };
    let before = served(&rt);
    // A broken file first: the reload fails and the old certificate stays.
    std::fs::write(certs.dir.join("frontend.pem"), "not a certificate").unwrap();
    signal_frontend(&cluster, 1);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        served(&rt),
        before,
        "a failed reload keeps the old certificate"
    );
    // Then a new certificate: new handshakes get it.
    let rotated = certs
        .ca
        .leaf(&["localhost", "127.0.0.1"], "frontend, rotated");
    rotated.write(&certs.dir, "frontend");
    signal_frontend(&cluster, 1);
    let fresh = load_certs(&certs.dir.join("frontend.pem")).unwrap()[0].clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while served(&rt) != fresh {
        assert!(Instant::now() < deadline, "certificate never reloaded");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_ne!(fresh, before);
}

#[test]
fn storage_nodes_serve_only_clients_with_a_cluster_certificate() {
    let cluster = Cluster::start_tls(3, 4, "");
    let certs = cluster.certs.as_ref().unwrap();
    let ca = certs.ca_path();
    let node = cluster.node_addr(0);
    let stranger = Ca::new("Some other CA").leaf(&["larder-frontend"], "intruder");
    let (stranger_cert, stranger_key) = stranger.write(cluster.dir.path(), "stranger");
    let member = (
        certs.dir.join("frontend-client.pem"),
        certs.dir.join("frontend-client-key.pem"),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let health = |identity| {
            let config = client_config(&ca, vec![b"h2".to_vec()], identity);
            async move { internal_health(config, node).await }
        };
        assert_eq!(
            health(Some(member)).await,
            Ok(200),
            "a cluster member is served"
        );
        assert!(
            health(None).await.is_err(),
            "a client without a certificate must be refused"
        );
        assert!(
            health(Some((stranger_cert, stranger_key))).await.is_err(),
            "a certificate from another CA must be refused"
        );
    });
    // And cleartext h2c to a TLS storage node gets nothing either.
    let status = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            "--http2-prior-knowledge",
            "-o",
            "/dev/null",
        ])
        .arg(format!("http://{node}/internal/v1/health"))
        .status()
        .unwrap();
    assert!(!status.success());
}

fn signal_frontend(cluster: &Cluster, sig: i32) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(cluster.frontend_pid().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

fn client_config(
    ca: &str,
    alpn: Vec<Vec<u8>>,
    identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(std::path::Path::new(ca)).unwrap() {
        roots.add(cert).unwrap();
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(larder_tls::provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(&cert).unwrap(), load_key(&key).unwrap())
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn;
    config
}

async fn connect(
    config: ClientConfig,
    addr: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::IpAddress(addr.ip().into());
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// GET /internal/v1/health over h2 on a fresh mutual-TLS connection: the status, or why not.
async fn internal_health(config: ClientConfig, addr: SocketAddr) -> Result<u16, String> {
    use http_body_util::Empty;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let tls = connect(config, addr).await.map_err(|e| e.to_string())?;
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake::<_, _, Empty<bytes::Bytes>>(
            TokioExecutor::new(),
            TokioIo::new(tls),
        )
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let request = http::Request::get(format!("https://{addr}/internal/v1/health"))
        .body(Empty::new())
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), sender.send_request(request))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(response.status().as_u16())
}
