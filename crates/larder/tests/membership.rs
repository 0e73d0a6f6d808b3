//! A cluster that changes shape, end to end with real processes and the `larder cluster`
//! command (issue 15): a SIGKILLed node replaced by a new one holds every acknowledged blob and
//! document, so that it alone serves them once the other original nodes are gone too; a node
//! drained under PUT/GET load can be stopped with nothing lost, and no GET fails meanwhile.

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::h2::H2Client;
use common::{Cluster, LARDER};
use http::{Method, StatusCode};

/// Replication every 50 ms and a short removal grace, so that moves finish quickly.
const STORAGE_EXTRA: &str = "[replication]\ninterval = \"50ms\"\n\
     [redistribution]\nremoval_grace = \"1s\"\n";

fn blob(i: usize) -> Bytes {
    let line = format!("membership blob {i:06} ");
    Bytes::from(line.repeat(4096 / line.len() + 1)[..4096].to_owned())
}

fn doc_name(i: usize) -> String {
    format!("doc-{i}")
}

/// A storage node added to the cluster after it started (its config names the cluster's map
/// file, which the `larder cluster` command rewrites), killed when dropped.
struct NewNode {
    child: Option<Child>,
    config: String,
    addr: SocketAddr,
}

impl NewNode {
    fn start(cluster: &Cluster, id: &str, addr: SocketAddr) -> NewNode {
        let config = format!(
            "node_id = \"{id}\"\ncluster_map = \"cluster.toml\"\ndata_dir = \"{id}\"\n\
             {STORAGE_EXTRA}\n[auth]\nsecret_file = \"{}\"\n",
            common::SECRET_FILE
        );
        let path = cluster.path(&format!("{id}.toml"));
        std::fs::write(&path, config).unwrap();
        let mut node = NewNode {
            child: None,
            config: path,
            addr,
        };
        node.restart();
        node
    }

    fn restart(&mut self) {
        assert!(self.child.is_none());
        self.child = Some(common::spawn(&["storage", "--config", &self.config]));
        common::wait_for_port(self.addr);
    }

    /// SIGKILL.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NewNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `larder cluster <args>`: success, stdout, stderr.
fn larder_cluster(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(LARDER)
        .arg("cluster")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `larder cluster status --json` with `config`'s credentials and the frontend's revision.
fn cluster_status(config: &str, frontend: SocketAddr) -> serde_json::Value {
    let url = format!("http://{frontend}");
    let (ok, out, err) =
        larder_cluster(&["status", "--json", "--config", config, "--frontend", &url]);
    assert!(ok, "{out}{err}");
    serde_json::from_str(&out).unwrap()
}

/// Polls `cluster status` until no move is left at a revision above `started`, and every
/// running node (those not `down`) and the frontend run that revision; returns the status.
async fn wait_moves_done(
    config: &str,
    frontend: SocketAddr,
    started: u64,
    limit: Duration,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let (config, status) = (config.to_owned(), frontend);
        let status = tokio::task::spawn_blocking(move || cluster_status(&config, status))
            .await
            .unwrap();
        let revision = status["map_revision"].as_u64().unwrap();
        let at = revision.to_string();
        let everyone = status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["map_revision"] == "down" || n["map_revision"] == at.as_str())
            && status["frontends"][0]["map_revision"] == at.as_str();
        if revision > started && everyone && status["moves"].as_array().unwrap().is_empty() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "the moves are not done after {limit:?}: {status}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// What a load run had acknowledged, and what went wrong.
#[derive(Default)]
struct Acked {
    blobs: Vec<(String, usize)>,
    docs: Vec<usize>,
    failed_gets: Vec<String>,
}

/// PUTs blobs and documents numbered from `from` (and, with `reads`, GETs an acknowledged blob
/// after each PUT, every failure noted) until `running` is cleared.
fn spawn_load(
    frontend: SocketAddr,
    from: usize,
    reads: bool,
    running: Arc<AtomicBool>,
    acked: Arc<Mutex<Acked>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = H2Client::connect(frontend).await;
        let mut i = from;
        while running.load(Ordering::Relaxed) {
            let (status, id, _) = client.put(blob(i)).await;
            if status == StatusCode::CREATED {
                acked.lock().unwrap().blobs.push((id.unwrap(), i));
            }
            if put_doc(&client, i).await == StatusCode::OK {
                acked.lock().unwrap().docs.push(i);
            }
            if reads {
                let pick = {
                    let acked = acked.lock().unwrap();
                    acked.blobs[(i * 7919) % acked.blobs.len()].clone()
                };
                let (status, body) = client.get(&pick.0).await;
                if status != StatusCode::OK || body != blob(pick.1) {
                    let failure = format!("GET of blob {} answered {status}", pick.1);
                    acked.lock().unwrap().failed_gets.push(failure);
                }
            }
            i += 1;
        }
    })
}

async fn put_doc(client: &H2Client, i: usize) -> StatusCode {
    let path = format!("/document/v1/ns/t/docid/{}", doc_name(i));
    let body = format!(r#"{{"fields":{{"n":{i}}}}}"#);
    let request = http::Request::post(format!("http://{}{path}", "localhost"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from(body)))
        .unwrap();
    client.send(request).await.0
}

/// Blobs and documents acknowledged before any change: the cluster's data at rest.
async fn fill(frontend: SocketAddr, count: usize) -> Acked {
    fill_from(frontend, 0, count).await
}

/// `count` blobs and documents numbered from `from`, each acknowledged.
async fn fill_from(frontend: SocketAddr, from: usize, count: usize) -> Acked {
    let client = H2Client::connect(frontend).await;
    let mut acked = Acked::default();
    for i in from..from + count {
        let (status, id, json) = client.put(blob(i)).await;
        assert_eq!(status, StatusCode::CREATED, "{json}");
        acked.blobs.push((id.unwrap(), i));
        assert_eq!(put_doc(&client, i).await, StatusCode::OK);
        acked.docs.push(i);
    }
    acked
}

/// Every acknowledged blob reads through the frontend with its bytes.
async fn assert_blobs_read(frontend: SocketAddr, blobs: &[(String, usize)]) {
    let client = H2Client::connect(frontend).await;
    for (id, i) in blobs {
        let (status, body) = client.get(id).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "blob {i} ({id}) through the frontend: {}",
            String::from_utf8_lossy(&body)
        );
        assert!(body == blob(*i), "blob {i} read with other bytes");
    }
}

/// Every acknowledged document reads through the frontend with its field.
async fn assert_docs_read(frontend: SocketAddr, docs: &[usize]) {
    let client = H2Client::connect(frontend).await;
    for i in docs {
        let path = format!("/document/v1/ns/t/docid/{}", doc_name(*i));
        let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
        assert_eq!(status, StatusCode::OK, "document {i}: {body:?}");
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["fields"]["n"], *i, "document {i}: {json}");
    }
}

/// Waits until `addr`'s own replicas hold every blob and document of `acked`.
async fn wait_on_node(cluster: &Cluster, addr: SocketAddr, acked: &Acked, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let missing = missing_on_node(cluster, addr, acked).await;
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} writes never reached {addr}, e.g. {}",
            missing.len(),
            missing[0]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What of `acked` `addr`'s own replicas lack (the internal read).
async fn missing_on_node(cluster: &Cluster, addr: SocketAddr, acked: &Acked) -> Vec<String> {
    let client = cluster.node_client(addr).await;
    let partitions = cluster.map.partitions.len() as u32;
    let mut missing = Vec::new();
    for (id, i) in &acked.blobs {
        let partition = id.parse::<larder_cluster::BlobId>().unwrap().partition;
        let path = larder_proto::blob_path(partition, id);
        let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
        if status != StatusCode::OK || body != blob(*i) {
            missing.push(format!("blob {i}: {status}"));
        }
    }
    for i in &acked.docs {
        let key = format!("id:ns:t::{}", doc_name(*i));
        let partition = larder_cluster::partition_for_key(key.as_bytes(), partitions);
        let path = larder_proto::doc_path(partition, &key);
        let (status, _) = client.request(Method::GET, &path, Bytes::new()).await;
        if status != StatusCode::OK {
            missing.push(format!("document {i}: {status}"));
        }
    }
    missing
}

/// Every acknowledged blob and document is in `addr`'s own replicas (the internal read).
async fn assert_on_node(cluster: &Cluster, addr: SocketAddr, acked: &Acked) {
    let client = cluster.node_client(addr).await;
    let partitions = cluster.map.partitions.len() as u32;
    for (id, i) in &acked.blobs {
        let partition = id.parse::<larder_cluster::BlobId>().unwrap().partition;
        let path = larder_proto::blob_path(partition, id);
        let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
        assert_eq!(status, StatusCode::OK, "blob {i} on the node's replica");
        assert!(body == blob(*i), "blob {i} on the node has other bytes");
    }
    for i in &acked.docs {
        let key = format!("id:ns:t::{}", doc_name(*i));
        let partition = larder_cluster::partition_for_key(key.as_bytes(), partitions);
        let path = larder_proto::doc_path(partition, &key);
        let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "document {i} on the node's replica: {body:?}"
        );
        assert!(
            String::from_utf8_lossy(&body).contains(&format!("\"n\":{i}")),
            "document {i} on the node: {body:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_node_alone_serves_everything_acknowledged_before_and_during_the_move() {
    let mut cluster = Cluster::start_full(3, 8, "", STORAGE_EXTRA);
    let frontend = cluster.frontend_addr;
    let mut acked = fill(frontend, 120).await;
    // s1, the map authority, dies: the new map's authority (s2) runs the plan.
    cluster.kill_node(0);

    let running = Arc::new(AtomicBool::new(true));
    let during = Arc::new(Mutex::new(Acked::default()));
    let load = spawn_load(frontend, 10_000, false, running.clone(), during.clone());
    let new_addr = common::free_addresses(1)[0];
    let config = cluster.path("s2.toml");
    let (ok, out, err) = larder_cluster(&[
        "replace-node",
        "s1",
        "s4",
        "--address",
        &new_addr.to_string(),
        "--config",
        &config,
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("8 replica moves started"), "{out}");
    let mut s4 = NewNode::start(&cluster, "s4", new_addr);
    let status = wait_moves_done(&config, frontend, 1, Duration::from_secs(120)).await;
    running.store(false, Ordering::Relaxed);
    load.await.unwrap();
    let during = std::mem::take(&mut *during.lock().unwrap());
    assert!(
        during.blobs.len() >= 5,
        "too few writes during the move to show anything: {}",
        during.blobs.len()
    );
    acked.blobs.extend(during.blobs);
    acked.docs.extend(during.docs);

    // s1 holds nothing any more; s4 holds every partition, live.
    let node = |id: &str| {
        let nodes = status["nodes"].as_array().unwrap();
        let n = nodes.iter().find(|n| n["id"] == id).unwrap();
        [&n["live"], &n["bootstrapping"], &n["leaving"]].map(|v| v.as_u64().unwrap())
    };
    assert_eq!(node("s1"), [0, 0, 0], "{status}");
    assert_eq!(node("s4"), [8, 0, 0], "{status}");

    // Writes s4 misses while it is down reach it from its peers by replication: the old
    // replicas serve their new peer (they once counted as behind it, and served it nothing).
    s4.kill();
    let missed = fill_from(frontend, 20_000, 20).await;
    s4.restart();
    wait_on_node(&cluster, new_addr, &missed, Duration::from_secs(30)).await;
    // The frontend's pool reconnects to s4 once its reconnect backoff (at most 2 s by
    // default) after the failures while s4 was down has passed; until then it answers 503.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    acked.blobs.extend(missed.blobs);
    acked.docs.extend(missed.docs);

    // The other two original nodes die: s4 alone serves everything.
    cluster.kill_node(1);
    cluster.kill_node(2);
    assert_on_node(&cluster, new_addr, &acked).await;
    assert_blobs_read(frontend, &acked.blobs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_drained_under_load_is_stopped_with_nothing_lost_and_no_get_failing() {
    let mut cluster = Cluster::start_full(4, 8, "", STORAGE_EXTRA);
    let frontend = cluster.frontend_addr;
    let mut acked = fill(frontend, 80).await;
    let acked_before = acked.blobs.clone();

    let running = Arc::new(AtomicBool::new(true));
    let during = Arc::new(Mutex::new(Acked {
        blobs: acked_before,
        ..Acked::default()
    }));
    let load = spawn_load(frontend, 10_000, true, running.clone(), during.clone());
    let config = cluster.path("s1.toml");
    let (ok, out, err) = larder_cluster(&["drain-node", "s2", "--config", &config]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("6 replica moves started"), "{out}");
    let status = wait_moves_done(&config, frontend, 1, Duration::from_secs(120)).await;
    let s2 = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "s2")
        .cloned()
        .unwrap();
    assert_eq!(
        (s2["live"].as_u64(), s2["leaving"].as_u64()),
        (Some(0), Some(0)),
        "{status}"
    );
    // Drained: it can be stopped while the load goes on.
    cluster.stop_node(1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    running.store(false, Ordering::Relaxed);
    load.await.unwrap();
    let during = std::mem::take(&mut *during.lock().unwrap());
    assert!(
        during.failed_gets.is_empty(),
        "{} GETs failed during the drain, e.g. {}",
        during.failed_gets.len(),
        during.failed_gets[0]
    );
    acked.blobs = during.blobs;
    acked.docs.extend(during.docs);
    assert_blobs_read(frontend, &acked.blobs).await;
    assert_docs_read(frontend, &acked.docs).await;
}

/// Storage configs with automatic re-replication after `after`.
fn auto_extra(after: &str) -> String {
    format!("{STORAGE_EXTRA}auto_replace_after = \"{after}\"\n")
}

/// The `cluster status` row of node `id`: [live, bootstrapping, leaving].
fn replica_counts(status: &serde_json::Value, id: &str) -> [u64; 3] {
    let nodes = status["nodes"].as_array().unwrap();
    let n = nodes.iter().find(|n| n["id"] == id).unwrap();
    [&n["live"], &n["bootstrapping"], &n["leaving"]].map(|v| v.as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_down_past_auto_replace_after_has_its_replicas_rebuilt_on_the_others() {
    let mut cluster = Cluster::start_full(4, 8, "", &auto_extra("3s"));
    let frontend = cluster.frontend_addr;
    let mut acked = fill(frontend, 80).await;
    // s1 is the map authority: s2, next in line, notices and decides.
    cluster.kill_node(0);
    let running = Arc::new(AtomicBool::new(true));
    let during = Arc::new(Mutex::new(Acked::default()));
    let load = spawn_load(frontend, 10_000, false, running.clone(), during.clone());
    let config = cluster.path("s2.toml");
    let status = wait_moves_done(&config, frontend, 1, Duration::from_secs(120)).await;
    running.store(false, Ordering::Relaxed);
    load.await.unwrap();
    let during = std::mem::take(&mut *during.lock().unwrap());
    acked.blobs.extend(during.blobs);
    acked.docs.extend(during.docs);

    // One plan (revision 2) and its completion (3); s1 holds nothing, the others all 8.
    assert_eq!(status["map_revision"], 3, "{status}");
    assert_eq!(status["authority"], "s2", "{status}");
    assert_eq!(replica_counts(&status, "s1"), [0, 0, 0], "{status}");
    for node in ["s2", "s3", "s4"] {
        assert_eq!(replica_counts(&status, node), [8, 0, 0], "{status}");
    }
    assert_eq!(status["auto_replace"]["after"], "3s", "{status}");
    assert_eq!(status["auto_replace"]["authority"]["plans"], 1, "{status}");
    assert_eq!(
        status["auto_replace"]["authority"]["nodes_down"], 1,
        "{status}"
    );
    // Nothing lost: every survivor holds every blob and document.
    for i in 1..4 {
        assert_on_node(&cluster, cluster.node_addr(i), &acked).await;
    }
    assert_blobs_read(frontend, &acked.blobs).await;
    assert_docs_read(frontend, &acked.docs).await;

    // Never twice for one outage: later ticks plan nothing more.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (config2, addr) = (config.clone(), frontend);
    let later = tokio::task::spawn_blocking(move || cluster_status(&config2, addr))
        .await
        .unwrap();
    assert_eq!(later["map_revision"], 3, "{later}");
    assert_eq!(later["auto_replace"]["authority"]["plans"], 1, "{later}");

    // s1 comes back: it takes the map where it holds nothing and deletes its old replicas.
    cluster.restart_node(0);
    let s1_disk = cluster.dir.path().join("s1").join("disk0");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<String> = std::fs::read_dir(&s1_disk)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with('p'))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "s1 still holds replicas after coming back: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (config2, addr) = (config.clone(), frontend);
    let back = tokio::task::spawn_blocking(move || cluster_status(&config2, addr))
        .await
        .unwrap();
    assert_eq!(back["map_revision"], 3, "{back}");
    assert_eq!(replica_counts(&back, "s1"), [0, 0, 0], "{back}");
    assert_blobs_read(frontend, &acked.blobs).await;
}

#[test]
fn a_dead_node_whose_replicas_have_nowhere_else_to_go_is_not_replaced() {
    let mut cluster = Cluster::start_full(3, 4, "", &auto_extra("1s"));
    let (status, id) = {
        let out = Command::new("curl")
            .args(["-sS", "--data-binary", "kept", &cluster.url("/v1/blobs")])
            .output()
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            json["id"].is_string(),
            json["id"].as_str().unwrap().to_owned(),
        )
    };
    assert!(status);
    cluster.kill_node(2);
    // Past the limit several times over: 3 replicas cannot live on the 2 nodes left.
    std::thread::sleep(Duration::from_secs(5));
    let status = cluster_status(&cluster.path("s1.toml"), cluster.frontend_addr);
    assert_eq!(status["map_revision"], 1, "{status}");
    assert_eq!(
        status["auto_replace"]["authority"]["blocked"], 1,
        "{status}"
    );
    let dead = &status["auto_replace"]["down_with_replicas"][0];
    assert_eq!(dead["node"], "s3", "{status}");
    assert!(
        dead["rebuild_elsewhere"]
            .as_str()
            .unwrap()
            .contains("short of replicas"),
        "{status}"
    );
    let (ok, text, err) = larder_cluster(&["status", "--config", &cluster.path("s1.toml")]);
    assert!(ok, "{err}");
    assert!(text.contains("1 blocked"), "{text}");
    assert!(
        text.contains("node s3 is down and holds 4 replicas"),
        "{text}"
    );
    // The cluster serves on its two nodes.
    let out = Command::new("curl")
        .args(["-sS", &cluster.url(&format!("/v1/blobs/{id}"))])
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"kept");
}

/// A node drained (it keeps running, holding nothing) is added again with `larder cluster
/// add-node`: it takes its share back, replicas of partitions it held before included, without
/// a restart, and holds every acknowledged write of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_is_added_again_without_a_restart() {
    let cluster = Cluster::start_full(4, 8, "", STORAGE_EXTRA);
    let frontend = cluster.frontend_addr;
    let acked = fill(frontend, 40).await;
    let config = cluster.path("s1.toml");
    let (ok, out, err) = larder_cluster(&["drain-node", "s2", "--config", &config]);
    assert!(ok, "{out}{err}");
    let drained = wait_moves_done(&config, frontend, 1, Duration::from_secs(120)).await;
    assert_eq!(replica_counts(&drained, "s2"), [0, 0, 0], "{drained}");
    // Its old replicas are deleted (after the removal grace).
    let s2_disk = cluster.dir.path().join("s2").join("disk0");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(&s2_disk)
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with('p'))
    {
        assert!(Instant::now() < deadline, "s2 keeps its drained replicas");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let s2 = cluster.node_addr(1).to_string();
    let (ok, out, err) = larder_cluster(&["add-node", "s2", "--address", &s2, "--config", &config]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("6 replica moves started"), "{out}");
    let revision = drained["map_revision"].as_u64().unwrap();
    let back = wait_moves_done(&config, frontend, revision, Duration::from_secs(120)).await;
    assert_eq!(replica_counts(&back, "s2"), [6, 0, 0], "{back}");
    let map = larder_cluster::ClusterMap::load(std::path::Path::new(&cluster.path("cluster.toml")))
        .unwrap();
    let on_s2: Vec<u32> = map.replicas_on("s2").into_iter().map(|(p, _)| p).collect();
    let client = cluster.node_client(cluster.node_addr(1)).await;
    let mut checked = 0;
    for (id, i) in &acked.blobs {
        let partition = id.parse::<larder_cluster::BlobId>().unwrap().partition;
        if !on_s2.contains(&partition) {
            continue;
        }
        let path = larder_proto::blob_path(partition, id);
        let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
        assert_eq!(status, StatusCode::OK, "blob {i} on s2's replica");
        assert!(body == blob(*i), "blob {i} on s2 has other bytes");
        checked += 1;
    }
    assert!(checked > 0);
}
