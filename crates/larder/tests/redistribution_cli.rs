//! Replica moves started with `larder cluster add-node` and run by the map authority, with real
//! processes (issue 15): a move's target SIGKILLed mid-bootstrap resumes from its durable
//! bootstrap position instead of copying again (checked: it fails when the copy ignores its
//! saved cursor); moves whose source peer is SIGKILLed and restarted still finish with nothing
//! lost (that test does not yet tell a resumed copy from a restarted one);
//! `larder cluster cancel-moves` puts the old replica sets back and the target deletes its
//! partial copies. Reads and writes never fail meanwhile, and nothing acknowledged is lost.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::h2::H2Client;
use common::{Cluster, LARDER};
use http::{Method, StatusCode};
use larder_cluster::{BlobId, ClusterMap, ReplicaState};

/// Moves throttled to 1 MB/s in batches of 8 records, so that copying a few MB takes seconds;
/// replication every 50 ms and a short removal grace, so that the rest is quick.
const STORAGE_EXTRA: &str = "[replication]\ninterval = \"50ms\"\n\
     [redistribution]\nremoval_grace = \"1s\"\nrate_mb_per_s = 1\nbatch_records = 8\n";

/// Blob size: 64 records a second at the throttled rate.
const SIZE: usize = 16 << 10;

fn blob(i: usize) -> Bytes {
    let line = format!("moving blob {i:06} ");
    Bytes::from(line.repeat(SIZE / line.len() + 1)[..SIZE].to_owned())
}

/// The storage node `s4`, added with `larder cluster add-node` (its config names the cluster's
/// map file, which the command rewrites), killed when dropped.
struct NewNode {
    child: Option<Child>,
    config: String,
    addr: SocketAddr,
}

impl NewNode {
    fn start(cluster: &Cluster, addr: SocketAddr, storage_extra: &str) -> NewNode {
        let config = format!(
            "node_id = \"s4\"\ncluster_map = \"cluster.toml\"\ndata_dir = \"s4\"\n\
             {storage_extra}\n[auth]\nsecret_file = \"{}\"\n",
            common::SECRET_FILE
        );
        let path = cluster.path("s4.toml");
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

async fn cluster_status(config: &str) -> serde_json::Value {
    let config = config.to_owned();
    tokio::task::spawn_blocking(move || {
        let (ok, out, err) = larder_cluster(&["status", "--json", "--config", &config]);
        assert!(ok, "{out}{err}");
        serde_json::from_str(&out).unwrap()
    })
    .await
    .unwrap()
}

/// Polls `cluster status` until it shows no move at a revision above `started` that every
/// running node runs.
async fn wait_moves_done(config: &str, started: u64, limit: Duration) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let status = cluster_status(config).await;
        let revision = status["map_revision"].as_u64().unwrap();
        let at = revision.to_string();
        let everyone = status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["map_revision"] == "down" || n["map_revision"] == at.as_str());
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

/// PUTs blobs `from..from + count` through the frontend, each acknowledged.
async fn put_blobs(frontend: SocketAddr, from: usize, count: usize) -> Vec<(String, usize)> {
    let client = H2Client::connect(frontend).await;
    let mut acked = Vec::new();
    for i in from..from + count {
        let (status, id, json) = client.put(blob(i)).await;
        assert_eq!(status, StatusCode::CREATED, "PUT of blob {i}: {json}");
        acked.push((id.unwrap(), i));
    }
    acked
}

/// Every blob of `blobs` reads through the frontend with its bytes.
async fn assert_blobs_read(frontend: SocketAddr, blobs: &[(String, usize)]) {
    let client = H2Client::connect(frontend).await;
    for (id, i) in blobs {
        let (status, body) = client.get(id).await;
        assert_eq!(status, StatusCode::OK, "GET of blob {i} ({id})");
        assert!(body == blob(*i), "blob {i} read with other bytes");
    }
}

fn partition_of(id: &str) -> u32 {
    id.parse::<BlobId>().unwrap().partition
}

/// Blobs per partition.
fn per_partition(blobs: &[(String, usize)]) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for (id, _) in blobs {
        *out.entry(partition_of(id)).or_default() += 1;
    }
    out
}

/// Partitions where `node` holds a replica in `state` in the map file the command writes.
fn partitions_in_state(cluster: &Cluster, node: &str, state: ReplicaState) -> Vec<u32> {
    let map = ClusterMap::load(std::path::Path::new(&cluster.path("cluster.toml"))).unwrap();
    map.partitions
        .iter()
        .filter(|p| {
            p.replicas
                .iter()
                .any(|r| r.node == node && r.state == state)
        })
        .map(|p| p.id)
        .collect()
}

/// `GET .../replica` of `partition` on the node at `addr`.
async fn replica_status(cluster: &Cluster, addr: SocketAddr, partition: u32) -> serde_json::Value {
    let client = cluster.node_client(addr).await;
    let path = larder_proto::replica_path(partition);
    let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

/// Polls the replicas of `partitions` on `addr` until `done` holds for one of them; returns
/// every one's status then.
async fn wait_one_replica(
    cluster: &Cluster,
    addr: SocketAddr,
    partitions: &[u32],
    limit: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> BTreeMap<u32, serde_json::Value> {
    let deadline = Instant::now() + limit;
    loop {
        let mut all = BTreeMap::new();
        for &p in partitions {
            all.insert(p, replica_status(cluster, addr, p).await);
        }
        if all.values().any(&done) {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "no replica got there in {limit:?}: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn metric(cluster: &Cluster, addr: SocketAddr, series: &str) -> u64 {
    let client = cluster.node_client(addr).await;
    let (_, body) = client
        .request(Method::GET, larder_proto::METRICS_PATH, Bytes::new())
        .await;
    common::metrics::value(&String::from_utf8_lossy(&body), series).unwrap_or(0.0) as u64
}

/// Every blob of `blobs` in one of `partitions` reads from `addr`'s own replica (the internal
/// read) with exactly its bytes; returns how many were checked.
async fn assert_on_node(
    cluster: &Cluster,
    addr: SocketAddr,
    partitions: &[u32],
    blobs: &[(String, usize)],
) -> usize {
    let client = cluster.node_client(addr).await;
    let mut checked = 0;
    for (id, i) in blobs {
        let partition = partition_of(id);
        if !partitions.contains(&partition) {
            continue;
        }
        let path = larder_proto::blob_path(partition, id);
        let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
        assert_eq!(status, StatusCode::OK, "blob {i} on {addr}'s own replica");
        assert!(body == blob(*i), "blob {i} on {addr} has other bytes");
        checked += 1;
    }
    checked
}

const COPIED_RECORDS: &str = "larder_storage_bootstrap_copied_records_total";
const COPIED_BYTES: &str = "larder_storage_bootstrap_copied_bytes_total";

/// A bootstrap copying now, part of the way through.
fn half_copied(status: &serde_json::Value) -> bool {
    status["copying"] == true
        && status["records_done"].as_u64().unwrap() >= 24
        && status["bytes_left"].as_u64().unwrap() > 0
}

/// 3 nodes, 4 partitions of 3 replicas, ~6.5 MB of blobs; `add-node s4` starts 3 moves to s4.
/// Returns the cluster, s4, the blobs acknowledged and the partitions moving to s4.
async fn start_moves_to_s4() -> (Cluster, NewNode, Vec<(String, usize)>, Vec<u32>) {
    start_moves_to_s4_with(STORAGE_EXTRA).await
}

/// `start_moves_to_s4` with `storage_extra` as every storage node's extra TOML.
async fn start_moves_to_s4_with(
    storage_extra: &str,
) -> (Cluster, NewNode, Vec<(String, usize)>, Vec<u32>) {
    let cluster = Cluster::start_full(3, 4, "", storage_extra);
    let acked = put_blobs(cluster.frontend_addr, 0, 400).await;
    let addr = common::free_addresses(1)[0];
    let config = cluster.path("s1.toml");
    let (ok, out, err) = larder_cluster(&[
        "add-node",
        "s4",
        "--address",
        &addr.to_string(),
        "--config",
        &config,
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("3 replica moves started"), "{out}");
    let s4 = NewNode::start(&cluster, addr, storage_extra);
    let moving = partitions_in_state(&cluster, "s4", ReplicaState::Bootstrapping);
    assert_eq!(moving.len(), 3, "{moving:?}");
    (cluster, s4, acked, moving)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_target_killed_mid_bootstrap_resumes_from_its_position() {
    let (cluster, mut s4, mut acked, moving) = start_moves_to_s4().await;
    let frontend = cluster.frontend_addr;
    // Writes during the copy land on the new replica set.
    acked.extend(put_blobs(frontend, 10_000, 20).await);
    let before = wait_one_replica(
        &cluster,
        s4.addr,
        &moving,
        Duration::from_secs(60),
        half_copied,
    )
    .await;
    s4.kill();
    // What s4 reported done was durable (its cursor file is saved before it reports it).
    let done_before: u64 = before
        .values()
        .map(|s| s["records_done"].as_u64().unwrap())
        .sum();
    let bytes_before: u64 = before
        .values()
        .map(|s| s["bytes_done"].as_u64().unwrap())
        .sum();
    // Writes while the target is down reach it later, by replication; reads go on.
    acked.extend(put_blobs(frontend, 20_000, 20).await);
    assert_blobs_read(frontend, &acked).await;
    s4.restart();
    acked.extend(put_blobs(frontend, 30_000, 20).await);
    let config = cluster.path("s1.toml");
    let status = wait_moves_done(&config, 2, Duration::from_secs(180)).await;
    let s4_row = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == "s4")
        .cloned()
        .unwrap();
    assert_eq!(s4_row["live"], 3, "{status}");

    // Resumed: the restarted process copied at most what was left. Every record of a moved
    // partition is one blob PUT (nothing else was written), so the partitions' records are
    // counted by the test; a copy started over would copy again what was done before the kill.
    let counts = per_partition(&acked);
    let total: u64 = moving
        .iter()
        .map(|p| counts.get(p).copied().unwrap_or(0))
        .sum();
    let copied_after = metric(&cluster, s4.addr, COPIED_RECORDS).await;
    let bytes_after = metric(&cluster, s4.addr, COPIED_BYTES).await;
    assert!(done_before >= 24, "{before:?}");
    assert!(
        copied_after + done_before <= total,
        "s4 copied {copied_after} records after its restart, {done_before} before, of \
         {total}: it copied again what it had ({before:?})"
    );
    assert!(
        bytes_after > 0,
        "the restarted s4 copied nothing ({bytes_before} bytes before the kill)"
    );

    // The new replicas are byte-identical: every blob of them reads from s4 alone.
    let checked = assert_on_node(&cluster, s4.addr, &moving, &acked).await;
    assert_eq!(checked as u64, total);
    assert_blobs_read(frontend, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_source_killed_mid_copy_is_resumed_from_the_position() {
    let (mut cluster, s4, mut acked, moving) = start_moves_to_s4().await;
    let frontend = cluster.frontend_addr;
    let before = wait_one_replica(
        &cluster,
        s4.addr,
        &moving,
        Duration::from_secs(60),
        half_copied,
    )
    .await;
    // The copy's source is the first live replica (in map order) of the partition being
    // copied; it is not the map authority (s1) unless s1 is that replica.
    let (&partition, _) = before.iter().find(|(_, s)| half_copied(s)).unwrap();
    let map = ClusterMap::load(std::path::Path::new(&cluster.path("cluster.toml"))).unwrap();
    let source = map.partitions[partition as usize]
        .replicas
        .iter()
        .find(|r| r.state == ReplicaState::Live && r.node != "s4")
        .unwrap()
        .node
        .clone();
    let index = map.nodes.iter().position(|n| n.id == source).unwrap();
    cluster.kill_node(index);
    // Writes go on with a node down (2 of 3 caught-up replicas are a quorum).
    acked.extend(put_blobs(frontend, 10_000, 20).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.restart_node(index);
    let config = cluster.path("s1.toml");
    wait_moves_done(&config, 2, Duration::from_secs(180)).await;

    let counts = per_partition(&acked);
    let total: u64 = moving
        .iter()
        .map(|p| counts.get(p).copied().unwrap_or(0))
        .sum();
    let copied = metric(&cluster, s4.addr, COPIED_RECORDS).await;
    // A batch in flight when the source died may be copied twice; the rest is not.
    assert!(
        copied <= total + 8,
        "s4 copied {copied} records for partitions of {total}: the copy started over"
    );
    let checked = assert_on_node(&cluster, s4.addr, &moving, &acked).await;
    assert_eq!(checked as u64, total);
    assert_blobs_read(frontend, &acked).await;
}

/// Disk space a replica directory takes (its files, recursively).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_moves_restore_the_old_replica_sets_and_the_target_drops_its_copies() {
    let cluster = Cluster::start_full(3, 4, "", STORAGE_EXTRA);
    let frontend = cluster.frontend_addr;
    let mut acked = put_blobs(frontend, 0, 400).await;
    let old_map = ClusterMap::load(std::path::Path::new(&cluster.path("cluster.toml"))).unwrap();
    let addr = common::free_addresses(1)[0];
    let config = cluster.path("s1.toml");
    // Nothing to cancel yet.
    let (ok, out, err) = larder_cluster(&["cancel-moves", "s4", "--config", &config]);
    assert!(!ok, "{out}");
    assert!(err.contains("no move to node \"s4\""), "{err}");
    let (ok, out, err) = larder_cluster(&[
        "add-node",
        "s4",
        "--address",
        &addr.to_string(),
        "--config",
        &config,
    ]);
    assert!(ok, "{out}{err}");
    let s4 = NewNode::start(&cluster, addr, STORAGE_EXTRA);
    let moving = partitions_in_state(&cluster, "s4", ReplicaState::Bootstrapping);
    wait_one_replica(
        &cluster,
        s4.addr,
        &moving,
        Duration::from_secs(60),
        half_copied,
    )
    .await;
    let s4_disk = cluster.dir.path().join("s4").join("disk0");
    let copied_bytes = dir_bytes(&s4_disk);
    assert!(copied_bytes > 300_000, "s4 holds {copied_bytes} bytes");

    let (ok, out, err) = larder_cluster(&["cancel-moves", "s4", "--config", &config]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("3 replica moves to s4 cancelled"), "{out}");
    // Reads and writes go on while the map changes back.
    acked.extend(put_blobs(frontend, 10_000, 20).await);
    assert_blobs_read(frontend, &acked).await;

    let status = wait_moves_done(&config, 2, Duration::from_secs(30)).await;
    assert_eq!(status["map_revision"], 3, "{status}");
    assert!(status["moves"].as_array().unwrap().is_empty(), "{status}");
    let done = ClusterMap::load(std::path::Path::new(&cluster.path("cluster.toml"))).unwrap();
    assert_eq!(done.partitions, old_map.partitions, "the old replica sets");
    assert!(done.replicas_on("s4").is_empty());
    let (ok, text, err) = larder_cluster(&["status", "--config", &config]);
    assert!(ok, "{err}");
    assert!(text.contains("no moves in progress"), "{text}");

    // s4 deletes its partial copies (after the removal grace): the space comes back.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<String> = std::fs::read_dir(&s4_disk)
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
            "s4 keeps its cancelled copies: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = dir_bytes(&s4_disk);
    assert!(
        after < copied_bytes / 4,
        "s4 still takes {after} bytes (had {copied_bytes})"
    );
    // Every write, before, during and after the cancel, is on the old replica sets.
    acked.extend(put_blobs(frontend, 20_000, 20).await);
    assert_blobs_read(frontend, &acked).await;
    for i in 0..3 {
        assert_on_node(&cluster, cluster.node_addr(i), &[0, 1, 2, 3], &acked).await;
    }
}

/// A move that outlasts the tombstone retention, with its target and one of its peers SIGKILLed
/// and restarted mid-copy (each down longer than the retention), ends with every replica of the
/// moved partitions serving. The start positions saved for a new replica, and for a new peer,
/// are not "a replica that was away" however long the copy takes: before the fix, the restarted
/// nodes took them for one and served those partitions nothing (503 ReplicaUnchecked, no
/// replication to or from the new replica) forever (nemesis, seed 1 with moves).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_longer_than_the_tombstone_retention_leaves_every_replica_serving() {
    let extra = format!("{STORAGE_EXTRA}[compaction]\ntombstone_retention = \"1s\"\n");
    let (mut cluster, mut s4, acked, moving) = start_moves_to_s4_with(&extra).await;
    wait_one_replica(
        &cluster,
        s4.addr,
        &moving,
        Duration::from_secs(60),
        half_copied,
    )
    .await;
    // The copy has run longer than the retention; both are down longer than it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s4.kill();
    cluster.kill_node(0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.restart_node(0);
    s4.restart();
    let config = cluster.path("s2.toml");
    wait_moves_done(&config, 2, Duration::from_secs(180)).await;

    let mut holders: Vec<(SocketAddr, Vec<u32>)> = (0..3)
        .map(|i| {
            let id = format!("s{}", i + 1);
            let live = partitions_in_state(&cluster, &id, ReplicaState::Live);
            (cluster.node_addr(i), live)
        })
        .collect();
    holders.push((
        s4.addr,
        partitions_in_state(&cluster, "s4", ReplicaState::Live),
    ));
    // Every replica of a moved partition answers every blob itself, within a few seconds.
    let deadline = Instant::now() + Duration::from_secs(20);
    for (addr, live) in &holders {
        let partitions: Vec<u32> = live
            .iter()
            .copied()
            .filter(|p| moving.contains(p))
            .collect();
        loop {
            let refused = unanswered(&cluster, *addr, &partitions, &acked).await;
            if refused.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{addr}'s replicas of {partitions:?} still refuse: {refused:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert_blobs_read(cluster.frontend_addr, &acked).await;
}

/// The blobs of `partitions` that the node at `addr` does not answer 200 with their bytes from
/// its own replica, with the status it gave (the first 5).
async fn unanswered(
    cluster: &Cluster,
    addr: SocketAddr,
    partitions: &[u32],
    blobs: &[(String, usize)],
) -> Vec<(usize, StatusCode, String)> {
    let client = cluster.node_client(addr).await;
    let mut refused = Vec::new();
    for (id, i) in blobs {
        let partition = partition_of(id);
        if !partitions.contains(&partition) {
            continue;
        }
        let path = larder_proto::blob_path(partition, id);
        let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
        if status != StatusCode::OK || body != blob(*i) {
            let text = String::from_utf8_lossy(&body[..body.len().min(120)]).into_owned();
            refused.push((*i, status, text));
            if refused.len() == 5 {
                break;
            }
        }
    }
    refused
}
