//! Blobs larger than the chunk size: stored as chunks plus a composite record, read back with
//! ranges across chunk boundaries, deleted with their chunks; failed uploads leave nothing
//! visible and their chunks tombstoned. Real processes, real clients (curl and hyper).

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::stream::{download, upload, Pattern};
use common::{curl, file_with, Cluster};
use http::{Method, StatusCode};
use larder_cluster::{BlobId, BlobKind};
use larder_router::Manifest;

const MIB: u64 = 1024 * 1024;
const SMALL_CHUNK: u64 = 64 * 1024;
const SMALL_CHUNKS: &str = "max_blob_size = \"1 GiB\"\n[chunking]\nchunk_size = \"64 KiB\"\n";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn sizes_around_the_chunk_size_round_trip_with_and_without_length_over_both_protocols() {
    let cluster = Cluster::start(3, 8);
    let chunk = 4 * MIB;
    let addr = cluster.frontend_addr;
    runtime().block_on(async {
        let sizes = [0, 1, chunk - 1, chunk, chunk + 1, chunk * 7 / 2];
        for (i, size) in sizes.into_iter().enumerate() {
            for (http2, with_length) in [(false, true), (false, false), (true, false), (true, true)]
            {
                let pattern = Pattern {
                    seed: i as u64 * 10 + http2 as u64 * 2 + with_length as u64,
                    size,
                };
                let what = format!("size {size}, http2 {http2}, Content-Length {with_length}");
                let length = with_length.then_some(size);
                let (status, json) = upload(addr, http2, pattern.body(), length).await;
                assert_eq!(status, StatusCode::CREATED, "{what}: {json}");
                assert_eq!(json["size"], size, "{what}");
                let id: BlobId = json["id"].as_str().unwrap().parse().unwrap();
                let kind = if size > chunk {
                    BlobKind::Composite
                } else {
                    BlobKind::Simple
                };
                assert_eq!(id.kind, kind, "{what}");
                let got = download(addr, !http2, &format!("/v1/blobs/{id}"), None).await;
                assert_eq!(got.status, StatusCode::OK, "{what}");
                assert_eq!(got.len, size, "{what}");
                assert_eq!(got.sha256, pattern.sha256(), "{what}");
                assert_eq!(
                    got.headers["content-length"].to_str().unwrap(),
                    size.to_string(),
                    "{what}"
                );
            }
        }
    });
}

/// The manifest of a composite blob, read from a storage node's internal API.
async fn manifest_of(cluster: &Cluster, id: &BlobId) -> Manifest {
    let partition = cluster.map.partition(id.partition).unwrap();
    // A quorum has it; the last replica may still be writing it.
    for replica in &partition.replicas {
        let node = cluster.map.node(&replica.node).unwrap();
        let client = cluster.node_client(node.address).await;
        let path = format!("/internal/v1/partitions/{}/blobs/{id}", id.partition);
        let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
        if status == StatusCode::OK {
            return Manifest::decode(&body).unwrap();
        }
    }
    panic!("no replica has composite {id}")
}

/// Tombstones `id` on every replica, behind the frontend's back.
async fn tombstone_everywhere(cluster: &Cluster, id: &BlobId) {
    let partition = cluster.map.partition(id.partition).unwrap();
    for replica in &partition.replicas {
        let node = cluster.map.node(&replica.node).unwrap();
        let client = cluster.node_client(node.address).await;
        let path = format!("/internal/v1/partitions/{}/blobs/{id}", id.partition);
        let (status, _) = client.request(Method::DELETE, &path, Bytes::new()).await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
}

/// Statuses of an internal GET of `id` at each of its replicas.
async fn replica_statuses(cluster: &Cluster, id: &BlobId) -> Vec<u16> {
    let partition = cluster.map.partition(id.partition).unwrap();
    let mut out = Vec::new();
    for replica in &partition.replicas {
        let node = cluster.map.node(&replica.node).unwrap();
        let client = cluster.node_client(node.address).await;
        let path = format!("/internal/v1/partitions/{}/blobs/{id}", id.partition);
        let (status, _) = client.request(Method::GET, &path, Bytes::new()).await;
        out.push(status.as_u16());
    }
    out
}

#[test]
fn ranges_at_and_across_chunk_boundaries_touch_only_their_chunks() {
    let cluster = Cluster::start_with(3, 8, SMALL_CHUNKS);
    let dir = cluster.dir.path();
    let size = SMALL_CHUNK * 7 / 2;
    let pattern = Pattern { seed: 7, size };
    let data = pattern.bytes(0..size);
    let file = format!("@{}", file_with(dir, &data));
    let created = curl(
        dir,
        &[
            "--data-binary",
            &file,
            "-H",
            "Content-Type: video/mp4",
            "-H",
            "x-larder-meta-owner: ada",
            &cluster.url("/v1/blobs"),
        ],
    );
    assert_eq!(created.status, 201);
    let id: BlobId = created.json()["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(id.kind, BlobKind::Composite);
    let url = cluster.url(&format!("/v1/blobs/{id}"));
    let c = SMALL_CHUNK;
    let cases: Vec<(String, std::ops::Range<u64>)> = vec![
        (format!("0-{}", c - 1), 0..c),             // exactly the first chunk
        (format!("{}-{}", c - 1, c), c - 1..c + 1), // one byte either side of a boundary
        (format!("{c}-{c}"), c..c + 1),             // the first byte of a chunk
        (format!("{}-{}", c - 1, c - 1), c - 1..c), // the last byte of a chunk
        (format!("{}-", 3 * c), 3 * c..size),       // the short last chunk
        (format!("{}-", c + 5), c + 5..size),       // from mid-chunk to the end
        ("-1".into(), size - 1..size),              // the last byte
        (format!("-{}", c * 2 + 10), size - 2 * c - 10..size), // a suffix over three chunks
        (format!("100-{}", size + 1000), 100..size), // past the end is clipped
        ("0-".into(), 0..size),
    ];
    for protocol in ["--http1.1", "--http2-prior-knowledge"] {
        for (range, expected) in &cases {
            let r = curl(
                dir,
                &[protocol, "-H", &format!("Range: bytes={range}"), &url],
            );
            assert_eq!(r.status, 206, "{range}");
            assert_eq!(
                r.body,
                &data[expected.start as usize..expected.end as usize],
                "{protocol} {range}"
            );
            let content_range = format!("bytes {}-{}/{size}", expected.start, expected.end - 1);
            assert_eq!(r.header("content-range"), Some(content_range.as_str()));
            assert_eq!(r.header("content-type"), Some("video/mp4"));
        }
        let r = curl(
            dir,
            &[protocol, "-H", &format!("Range: bytes={size}-"), &url],
        );
        assert_eq!(r.status, 416);
        let expected = format!("bytes */{size}");
        assert_eq!(r.header("content-range"), Some(expected.as_str()));

        let whole = curl(dir, &[protocol, &url]);
        assert_eq!(whole.status, 200);
        assert_eq!(whole.body, data);
        assert_eq!(whole.header("x-larder-meta-owner"), Some("ada"));
        assert_eq!(whole.header("accept-ranges"), Some("bytes"));
        assert!(whole.header("last-modified").is_some());
        let etag = whole.header("etag").unwrap().to_owned();

        let head = curl(dir, &[protocol, "-I", &url]);
        assert_eq!(head.status, 200);
        assert_eq!(
            head.header("content-length"),
            Some(size.to_string().as_str())
        );
        assert_eq!(head.header("content-type"), Some("video/mp4"));

        let cached = curl(
            dir,
            &[protocol, "-H", &format!("If-None-Match: {etag}"), &url],
        );
        assert_eq!(cached.status, 304);
        assert!(cached.body.is_empty());
    }

    // Remove chunk 2 behind the frontend's back: ranges inside chunks 0-1 and 3 still work
    // (they never ask for chunk 2), a range that starts in chunk 2 fails with an error status.
    // (One that starts before it has sent its 206 by then: the transfer ends short, reset.)
    runtime().block_on(async {
        let manifest = manifest_of(&cluster, &id).await;
        assert_eq!(manifest.chunks.len(), 4);
        assert_eq!(manifest.size, size);
        tombstone_everywhere(&cluster, &manifest.chunks[2]).await;
    });
    for (range, ok) in [
        (format!("0-{}", 2 * c - 1), true),
        (format!("{}-", 3 * c), true),
        (format!("{}-{}", 2 * c + 1, 2 * c + 5), false),
    ] {
        let r = curl(dir, &["-H", &format!("Range: bytes={range}"), &url]);
        assert_eq!(r.status == 206, ok, "{range}: {}", r.status);
    }
}

#[test]
fn deleting_a_composite_blob_tombstones_its_chunks() {
    let cluster = Cluster::start_with(3, 8, SMALL_CHUNKS);
    let dir = cluster.dir.path();
    let pattern = Pattern {
        seed: 3,
        size: SMALL_CHUNK * 5 + 17,
    };
    let file = format!("@{}", file_with(dir, &pattern.bytes(0..pattern.size)));
    let created = curl(dir, &["--data-binary", &file, &cluster.url("/v1/blobs")]);
    let id: BlobId = created.json()["id"].as_str().unwrap().parse().unwrap();
    let manifest = runtime().block_on(manifest_of(&cluster, &id));
    assert_eq!(manifest.chunks.len(), 6);
    let url = cluster.url(&format!("/v1/blobs/{id}"));
    assert_eq!(curl(dir, &["-X", "DELETE", &url]).status, 202);
    assert_eq!(curl(dir, &[&url]).status, 410);
    assert_eq!(curl(dir, &["-I", &url]).status, 410);
    assert_eq!(curl(dir, &["-X", "DELETE", &url]).status, 202, "idempotent");
    runtime().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(20);
        for chunk in &manifest.chunks {
            loop {
                let statuses = replica_statuses(&cluster, chunk).await;
                if statuses.iter().all(|s| *s == 410) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "chunk {chunk} still {statuses:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    // A chunk ID is not a public blob, even when someone learns one.
    let chunk_url = cluster.url(&format!("/v1/blobs/{}", manifest.chunks[0]));
    assert_eq!(curl(dir, &[&chunk_url]).status, 404);
}

/// Chunk keys live (put, not deleted) and tombstoned (delete) on every replica, and whether any
/// composite blob was stored, from the storage nodes' change feeds.
async fn chunk_records(cluster: &Cluster) -> (HashSet<String>, HashSet<String>, usize) {
    let (mut put, mut deleted, mut composites) = (HashSet::new(), HashSet::new(), 0);
    for partition in &cluster.map.partitions {
        for replica in &partition.replicas {
            let node = cluster.map.node(&replica.node).unwrap();
            let client = cluster.node_client(node.address).await;
            let path = format!(
                "/internal/v1/partitions/{}/changes?limit=10000",
                partition.id
            );
            let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
            assert_eq!(status, StatusCode::OK);
            let page: serde_json::Value = serde_json::from_slice(&body).unwrap();
            for change in page["changes"].as_array().unwrap() {
                let key = change["key"].as_str().unwrap().to_owned();
                let Ok(id) = key.parse::<BlobId>() else {
                    continue;
                };
                match (id.kind, change["op"].as_str().unwrap()) {
                    (BlobKind::Chunk, "put-blob") => {
                        put.insert(key);
                    }
                    (BlobKind::Chunk, "delete-blob") => {
                        deleted.insert(key);
                    }
                    (BlobKind::Composite, "put-blob") => composites += 1,
                    _ => {}
                }
            }
        }
    }
    (put, deleted, composites)
}

async fn assert_chunks_all_tombstoned(cluster: &Cluster, what: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (put, deleted, composites) = chunk_records(cluster).await;
        assert_eq!(composites, 0, "{what}: a composite blob was stored");
        let orphans: Vec<_> = put.difference(&deleted).collect();
        if orphans.is_empty() {
            // The feed shows a put only while its blob is live, so once every chunk is
            // tombstoned the tombstones are what tells how many chunks the upload stored.
            return deleted.len();
        }
        assert!(
            Instant::now() < deadline,
            "{what}: chunks never tombstoned: {orphans:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn failed_uploads_leave_no_blob_and_tombstone_their_chunks() {
    let limits = "max_blob_size = \"640 KiB\"\n[chunking]\nchunk_size = \"64 KiB\"\n";
    let cluster = Cluster::start_with(3, 4, limits);
    let addr = cluster.frontend_addr;
    runtime().block_on(async {
        // 1. An HTTP/2 client resets its upload after six chunks' worth.
        let pieces = (0..24).map(|i| {
            if i < 23 {
                Ok(http_body::Frame::data(Bytes::from(vec![
                    i as u8;
                    16 * 1024
                ])))
            } else {
                Err::<_, common::stream::BoxError>("client gives up".into())
            }
        });
        let body = futures_util::StreamExt::then(futures_util::stream::iter(pieces), |p| async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            p
        });
        let body = http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(body));
        let mut conn = common::stream::Conn::connect(addr, true).await;
        let request = http::Request::post(format!("http://{addr}/v1/blobs"))
            .body(body)
            .unwrap();
        let answer = conn.send(request).await;
        assert!(
            answer.as_ref().map_or(true, |r| !r.status().is_success()),
            "a reset upload must not succeed"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let stored = assert_chunks_all_tombstoned(&cluster, "reset upload").await;
        assert!(stored >= 3, "the reset upload stored only {stored} chunks");

        // 2. Too large, without Content-Length (it only shows half-way): 413.
        let big = Pattern {
            seed: 1,
            size: 900 * 1024,
        };
        let (status, json) = upload(addr, false, big.body(), None).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{json}");
        assert_eq!(json["error"]["code"], "TooLarge");
        let (status, _) = upload(addr, true, big.body(), None).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        // ... and with a Content-Length that says so up front.
        let (status, _) = upload(addr, false, big.body(), Some(big.size)).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

        // 3. An HTTP/1.1 client promises 600 KiB, sends 400 KiB and hangs up.
        use tokio::io::AsyncWriteExt;
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /v1/blobs HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n",
            600 * 1024
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        socket.write_all(&vec![7u8; 400 * 1024]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(socket);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let stored_after = assert_chunks_all_tombstoned(&cluster, "every failed upload").await;
        assert!(stored_after > stored, "later failures stored chunks too");
    });
}

/// The upload journal's open entries under `dir`, and the IDs they list.
fn journalled_ids(dir: &std::path::Path) -> (usize, usize) {
    if !dir.exists() {
        return (0, 0);
    }
    let open = larder_router::UploadJournal::inspect(dir).unwrap();
    (open.len(), open.iter().map(|e| e.ids.len()).sum())
}

/// A frontend SIGKILLed mid-upload cannot clean up after itself; its upload journal lists the
/// upload's chunks, and the restarted frontend tombstones them on every replica.
#[test]
fn chunks_of_an_upload_cut_short_by_a_frontend_crash_are_tombstoned_after_restart() {
    let config = format!("upload_journal_dir = \"uploads\"\n{SMALL_CHUNKS}");
    let mut cluster = Cluster::start_with(3, 4, &config);
    let journal = cluster.dir.path().join("uploads");
    let addr = cluster.frontend_addr;
    let rt = runtime();
    // An HTTP/1.1 client promises 4 MiB, sends 1 MiB (16 chunks) and waits.
    let socket = rt.block_on(async {
        use tokio::io::AsyncWriteExt;
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /v1/blobs HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n",
            4 * MIB
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        socket.write_all(&vec![9u8; MIB as usize]).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while journalled_ids(&journal).1 < 8 {
            assert!(Instant::now() < deadline, "the upload was never journalled");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (put, _, _) = chunk_records(&cluster).await;
        assert!(
            put.len() >= 4,
            "only {} chunks stored before the crash",
            put.len()
        );
        socket
    });
    cluster.kill_and_restart_frontend();
    drop(socket);
    rt.block_on(async {
        let stored = assert_chunks_all_tombstoned(&cluster, "upload cut short by a crash").await;
        assert!(stored >= 4);
        let deadline = Instant::now() + Duration::from_secs(20);
        while journalled_ids(&journal).0 > 0 {
            assert!(
                Instant::now() < deadline,
                "the journal entry was never removed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    // The restarted frontend serves uploads (and journals them) as before.
    let data = vec![3u8; 200 * 1024];
    let put = curl(
        cluster.dir.path(),
        &[
            "--data-binary",
            &format!("@{}", file_with(cluster.dir.path(), &data)),
            &cluster.url("/v1/blobs"),
        ],
    );
    assert_eq!(put.status, 201);
    assert_eq!(
        journalled_ids(&journal),
        (0, 0),
        "a committed upload leaves no entry"
    );
}

/// A node's count of large-record bytes read, by where they came from (`page_cache`, `disk`).
fn large_read_bytes(cluster: &Cluster, node: usize, source: &str) -> u64 {
    let (status, text) =
        cluster.internal_request(cluster.node_addr(node), "GET", larder_proto::METRICS_PATH);
    assert_eq!(status, 200);
    let line = format!("larder_storage_large_read_bytes_total{{source=\"{source}\"}}");
    String::from_utf8(text)
        .unwrap()
        .lines()
        .find(|l| l.starts_with(&line))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("node {node}: no {line}"))
}

#[test]
fn a_chunk_out_of_the_page_cache_is_read_past_it_counted_and_checked() {
    // Every synced record of 1 MiB or more leaves the page cache at once: read back, each
    // chunk of this 3 MiB blob (one record on each replica) comes from the disk directly.
    let storage = "[store]\nuncache_after_recent = \"0 B\"\n";
    let cluster = Cluster::start_full(3, 4, "", storage);
    let dir = cluster.dir.path();
    let pattern = Pattern {
        seed: 11,
        size: 3 * MIB,
    };
    let file = format!("@{}", file_with(dir, &pattern.bytes(0..pattern.size)));
    let created = curl(dir, &["--data-binary", &file, &cluster.url("/v1/blobs")]);
    assert_eq!(created.status, 201);
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let direct = |c: &Cluster| (0..3).map(|n| large_read_bytes(c, n, "disk")).sum::<u64>();
    let before = direct(&cluster);
    let url = cluster.url(&format!("/v1/blobs/{id}"));
    let whole = curl(dir, &[&url]);
    assert_eq!(whole.status, 200);
    assert!(
        whole.body == pattern.bytes(0..pattern.size),
        "the same bytes"
    );
    let ranged = curl(dir, &["-r", "1000000-2000000", &url]);
    assert_eq!(ranged.status, 206);
    assert!(
        ranged.body == pattern.bytes(1_000_000..2_000_001),
        "the same range"
    );
    let read = direct(&cluster) - before;
    assert!(
        read >= pattern.size + 1_000_001,
        "{read} bytes read past the page cache for a whole read and a range of it"
    );
}
