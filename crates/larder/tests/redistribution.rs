//! Replica moves, the storage node's half (issue 15), with real processes: a replica placed on a
//! new 4th node bootstraps from its peers through one streamed export per partition while PUTs
//! go on, and ends byte-identical; a bootstrap whose receiver or source is SIGKILLed resumes
//! from its durable cursor instead of copying again; a record that fails its checksum on the
//! source is never copied as valid; a replica removed from a node is no longer served and its
//! data is deleted. Maps reach running nodes through `PUT /internal/v1/map` (as the map authority distributes
//! them).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::h2::H2Client;
use common::Cluster;
use http::{Method, StatusCode};
use larder_cluster::{BlobId, ClusterMap, Node, Replica, ReplicaState};

/// The partition the tests move.
const MOVED: u32 = 0;

fn storage_extra(rate_mb_per_s: u64, batch_records: usize) -> String {
    format!(
        "[replication]\ninterval = \"50ms\"\n\
         [redistribution]\nremoval_grace = \"1s\"\n\
         rate_mb_per_s = {rate_mb_per_s}\nbatch_records = {batch_records}\n"
    )
}

fn blob(i: usize, size: usize) -> Bytes {
    let line = format!("moved blob {i:06} ");
    Bytes::from(line.repeat(size / line.len() + 1)[..size].to_owned())
}

/// A 3-node cluster with 2 partitions (3 replicas each) and a 4th storage node to add.
struct Grown {
    cluster: Cluster,
    extra: String,
    new_node: Option<std::process::Child>,
    new_addr: std::net::SocketAddr,
}

impl Grown {
    fn start(extra: String) -> Grown {
        let cluster = Cluster::start_full(3, 2, "", &extra);
        let new_addr = common::free_addresses(1)[0];
        Grown {
            cluster,
            extra,
            new_node: None,
            new_addr,
        }
    }

    /// The map with `s4` added and holding a bootstrapping replica of `MOVED`.
    fn grown_map(&self) -> ClusterMap {
        let mut map = self.cluster.map.clone();
        map.revision += 1;
        map.nodes.push(Node {
            id: "s4".into(),
            datacenter: "dc1".into(),
            address: self.new_addr,
            disks: vec!["disk0".into()],
        });
        map.partitions[MOVED as usize].replicas.push(Replica {
            node: "s4".into(),
            disk: "disk0".into(),
            state: ReplicaState::Bootstrapping,
        });
        map
    }

    /// The node the bootstrap copies from: the first live replica of `MOVED`.
    fn source(&self) -> usize {
        let first = &self.cluster.map.partitions[MOVED as usize].replicas[0].node;
        self.cluster
            .map
            .nodes
            .iter()
            .position(|n| &n.id == first)
            .unwrap()
    }

    /// Starts `s4` on the grown map (its own map file) and pushes that map to s1..s3.
    async fn add_node(&mut self) {
        let map = self.grown_map();
        map.save(&self.cluster.dir.path().join("cluster4.toml"))
            .unwrap();
        let config = format!(
            "node_id = \"s4\"\ncluster_map = \"cluster4.toml\"\ndata_dir = \"s4\"\n{}\n[auth]\nsecret_file = \"{}\"\n",
            self.extra,
            common::SECRET_FILE
        );
        std::fs::write(self.cluster.dir.path().join("s4.toml"), config).unwrap();
        self.spawn_new_node();
        for i in 0..3 {
            push_map(&self.cluster, self.cluster.node_addr(i), &map).await;
        }
    }

    fn spawn_new_node(&mut self) {
        let config = self.cluster.path("s4.toml");
        self.new_node = Some(common::spawn(&["storage", "--config", &config]));
        common::wait_for_port(self.new_addr);
    }

    fn kill_new_node(&mut self) {
        if let Some(mut child) = self.new_node.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    async fn replica_status(&self) -> serde_json::Value {
        let client = self.cluster.node_client(self.new_addr).await;
        let path = larder_proto::replica_path(MOVED);
        let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).unwrap()
    }

    /// Polls `s4`'s replica until `done` holds for its status.
    async fn wait_status(
        &self,
        limit: Duration,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let started = Instant::now();
        loop {
            let status = self.replica_status().await;
            if done(&status) {
                return status;
            }
            assert!(
                started.elapsed() < limit,
                "replica not there after {limit:?}: {status}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn metric(&self, addr: std::net::SocketAddr, series: &str) -> f64 {
        let client = self.cluster.node_client(addr).await;
        let (_, body) = client
            .request(Method::GET, larder_proto::METRICS_PATH, Bytes::new())
            .await;
        common::metrics::value(&String::from_utf8_lossy(&body), series).unwrap_or(0.0)
    }
}

impl Drop for Grown {
    fn drop(&mut self) {
        self.kill_new_node();
    }
}

/// A GET to a storage node's internal port; the status and body.
async fn internal_get(cluster: &Cluster, addr: std::net::SocketAddr, path: &str) -> (u16, Bytes) {
    let client = cluster.node_client(addr).await;
    let (status, body) = client.request(Method::GET, path, Bytes::new()).await;
    (status.as_u16(), body)
}

async fn push_map(cluster: &Cluster, addr: std::net::SocketAddr, map: &ClusterMap) {
    let client = cluster.node_client(addr).await;
    let (status, body) = client
        .request(
            Method::PUT,
            larder_proto::MAP_PATH,
            Bytes::from(map.to_toml()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
}

/// PUTs `count` blobs of `size` bytes; returns (id, index) of those acknowledged.
async fn put_blobs(
    client: &H2Client,
    from: usize,
    count: usize,
    size: usize,
) -> Vec<(String, usize)> {
    let mut ids = Vec::new();
    for i in from..from + count {
        let (status, id, json) = client.put(blob(i, size)).await;
        assert_eq!(status, StatusCode::CREATED, "{json}");
        ids.push((id.unwrap(), i));
    }
    ids
}

fn in_moved(ids: &[(String, usize)]) -> Vec<(String, usize)> {
    ids.iter()
        .filter(|(id, _)| id.parse::<BlobId>().unwrap().partition == MOVED)
        .cloned()
        .collect()
}

/// Waits until `s4` serves every blob of `expected` with exactly its bytes (or, for the deleted
/// ones, 410).
async fn wait_identical(
    grown: &Grown,
    expected: &[(String, usize)],
    size: usize,
    deleted: &[String],
    limit: Duration,
) {
    let client = grown.cluster.node_client(grown.new_addr).await;
    let started = Instant::now();
    loop {
        let mut wrong = Vec::new();
        for (id, i) in expected {
            let path = larder_proto::blob_path(MOVED, id);
            let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
            let ok = match deleted.contains(id) {
                true => status == StatusCode::GONE,
                false => status == StatusCode::OK && body == blob(*i, size),
            };
            if !ok {
                // Never different bytes: a blob is either missing (not yet) or exact.
                assert!(
                    status != StatusCode::OK || body == blob(*i, size),
                    "s4 serves different bytes for blob {i}"
                );
                wrong.push(format!("{i}: {status}"));
            }
        }
        if wrong.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "s4 differs after {limit:?}: {} blobs, e.g. {}",
            wrong.len(),
            wrong[0]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The replica's copy is done and replication covers the peers' positions: `caught_up`, or
/// already `live` (the map authority promotes a caught-up replica, sometimes between two polls).
fn caught_up_or_live(status: &serde_json::Value) -> bool {
    status["state"] == "caught_up" || status["state"] == "live"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_replica_bootstraps_under_put_load_and_ends_byte_identical() {
    let mut grown = Grown::start(storage_extra(0, 64));
    let client = H2Client::connect(grown.cluster.frontend_addr).await;
    let size = 4096;
    let mut ids = put_blobs(&client, 0, 240, size).await;
    let deleted: Vec<String> = in_moved(&ids)
        .iter()
        .step_by(5)
        .map(|(id, _)| id.clone())
        .collect();
    for id in &deleted {
        let (status, _) = client
            .request(Method::DELETE, &format!("/v1/blobs/{id}"), Bytes::new())
            .await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    // PUT load while s4 bootstraps.
    let running = Arc::new(AtomicBool::new(true));
    let during = Arc::new(Mutex::new(Vec::new()));
    let load = {
        let (running, during) = (running.clone(), during.clone());
        let client = H2Client::connect(grown.cluster.frontend_addr).await;
        tokio::spawn(async move {
            let mut i = 10_000;
            while running.load(Ordering::Relaxed) {
                let put = put_blobs(&client, i, 1, size).await;
                during.lock().unwrap().extend(put);
                i += 1;
            }
        })
    };
    grown.add_node().await;
    let status = grown
        .wait_status(Duration::from_secs(90), caught_up_or_live)
        .await;
    running.store(false, Ordering::Relaxed);
    load.await.unwrap();
    ids.extend(during.lock().unwrap().drain(..));
    assert!(status["records_done"].as_u64().unwrap() > 0, "{status}");
    assert!(
        grown
            .metric(
                grown.new_addr,
                "larder_storage_bootstrap_copied_records_total"
            )
            .await
            > 0.0
    );
    let moved = in_moved(&ids);
    wait_identical(&grown, &moved, size, &deleted, Duration::from_secs(60)).await;
    // The partition it does not hold is not served there.
    let other = ids
        .iter()
        .find(|(id, _)| id.parse::<BlobId>().unwrap().partition != MOVED)
        .unwrap();
    let (code, _) = internal_get(
        &grown.cluster,
        grown.new_addr,
        &larder_proto::blob_path(1, &other.0),
    )
    .await;
    assert_eq!(code, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_receiver_resumes_from_its_cursor() {
    // 1 MB/s: the copy of ~1.5 MB takes a while, long enough to kill it half-way.
    let mut grown = Grown::start(storage_extra(1, 8));
    let client = H2Client::connect(grown.cluster.frontend_addr).await;
    let size = 16 << 10;
    let ids = put_blobs(&client, 0, 200, size).await;
    let moved = in_moved(&ids);
    grown.add_node().await;
    let first = grown
        .wait_status(Duration::from_secs(60), |s| {
            s["records_done"].as_u64().unwrap() >= 16
        })
        .await;
    assert_eq!(first["state"], "bootstrapping", "{first}");
    assert!(
        first["records_done"].as_u64().unwrap() < moved.len() as u64,
        "{first}"
    );
    grown.kill_new_node();
    grown.spawn_new_node();
    let done = grown
        .wait_status(Duration::from_secs(120), caught_up_or_live)
        .await;
    let total = done["records_done"].as_u64().unwrap();
    let second_run = grown
        .metric(
            grown.new_addr,
            "larder_storage_bootstrap_copied_records_total",
        )
        .await as u64;
    assert!(total >= moved.len() as u64, "{done}");
    assert!(
        second_run > 0 && second_run + 16 <= moved.len() as u64,
        "the restarted receiver copied {second_run} of {} records: it should resume, not start over",
        moved.len()
    );
    wait_identical(&grown, &moved, size, &[], Duration::from_secs(60)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_source_is_resumed_from_the_cursor() {
    let mut grown = Grown::start(storage_extra(1, 8));
    let client = H2Client::connect(grown.cluster.frontend_addr).await;
    let size = 16 << 10;
    let ids = put_blobs(&client, 0, 200, size).await;
    let moved = in_moved(&ids);
    grown.add_node().await;
    grown
        .wait_status(Duration::from_secs(60), |s| {
            s["records_done"].as_u64().unwrap() >= 16
        })
        .await;
    let source = grown.source();
    grown.cluster.kill_node(source);
    tokio::time::sleep(Duration::from_millis(500)).await;
    grown.cluster.restart_node(source);
    // The restarted source runs the file's map (without s4): give it the grown one again.
    push_map(
        &grown.cluster,
        grown.cluster.node_addr(source),
        &grown.grown_map(),
    )
    .await;
    let done = grown
        .wait_status(Duration::from_secs(120), caught_up_or_live)
        .await;
    let copied = grown
        .metric(
            grown.new_addr,
            "larder_storage_bootstrap_copied_records_total",
        )
        .await as u64;
    assert!(
        copied <= moved.len() as u64 + 8,
        "copied {copied} records for a partition of {}: the copy started over ({done})",
        moved.len()
    );
    wait_identical(&grown, &moved, size, &[], Duration::from_secs(60)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_on_the_source_is_never_copied_as_valid() {
    let mut grown = Grown::start(storage_extra(0, 64));
    let client = H2Client::connect(grown.cluster.frontend_addr).await;
    let size = 8192;
    let ids = put_blobs(&client, 0, 60, size).await;
    let moved = in_moved(&ids);
    let (victim_id, victim) = moved[0].clone();
    // Flip one byte of the victim's data in the source's segment.
    let source = grown.source();
    let node_id = grown.cluster.map.nodes[source].id.clone();
    let segment = grown
        .cluster
        .dir
        .path()
        .join(&node_id)
        .join("disk0")
        .join(format!("p{MOVED}"))
        .join("seg-00000001.log");
    let mut bytes = std::fs::read(&segment).unwrap();
    let pattern = format!("moved blob {victim:06} ");
    let at = bytes
        .windows(pattern.len())
        .position(|w| w == pattern.as_bytes())
        .expect("the victim's data is in the segment");
    bytes[at + 100] ^= 0x55;
    std::fs::write(&segment, &bytes).unwrap();
    let (code, _) = internal_get(
        &grown.cluster,
        grown.cluster.node_addr(source),
        &larder_proto::blob_path(MOVED, &victim_id),
    )
    .await;
    assert_eq!(code, 500, "the source's copy is corrupt");
    grown.add_node().await;
    grown
        .wait_status(Duration::from_secs(90), caught_up_or_live)
        .await;
    let skipped = grown
        .metric(
            grown.cluster.node_addr(source),
            "larder_storage_export_corrupt_skipped_total",
        )
        .await;
    assert_eq!(skipped, 1.0, "the export left the corrupt record out");
    // Every blob, the victim included (from another peer, by replication), is exact on s4.
    wait_identical(&grown, &moved, size, &[], Duration::from_secs(60)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_replica_is_no_longer_served_and_its_data_is_deleted() {
    let grown = Grown::start(storage_extra(0, 64));
    let client = H2Client::connect(grown.cluster.frontend_addr).await;
    let ids = put_blobs(&client, 0, 40, 1024).await;
    let (id, _) = in_moved(&ids)[0].clone();
    let last = grown.cluster.map.partitions[MOVED as usize].replicas[2]
        .node
        .clone();
    let index = grown
        .cluster
        .map
        .nodes
        .iter()
        .position(|n| n.id == last)
        .unwrap();
    let addr = grown.cluster.node_addr(index);
    let dir = grown
        .cluster
        .dir
        .path()
        .join(&last)
        .join("disk0")
        .join(format!("p{MOVED}"));
    assert!(dir.exists());
    let (code, _) = internal_get(&grown.cluster, addr, &larder_proto::blob_path(MOVED, &id)).await;
    assert_eq!(code, 200);
    let mut map = grown.cluster.map.clone();
    map.revision += 1;
    map.partitions[MOVED as usize]
        .replicas
        .retain(|r| r.node != last);
    push_map(&grown.cluster, addr, &map).await;
    // An older revision is refused whole (409, as any revision not above the running one).
    let client_internal = grown.cluster.node_client(addr).await;
    let (status, _) = client_internal
        .request(
            Method::PUT,
            larder_proto::MAP_PATH,
            Bytes::from(grown.cluster.map.to_toml()),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let started = Instant::now();
    loop {
        let (code, _) =
            internal_get(&grown.cluster, addr, &larder_proto::blob_path(MOVED, &id)).await;
        if code == 404 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still served: {code}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while dir.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{} not deleted",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!dir.with_extension("deleting").exists());
    // The other partition is still served.
    let other = ids
        .iter()
        .find(|(id, _)| id.parse::<BlobId>().unwrap().partition != MOVED)
        .unwrap();
    let (code, _) = internal_get(&grown.cluster, addr, &larder_proto::blob_path(1, &other.0)).await;
    assert_eq!(code, 200);
}
