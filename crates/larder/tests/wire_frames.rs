//! What the pool's tuning knobs do on the wire. A storage node and the frontend's pool run in
//! this process with a frame-logging TCP proxy between them that parses the HTTP/2 frame headers
//! going each way, so the test sees the DATA frame sizes actually sent (Ambry configured 4 MB
//! frames and still saw small ones until it raised Netty's write-buffer high-water mark).
//! Also: the `http1-for-comparison` pool mode serves the same public API.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use bytesize::ByteSize;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use larder_cluster::{init_map, BlobId, BlobKind, LayoutSpec};
use larder_pool::{PoolConfig, StoragePool};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PREFACE: usize = 24;
/// The cluster-secret handshake before the first HTTP byte (larder-auth): client → server
/// magic, nonce and proof; server → client magic and nonce, then its proof.
const AUTH_UP: usize = 8 + 32 + 32;
const AUTH_DOWN: usize = 8 + 32 + 32;

/// DATA frame payload sizes seen going to the storage node (`up`) and coming back (`down`).
#[derive(Default)]
struct FrameLog {
    up: Vec<usize>,
    down: Vec<usize>,
}

/// Copies `from` to `to`, logging the length of every DATA frame (type 0) it carries.
async fn copy_logging(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    log: Arc<Mutex<FrameLog>>,
    upstream: bool,
) {
    let mut pending = Vec::new();
    let mut skip = if upstream {
        AUTH_UP + PREFACE
    } else {
        AUTH_DOWN
    };
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        pending.extend_from_slice(&buf[..n]);
        let cut = skip.min(pending.len());
        pending.drain(..cut);
        skip -= cut;
        while pending.len() >= 9 {
            let len = u32::from_be_bytes([0, pending[0], pending[1], pending[2]]) as usize;
            if pending.len() < 9 + len {
                break;
            }
            if pending[3] == 0 {
                let mut log = log.lock().unwrap();
                if upstream { &mut log.up } else { &mut log.down }.push(len);
            }
            pending.drain(..9 + len);
        }
    }
}

async fn proxy(listener: TcpListener, target: SocketAddr, log: Arc<Mutex<FrameLog>>) {
    while let Ok((client, _)) = listener.accept().await {
        let server = TcpStream::connect(target).await.unwrap();
        let (cr, cw) = client.into_split();
        let (sr, sw) = server.into_split();
        tokio::spawn(copy_logging(cr, sw, log.clone(), true));
        tokio::spawn(copy_logging(sr, cw, log.clone(), false));
    }
}

/// Starts a one-node cluster behind a logging proxy; returns the proxy's address and the log.
/// The node requires the cluster secret in `dir` (`secret_file`).
async fn storage_behind_proxy(dir: &std::path::Path) -> (SocketAddr, Arc<Mutex<FrameLog>>) {
    let proxy_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let storage_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_addr = proxy_listener.local_addr().unwrap();
    let spec = LayoutSpec {
        datacenters: vec!["dc1".into()],
        node_addresses: vec![proxy_addr],
        partitions: 1,
        replicas_per_datacenter: 1,
    };
    let map = init_map(&spec).unwrap();
    let mut config = larder_storage::StorageConfig::example();
    config.node_id = map.nodes[0].id.clone();
    config.data_dir = dir.join("s1");
    config.listen = Some(storage_listener.local_addr().unwrap());
    config.store.durability = "relaxed-no-sync-for-benchmarks".into();
    larder_auth::generate_secret_file(&secret_file(dir)).unwrap();
    config.auth.secret_file = Some(secret_file(dir));
    let target = storage_listener.local_addr().unwrap();
    tokio::spawn(larder_storage::serve(
        config,
        map,
        storage_listener,
        larder_storage::Signals::shutdown_only(Box::pin(std::future::pending())),
    ));
    let log = Arc::new(Mutex::new(FrameLog::default()));
    tokio::spawn(proxy(proxy_listener, target, log.clone()));
    (proxy_addr, log)
}

fn secret_file(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("cluster.secret")
}

/// PUTs and GETs one 4 MiB blob through a pool with `pool`; returns the largest DATA frame
/// seen going up and coming down.
async fn largest_frames(
    pool: PoolConfig,
    storage_at: SocketAddr,
    log: &Mutex<FrameLog>,
    dir: &std::path::Path,
) -> (usize, usize) {
    *log.lock().unwrap() = FrameLog::default();
    let credentials = larder_auth::Credentials::load(&secret_file(dir)).unwrap();
    let pool = StoragePool::new(
        [("s1".to_string(), storage_at)],
        pool,
        Some(Arc::new(credentials)),
    )
    .unwrap();
    let data = Bytes::from(vec![5u8; 4 << 20]);
    let key = BlobId::mint(BlobKind::Chunk, 1, 0).to_string();
    let path = format!("/internal/v1/partitions/0/blobs/{key}");
    let put = Request::builder()
        .method(Method::PUT)
        .uri(&path)
        .header("content-length", data.len())
        .header("x-larder-time-ms", 1)
        .body(larder_pool::full(data.clone()))
        .unwrap();
    let response = pool.send("s1", put).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let get = Request::get(&path).body(larder_pool::empty()).unwrap();
    let response = pool.send("s1", get).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, data);
    let log = log.lock().unwrap();
    let max = |v: &Vec<usize>| v.iter().copied().max().unwrap_or(0);
    (max(&log.up), max(&log.down))
}

#[test]
fn configured_frame_sizes_are_what_goes_on_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (addr, log) = storage_behind_proxy(dir.path()).await;
        const MIB: usize = 1 << 20;

        // Defaults: 1 MiB frames both ways (the storage node advertises 1 MiB for uploads, the
        // pool 1 MiB for downloads), with the 4 MiB send buffers not getting in the way.
        let (up, down) = largest_frames(PoolConfig::default(), addr, &log, dir.path()).await;
        assert_eq!((up, down), (MIB, MIB), "default frames");

        // The pool's max_frame_size is what the storage node may send: downloads shrink to it.
        let small_frames = PoolConfig {
            max_frame_size: ByteSize::kib(16),
            ..PoolConfig::default()
        };
        let (up, down) = largest_frames(small_frames, addr, &log, dir.path()).await;
        assert_eq!((up, down), (MIB, 16 * 1024), "16 KiB receive frames");

        // Netty's write-buffer high-water mark capped Ambry's frames; h2's send buffer does
        // not: with a 64 KiB send buffer, uploads still go out in 1 MiB frames (it only bounds
        // how much of a stream h2 buffers before the body producer must wait).
        let small_buffer = PoolConfig {
            max_send_buffer: ByteSize::kib(64),
            ..PoolConfig::default()
        };
        let (up, down) = largest_frames(small_buffer, addr, &log, dir.path()).await;
        assert_eq!(up, MIB, "upload frames with a 64 KiB send buffer");
        assert_eq!(down, MIB);
    });
}

#[test]
fn http1_pool_mode_serves_the_same_api() {
    let extra = "[pool]\nprotocol = \"http1-for-comparison\"\nhttp1_connections_per_node = 2\n";
    let cluster = common::Cluster::start_with(3, 4, extra);
    let dir = cluster.dir.path();
    for size in [1000usize, 9 << 20] {
        let data = common::random_bytes(size);
        let file = format!("@{}", common::file_with(dir, &data));
        let created = common::curl(dir, &["--data-binary", &file, &cluster.url("/v1/blobs")]);
        assert_eq!(created.status, 201);
        let id = created.json()["id"].as_str().unwrap().to_owned();
        let url = cluster.url(&format!("/v1/blobs/{id}"));
        // More concurrent reads than connections: they queue for one, and all complete.
        let handles: Vec<_> = (0..6)
            .map(|_| {
                let (url, dir) = (url.clone(), dir.to_path_buf());
                std::thread::spawn(move || common::curl(&dir, &[&url]).body)
            })
            .collect();
        for handle in handles {
            assert_eq!(handle.join().unwrap(), data);
        }
        assert_eq!(common::curl(dir, &["-X", "DELETE", &url]).status, 202);
    }
}
