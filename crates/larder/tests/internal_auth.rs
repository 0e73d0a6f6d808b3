//! The storage nodes' internal port serves nobody without credentials: not curl (HTTP/2 or
//! HTTP/1.1), not a client with a wrong secret, not a replayed handshake. A node with neither
//! `[tls]` nor a secret refuses to start unless told so; the secret rotates with SIGHUP while the
//! cluster serves; `/v1/cluster` does not show internal addresses.

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::{
    curl, file_with, free_addresses, signal, wait_for_port, wait_timeout, Cluster, Reaped, LARDER,
};
use larder_auth::{Secret, Secrets};
use larder_cluster::{init_map, BlobId, BlobKind, LayoutSpec};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

const SIGHUP: i32 = 1;

/// Runs curl against a storage node's internal port; true if it got any HTTP answer at all.
fn curl_answers(args: &[&str]) -> bool {
    Command::new("curl")
        .args(["-sS", "--max-time", "10", "-o", "/dev/null"])
        .stderr(Stdio::null())
        .args(args)
        .status()
        .expect("curl is installed")
        .success()
}

#[test]
fn dev_cluster_internal_port_serves_nothing_without_credentials() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("larder-data");
    // A data dir from before credentials existed: a map, no secret.
    std::fs::create_dir_all(&data_dir).unwrap();
    let spec = LayoutSpec {
        datacenters: vec!["dc1".into()],
        node_addresses: free_addresses(3),
        partitions: 4,
        replicas_per_datacenter: 3,
    };
    init_map(&spec)
        .unwrap()
        .save(&data_dir.join("cluster.toml"))
        .unwrap();
    let listen = free_addresses(1)[0];
    let mut dev = Reaped(
        Command::new(LARDER)
            .args(["dev", "--data-dir", &data_dir.display().to_string()])
            .args(["--listen", &listen.to_string()])
            .env("LARDER_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_port(listen);

    let secret = data_dir.join("cluster.secret");
    let mode = std::fs::metadata(&secret).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the secret is private");
    let map = std::fs::read_to_string(data_dir.join("cluster.toml")).unwrap();
    let hex = std::fs::read_to_string(&secret).unwrap();
    assert!(!map.contains(hex.trim()), "the secret is not in the map");

    let dir = tmp.path();
    let file = format!("@{}", file_with(dir, b"kept"));
    let created = curl(
        dir,
        &["--data-binary", &file, &format!("http://{listen}/v1/blobs")],
    );
    assert_eq!(created.status, 201);
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let parsed: BlobId = id.parse().unwrap();
    let planted = BlobId::mint(BlobKind::Simple, 1, parsed.partition).to_string();
    let plant_file = format!("@{}", file_with(dir, b"planted"));

    let addresses: Vec<SocketAddr> = spec.node_addresses.clone();
    for node in &addresses {
        let base = format!("http://{node}");
        let blob = format!("{base}{}", larder_proto::blob_path(parsed.partition, &id));
        let plant = format!(
            "{base}{}",
            larder_proto::blob_path(parsed.partition, &planted)
        );
        let changes = format!("{base}/internal/v1/partitions/{}/changes", parsed.partition);
        for protocol in ["--http2-prior-knowledge", "--http1.1"] {
            for args in [
                vec![protocol, blob.as_str()],
                vec![protocol, changes.as_str()],
                vec![protocol, "-X", "DELETE", blob.as_str()],
                vec![
                    protocol,
                    "-X",
                    "PUT",
                    "--data-binary",
                    &plant_file,
                    plant.as_str(),
                ],
            ] {
                assert!(!curl_answers(&args), "{args:?} was served");
            }
        }
    }
    // Nothing was deleted, nothing was planted.
    let url = |id: &str| format!("http://{listen}/v1/blobs/{id}");
    let kept = curl(dir, &[&url(&id)]);
    assert_eq!(
        (kept.status, kept.body.as_slice()),
        (200, b"kept".as_slice())
    );
    assert_eq!(curl(dir, &[&url(&planted)]).status, 404);

    signal(&dev.0, common::libc_sigterm());
    let status = wait_timeout(&mut dev.0, Duration::from_secs(40)).expect("larder dev stops");
    assert!(status.success(), "{status}");
}

/// An `AsyncRead + AsyncWrite` that keeps a copy of everything written through it.
struct Recorder {
    inner: TcpStream,
    written: Vec<u8>,
}

impl AsyncRead for Recorder {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Recorder {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = poll {
            this.written.extend_from_slice(&buf[..n]);
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Whether a client holding `secrets` passes the handshake with the node at `addr`.
async fn handshake_passes(addr: SocketAddr, secrets: &Secrets) -> bool {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    larder_auth::connect(&mut stream, secrets, Duration::from_secs(5))
        .await
        .is_ok()
}

/// True once the node closed the connection (EOF or reset) without sending anything more.
async fn closed_without_answer(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await;
    matches!(read, Ok(Ok(0)) | Ok(Err(_)))
}

fn one_secret() -> Secrets {
    Secrets::new(Secret::generate().unwrap(), [])
}

fn refusals(metrics: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with("larder_storage_internal_auth_refusals_total{reason=\"refused\"}"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .expect("the refusal counter is exported")
}

#[test]
fn wrong_secrets_and_replayed_handshakes_are_refused_and_the_cluster_view_hides_addresses() {
    let cluster = Cluster::start(3, 4);
    let node = cluster.node_addr(0);
    let right = Secrets::load(&cluster.dir.path().join(common::SECRET_FILE)).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        // The right secret: served (a control for everything below).
        let client = cluster.node_client(node).await;
        let (status, _) = client
            .request(
                http::Method::GET,
                larder_proto::HEALTH_PATH,
                Default::default(),
            )
            .await;
        assert_eq!(status, 200);

        // A wrong secret: the node closes the connection, and never proves itself.
        assert!(!handshake_passes(node, &one_secret()).await);

        // A genuine client message, recorded, replayed on a new connection.
        let mut recorder = Recorder {
            inner: TcpStream::connect(node).await.unwrap(),
            written: Vec::new(),
        };
        larder_auth::connect(&mut recorder, &right, Duration::from_secs(5))
            .await
            .unwrap();
        let mut replay = TcpStream::connect(node).await.unwrap();
        let mut hello = [0u8; 40];
        replay.read_exact(&mut hello).await.unwrap();
        replay.write_all(&recorder.written).await.unwrap();
        // Then what a real client would send next (the node may have closed already).
        let _ = replay.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
        assert!(
            closed_without_answer(&mut replay).await,
            "a replayed handshake was accepted"
        );

        let (_, metrics) = client
            .request(
                http::Method::GET,
                larder_proto::METRICS_PATH,
                Default::default(),
            )
            .await;
        assert!(refusals(std::str::from_utf8(&metrics).unwrap()) >= 2);
    });

    let view = curl(cluster.dir.path(), &[&cluster.url("/v1/cluster")]);
    assert_eq!(view.status, 200);
    let text = String::from_utf8(view.body.clone()).unwrap();
    for node in &cluster.map.nodes {
        assert!(!text.contains(&node.address.to_string()), "{text}");
        assert!(!text.contains(&node.address.port().to_string()), "{text}");
    }
    for node in view.json()["nodes"].as_array().unwrap() {
        assert!(
            node["id"].is_string() && node["datacenter"].is_string() && node["state"].is_string()
        );
        assert!(node.get("address").is_none(), "{node}");
    }
}

/// Starts `larder storage` with `auth` as its `[auth]` section (or none); returns the child.
fn storage_node(dir: &Path, auth: &str) -> (Reaped, SocketAddr) {
    let addr = free_addresses(1)[0];
    let spec = LayoutSpec {
        datacenters: vec!["dc1".into()],
        node_addresses: vec![addr],
        partitions: 1,
        replicas_per_datacenter: 1,
    };
    let map = init_map(&spec).unwrap();
    map.save(&dir.join("cluster.toml")).unwrap();
    let config = dir.join("s.toml");
    let text = format!(
        "node_id = {:?}\ncluster_map = \"cluster.toml\"\ndata_dir = \"data\"\n{auth}",
        map.nodes[0].id
    );
    std::fs::write(&config, text).unwrap();
    let child = Command::new(LARDER)
        .args(["storage", "--config", &config.display().to_string()])
        .env("LARDER_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (Reaped(child), addr)
}

fn stderr_of(child: &mut Reaped) -> String {
    let mut text = String::new();
    std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut text).unwrap();
    text
}

#[test]
fn a_node_without_credentials_refuses_to_start_unless_told_it_is_insecure() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, _) = storage_node(tmp.path(), "");
    let status = wait_timeout(&mut child.0, Duration::from_secs(30))
        .expect("a node without credentials exits");
    assert!(!status.success());
    let stderr = stderr_of(&mut child);
    for needle in [
        "secret_file",
        "[tls]",
        "insecure_unauthenticated_internal_api",
        "anyone",
    ] {
        assert!(stderr.contains(needle), "{needle} not in {stderr}");
    }

    let tmp = tempfile::tempdir().unwrap();
    let (mut child, addr) = storage_node(
        tmp.path(),
        "[auth]\ninsecure_unauthenticated_internal_api = true\n",
    );
    wait_for_port(addr);
    let health = format!("http://{addr}{}", larder_proto::HEALTH_PATH);
    let served = curl_answers(&["--http2-prior-knowledge", "--fail", &health]);
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    assert!(served, "the insecure mode serves without credentials");
    assert!(stderr_of(&mut child).contains("insecure_unauthenticated_internal_api"));
}

/// Writes `secrets` (first signs) to the cluster's secret file and SIGHUPs every process.
fn rotate(cluster: &mut Cluster, secrets: &[&Secret]) {
    let text: String = secrets
        .iter()
        .map(|s| format!("{}\n", s.to_hex()))
        .collect();
    std::fs::write(cluster.dir.path().join(common::SECRET_FILE), text).unwrap();
    for i in 0..cluster.map.nodes.len() {
        cluster.signal_node(i, SIGHUP);
    }
    signal(cluster.frontend_mut(), SIGHUP);
}

/// Waits until every node admits (or refuses) `secrets`, as its SIGHUP takes effect.
async fn wait_for_nodes(cluster: &Cluster, secrets: &Secrets, admitted: bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    for i in 0..cluster.map.nodes.len() {
        while handshake_passes(cluster.node_addr(i), secrets).await != admitted {
            assert!(Instant::now() < deadline, "node {i} never changed its mind");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A blob stored and read back through the frontend.
fn round_trip(cluster: &Cluster, data: &[u8]) {
    let dir = cluster.dir.path();
    let file = format!("@{}", file_with(dir, data));
    let created = curl(dir, &["--data-binary", &file, &cluster.url("/v1/blobs")]);
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let id = created.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        curl(dir, &[&cluster.url(&format!("/v1/blobs/{id}"))]).body,
        data
    );
}

#[test]
fn the_secret_rotates_with_sighup_while_the_cluster_serves() {
    let mut cluster = Cluster::start(3, 4);
    let old = Secrets::load(&cluster.dir.path().join(common::SECRET_FILE)).unwrap();
    let old_secret = old.signing().clone();
    let new_secret = Secret::generate().unwrap();
    let new = Secrets::new(new_secret.clone(), []);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    round_trip(&cluster, b"before");
    assert!(!runtime.block_on(handshake_passes(cluster.node_addr(0), &new)));

    // 1. The new secret as a second line everywhere: both are accepted.
    rotate(&mut cluster, &[&old_secret, &new_secret]);
    runtime.block_on(wait_for_nodes(&cluster, &new, true));
    runtime.block_on(wait_for_nodes(&cluster, &old, true));
    round_trip(&cluster, b"both accepted");

    // 2. The new one first: it signs. 3. The old one removed: refused.
    rotate(&mut cluster, &[&new_secret, &old_secret]);
    round_trip(&cluster, b"new signs");
    rotate(&mut cluster, &[&new_secret]);
    runtime.block_on(wait_for_nodes(&cluster, &old, false));
    round_trip(&cluster, b"old removed");

    // The frontend's open connections stay authenticated; restarted nodes make it reconnect,
    // which works only if it now proves the new secret.
    for i in 0..3 {
        cluster.stop_node(i);
        cluster.restart_node(i);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ready = curl(cluster.dir.path(), &[&cluster.url("/readyz")]);
        if ready.json()["reachable_local_nodes"] == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the frontend did not reconnect: {}",
            ready.json()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    round_trip(&cluster, b"after the restarts");
}
