//! "Rebuilt, never rejoined", by the node itself (`ARCHITECTURE.md`, Replication;
//! `larder-storage/src/rebuild.rs`): a replica whose data went back behind tombstones its peers
//! dropped (here: node 0's directory restored from a copy taken before the deletes) is refused
//! by them (409), replaces its data with a fresh copy from them without any operator step, and
//! ends up holding exactly the live blobs. Meanwhile no deleted blob is ever served, neither by
//! the frontend nor by node 0 itself.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::h2::H2Client;
use common::Cluster;
use http::{Method, StatusCode};
use larder_cluster::BlobId;

/// Compaction runs only when asked (`compact`), and drops a tombstone 1 s after its delete
/// once every replica has pulled past it.
const STORAGE: &str = "[compaction]\nenabled = false\ntombstone_retention = \"1s\"\n";

fn blob(i: usize) -> Bytes {
    Bytes::from(format!("rebuild test blob {i} ").repeat(1 + i % 50))
}

async fn put_blobs(client: &H2Client, from: usize, n: usize) -> Vec<(String, Bytes)> {
    let mut blobs = Vec::new();
    for i in from..from + n {
        let (status, id, json) = client.put(blob(i)).await;
        assert_eq!(status, StatusCode::CREATED, "{json}");
        blobs.push((id.unwrap(), blob(i)));
    }
    blobs
}

fn partition_of(id: &str) -> larder_cluster::PartitionId {
    let parsed: BlobId = id.parse().unwrap();
    parsed.partition
}

/// At least 16 blobs, and 4 on each of the 2 partitions: the frontend picks a partition at
/// random, and a rebuild of both of node 0's replicas needs deletes on both.
async fn put_blobs_on_both_partitions(client: &H2Client) -> Vec<(String, Bytes)> {
    let mut blobs = put_blobs(client, 0, 16).await;
    while [0, 1]
        .iter()
        .any(|&p| blobs.iter().filter(|(id, _)| partition_of(id) == p).count() < 4)
    {
        assert!(
            blobs.len() < 256,
            "the frontend writes to one partition only"
        );
        let more = put_blobs(client, blobs.len(), 4).await;
        blobs.extend(more);
    }
    blobs
}

/// Splits `blobs` into the IDs to delete (half of each partition's) and the blobs to keep.
fn delete_half_of_each_partition(blobs: &[(String, Bytes)]) -> (Vec<String>, Vec<(String, Bytes)>) {
    let (mut deleted, mut kept) = (Vec::new(), Vec::new());
    for p in [0, 1] {
        let on_p: Vec<_> = blobs
            .iter()
            .filter(|(id, _)| partition_of(id) == p)
            .collect();
        let (gone, stay) = on_p.split_at(on_p.len() / 2);
        deleted.extend(gone.iter().map(|(id, _)| id.clone()));
        kept.extend(stay.iter().map(|&b| b.clone()));
    }
    (deleted, kept)
}

/// GET of `id` on storage node `i`, through the internal API.
async fn on_node(cluster: &Cluster, i: usize, id: &str) -> (StatusCode, Bytes) {
    let parsed: BlobId = id.parse().unwrap();
    let path = larder_proto::blob_path(parsed.partition, id);
    let client = cluster.node_client(cluster.node_addr(i)).await;
    client.request(Method::GET, &path, Bytes::new()).await
}

/// Waits until `id` answers `want` on node `i`, for every node and id.
async fn wait_for(cluster: &Cluster, nodes: &[usize], ids: &[String], want: StatusCode) {
    let started = Instant::now();
    for &i in nodes {
        for id in ids {
            loop {
                let (got, _) = on_node(cluster, i, id).await;
                if got == want {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "node {i}, {id}: {got}, want {want}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Compacts nodes 0 to 2 until every one answers 404 for every deleted blob: the tombstones
/// went (every replica pulled past them, and the retention passed).
async fn compact_until_gone(cluster: &Cluster, deleted: &[String]) {
    let started = Instant::now();
    loop {
        for i in 0..3 {
            let client = cluster.node_client(cluster.node_addr(i)).await;
            let (status, body) = client
                .request(Method::POST, "/internal/v1/compaction", Bytes::new())
                .await;
            assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        }
        let mut left = 0;
        for i in 0..3 {
            for id in deleted {
                left += (on_node(cluster, i, id).await.0 != StatusCode::NOT_FOUND) as usize;
            }
        }
        if left == 0 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{left} tombstones left"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn data_dir(cluster: &Cluster, i: usize) -> std::path::PathBuf {
    cluster.dir.path().join(&cluster.map.nodes[i].id)
}

/// Waits until node 0 has saved a position past the start in each peer's feed of each
/// partition (2 partitions x 2 peers): it has pulled from them.
async fn wait_for_cursors(cluster: &Cluster) {
    let cursors = data_dir(cluster, 0).join("replication");
    let pulled = |e: &std::fs::DirEntry| {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        e.file_name().to_string_lossy().ends_with(".cursor")
            // Either slot (the file keeps the last two saves) past the start.
            && text
                .lines()
                .filter_map(|slot| slot.split_whitespace().next())
                .any(|cursor| !cursor.starts_with("0000000000000000."))
    };
    let started = Instant::now();
    while std::fs::read_dir(&cursors).map_or(0, |d| d.flatten().filter(pulled).count()) < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no cursors saved"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One of node 0's metrics, by its exposition name.
async fn metric(cluster: &Cluster, name: &str) -> f64 {
    let client = cluster.node_client(cluster.node_addr(0)).await;
    let (status, body) = client
        .request(Method::GET, "/internal/v1/metrics", Bytes::new())
        .await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8_lossy(&body).into_owned();
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

/// A cluster whose node 0 has just restarted on a copy of its data taken before `deleted` were
/// deleted (their tombstones since dropped by every node): it holds them again, and its
/// positions in its peers' feeds lie before their drops. `live` is what the cluster holds.
struct Behind {
    cluster: Cluster,
    client: H2Client,
    deleted: Vec<String>,
    live: Vec<(String, Bytes)>,
}

/// Sets up `Behind` with `storage` as the nodes' config; `big` blobs of 512 KiB are written
/// after the deletes (what a rebuild of node 0 has to copy besides the small ones).
async fn node_0_behind_dropped_tombstones(storage: &str, big: usize) -> Behind {
    let mut cluster = Cluster::start_full(3, 2, "", storage);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let old = put_blobs_on_both_partitions(&client).await;
    let (deleted, kept) = delete_half_of_each_partition(&old);
    let old_ids: Vec<String> = old.iter().map(|(id, _)| id.clone()).collect();
    wait_for(&cluster, &[0], &old_ids, StatusCode::OK).await;
    wait_for_cursors(&cluster).await;

    // A copy of node 0's data as it is now, before the deletes (a backup to restore later).
    cluster.stop_node(0);
    let backup = tempfile::tempdir().unwrap();
    copy_tree(&data_dir(&cluster, 0), backup.path());
    cluster.restart_node(0);

    // Deletes and new blobs through the frontend; every replica pulls them, then every
    // node's compaction drops the tombstones.
    for id in &deleted {
        let path = format!("/v1/blobs/{id}");
        let (status, _) = client.request(Method::DELETE, &path, Bytes::new()).await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    let mut new = put_blobs(&client, old.len(), 8).await;
    for i in 0..big {
        let bytes = Bytes::from(vec![i as u8; 512 << 10]);
        let (status, id, json) = client.put(bytes.clone()).await;
        assert_eq!(status, StatusCode::CREATED, "{json}");
        new.push((id.unwrap(), bytes));
    }
    wait_for(&cluster, &[0, 1, 2], &deleted, StatusCode::GONE).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    compact_until_gone(&cluster, &deleted).await;

    // Node 0's data goes back to the copy: it holds the deleted blobs again, and its
    // positions in its peers' feeds lie before their drops.
    cluster.stop_node(0);
    std::fs::remove_dir_all(data_dir(&cluster, 0)).unwrap();
    copy_tree(backup.path(), &data_dir(&cluster, 0));
    cluster.restart_node(0);
    let live: Vec<(String, Bytes)> = kept.into_iter().chain(new).collect();
    Behind {
        cluster,
        client,
        deleted,
        live,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_behind_dropped_tombstones_rebuilds_itself_and_never_serves_a_deleted_blob() {
    let Behind {
        mut cluster,
        client,
        deleted,
        live,
    } = node_0_behind_dropped_tombstones(STORAGE, 0).await;

    // From its start on, neither node 0 nor the frontend ever serves a deleted blob, and node
    // 0 ends up with exactly the live blobs: no operator step.
    let started = Instant::now();
    loop {
        for id in &deleted {
            let (status, _) = on_node(&cluster, 0, id).await;
            assert_ne!(status, StatusCode::OK, "node 0 serves deleted {id}");
            let (status, _) = client.get(id).await;
            assert_ne!(status, StatusCode::OK, "the frontend serves deleted {id}");
        }
        let mut missing = 0;
        for (id, _) in &live {
            missing += (on_node(&cluster, 0, id).await.0 != StatusCode::OK) as usize;
        }
        let gone = {
            let mut gone = true;
            for id in &deleted {
                let (status, _) = on_node(&cluster, 0, id).await;
                gone &= status == StatusCode::NOT_FOUND || status == StatusCode::GONE;
            }
            gone
        };
        if missing == 0 && gone {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "node 0 not rebuilt: {missing} live blobs missing, deleted ones gone: {gone}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (id, bytes) in &live {
        let (status, body) = on_node(&cluster, 0, id).await;
        assert_eq!(status, StatusCode::OK);
        assert!(body == *bytes, "{id} differs on node 0");
        let (status, body) = client.get(id).await;
        assert_eq!(status, StatusCode::OK);
        assert!(body == *bytes, "{id} differs through the frontend");
    }
    assert_eq!(metric(&cluster, "larder_storage_rebuilds_total").await, 2.0);
    assert_eq!(
        metric(&cluster, "larder_storage_replicas_rebuilding").await,
        0.0
    );
    let bootstrap = data_dir(&cluster, 0).join("bootstrap");
    let left: Vec<String> = std::fs::read_dir(&bootstrap)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "markers left: {left:?}");

    // It serves its peers again, and a restart keeps what it holds.
    cluster.stop_node(0);
    cluster.restart_node(0);
    let ids: Vec<String> = live.iter().map(|(id, _)| id.clone()).collect();
    wait_for(&cluster, &[0], &ids, StatusCode::OK).await;
    for id in &deleted {
        let (status, _) = on_node(&cluster, 0, id).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{id} after a restart");
    }
}

/// Node 0's `rebuilding` in its health answer: partition -> phase, since, bytes done and left.
async fn rebuilding(cluster: &Cluster) -> serde_json::Map<String, serde_json::Value> {
    let client = cluster.node_client(cluster.node_addr(0)).await;
    let (status, body) = client
        .request(Method::GET, "/internal/v1/health", Bytes::new())
        .await;
    assert_eq!(status, StatusCode::OK);
    let health: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let disks = health["disks"].as_object().expect("health lists the disks");
    assert!(
        !disks.is_empty() && disks.values().all(|d| d["refusing_writes"].is_null()),
        "{health}"
    );
    health["rebuilding"]
        .as_object()
        .cloned()
        .unwrap_or_default()
}

/// One look at node 0, as a rebuild goes: it serves no deleted blob, and a live one either
/// with its bytes or not at all (503 `ReplicaRebuilding` while it is rebuilt). Returns the live
/// blobs it served and those it refused as rebuilding.
async fn look_at_node_0(behind: &Behind) -> (usize, usize) {
    for id in &behind.deleted {
        let (status, _) = on_node(&behind.cluster, 0, id).await;
        assert_ne!(status, StatusCode::OK, "node 0 serves deleted {id}");
    }
    let (mut served, mut rebuilding) = (0, 0);
    for (id, bytes) in &behind.live {
        let (status, body) = on_node(&behind.cluster, 0, id).await;
        match status {
            StatusCode::OK => {
                assert!(body == *bytes, "{id} differs on node 0");
                served += 1;
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                let text = String::from_utf8_lossy(&body);
                rebuilding += text.contains("ReplicaRebuilding") as usize;
            }
            _ => {}
        }
    }
    (served, rebuilding)
}

/// `larder cluster status --json`, asked through node 0's config.
fn cluster_status(cluster: &Cluster) -> serde_json::Value {
    let config = cluster.path(&format!("{}.toml", cluster.map.nodes[0].id));
    let out = std::process::Command::new(common::LARDER)
        .args(["cluster", "status", "--json", "--config", &config])
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

/// A SIGKILL while the rebuild copies: the restarted node serves nothing of the half-made copy
/// (503 `ReplicaRebuilding` from its first request), goes on with the rebuild by itself, and
/// ends holding exactly the live blobs. `larder cluster status` shows the rebuilds meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_killed_while_it_copies_goes_on_after_the_restart_and_serves_nothing_stale() {
    // The rebuild copies 4 MiB and more at 1 MB/s: seconds in which to kill it.
    let storage = format!("{STORAGE}[redistribution]\nrate_mb_per_s = 1\n");
    let mut behind = node_0_behind_dropped_tombstones(&storage, 8).await;

    // Until the bulk copy has saved progress, and node 0 and the CLI show it.
    let started = Instant::now();
    let before = loop {
        look_at_node_0(&behind).await;
        let rebuilds = rebuilding(&behind.cluster).await;
        let copied = rebuilds
            .values()
            .any(|r| r["phase"] == "copying" && r["bytes_done"].as_u64() > Some(0));
        if copied {
            break rebuilds;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no rebuild copying: {rebuilds:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let status = cluster_status(&behind.cluster);
    let shown = status["rebuilding"].as_array().cloned().unwrap_or_default();
    assert!(
        shown
            .iter()
            .any(|r| r["node"] == behind.cluster.map.nodes[0].id.as_str()
                && r["phase"] == "copying"
                && r["since"].as_u64().is_some()),
        "cluster status: {status}"
    );

    behind.cluster.kill_node(0);
    behind.cluster.restart_node(0);

    // From its first answer on, the restarted node rebuilds the same replicas (since when
    // they were decided) and refuses their reads.
    let after = rebuilding(&behind.cluster).await;
    assert_eq!(after.len(), 2, "rebuilding after the restart: {after:?}");
    for (partition, r) in &before {
        assert_eq!(after[partition]["since"], r["since"], "{after:?}");
    }
    let (served, refused) = look_at_node_0(&behind).await;
    assert_eq!((served, refused), (0, behind.live.len()));

    // It finishes by itself, never serving a deleted blob meanwhile.
    let started = Instant::now();
    loop {
        let (served, _) = look_at_node_0(&behind).await;
        if served == behind.live.len() && rebuilding(&behind.cluster).await.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "node 0 not rebuilt: {served} of {} live blobs served",
            behind.live.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Exactly the live blobs: deleted ones are not found, nothing else is held.
    for id in &behind.deleted {
        let (status, _) = on_node(&behind.cluster, 0, id).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{id} on node 0");
    }
    let client = behind
        .cluster
        .node_client(behind.cluster.node_addr(0))
        .await;
    let (_, body) = client
        .request(Method::GET, "/internal/v1/health", Bytes::new())
        .await;
    let health: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let keys: u64 = health["partitions"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| p["live_keys"].as_u64().unwrap())
        .sum();
    assert_eq!(keys, behind.live.len() as u64, "{health}");
    let status = cluster_status(&behind.cluster);
    assert_eq!(status["rebuilding"], serde_json::json!([]), "{status}");
    assert!(!behind.client.get(&behind.deleted[0]).await.0.is_success());
}
