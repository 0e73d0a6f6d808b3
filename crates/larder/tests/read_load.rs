//! Heavy reads through one frontend, as the hardening issue's finding 6 observed them: h2load,
//! 20 connections × 100 streams, GETs of a small blob and of a document. Every answer must be
//! 2xx and no storage node may be marked down: with the usual hedging, and with a hedge sent on
//! every read (each read then cancels streams on the pool's connections, the pattern that looked
//! like a rapid-reset attack to the storage nodes and made them close those connections).

mod common;

use std::process::Command;

use common::{curl, file_with, metrics, random_bytes, tool, Cluster};

/// Requests per h2load run: enough for thousands of cancelled hedges, bounded for CI.
const REQUESTS: &str = "30000";

/// Hedge every read at once, to every other replica.
const HEDGE_EVERY_READ: &str = "[router]\nhedge_max_delay = \"0ms\"\n";

/// One test, the two loads one after the other: run side by side they would measure the
/// machine's two cores more than the cluster.
#[test]
fn heavy_reads_get_only_2xx_and_mark_no_node_down() {
    heavy_reads("", 0.0);
    // Half the reads are of the blob (documents read every replica anyway): at least one hedge
    // for each of those.
    heavy_reads(HEDGE_EVERY_READ, 15_000.0);
}

fn heavy_reads(frontend_extra: &str, min_hedges: f64) {
    let cluster = Cluster::start_with(3, 8, frontend_extra);
    let urls = [blob_url(&cluster), document_url(&cluster)];
    let output = Command::new(tool("h2load"))
        .args(["-n", REQUESTS, "-c", "20", "-m", "100"])
        .args(&urls)
        .output()
        .expect("h2load runs");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "h2load failed:\n{report}");
    let codes = status_codes(&report);
    assert_eq!(
        codes,
        [30_000, 0, 0, 0],
        "2xx, 3xx, 4xx, 5xx over {REQUESTS} reads:\n{report}"
    );

    let view = curl(cluster.dir.path(), &[&cluster.url("/v1/cluster")]).json();
    for node in view["nodes"].as_array().expect("nodes") {
        assert_eq!(
            node["state_changes"], 0,
            "a storage node was marked down under read load: {node}"
        );
    }
    let text = metrics::scrape_frontend(cluster.frontend_addr).expect("metrics");
    let hedges = metrics::value(&text, "larder_frontend_hedges_sent_total").unwrap_or(0.0);
    eprintln!("{REQUESTS} reads, {hedges} hedges sent");
    assert!(
        hedges >= min_hedges,
        "{hedges} hedges, expected at least {min_hedges}"
    );
}

fn blob_url(cluster: &Cluster) -> String {
    let body = file_with(cluster.dir.path(), &random_bytes(1024));
    let put = curl(
        cluster.dir.path(),
        &[
            "--data-binary",
            &format!("@{body}"),
            &cluster.url("/v1/blobs"),
        ],
    );
    assert_eq!(put.status, 201);
    let id = put.json()["id"].as_str().expect("an id").to_owned();
    cluster.url(&format!("/v1/blobs/{id}"))
}

fn document_url(cluster: &Cluster) -> String {
    let path = "/document/v1/load/music/docid/one";
    let body = file_with(
        cluster.dir.path(),
        br#"{"fields":{"title":"read under load","year":2026}}"#,
    );
    let put = curl(
        cluster.dir.path(),
        &[
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &format!("@{body}"),
            &cluster.url(path),
        ],
    );
    assert_eq!(put.status, 200);
    cluster.url(path)
}

/// `status codes: N 2xx, N 3xx, N 4xx, N 5xx` from h2load's report.
fn status_codes(report: &str) -> [u64; 4] {
    let line = report
        .lines()
        .find_map(|l| l.trim().strip_prefix("status codes:"))
        .unwrap_or_else(|| panic!("no status codes in h2load's report:\n{report}"));
    let mut codes = [0; 4];
    for (slot, part) in codes.iter_mut().zip(line.split(',')) {
        *slot = part
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unreadable {part:?} in {line:?}"));
    }
    codes
}
