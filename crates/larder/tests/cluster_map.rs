//! The cluster map changes while the cluster serves: a change accepted by the map authority
//! reaches every node and frontend (also those stopped during it, when they come back); a bad
//! map is refused whole and the old one keeps serving; a node that no longer holds a partition
//! at its newer map answers an older map's request with 421 and its revision.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Cluster, SecondFrontend, LARDER};
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use larder_cluster::{BlobId, ClusterMap, PartitionState};

/// `PUT /internal/v1/map` (`?change` for the authority) on node `i`: status and JSON answer.
fn put_map(cluster: &Cluster, i: usize, text: &str, change: bool) -> (u16, serde_json::Value) {
    let path = if change {
        "/internal/v1/map?change"
    } else {
        "/internal/v1/map"
    };
    let (status, _, body) = internal(cluster, i, Method::PUT, path, None, text.to_owned());
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

/// One authenticated request to node `i`, with `larder-map-revision` when given.
fn internal(
    cluster: &Cluster,
    i: usize,
    method: Method,
    path: &str,
    revision: Option<u64>,
    body: String,
) -> (u16, http::HeaderMap, Bytes) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let addr = cluster.node_addr(i);
        let client = cluster.node_client(addr).await;
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"));
        if let Some(revision) = revision {
            request = request.header("larder-map-revision", revision);
        }
        let (status, headers, body) = client
            .send(request.body(Full::new(Bytes::from(body))).unwrap())
            .await;
        (status.as_u16(), headers, body)
    })
}

/// Node `i`'s map, or None while it does not answer.
fn node_map(cluster: &Cluster, i: usize) -> ClusterMap {
    let (status, _, body) = internal(
        cluster,
        i,
        Method::GET,
        "/internal/v1/map",
        None,
        String::new(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    ClusterMap::from_toml(std::str::from_utf8(&body).unwrap()).unwrap()
}

fn frontend_cluster(addr: std::net::SocketAddr) -> serde_json::Value {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            &format!("http://{addr}/v1/cluster"),
        ])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

fn eventually(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// curl with `args` (10 s at most): the status and the body.
fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_owned())
}

fn put_blob(addr: std::net::SocketAddr) -> (u16, Option<String>) {
    let (status, body) = curl(&["--data-binary", "hello", &format!("http://{addr}/v1/blobs")]);
    let id = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["id"].as_str().map(str::to_owned));
    (status, id)
}

fn get_blob(addr: std::net::SocketAddr, id: &str) -> (u16, String) {
    curl(&[&format!("http://{addr}/v1/blobs/{id}")])
}

#[test]
fn a_node_and_a_frontend_stopped_during_a_map_change_catch_up_when_they_come_back() {
    let mut cluster = Cluster::start(3, 4);
    // A frontend that runs, then stops before the change (it comes back afterwards).
    let second = SecondFrontend::start(&cluster);
    drop(second);
    cluster.stop_node(2);

    // Revision 2: partition 1 read-only. Asked of the authority (s1); cluster.toml stays at 1.
    let mut next = cluster.map.clone();
    next.revision = 2;
    next.partitions[1].state = PartitionState::ReadOnly;
    let (status, answer) = put_map(&cluster, 0, &next.to_toml(), true);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["revision"], 2);
    eventually(
        "s2 gets revision 2 from the authority",
        Duration::from_secs(10),
        || node_map(&cluster, 1).revision == 2,
    );
    eventually(
        "the running frontend follows",
        Duration::from_secs(10),
        || frontend_cluster(cluster.frontend_addr)["map_revision"] == 2,
    );

    // Back after the change, both started from the revision-1 file.
    cluster.restart_node(2);
    eventually(
        "the restarted s3 catches up",
        Duration::from_secs(15),
        || node_map(&cluster, 2) == next,
    );
    let second = SecondFrontend::start(&cluster);
    eventually(
        "the restarted frontend catches up",
        Duration::from_secs(15),
        || frontend_cluster(second.addr)["map_revision"] == 2,
    );
    assert_eq!(
        frontend_cluster(second.addr)["partitions"][1]["state"],
        "read-only"
    );
    // It routes by the new map: no write lands on the read-only partition.
    for _ in 0..12 {
        let (status, id) = put_blob(second.addr);
        assert_eq!(status, 201);
        let id: BlobId = id.unwrap().parse().unwrap();
        assert_ne!(id.partition, 1, "a write went to the read-only partition");
    }

    // The accepted map is durable: the authority restarts on revision 2, not the file's 1.
    cluster.stop_node(0);
    cluster.restart_node(0);
    assert_eq!(node_map(&cluster, 0), next);
    let on_disk =
        ClusterMap::load(&cluster.dir.path().join("s1").join("cluster-map.toml")).unwrap();
    assert_eq!(on_disk, next);
}

#[test]
fn a_bad_map_is_refused_whole_and_the_cluster_keeps_serving() {
    let cluster = Cluster::start(3, 4);
    let (status, id) = put_blob(cluster.frontend_addr);
    assert_eq!(status, 201);
    let id = id.unwrap();
    let original = cluster.map.clone();

    let refused = |text: &str, change: bool, status: u16, message: &str| {
        let (got, answer) = put_map(&cluster, 0, text, change);
        assert_eq!(got, status, "{answer}");
        let said = answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(said.contains(message), "expected {message:?} in {said:?}");
    };
    refused("revision = [", true, 400, "not valid TOML");
    let mut twice = original.clone();
    twice.revision = 2;
    twice.partitions[0].replicas[1].node = twice.partitions[0].replicas[0].node.clone();
    refused(&twice.to_toml(), true, 400, "two replicas on node");
    let mut same_revision = original.clone();
    same_revision.partitions[0].state = PartitionState::ReadOnly;
    refused(&same_revision.to_toml(), true, 409, "different content");
    let mut skipping = original.clone();
    skipping.revision = 5;
    refused(&skipping.to_toml(), true, 409, "not the next revision");
    // A node that is not the authority takes no change.
    let (got, answer) = put_map(
        &cluster,
        1,
        &{
            let mut next = original.clone();
            next.revision = 2;
            next.to_toml()
        },
        true,
    );
    assert_eq!(got, 400, "{answer}");

    // A good change, then an older revision offered to everyone: refused, revision 2 stays.
    let mut good = original.clone();
    good.revision = 2;
    good.partitions[3].state = PartitionState::ReadOnly;
    assert_eq!(put_map(&cluster, 0, &good.to_toml(), true).0, 200);
    assert_eq!(
        put_map(&cluster, 0, &good.to_toml(), true).0,
        200,
        "the same map again is a no-op"
    );
    for i in 0..3 {
        eventually(
            "every node runs revision 2",
            Duration::from_secs(10),
            || node_map(&cluster, i) == good,
        );
        let (got, answer) = put_map(&cluster, i, &original.to_toml(), false);
        assert_eq!(got, 409, "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("older"),
            "{answer}"
        );
    }

    // A plan that would leave partitions short is refused by the command, with the reason.
    let out = Command::new(LARDER)
        .args([
            "cluster",
            "drain-node",
            "s2",
            "--config",
            &cluster.path("s1.toml"),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("short of replicas"), "{stderr}");

    // A broken map file is refused too; nodes and the frontend keep their map.
    std::fs::write(
        cluster.dir.path().join("cluster.toml"),
        "format_version = 1\nrevision = 9\n",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    for i in 0..3 {
        assert_eq!(node_map(&cluster, i), good);
    }
    assert_eq!(frontend_cluster(cluster.frontend_addr)["map_revision"], 2);

    // The cluster served throughout.
    assert_eq!(
        get_blob(cluster.frontend_addr, &id),
        (200, "hello".to_owned())
    );
    assert_eq!(put_blob(cluster.frontend_addr).0, 201);
}

#[test]
fn a_node_that_no_longer_holds_a_partition_refuses_an_older_maps_request_with_421() {
    let cluster = Cluster::start(4, 4);
    // Partition 0 is on s1, s2, s3; revision 2 puts it on s2, s3, s4.
    let before = &cluster.map.partitions[0];
    assert!(before.replicas.iter().any(|r| r.node == "s1"));
    let mut next = cluster.map.clone();
    next.revision = 2;
    next.partitions[0].replicas.retain(|r| r.node != "s1");
    let s4 = next.node("s4").unwrap().clone();
    next.partitions[0].replicas.push(larder_cluster::Replica {
        node: s4.id.clone(),
        disk: s4.disks[0].clone(),
        state: larder_cluster::ReplicaState::Live,
    });
    assert_eq!(put_map(&cluster, 0, &next.to_toml(), true).0, 200);

    let path = "/internal/v1/partitions/0/blobs/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let (status, headers, body) = internal(&cluster, 0, Method::GET, path, Some(1), String::new());
    assert_eq!(
        status,
        StatusCode::MISDIRECTED_REQUEST.as_u16(),
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(headers["larder-map-revision"], "2");
    assert!(String::from_utf8_lossy(&body).contains("MapMoved"));
    // At the node's own revision it is an ordinary answer; a partition it still holds is served.
    let (status, ..) = internal(&cluster, 0, Method::GET, path, Some(2), String::new());
    assert_ne!(status, 421);
    let held = "/internal/v1/partitions/2/blobs/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let (status, headers, _) = internal(&cluster, 0, Method::GET, held, Some(1), String::new());
    assert_eq!(status, 404);
    assert_eq!(headers["larder-map-revision"], "2");
}

#[test]
fn a_bootstrapping_replica_is_written_to_but_serves_no_read_and_counts_for_no_quorum() {
    let mut cluster = Cluster::start(4, 1);
    // Partition 0 on s1, s2, s3; revision 2 adds s4 as a bootstrapping replica.
    let mut next = cluster.map.clone();
    next.revision = 2;
    next.partitions[0].replicas.push(larder_cluster::Replica {
        node: "s4".into(),
        disk: "disk0".into(),
        state: larder_cluster::ReplicaState::Bootstrapping,
    });
    assert_eq!(put_map(&cluster, 0, &next.to_toml(), true).0, 200);
    eventually("s4 has revision 2", Duration::from_secs(10), || {
        node_map(&cluster, 3).revision == 2
    });
    // Opening the new replica's store is the data path's work; a restart does it here.
    cluster.stop_node(3);
    cluster.restart_node(3);
    eventually(
        "the frontend runs revision 2",
        Duration::from_secs(10),
        || frontend_cluster(cluster.frontend_addr)["map_revision"] == 2,
    );

    // Writes reach the bootstrapping replica too.
    let (status, id) = put_blob(cluster.frontend_addr);
    assert_eq!(status, 201);
    let id = id.unwrap();
    let on_s4 = format!("/internal/v1/partitions/0/blobs/{id}");
    eventually("the blob is on s4", Duration::from_secs(5), || {
        internal(&cluster, 3, Method::GET, &on_s4, None, String::new()).0 == 200
    });

    // Its acknowledgement counts for nothing: with s1 and s2 down, s3 alone is no quorum of 2.
    cluster.kill_node(0);
    cluster.kill_node(1);
    let (status, _) = put_blob(cluster.frontend_addr);
    assert_eq!(
        status, 503,
        "a write acknowledged by s3 and the bootstrapping s4 succeeded"
    );

    // And it serves no read: with every caught-up replica down, the blob is not read from s4.
    cluster.kill_node(2);
    let (status, _) = get_blob(cluster.frontend_addr, &id);
    assert_ne!(status, 200, "a bootstrapping replica served a read");
}

#[test]
fn a_dead_map_authority_is_replaced_through_the_next_one() {
    let mut cluster = Cluster::start(3, 4);
    cluster.kill_node(0);
    let new_node = common::free_addresses(1)[0];
    let out = Command::new(LARDER)
        .args([
            "cluster",
            "replace-node",
            "s1",
            "s4",
            "--address",
            &new_node.to_string(),
        ])
        .args(["--config", &cluster.path("s2.toml")])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("map revision 2 accepted by the map authority s2"),
        "{stdout}"
    );
    for i in 1..3 {
        eventually(
            "the survivors run revision 2",
            Duration::from_secs(10),
            || node_map(&cluster, i).revision == 2,
        );
    }
    let map = node_map(&cluster, 1);
    assert_eq!(map.authority(), Some("s2"));
    for p in &map.partitions {
        let on = |node: &str| p.replicas.iter().find(|r| r.node == node).map(|r| r.state);
        assert_eq!(on("s1"), Some(larder_cluster::ReplicaState::Leaving));
        assert_eq!(on("s4"), Some(larder_cluster::ReplicaState::Bootstrapping));
    }
    // The command wrote the accepted map to its map file.
    assert_eq!(
        ClusterMap::load(&cluster.dir.path().join("cluster.toml")).unwrap(),
        map
    );
}

fn curl_doc(addr: std::net::SocketAddr, method: &str, body: &str) -> (u16, String) {
    let url = format!("http://{addr}/document/v1/ns/t/docid/counter");
    let json = "content-type: application/json";
    curl(&["-X", method, "-H", json, "--data-binary", body, &url])
}

/// A map change that moves a partition's primary (the first replica listed) takes effect on
/// the storage nodes at once: the new primary takes read-modify-writes fenced with the new
/// map, without a restart.
#[test]
fn a_primary_moved_by_a_map_change_serialises_updates_at_once() {
    let cluster = Cluster::start(3, 1);
    let addr = cluster.frontend_addr;
    let increment = r#"{"fields":{"n":{"increment":1}}}"#;
    assert_eq!(curl_doc(addr, "POST", r#"{"fields":{"n":0}}"#).0, 200);
    assert_eq!(curl_doc(addr, "PUT", increment).0, 200);

    let mut next = cluster.map.clone();
    next.revision = 2;
    next.partitions[0].replicas.reverse();
    let (status, answer) = put_map(&cluster, 0, &next.to_toml(), true);
    assert_eq!(status, 200, "{answer}");
    eventually(
        "every node and the frontend at revision 2",
        Duration::from_secs(30),
        || {
            (0..3).all(|i| node_map(&cluster, i).revision == 2)
                && frontend_cluster(addr)["map_revision"] == 2
        },
    );
    for _ in 0..3 {
        let (status, body) = curl_doc(addr, "PUT", increment);
        assert_eq!(status, 200, "an update at the new primary: {body}");
    }
    let (status, body) = curl_doc(addr, "GET", "");
    assert_eq!(status, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["fields"]["n"], 4, "{doc}");
}
