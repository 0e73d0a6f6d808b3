//! Edge values against a real three-node cluster: TTLs at and past the documented maximum, Range
//! headers RFC 9110 lets a server ignore, overflowing positions, blob IDs of the wrong length,
//! empty metadata names, odd methods in the metrics, and a storage 4xx on a document read.
//!
//! Times past the year 9999 and versions at u64::MAX can no longer be planted on a storage node
//! (it refuses them: `storage_limits.rs`), so what the frontend does with such answers is tested
//! by unit tests: `larder-frontend`'s `api/blobs.rs` (dates left out), `larder-router`'s `hlc.rs`
//! (no version past u64::MAX) and `api/documents/reply.rs` (a superseded write is never 200).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{curl, file_with, Cluster, CurlResponse};

const H2: &str = "--http2-prior-knowledge";

fn upload(cluster: &Cluster, data: &[u8], extra: &[&str]) -> CurlResponse {
    let dir = cluster.dir.path();
    let file = format!("@{}", file_with(dir, data));
    let url = cluster.url("/v1/blobs");
    let mut args = vec![H2, "--data-binary", &file];
    args.extend_from_slice(extra);
    args.push(&url);
    curl(dir, &args)
}

fn text(r: &CurlResponse) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

#[test]
fn ttls_past_100_years_are_refused_and_stored_times_always_format() {
    let cluster = Cluster::start(3, 4);
    let dir = cluster.dir.path();
    // Past the year 9999 (every later GET panicked) and past u64 (the expiry wrapped: 410).
    for ttl in ["3155760001", "300000000000", "18446744073709551615"] {
        let r = upload(&cluster, b"x", &["-H", &format!("x-larder-ttl: {ttl}")]);
        assert_eq!(r.status, 400, "ttl {ttl}: {}", text(&r));
        assert_eq!(r.error_code(), "BadHeader");
    }
    // The longest TTL allowed is stored, served, and its expiry shown as a date.
    let r = upload(&cluster, b"kept", &["-H", "x-larder-ttl: 3155760000"]);
    assert_eq!(r.status, 201, "{}", text(&r));
    let url = cluster.url(r.header("location").unwrap());
    for method in [&["-X", "GET"][..], &["-I"][..]] {
        let mut args = vec![H2];
        args.extend_from_slice(method);
        args.push(&url);
        let got = curl(dir, &args);
        assert_eq!(got.status, 200, "{method:?}");
        let expires = got.header("x-larder-expires").expect("an expiry date");
        assert!(expires.ends_with(" GMT"), "{expires}");
    }
}

#[test]
fn ranges_follow_rfc_9110() {
    let cluster = Cluster::start(3, 4);
    let dir = cluster.dir.path();
    let data: Vec<u8> = (0..100u8).collect();
    let r = upload(&cluster, &data, &[]);
    assert_eq!(r.status, 201);
    let url = cluster.url(r.header("location").unwrap());
    let get = |range: &str| curl(dir, &[H2, "-H", &format!("Range: {range}"), &url]);

    // Ranges this server does not honour are ignored: 200 with the whole blob.
    for ignored in [
        "bytes=0-1,5-6",
        "items=0-3",
        "bytes=9-2",
        "bytes=a-b",
        "bytes=",
    ] {
        let r = get(ignored);
        assert_eq!(r.status, 200, "{ignored}: {}", text(&r));
        assert_eq!(r.body, data, "{ignored}");
        assert_eq!(r.header("content-range"), None, "{ignored}");
    }
    // The unit is case-insensitive.
    let r = get("BYTES=0-3");
    assert_eq!(r.status, 206);
    assert_eq!(r.body, &data[..4]);
    assert_eq!(r.header("content-range"), Some("bytes 0-3/100"));
    // A first position past the end, even past u64, is unsatisfiable: 416 with the size.
    for unsatisfiable in [
        "bytes=100-",
        "bytes=99999999999999999999999-",
        "bytes=18446744073709551616-18446744073709551617",
    ] {
        let r = get(unsatisfiable);
        assert_eq!(r.status, 416, "{unsatisfiable}: {}", text(&r));
        assert_eq!(
            r.header("content-range"),
            Some("bytes */100"),
            "{unsatisfiable}"
        );
    }
    // A last position past u64 reaches the end.
    let r = get("bytes=98-99999999999999999999999");
    assert_eq!(r.status, 206);
    assert_eq!(r.body, &data[98..]);
}

#[test]
fn malformed_blob_ids_and_metadata_names_say_what_is_wrong() {
    let cluster = Cluster::start(3, 4);
    let dir = cluster.dir.path();
    let r = curl(
        dir,
        &[H2, &cluster.url(&format!("/v1/blobs/{}", "A".repeat(37)))],
    );
    assert_eq!(r.status, 400);
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("37 characters long, expected 36"),
        "{message}"
    );

    // An empty name would cost nothing against the 8 KiB metadata limit.
    for protocol in ["--http1.1", H2] {
        let file = format!("@{}", file_with(dir, b"x"));
        let url = cluster.url("/v1/blobs");
        let r = curl(
            dir,
            &[
                protocol,
                "--data-binary",
                &file,
                "-H",
                "x-larder-meta-: v",
                &url,
            ],
        );
        assert_eq!(r.status, 400, "{protocol}: {}", text(&r));
        assert_eq!(r.error_code(), "BadHeader");
    }
}

/// Sends `count` requests with made-up methods on one HTTP/1.1 connection.
fn odd_methods(cluster: &Cluster, count: usize) {
    let mut stream = TcpStream::connect(cluster.frontend_addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut requests = String::new();
    for i in 0..count {
        requests.push_str(&format!(
            "ODD{i} /v1/blobs/x HTTP/1.1\r\nHost: larder\r\nContent-Length: 0\r\n\r\n"
        ));
    }
    requests.push_str("GET /healthz HTTP/1.1\r\nHost: larder\r\nConnection: close\r\n\r\n");
    stream.write_all(requests.as_bytes()).unwrap();
    let mut answers = Vec::new();
    stream.read_to_end(&mut answers).unwrap();
    let answers = String::from_utf8_lossy(&answers);
    assert_eq!(answers.matches("HTTP/1.1 ").count(), count + 1, "{answers}");
}

#[test]
fn odd_methods_do_not_grow_the_metrics() {
    let cluster = Cluster::start(3, 4);
    let dir = cluster.dir.path();
    odd_methods(&cluster, 300);
    let metrics = curl(dir, &[&cluster.url("/metrics")]);
    let body = text(&metrics);
    assert!(!body.contains("ODD"), "a client's method became a label");
    assert!(
        body.contains(r#"larder_frontend_requests_total{route="blob",method="other",status="#),
        "{body}"
    );
}

/// Writes a document record straight to every storage node's internal API, the way replication
/// or a peer would.
#[test]
fn a_storage_4xx_on_a_document_read_stays_a_4xx() {
    let cluster = Cluster::start(3, 4);
    let dir = cluster.dir.path();
    // Storage nodes refuse keys longer than 1 KiB (400); the frontend passes this one on.
    let url = cluster.url(&format!("/document/v1/ns/t/docid/{}", "k".repeat(1100)));
    let r = curl(dir, &[H2, &url]);
    assert_eq!(r.status, 400, "{}", text(&r));
    assert_eq!(r.header("retry-after"), None);
    let message = r.json()["message"].as_str().unwrap().to_owned();
    assert!(message.contains("longer than 1024"), "{message}");
}
