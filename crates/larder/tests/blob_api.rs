//! The public blob API, driven by curl over HTTP/1.1 and HTTP/2 (prior knowledge) against a real
//! three-node cluster.

mod common;

use common::{curl, file_with, random_bytes, Cluster};
use larder_cluster::{BlobId, BlobKind};

const PROTOCOLS: [&str; 2] = ["--http1.1", "--http2-prior-knowledge"];

fn upload(cluster: &Cluster, protocol: &str, data: &[u8], extra: &[&str]) -> String {
    let dir = cluster.dir.path();
    let file = format!("@{}", file_with(dir, data));
    let mut args = vec![protocol, "--data-binary", &file];
    args.extend_from_slice(extra);
    let url = cluster.url("/v1/blobs");
    args.push(&url);
    let r = curl(dir, &args);
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let id = r.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(r.json()["size"], data.len());
    assert_eq!(
        r.header("location"),
        Some(format!("/v1/blobs/{id}").as_str())
    );
    id
}

#[test]
fn put_get_head_ranges_and_metadata_over_both_protocols() {
    let cluster = Cluster::start(3, 8);
    let dir = cluster.dir.path();
    for protocol in PROTOCOLS {
        let data = random_bytes(300_000);
        let id = upload(
            &cluster,
            protocol,
            &data,
            &[
                "-H",
                "Content-Type: image/png",
                "-H",
                "x-larder-meta-owner: ada",
                "-H",
                "X-Larder-Meta-Tag: blue sky",
            ],
        );
        let url = cluster.url(&format!("/v1/blobs/{id}"));

        let whole = curl(dir, &[protocol, &url]);
        assert_eq!(whole.status, 200);
        assert_eq!(whole.body, data, "{protocol}: whole body");
        let expected_version = if protocol == "--http1.1" {
            "HTTP/1.1"
        } else {
            "HTTP/2"
        };
        assert_eq!(whole.version, expected_version);
        assert_eq!(whole.header("content-type"), Some("image/png"));
        assert_eq!(whole.header("x-larder-meta-owner"), Some("ada"));
        assert_eq!(whole.header("x-larder-meta-tag"), Some("blue sky"));
        assert_eq!(whole.header("accept-ranges"), Some("bytes"));
        assert_eq!(whole.header("content-length"), Some("300000"));
        let etag = whole.header("etag").unwrap().to_owned();
        assert!(whole.header("last-modified").is_some());

        for (range, expected, content_range) in [
            ("0-99", &data[0..100], "bytes 0-99/300000"),
            ("299990-", &data[299_990..], "bytes 299990-299999/300000"),
            ("-10", &data[299_990..], "bytes 299990-299999/300000"),
            ("1000-1000", &data[1000..1001], "bytes 1000-1000/300000"),
            (
                "299000-999999",
                &data[299_000..],
                "bytes 299000-299999/300000",
            ),
        ] {
            let r = curl(
                dir,
                &[protocol, "-H", &format!("Range: bytes={range}"), &url],
            );
            assert_eq!(r.status, 206, "{range}");
            assert_eq!(r.body, expected, "{range}");
            assert_eq!(r.header("content-range"), Some(content_range), "{range}");
        }
        let unsatisfiable = curl(dir, &[protocol, "-H", "Range: bytes=300000-", &url]);
        assert_eq!(unsatisfiable.status, 416);
        assert_eq!(
            unsatisfiable.header("content-range"),
            Some("bytes */300000")
        );
        // A range-spec RFC 9110 calls invalid is ignored: the whole blob.
        let ignored = curl(dir, &[protocol, "-H", "Range: bytes=9-2", &url]);
        assert_eq!(ignored.status, 200);
        assert_eq!(ignored.body.len(), 300000);

        let head = curl(dir, &[protocol, "-I", &url]);
        assert_eq!(head.status, 200);
        assert_eq!(head.header("content-length"), Some("300000"));
        assert_eq!(head.header("x-larder-meta-owner"), Some("ada"));

        let cached = curl(
            dir,
            &[protocol, "-H", &format!("If-None-Match: {etag}"), &url],
        );
        assert_eq!(cached.status, 304);
        assert!(cached.body.is_empty());
        let stale = curl(dir, &[protocol, "-H", "If-None-Match: \"other\"", &url]);
        assert_eq!(stale.status, 200);
    }
}

#[test]
fn delete_unknown_malformed_methods_and_limits() {
    // A limit equal to the chunk size, to test the 413 at a size the test can afford.
    let cluster = Cluster::start_with(3, 8, "max_blob_size = \"4 MiB\"\n");
    let dir = cluster.dir.path();
    for protocol in PROTOCOLS {
        let id = upload(&cluster, protocol, b"short-lived", &[]);
        let url = cluster.url(&format!("/v1/blobs/{id}"));
        let deleted = curl(dir, &[protocol, "-X", "DELETE", &url]);
        assert_eq!(deleted.status, 202);
        let again = curl(dir, &[protocol, "-X", "DELETE", &url]);
        assert_eq!(again.status, 202, "delete is idempotent");
        let gone = curl(dir, &[protocol, &url]);
        assert_eq!(gone.status, 410);
        assert_eq!(gone.error_code(), "Deleted");
        // HEAD of an error answer carries no body (over HTTP/2 a body would be a protocol error).
        assert_eq!(curl(dir, &[protocol, "-I", &url]).status, 410);

        let unknown = BlobId::mint(BlobKind::Simple, 1, 3);
        let r = curl(
            dir,
            &[protocol, &cluster.url(&format!("/v1/blobs/{unknown}"))],
        );
        assert_eq!(r.status, 404);
        assert_eq!(r.error_code(), "NotFound");
        let beyond = BlobId::mint(BlobKind::Simple, 1, 999);
        assert_eq!(
            curl(
                dir,
                &[protocol, &cluster.url(&format!("/v1/blobs/{beyond}"))]
            )
            .status,
            404
        );

        for bad in ["nonsense", "AAAA", &"A".repeat(36), &"%%".repeat(18)] {
            let r = curl(dir, &[protocol, &cluster.url(&format!("/v1/blobs/{bad}"))]);
            assert_eq!(r.status, 400, "{bad}");
            assert_eq!(r.error_code(), "InvalidBlobId");
        }

        let r = curl(dir, &[protocol, "-X", "PUT", "--data-binary", "x", &url]);
        assert_eq!(r.status, 405);
        assert_eq!(r.header("allow"), Some("GET, HEAD, DELETE"));
        let r = curl(dir, &[protocol, &cluster.url("/v1/blobs")]);
        assert_eq!(r.status, 405);
        assert_eq!(r.header("allow"), Some("POST"));
        assert_eq!(
            curl(dir, &[protocol, &cluster.url("/nothing/here")]).status,
            404
        );

        let big = format!("@{}", file_with(dir, &vec![7u8; 4 * 1024 * 1024 + 1]));
        let r = curl(
            dir,
            &[protocol, "--data-binary", &big, &cluster.url("/v1/blobs")],
        );
        assert_eq!(r.status, 413);
        assert_eq!(r.error_code(), "TooLarge");
        let exact = upload(&cluster, protocol, &vec![9u8; 4 * 1024 * 1024], &[]);
        assert_eq!(
            curl(
                dir,
                &[protocol, &cluster.url(&format!("/v1/blobs/{exact}"))]
            )
            .body
            .len(),
            4 << 20
        );

        let r = curl(
            dir,
            &[
                protocol,
                "--data-binary",
                "x",
                "-H",
                "x-larder-ttl: soon",
                &cluster.url("/v1/blobs"),
            ],
        );
        assert_eq!(r.status, 400);
        let meta = format!("x-larder-meta-big: {}", "m".repeat(9000));
        let r = curl(
            dir,
            &[
                protocol,
                "--data-binary",
                "x",
                "-H",
                &meta,
                &cluster.url("/v1/blobs"),
            ],
        );
        assert_eq!(r.status, 400);
    }
    // Chunked HTTP/1.1 uploads (no Content-Length) are accepted and limited the same way.
    let file = format!("@{}", file_with(dir, b"chunked body"));
    let r = curl(
        dir,
        &[
            "--http1.1",
            "-H",
            "Transfer-Encoding: chunked",
            "--data-binary",
            &file,
            &cluster.url("/v1/blobs"),
        ],
    );
    assert_eq!(r.status, 201);
}

#[test]
fn ttl_expiry_answers_410() {
    let cluster = Cluster::start(3, 4);
    let dir = cluster.dir.path();
    let id = upload(
        &cluster,
        "--http2-prior-knowledge",
        b"ephemeral",
        &["-H", "x-larder-ttl: 1"],
    );
    let url = cluster.url(&format!("/v1/blobs/{id}"));
    let fresh = curl(dir, &[&url]);
    assert_eq!(fresh.status, 200);
    assert!(fresh.header("x-larder-expires").is_some());
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let expired = curl(dir, &[&url]);
    assert_eq!(expired.status, 410);
    assert_eq!(expired.error_code(), "Expired");
}

#[test]
fn operations_endpoints() {
    let cluster = Cluster::start(3, 4);
    let dir = cluster.dir.path();
    assert_eq!(curl(dir, &[&cluster.url("/healthz")]).status, 200);
    let ready = curl(dir, &[&cluster.url("/readyz")]);
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["ready"], true);
    let map = curl(dir, &[&cluster.url("/v1/cluster")]).json();
    assert_eq!(map["nodes"].as_array().unwrap().len(), 3);
    assert_eq!(map["partitions"].as_array().unwrap().len(), 4);
    upload(&cluster, "--http1.1", b"counted", &[]);
    let metrics = String::from_utf8(curl(dir, &[&cluster.url("/metrics")]).body).unwrap();
    assert!(
        metrics.contains(
            "larder_frontend_requests_total{route=\"blobs\",method=\"POST\",status=\"201\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("larder_frontend_storage_node_up{node=\"s1\"} 1"),
        "{metrics}"
    );
}

/// A client that sends `Expect: 100-continue` and waits before sending the body (botocore,
/// Java's HttpClient) must not have its next request read as that body: a refusal decided by
/// the head ends the connection (`larder-frontend/src/expect.rs`); a success keeps it.
#[test]
fn a_refused_upload_whose_body_was_withheld_closes_its_connection() {
    use std::io::{Read, Write};
    use std::time::Duration;
    let cluster = Cluster::start(3, 4);
    let address = cluster.url("").trim_start_matches("http://").to_owned();
    let connect = || {
        let stream = std::net::TcpStream::connect(&address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
    };
    let head = |extra: &str| {
        format!(
            "POST /v1/blobs HTTP/1.1\r\nHost: {address}\r\nExpect: 100-continue\r\n\
             Content-Length: 2\r\n{extra}\r\n"
        )
    };

    // Refused by its head (a TTL that is no duration): the 400, then end of stream.
    let mut stream = connect();
    stream
        .write_all(head("x-larder-ttl: soon\r\n").as_bytes())
        .unwrap();
    let mut answer = Vec::new();
    let read = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    assert!(answer.starts_with("http/1.1 400"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(
        read.is_ok(),
        "the connection stayed open: {read:?}\n{answer}"
    );

    // Accepted: 100 Continue, the body, 201, and the connection serves the next request.
    let mut stream = connect();
    stream.write_all(head("").as_bytes()).unwrap();
    let mut continued = [0u8; 25];
    stream.read_exact(&mut continued).unwrap();
    assert_eq!(&continued, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"ab").unwrap();
    let next = format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(next.as_bytes()).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    assert!(answer.starts_with("http/1.1 201"), "{answer}");
    assert!(answer.contains("http/1.1 200"), "{answer}");
    assert_eq!(answer.matches("connection: close").count(), 1, "{answer}");
}
