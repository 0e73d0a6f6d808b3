//! Replication and repair with real processes: a node that was down (SIGKILL) during writes and
//! deletes catches up, deleted blobs stay deleted, and under sustained load with repeated kills
//! every acknowledged blob ends up on every replica (checked per replica through the internal API).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::h2::H2Client;
use common::Cluster;
use http::{Method, StatusCode};
use larder_cluster::BlobId;

fn blob(i: usize) -> Bytes {
    Bytes::from(format!("replicated blob {i} ").repeat(1 + i % 50))
}

/// Status of `id` on every replica of its partition, asked directly of each storage node.
async fn replica_statuses(
    cluster: &Cluster,
    clients: &HashMap<String, H2Client>,
    id: &str,
) -> Vec<StatusCode> {
    let parsed: BlobId = id.parse().unwrap();
    let partition = cluster.map.partition(parsed.partition).unwrap();
    let mut out = Vec::new();
    for replica in &partition.replicas {
        let path = larder_proto::blob_path(parsed.partition, id);
        let (status, _) = clients[&replica.node]
            .request(Method::HEAD, &path, Bytes::new())
            .await;
        out.push(status);
    }
    out
}

async fn node_clients(cluster: &Cluster) -> HashMap<String, H2Client> {
    let mut clients = HashMap::new();
    for (i, node) in cluster.map.nodes.iter().enumerate() {
        clients.insert(
            node.id.clone(),
            cluster.node_client(cluster.node_addr(i)).await,
        );
    }
    clients
}

/// Waits until every replica answers `expected` for every id, or fails after `limit`.
async fn wait_converged(
    cluster: &Cluster,
    expected: &[(String, StatusCode)],
    limit: Duration,
) -> Duration {
    let started = Instant::now();
    let clients = node_clients(cluster).await;
    loop {
        let mut lagging = Vec::new();
        for (id, want) in expected {
            let statuses = replica_statuses(cluster, &clients, id).await;
            if statuses.iter().any(|s| s != want) {
                lagging.push(format!("{id}: {statuses:?} (want {want})"));
            }
        }
        if lagging.is_empty() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "not converged after {limit:?}: {} blobs, e.g. {}",
            lagging.len(),
            lagging[0]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn put(client: &H2Client, i: usize) -> String {
    let (status, id, json) = client.put(blob(i)).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    id.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_down_during_writes_and_deletes_converges_without_resurrection() {
    let mut cluster = Cluster::start(3, 6);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let mut ids = Vec::new();
    for i in 0..30 {
        ids.push(put(&client, i).await);
    }
    cluster.kill_node(0);
    for i in 30..60 {
        ids.push(put(&client, i).await);
    }
    // Deletes while s1 is down: of blobs it has, and of blobs it never saw.
    let deleted: Vec<String> = ids.iter().step_by(4).cloned().collect();
    for id in &deleted {
        let (status, _) = client
            .request(Method::DELETE, &format!("/v1/blobs/{id}"), Bytes::new())
            .await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    cluster.restart_node(0);
    let expected: Vec<(String, StatusCode)> = ids
        .iter()
        .map(|id| {
            (
                id.clone(),
                if deleted.contains(id) {
                    StatusCode::GONE
                } else {
                    StatusCode::OK
                },
            )
        })
        .collect();
    wait_converged(&cluster, &expected, Duration::from_secs(30)).await;
    for (i, id) in ids.iter().enumerate() {
        let (status, body) = client.get(id).await;
        if deleted.contains(id) {
            assert_eq!(status, StatusCode::GONE, "deleted blob {i} came back");
        } else {
            assert_eq!((status, body), (StatusCode::OK, blob(i)));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sustained_writes_while_nodes_are_killed_and_restarted() {
    let mut cluster = Cluster::start(3, 6);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let acknowledged: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (client, acknowledged, stop) = (client.clone(), acknowledged.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut i = w;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (status, id, _) = client.put(blob(i)).await;
                if status == StatusCode::CREATED {
                    acknowledged.lock().unwrap().push((i, id.unwrap()));
                }
                i += 4;
            }
        }));
    }
    for round in 0..3 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let victim = round % 3;
        cluster.kill_node(victim);
        tokio::time::sleep(Duration::from_millis(700)).await;
        cluster.restart_node(victim);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for writer in writers {
        writer.await.unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() > 50,
        "only {} writes succeeded",
        acknowledged.len()
    );
    for (i, id) in &acknowledged {
        let (status, body) = client.get(id).await;
        assert_eq!(
            (status, body),
            (StatusCode::OK, blob(*i)),
            "acknowledged blob {i}"
        );
    }
    let expected: Vec<(String, StatusCode)> = acknowledged
        .iter()
        .map(|(_, id)| (id.clone(), StatusCode::OK))
        .collect();
    let took = wait_converged(&cluster, &expected, Duration::from_secs(60)).await;
    eprintln!(
        "{} acknowledged blobs on every replica {took:?} after the load stopped",
        acknowledged.len()
    );
}

/// Puts `n` blobs and waits until every replica has each: the blobs, each with 200.
async fn put_converged(cluster: &Cluster, n: usize) -> Vec<(String, StatusCode)> {
    let client = H2Client::connect(cluster.frontend_addr).await;
    let mut expected = Vec::new();
    for i in 0..n {
        expected.push((put(&client, i).await, StatusCode::OK));
    }
    wait_converged(cluster, &expected, Duration::from_secs(30)).await;
    expected
}

/// Every file in `dir` whose name ends with `.cursor`, with its contents.
fn cursor_files(dir: &std::path::Path) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".cursor"))
                .map(|e| {
                    let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                    (e.file_name().to_string_lossy().into_owned(), text)
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// A replica rebuilt from scratch (its store directories removed while the node was down: a new
/// incarnation) pulls everything from its peers again, although the cursors it saved say it
/// had pulled it all: those cursors belonged to the replica that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_replica_pulls_everything_again() {
    let mut cluster = Cluster::start(3, 2);
    let expected = put_converged(&cluster, 20).await;
    // Node 0 has pulled its peers' feeds to their ends: its cursors exist and stop moving.
    let data_dir = cluster.dir.path().join(&cluster.map.nodes[0].id);
    let replication_dir = data_dir.join("replication");
    let started = Instant::now();
    let mut last = cursor_files(&replication_dir);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = cursor_files(&replication_dir);
        if now.len() == 4 && now == last {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "cursors: {now:?}"
        );
        last = now;
    }
    cluster.stop_node(0);
    for entry in std::fs::read_dir(&data_dir).unwrap().flatten() {
        if entry.file_name() != "replication" && entry.path().is_dir() {
            std::fs::remove_dir_all(entry.path()).unwrap();
        }
    }
    cluster.restart_node(0);
    wait_converged(&cluster, &expected, Duration::from_secs(30)).await;
}

/// Whether a cursor file's text names a position past the start of a feed in either slot (the
/// file keeps the last two saves).
fn past_start(text: &str) -> bool {
    text.lines()
        .filter_map(|slot| slot.split_whitespace().next())
        .filter_map(|cursor| cursor.split_once('.'))
        .any(|(_, sequence)| sequence != "0")
}

/// Replication saves a link's position (an `fdatasync`) at most once per `cursor_save_every`,
/// and where every link got to at a clean stop. With an hour between saves, pulls move past
/// the writes while every file still holds a start position; a clean stop saves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_are_saved_at_most_once_per_interval_and_at_a_clean_stop() {
    let storage = "[replication]\ncursor_save_every = \"1h\"\n";
    let mut cluster = Cluster::start_full(3, 2, "", storage);
    let expected = put_converged(&cluster, 20).await;
    // Rounds run every 200 ms: node 0 has pulled past the writes several times over.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let replication_dir = cluster
        .dir
        .path()
        .join(&cluster.map.nodes[0].id)
        .join("replication");
    let files = cursor_files(&replication_dir);
    assert_eq!(files.len(), 4, "a file per partition and peer: {files:?}");
    assert!(
        files.iter().all(|(_, text)| !past_start(text)),
        "saved before an hour passed: {files:?}"
    );
    cluster.stop_node(0);
    let files = cursor_files(&replication_dir);
    assert!(
        files.iter().all(|(_, text)| past_start(text)),
        "not saved at the clean stop: {files:?}"
    );
    // And the restart resumes from there.
    cluster.restart_node(0);
    wait_converged(&cluster, &expected, Duration::from_secs(30)).await;
}

/// `cursor_save_every = 0`: a link saves its position after every page that moved it, while
/// it runs (not only at a clean stop, as with an hour between saves above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_interval_of_zero_saves_cursors_while_replication_runs() {
    let storage = "[replication]\ncursor_save_every = \"0s\"\n";
    let cluster = Cluster::start_full(3, 2, "", storage);
    put_converged(&cluster, 20).await;
    let replication_dir = cluster
        .dir
        .path()
        .join(&cluster.map.nodes[0].id)
        .join("replication");
    let started = std::time::Instant::now();
    loop {
        let files = cursor_files(&replication_dir);
        if files.len() == 4 && files.iter().all(|(_, text)| past_start(text)) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "positions not saved while running: {files:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
