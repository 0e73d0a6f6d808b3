//! Interop with the real Java `vespa-feed-client` (Maven Central), built by `scripts/test` into
//! `interop/vespa-feed-client/target`: its handshake succeeds, it feeds 10,000 documents over h2c
//! and 1,000 over TLS (bodies over 512 bytes arrive gzipped, IDs URL-encoded by Java's
//! `URLEncoder`), and every document reads back identical.
//!
//! Without the built program the test is skipped, unless `LARDER_REQUIRE_INTEROP=1` (as
//! `scripts/test` sets it), when a missing build is a failure.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{h2::H2Client, Cluster};
use http::{Method, StatusCode};
use serde_json::{json, Value};

const DOCUMENTS: usize = 10_000;

fn interop_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../interop/vespa-feed-client/target")
}

fn fields(i: usize) -> Value {
    // Every 10th document is large enough for the client to gzip it.
    let text = if i.is_multiple_of(10) {
        "lorem ipsum ".repeat(80)
    } else {
        format!("doc {i}")
    };
    json!({"title": text, "n": i, "tags": ["a", i.to_string()], "score": i as f64 / 4.0})
}

fn id(i: usize) -> String {
    format!("id:music:song::doc {i}/x+y?é")
}

/// Whether the Java program is built; when it is not, the test is skipped (or fails when
/// `LARDER_REQUIRE_INTEROP=1`).
fn interop_built() -> bool {
    let target = interop_dir();
    if target.join("classes").exists() && target.join("lib").exists() {
        return true;
    }
    assert!(
        std::env::var("LARDER_REQUIRE_INTEROP").as_deref() != Ok("1"),
        "interop/vespa-feed-client is not built (mvn package)"
    );
    eprintln!("skipping: interop/vespa-feed-client is not built (scripts/test builds it)");
    false
}

/// Feeds `documents` documents to `endpoint` with the Java client (trusting `ca` for https) and
/// checks that every one succeeded.
fn feed_with_java(cluster: &Cluster, endpoint: &str, documents: usize, ca: Option<&str>) {
    let target = interop_dir();
    let feed: Vec<String> = (0..documents)
        .map(|i| json!({"put": id(i), "fields": fields(i)}).to_string())
        .collect();
    let file = cluster.path("feed.jsonl");
    std::fs::write(&file, feed.join("\n")).unwrap();
    let classpath = format!(
        "{}:{}/*",
        target.join("classes").display(),
        target.join("lib").display()
    );
    let mut args = vec![
        "-cp",
        &classpath,
        "larder.interop.Feed",
        endpoint,
        &file,
        "4",
        "128",
    ];
    args.extend(ca);
    let output = Command::new("java")
        .args(args)
        .output()
        .expect("java is installed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "exit {:?}: {stdout}\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    let result: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        (result["ok"].as_u64(), result["failed"].as_u64()),
        (Some(documents as u64), Some(0)),
        "{result}"
    );
}

/// Reads the first `documents` documents back over h2c and compares them with what was fed.
fn assert_read_back(cluster: &Cluster, documents: usize) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = H2Client::connect(cluster.frontend_addr).await;
        for i in 0..documents {
            let path = format!("/document/v1/music/song/docid/doc%20{i}%2Fx%2By%3F%C3%A9");
            let (status, body) = client.request(Method::GET, &path, Default::default()).await;
            assert_eq!(status, StatusCode::OK, "{path}");
            let got: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(got["id"], id(i));
            assert_eq!(got["fields"], fields(i), "{path}");
        }
    });
}

#[test]
fn vespa_feed_client_feeds_larder() {
    if !interop_built() {
        return;
    }
    let cluster = Cluster::start(3, 16);
    feed_with_java(&cluster, &cluster.url("/"), DOCUMENTS, None);
    assert_read_back(&cluster, DOCUMENTS);
}

/// The same client over the HTTPS port, as it feeds Vespa by default: TLS, HTTP/2 by ALPN, the
/// cluster's CA given as its `--ca-certificates`.
#[test]
fn vespa_feed_client_feeds_larder_over_https() {
    if !interop_built() {
        return;
    }
    let cluster = Cluster::start_tls(3, 8, "");
    let ca = cluster.certs.as_ref().unwrap().ca_path();
    feed_with_java(&cluster, &cluster.https_url("/"), 1_000, Some(&ca));
    assert_read_back(&cluster, 1_000);
}
