//! What an operator sees of compaction: background passes measure each replica's garbage ratio
//! (shown by `larder compaction status` and `GET /internal/v1/compaction`, and as metrics, with the
//! lag since the last pass); `larder compaction run --rate` compacts now and the ratio drops to 0.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::h2::H2Client;
use common::{Cluster, LARDER};
use http::{Method, StatusCode};

fn cli(cluster: &Cluster, args: &[&str]) -> serde_json::Value {
    let out = Command::new(LARDER)
        .arg("compaction")
        .args(args)
        .args(["--json", "--config", &cluster.path("s1.toml")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The largest garbage ratio over the node's replicas, if any was measured.
fn max_ratio(status: &serde_json::Value) -> Option<f64> {
    status["partitions"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(|p| p["garbage_ratio"].as_f64())
        .reduce(f64::max)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_ratio_and_lag_are_shown_and_compaction_runs_on_demand() {
    // Passes every 300 ms that measure but rewrite nothing (no segment is 99% garbage).
    let cluster = Cluster::start_full(
        3,
        2,
        "",
        "[store]\nsegment_size = \"1 MiB\"\n[compaction]\ninterval = \"300ms\"\nmin_garbage_ratio = 0.99\n",
    );
    let client = H2Client::connect(cluster.frontend_addr).await;
    let mut ids = Vec::new();
    for i in 0..24u8 {
        let (status, id, json) = client.put(Bytes::from(vec![i; 256 << 10])).await;
        assert_eq!(status, StatusCode::CREATED, "{json}");
        ids.push(id.unwrap());
    }
    for id in ids.iter().step_by(2) {
        let (status, _) = client
            .request(Method::DELETE, &format!("/v1/blobs/{id}"), Bytes::new())
            .await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    let started = Instant::now();
    let status = loop {
        let status = cli(&cluster, &["status"]);
        if max_ratio(&status).is_some_and(|r| r > 0.2) {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no garbage measured: {status}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(status["node"], "s1");
    assert_eq!(status["busy_requests"], 8);

    let node = cluster.node_client(cluster.node_addr(0)).await;
    let (code, body) = node
        .request(Method::GET, "/internal/v1/metrics", Bytes::new())
        .await;
    assert_eq!(code, StatusCode::OK);
    let text = String::from_utf8_lossy(&body);
    let values = |name: &str| -> Vec<f64> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{partition=")))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect()
    };
    let ratios = values("larder_storage_compaction_garbage_ratio");
    assert!(ratios.iter().any(|r| *r > 0.2), "{text}");
    let lags = values("larder_storage_compaction_lag_seconds");
    assert!(
        !lags.is_empty() && lags.iter().all(|l| *l < 10.0),
        "passes complete: {text}"
    );
    assert!(
        text.contains("larder_storage_compaction_yielded_seconds_total"),
        "{text}"
    );

    let read: f64 = values("larder_storage_compaction_bytes_read_total")
        .iter()
        .sum();
    assert!(read > 0.0, "the sealed segments were read once: {text}");
    // Passes that follow find nothing new in them, and read nothing.
    let started = Instant::now();
    loop {
        let status = cli(&cluster, &["status"]);
        if status["last_pass"]["bytes_read"].as_u64() == Some(0) {
            assert!(max_ratio(&status).is_some_and(|r| r > 0.2), "{status}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "every pass reads the unchanged segments again: {status}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let (code, _) = node
        .request(
            Method::POST,
            "/internal/v1/compaction?rate_mb_per_s=fast",
            Bytes::new(),
        )
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);

    let run = cli(&cluster, &["run", "--rate", "100"]);
    let reclaimed: u64 = run["partitions"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| p["bytes_reclaimed"].as_u64().unwrap())
        .sum();
    assert!(reclaimed >= 6 * (256 << 10), "{run}");
    let after = cli(&cluster, &["status"]);
    assert_eq!(max_ratio(&after), Some(0.0), "{after}");
}
