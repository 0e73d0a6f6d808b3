//! Big blobs end to end: a 1 GiB round trip with matching SHA-256, the frontend's peak memory
//! while a 2 GiB blob goes up and comes back, and a client that stops reading mid-download.
//! Blobs are generated and hashed on the fly: neither the test nor the servers hold them whole.
//!
//! The storage nodes run with `durability = "relaxed-no-sync-for-benchmarks"` here: these tests
//! are about the frontend's streaming and memory, and 9 GiB of replica writes with an fdatasync
//! per record take minutes on this kind of disk (~100 MB/s synced) against seconds without. Every
//! other test runs durable.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::stream::{download, proc_status_bytes, reset_peak_rss, upload, Pattern};
use common::Cluster;
use http::StatusCode;
use larder_cluster::{BlobId, BlobKind};

const MIB: u64 = 1024 * 1024;
const CHUNK: u64 = 4 * MIB;
const RELAXED: &str = "[store]\ndurability = \"relaxed-no-sync-for-benchmarks\"\n";

/// One test of this file at a time: each writes its blobs to three replicas on this machine's one
/// disk (9 GiB for the first two together), and a CI machine shared with other work may not
/// have that much free at once; one after the other needs at most 6 GiB.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn round_trip(cluster: &Cluster, pattern: &Pattern, up_http2: bool, down_http2: bool) {
    let addr = cluster.frontend_addr;
    let (status, json) = upload(addr, up_http2, pattern.body(), Some(pattern.size)).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    let id: BlobId = json["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(id.kind, BlobKind::Composite);
    let got = download(addr, down_http2, &format!("/v1/blobs/{id}"), None).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.len, pattern.size);
    assert_eq!(
        got.sha256,
        pattern.sha256(),
        "SHA-256 of the downloaded blob"
    );
}

#[test]
fn one_gib_blob_round_trips_with_matching_sha256() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start_full(3, 8, "", RELAXED);
    let pattern = Pattern {
        seed: 1,
        size: 1 << 30,
    };
    runtime().block_on(round_trip(&cluster, &pattern, true, false));
}

#[test]
fn frontend_peak_memory_stays_a_few_chunks_for_a_2_gib_blob() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start_full(3, 8, "", RELAXED);
    let pid = cluster.frontend_pid();
    let addr = cluster.frontend_addr;
    let pattern = Pattern {
        seed: 2,
        size: 2 << 30,
    };
    runtime().block_on(async {
        // Warm up: connections to every storage node, the runtime's threads, one chunked blob.
        round_trip(
            &cluster,
            &Pattern {
                seed: 3,
                size: 3 * CHUNK,
            },
            false,
            false,
        )
        .await;
        let baseline = proc_status_bytes(pid, "VmRSS");
        reset_peak_rss(pid);

        // Upload over HTTP/1.1 without Content-Length (chunked), download over HTTP/2.
        let (status, json) = upload(addr, false, pattern.body(), None).await;
        assert_eq!(status, StatusCode::CREATED, "{json}");
        let upload_peak = proc_status_bytes(pid, "VmHWM");
        let id = json["id"].as_str().unwrap().to_owned();
        reset_peak_rss(pid);
        let got = download(addr, true, &format!("/v1/blobs/{id}"), None).await;
        assert_eq!(got.len, pattern.size);
        assert_eq!(got.sha256, pattern.sha256());
        let download_peak = proc_status_bytes(pid, "VmHWM");

        let mib = |b: u64| b as f64 / MIB as f64;
        println!(
            "frontend RSS before: {:.1} MiB; peak while uploading 2 GiB: {:.1} MiB (+{:.1}); \
             while downloading: {:.1} MiB (+{:.1}); chunk size {} MiB",
            mib(baseline),
            mib(upload_peak),
            mib(upload_peak.saturating_sub(baseline)),
            mib(download_peak),
            mib(download_peak.saturating_sub(baseline)),
            CHUNK / MIB
        );
        // Upload: the chunk being filled plus 4 in flight; download: the chunk being sent plus
        // 2 read ahead; plus HTTP/2 buffers. 16 chunks leaves room for allocator slack.
        for (what, peak) in [("upload", upload_peak), ("download", download_peak)] {
            assert!(
                peak.saturating_sub(baseline) < 16 * CHUNK,
                "{what}: peak RSS grew by {:.1} MiB",
                mib(peak.saturating_sub(baseline))
            );
        }
    });
}

#[test]
fn a_client_that_stops_reading_does_not_grow_server_memory() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start_full(3, 8, "", RELAXED);
    let pid = cluster.frontend_pid();
    let pattern = Pattern {
        seed: 4,
        size: 256 * MIB,
    };
    let id = runtime().block_on(async {
        let (status, json) = upload(cluster.frontend_addr, true, pattern.body(), None).await;
        assert_eq!(status, StatusCode::CREATED);
        json["id"].as_str().unwrap().to_owned()
    });
    let before = proc_status_bytes(pid, "VmRSS");

    // A raw HTTP/1.1 client with a small receive buffer reads 1 MiB, then nothing.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(64 * 1024).unwrap();
    socket.connect(&cluster.frontend_addr.into()).unwrap();
    let mut stream: std::net::TcpStream = socket.into();
    write!(
        stream,
        "GET /v1/blobs/{id} HTTP/1.1\r\nHost: larder\r\n\r\n"
    )
    .unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = 0;
    while read < MIB as usize {
        read += stream.read(&mut buf).unwrap();
    }
    std::thread::sleep(Duration::from_secs(2));
    let stalled = proc_status_bytes(pid, "VmRSS");
    std::thread::sleep(Duration::from_secs(2));
    let later = proc_status_bytes(pid, "VmRSS");
    let storage: Vec<u64> = (0..3)
        .map(|i| proc_status_bytes(cluster.node_pid(i).unwrap(), "VmRSS"))
        .collect();
    let mib = |b: u64| b as f64 / MIB as f64;
    println!(
        "frontend RSS before: {:.1} MiB; 2 s into the stall: {:.1} MiB; 4 s: {:.1} MiB; storage nodes: {:?} MiB",
        mib(before),
        mib(stalled),
        mib(later),
        storage.iter().map(|b| mib(*b).round()).collect::<Vec<_>>()
    );
    // Had the frontend not waited for the client, it would have buffered the 256 MiB blob.
    assert!(
        stalled.saturating_sub(before) < 8 * CHUNK,
        "RSS grew by {:.1} MiB while the client was not reading",
        mib(stalled.saturating_sub(before))
    );
    assert!(later.saturating_sub(stalled) < CHUNK, "RSS kept growing");
    for rss in storage {
        assert!(rss < 128 * MIB, "a storage node holds {:.1} MiB", mib(rss));
    }
    drop(stream);
}
