//! The TLS port and the mutual-TLS internal hop, driven by curl and rustls clients against a real
//! cluster: ALPN picks the protocol, only HTTP/2-grade TLS is offered, plain TCP fails cleanly,
//! certificates reload on SIGHUP, and storage nodes serve only holders of a cluster certificate.

mod common;

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use common::certs::Ca;
use common::metrics::{scrape_frontend, wait_for};
use common::tls::{client_config, connect, internal_get, member_identity, served_certificate};
use common::{curl, file_with, random_bytes, Cluster};
use larder_tls::load_certs;

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
    let served = || served_certificate(client_config(&ca, vec![b"h2".to_vec()], None), addr);
    let before = served();
    // A broken file first: the reload fails and the old certificate stays.
    std::fs::write(certs.dir.join("frontend.pem"), "not a certificate").unwrap();
    signal_frontend(&cluster, 1);
    wait_for_frontend(
        &cluster,
        &[(PUBLIC_RELOADS_FAILED, 1.0), (PUBLIC_RELOADS_OK, 0.0)],
    );
    assert_eq!(
        served(),
        before,
        "a failed reload keeps the old certificate"
    );
    // Then a new certificate: new handshakes get it.
    let rotated = certs
        .ca
        .leaf(&["localhost", "127.0.0.1"], "frontend, rotated");
    rotated.write(&certs.dir, "frontend");
    signal_frontend(&cluster, 1);
    wait_for_frontend(&cluster, &[(PUBLIC_RELOADS_OK, 1.0)]);
    let fresh = load_certs(&certs.dir.join("frontend.pem")).unwrap()[0].clone();
    assert_eq!(served(), fresh);
    assert_ne!(fresh, before);
}

#[test]
fn storage_node_sighup_reloads_its_certificate_and_keeps_the_old_one_when_broken() {
    let cluster = Cluster::start_tls(3, 4, "");
    let certs = cluster.certs.as_ref().unwrap();
    let ca = certs.ca_path();
    let node = cluster.node_addr(0);
    let member = || client_config(&ca, vec![b"h2".to_vec()], Some(member_identity(certs)));
    let before = served_certificate(member(), node);
    // Every node serves storage.pem; only node 0 is told to reload it.
    std::fs::write(certs.dir.join("storage.pem"), "not a certificate").unwrap();
    cluster.signal_node(0, 1);
    wait_for_storage(&cluster, 0, &member, &[(SERVER_RELOADS_FAILED, 1.0)]);
    assert_eq!(
        served_certificate(member(), node),
        before,
        "a failed reload keeps the old certificate"
    );
    let rotated = certs.ca.leaf(&["127.0.0.1"], "storage, rotated");
    rotated.write(&certs.dir, "storage");
    cluster.signal_node(0, 1);
    wait_for_storage(&cluster, 0, &member, &[(SERVER_RELOADS_OK, 1.0)]);
    let fresh = load_certs(&certs.dir.join("storage.pem")).unwrap()[0].clone();
    // served_certificate verified it against the cluster CA for the node's IP address, as the
    // frontend's pool does.
    assert_eq!(served_certificate(member(), node), fresh);
    assert_ne!(fresh, before);
}

#[test]
fn after_sighup_new_pool_connections_present_the_frontends_new_client_certificate() {
    let mut cluster = Cluster::start_tls(3, 4, "");
    let dir = cluster.dir.path().to_path_buf();
    let tls_dir = cluster.certs.as_ref().unwrap().dir.clone();
    let ca_path = cluster.certs.as_ref().unwrap().ca_path();
    let old_ca = std::fs::read_to_string(&ca_path).unwrap();
    // Reading the storage nodes' metrics as a storage node (whose certificate does not change).
    let peer = || {
        let identity = (tls_dir.join("storage.pem"), tls_dir.join("storage-key.pem"));
        client_config(&ca_path, vec![b"h2".to_vec()], Some(identity))
    };
    let put = |cluster: &Cluster| {
        let file = format!("@{}", file_with(&dir, &random_bytes(1000)));
        curl(&dir, &["--data-binary", &file, &cluster.url("/v1/blobs")]).status
    };
    assert_eq!(put(&cluster), 201);
    // Rotate the frontend's client certificate to one from a new CA, and reload the frontend.
    let new_ca = Ca::new("Larder test CA, next");
    new_ca
        .leaf(&["larder-frontend"], "frontend-client, next")
        .write(&tls_dir, "frontend-client");
    signal_frontend(&cluster, 1);
    wait_for_frontend(&cluster, &[(POOL_RELOADS_OK, 1.0)]);
    // Restarted storage nodes (which trust only the old CA) force new pool connections: they
    // present the new certificate, so they are refused.
    for i in 0..3 {
        cluster.kill_node(i);
        cluster.restart_node(i);
    }
    // Longer than the pool's reconnect backoff and the router's down period, so that the
    // frontend has opened fresh connections to every node by the end.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        let refused = put(&cluster);
        assert!(
            refused >= 500,
            "storage nodes that do not trust the new CA must refuse the frontend, got {refused}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // The rotation's middle step: storage nodes trust both CAs, by SIGHUP, without a restart.
    std::fs::write(&ca_path, format!("{old_ca}{}", new_ca.pem)).unwrap();
    for i in 0..3 {
        cluster.signal_node(i, 1);
        wait_for_storage(&cluster, i, &peer, &[(SERVER_RELOADS_OK, 1.0)]);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while put(&cluster) != 201 {
        assert!(
            Instant::now() < deadline,
            "the frontend never wrote again with its new certificate"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn storage_nodes_serve_only_clients_with_a_cluster_certificate() {
    let cluster = Cluster::start_tls(3, 4, "");
    let certs = cluster.certs.as_ref().unwrap();
    let ca = certs.ca_path();
    let node = cluster.node_addr(0);
    let stranger = Ca::new("Some other CA").leaf(&["larder-frontend"], "intruder");
    let (stranger_cert, stranger_key) = stranger.write(cluster.dir.path(), "stranger");
    let member = member_identity(certs);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let health = |identity| {
            let config = client_config(&ca, vec![b"h2".to_vec()], identity);
            async move {
                internal_get(config, node, "/internal/v1/health")
                    .await
                    .map(|(status, _)| status)
            }
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

const PUBLIC_RELOADS_OK: &str =
    r#"larder_frontend_certificate_reloads_total{certificate="public",result="ok"}"#;
const PUBLIC_RELOADS_FAILED: &str =
    r#"larder_frontend_certificate_reloads_total{certificate="public",result="failed"}"#;
const POOL_RELOADS_OK: &str =
    r#"larder_frontend_certificate_reloads_total{certificate="pool",result="ok"}"#;
const SERVER_RELOADS_OK: &str =
    r#"larder_storage_certificate_reloads_total{certificate="server",result="ok"}"#;
const SERVER_RELOADS_FAILED: &str =
    r#"larder_storage_certificate_reloads_total{certificate="server",result="failed"}"#;

/// Waits until the frontend's /metrics shows `expected` (a reload has been handled).
fn wait_for_frontend(cluster: &Cluster, expected: &[(&str, f64)]) {
    wait_for(|| scrape_frontend(cluster.frontend_addr), expected);
}

/// Waits until storage node `i`'s /internal/v1/metrics, read over mutual TLS with `config()`,
/// shows `expected`.
fn wait_for_storage(
    cluster: &Cluster,
    i: usize,
    config: &dyn Fn() -> larder_tls::rustls::ClientConfig,
    expected: &[(&str, f64)],
) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr = cluster.node_addr(i);
    wait_for(
        || {
            let answer = rt.block_on(internal_get(config(), addr, "/internal/v1/metrics"));
            answer.ok().map(|(_, body)| body)
        },
        expected,
    );
}

#[test]
fn larder_feed_put_get_and_delete_speak_https_with_the_given_ca() {
    let cluster = Cluster::start_tls(3, 4, "");
    let dir = cluster.dir.path();
    let ca = cluster.certs.as_ref().unwrap().ca_path();
    let larder = |args: &[&str], stdin: &str| {
        let mut child = Command::new(common::LARDER)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let endpoint = cluster.https_url("/");
    let docs: String = (0..20)
        .map(|i| format!("{{\"put\":\"id:t:doc::{i}\",\"fields\":{{\"n\":{i}}}}}\n"))
        .collect();
    let fed = larder(
        &[
            "feed",
            "--endpoint",
            &endpoint,
            "--ca-certificates",
            &ca,
            "--stdin",
            "--json",
        ],
        &docs,
    );
    assert!(
        fed.status.success(),
        "{}",
        String::from_utf8_lossy(&fed.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&fed.stdout).unwrap();
    assert_eq!(summary["succeeded"], 20, "{summary}");
    let got = curl(
        dir,
        &[
            "--cacert",
            &ca,
            &cluster.https_url("/document/v1/t/doc/docid/7"),
        ],
    );
    assert_eq!(got.status, 200, "{}", String::from_utf8_lossy(&got.body));
    assert_eq!(got.json()["fields"]["n"], 7);

    // Without the CA, the throwaway certificate is not trusted: a clear failure, nothing fed.
    let refused = larder(&["feed", "--endpoint", &endpoint, "--stdin"], &docs);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("certificate"), "{stderr}");

    // larder put / get / delete over the same port.
    let data = random_bytes(300_000);
    let input = file_with(dir, &data);
    let base = endpoint.trim_end_matches('/');
    let tls_args = ["--endpoint", base, "--ca-certificates", &ca];
    let put = larder(
        &[&["put", &input, "--no-progress"], &tls_args[..]].concat(),
        "",
    );
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let id = String::from_utf8(put.stdout).unwrap().trim().to_owned();
    let output = dir.join("fetched.bin");
    let output = output.to_str().unwrap();
    let get = larder(&[&["get", &id, "-o", output], &tls_args[..]].concat(), "");
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    assert_eq!(std::fs::read(output).unwrap(), data);
    let delete = larder(&[&["delete", &id], &tls_args[..]].concat(), "");
    assert!(delete.status.success());
    let gone = curl(
        dir,
        &[
            "--cacert",
            &ca,
            &cluster.https_url(&format!("/v1/blobs/{id}")),
        ],
    );
    assert_eq!(gone.status, 410);
}
