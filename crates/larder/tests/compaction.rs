//! Compaction as an operator sees it: upload, delete most, compact every node through the
//! internal API, and the data directories shrink; survivors read back byte-identical, also after
//! a restart, and deleted blobs stay gone (410).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::h2::H2Client;
use common::Cluster;
use http::{Method, StatusCode};
use larder_cluster::BlobId;

const BLOBS: usize = 60;
const BLOB_SIZE: usize = 256 << 10;

fn blob(i: usize) -> Bytes {
    (0..BLOB_SIZE)
        .map(|j| (j as u8).wrapping_mul(7) ^ (i as u8))
        .collect::<Vec<u8>>()
        .into()
}

fn tree_size(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() {
            tree_size(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

fn data_dirs_size(cluster: &Cluster) -> u64 {
    cluster
        .map
        .nodes
        .iter()
        .map(|n| tree_size(&cluster.dir.path().join(&n.id)))
        .sum()
}

/// Waits until every replica of every deleted blob answers 410 (the tombstones are everywhere).
async fn wait_deleted_everywhere(cluster: &Cluster, deleted: &[String]) {
    let mut clients = Vec::new();
    for i in 0..cluster.map.nodes.len() {
        clients.push(cluster.node_client(cluster.node_addr(i)).await);
    }
    let started = Instant::now();
    'outer: loop {
        for id in deleted {
            let parsed: BlobId = id.parse().unwrap();
            let path = larder_proto::blob_path(parsed.partition, id);
            for client in &clients {
                let (status, _) = client.request(Method::HEAD, &path, Bytes::new()).await;
                if status != StatusCode::GONE {
                    assert!(
                        started.elapsed() < Duration::from_secs(30),
                        "{id}: {status}"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue 'outer;
                }
            }
        }
        return;
    }
}

async fn check(client: &H2Client, ids: &[String], deleted: &[String]) {
    for (i, id) in ids.iter().enumerate() {
        let (status, body) = client.get(id).await;
        if deleted.contains(id) {
            assert_eq!(status, StatusCode::GONE, "deleted blob {i}");
        } else {
            assert_eq!(status, StatusCode::OK, "blob {i}");
            assert!(body == blob(i), "blob {i} differs");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_blobs_give_their_space_back() {
    let mut cluster = Cluster::start(3, 2);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let mut ids = Vec::new();
    for i in 0..BLOBS {
        let (status, id, json) = client.put(blob(i)).await;
        assert_eq!(status, StatusCode::CREATED, "{json}");
        ids.push(id.unwrap());
    }
    let deleted: Vec<String> = ids.iter().take(BLOBS * 9 / 10).cloned().collect();
    for id in &deleted {
        let (status, _) = client
            .request(Method::DELETE, &format!("/v1/blobs/{id}"), Bytes::new())
            .await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    wait_deleted_everywhere(&cluster, &deleted).await;
    let before = data_dirs_size(&cluster);
    for i in 0..cluster.map.nodes.len() {
        let node = cluster.node_client(cluster.node_addr(i)).await;
        let (status, body) = node
            .request(Method::POST, "/internal/v1/compaction", Bytes::new())
            .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
    let after = data_dirs_size(&cluster);
    // Every node holds a replica of every blob.
    let deleted_bytes = (deleted.len() * BLOB_SIZE * cluster.map.nodes.len()) as u64;
    assert!(
        before.saturating_sub(after) * 10 >= deleted_bytes * 7,
        "before {before}, after {after}, deleted {deleted_bytes}"
    );
    check(&client, &ids, &deleted).await;
    for i in 0..cluster.map.nodes.len() {
        cluster.stop_node(i);
        cluster.restart_node(i);
    }
    check(&client, &ids, &deleted).await;
    assert!(data_dirs_size(&cluster) <= after + (1 << 20));
}

/// Background compaction is on by default: with small segments and a short interval, deleted
/// blobs' space comes back without anyone asking, and the node's metrics count it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_compaction_reclaims_without_being_asked() {
    let cluster = Cluster::start_full(
        3,
        2,
        "",
        "[store]\nsegment_size = \"1 MiB\"\n[compaction]\ninterval = \"300ms\"\n",
    );
    let client = H2Client::connect(cluster.frontend_addr).await;
    let mut ids = Vec::new();
    for i in 0..BLOBS {
        let (status, id, json) = client.put(blob(i)).await;
        assert_eq!(status, StatusCode::CREATED, "{json}");
        ids.push(id.unwrap());
    }
    let deleted: Vec<String> = ids.iter().take(BLOBS * 9 / 10).cloned().collect();
    for id in &deleted {
        let (status, _) = client
            .request(Method::DELETE, &format!("/v1/blobs/{id}"), Bytes::new())
            .await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    wait_deleted_everywhere(&cluster, &deleted).await;
    let node = cluster.node_client(cluster.node_addr(0)).await;
    let started = Instant::now();
    loop {
        let (status, body) = node
            .request(Method::GET, "/internal/v1/metrics", Bytes::new())
            .await;
        assert_eq!(status, StatusCode::OK);
        let text = String::from_utf8_lossy(&body);
        let reclaimed: u64 = text
            .lines()
            .filter(|l| l.starts_with("larder_storage_compaction_bytes_reclaimed_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        // Most deleted bytes of this node's replicas (the active segments keep some).
        if reclaimed >= (deleted.len() * BLOB_SIZE) as u64 / 2 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "reclaimed only {reclaimed} bytes"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    check(&client, &ids, &deleted).await;
}
