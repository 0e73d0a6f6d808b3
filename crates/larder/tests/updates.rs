//! Read-modify-writes of one document through two frontends are serialised at the partition's
//! primary (DESIGN 6.1): concurrent increments are never lost, a failover of the primary loses
//! no acknowledged one and applies none twice, and a node that is not the primary at the
//! request's map refuses a serialised write.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::h2::H2Client;
use common::{Cluster, SecondFrontend};
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use larder_cluster::partition_for_key;
use serde_json::{json, Value};

const CLIENTS_PER_FRONTEND: usize = 4;
const INCREMENTS_PER_CLIENT: u64 = 50;
const COUNTER: &str = "/document/v1/ns/t/docid/counter";
const COUNTER_ID: &str = "id:ns:t::counter";

/// What the clients did: increments they sent, and those answered 200.
#[derive(Default)]
struct Tally {
    attempted: AtomicU64,
    acknowledged: AtomicU64,
}

/// One client: sends increments until `INCREMENTS_PER_CLIENT` are acknowledged, retrying any
/// other answer (as `larder feed` and Vespa's clients retry 503) after a short pause.
async fn increment(addr: SocketAddr, tally: Arc<Tally>) {
    let client = H2Client::connect(addr).await;
    let body = Bytes::from(json!({"fields": {"n": {"increment": 1}}}).to_string());
    let mut acknowledged = 0;
    while acknowledged < INCREMENTS_PER_CLIENT {
        tally.attempted.fetch_add(1, Ordering::SeqCst);
        let (status, _) = client.request(Method::PUT, COUNTER, body.clone()).await;
        if status == StatusCode::OK {
            acknowledged += 1;
            tally.acknowledged.fetch_add(1, Ordering::SeqCst);
        } else {
            assert_eq!(
                status,
                StatusCode::SERVICE_UNAVAILABLE,
                "only 503s are retried"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn run_clients(frontends: [SocketAddr; 2], tally: &Arc<Tally>) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for addr in frontends {
        for _ in 0..CLIENTS_PER_FRONTEND {
            tasks.push(tokio::spawn(increment(addr, tally.clone())));
        }
    }
    tasks
}

async fn counter(addr: SocketAddr) -> u64 {
    let client = H2Client::connect(addr).await;
    let (status, body) = client.request(Method::GET, COUNTER, Bytes::new()).await;
    assert_eq!(status, StatusCode::OK);
    let doc: Value = serde_json::from_slice(&body).unwrap();
    doc["fields"]["n"].as_u64().unwrap()
}

async fn create_counter(addr: SocketAddr) {
    let client = H2Client::connect(addr).await;
    let body = Bytes::from(json!({"fields": {"n": 0}}).to_string());
    let (status, _) = client.request(Method::POST, COUNTER, body).await;
    assert_eq!(status, StatusCode::OK);
}

/// Index (in the map's node list) of the primary of the counter's partition.
fn counter_primary(cluster: &Cluster) -> (u32, usize) {
    let partition = partition_for_key(COUNTER_ID.as_bytes(), cluster.map.partitions.len() as u32);
    let primary = cluster.map.primary_of(partition, "dc1").unwrap();
    let index = cluster
        .map
        .nodes
        .iter()
        .position(|n| n.id == primary)
        .unwrap();
    (partition, index)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn increments_through_two_frontends_are_never_lost() {
    let cluster = Cluster::start(3, 4);
    let second = SecondFrontend::start(&cluster);
    let frontends = [cluster.frontend_addr, second.addr];
    for round in 0..2 {
        create_counter(cluster.frontend_addr).await;
        let tally = Arc::new(Tally::default());
        for task in run_clients(frontends, &tally) {
            task.await.unwrap();
        }
        let expected = 2 * CLIENTS_PER_FRONTEND as u64 * INCREMENTS_PER_CLIENT;
        for addr in frontends {
            assert_eq!(
                counter(addr).await,
                expected,
                "round {round}, through {addr}"
            );
        }
    }
}

/// The failover behaviour: while the primary of the counter's partition is down, every
/// increment of the counter answers 503 and plain puts of that partition still answer 200;
/// once it is back, increments succeed again. No acknowledged increment is lost and none is
/// applied twice: acknowledged <= final count <= attempted (an increment whose answer was a 503
/// or a transport error may or may not have been applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_killed_mid_run_loses_no_acknowledged_increment() {
    let mut cluster = Cluster::start(3, 4);
    let second = SecondFrontend::start(&cluster);
    let frontends = [cluster.frontend_addr, second.addr];
    let (partition, primary) = counter_primary(&cluster);
    create_counter(cluster.frontend_addr).await;
    let tally = Arc::new(Tally::default());
    let tasks = run_clients(frontends, &tally);
    while tally.acknowledged.load(Ordering::SeqCst) < 100 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cluster.kill_node(primary);
    // While it is down: read-modify-writes of its partition answer 503, plain puts go on.
    let client = H2Client::connect(cluster.frontend_addr).await;
    let update = Bytes::from(json!({"fields": {"n": {"increment": 1}}}).to_string());
    let plain = (0..)
        .map(|i| format!("other{i}"))
        .find(|key| partition_for_key(format!("id:ns:t::{key}").as_bytes(), 4) == partition)
        .unwrap();
    for _ in 0..3 {
        tally.attempted.fetch_add(1, Ordering::SeqCst);
        let (status, _) = client.request(Method::PUT, COUNTER, update.clone()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let body = Bytes::from(json!({"fields": {"x": 1}}).to_string());
        let path = format!("/document/v1/ns/t/docid/{plain}");
        let (status, _) = client.request(Method::POST, &path, body).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "a plain put while the primary is down"
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.restart_node(primary);
    for task in tasks {
        task.await.unwrap();
    }
    let (attempted, acknowledged) = (
        tally.attempted.load(Ordering::SeqCst),
        tally.acknowledged.load(Ordering::SeqCst),
    );
    assert_eq!(
        acknowledged,
        2 * CLIENTS_PER_FRONTEND as u64 * INCREMENTS_PER_CLIENT
    );
    for addr in frontends {
        let n = counter(addr).await;
        assert!(
            (acknowledged..=attempted).contains(&n),
            "final count {n}, acknowledged {acknowledged}, attempted {attempted}"
        );
    }
}

/// A node refuses a serialised write (the write of a read-modify-write) unless it is the
/// partition's primary at the map the request names: another node, or a fence of another map
/// (e.g. a frontend that has not seen the primary move), gets a 421 and nothing is written.
#[tokio::test]
async fn a_node_that_is_not_the_primary_refuses_a_serialised_write() {
    let cluster = Cluster::start(3, 4);
    let (partition, primary) = counter_primary(&cluster);
    let fence = cluster.map.primary_fence(partition, "dc1").unwrap();
    let key = larder_proto::doc_path(partition, COUNTER_ID);
    let mut stale = cluster.map.clone();
    stale.partitions[partition as usize].replicas.rotate_left(1);
    let stale_fence = stale.primary_fence(partition, "dc1").unwrap();
    let secondary = (primary + 1) % 3;
    let write = |node: usize, fence: &str, expect: u64| {
        Request::put(format!("http://{}{key}", cluster.node_addr(node)))
            .header("x-larder-doc-version", 1u64 << 16)
            .header("x-larder-doc-primary", fence)
            .header("x-larder-doc-expect", expect)
            .body(Full::new(Bytes::from_static(b"{\"n\":1}")))
            .unwrap()
    };
    let to = |node: usize| cluster.node_client(cluster.node_addr(node));
    // The current fence at a node that is not the primary.
    let (status, _, body) = to(secondary).await.send(write(secondary, &fence, 0)).await;
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{body:?}");
    // The stale map's fence (it names the secondary as primary) at either node.
    for node in [primary, secondary] {
        let (status, _, _) = to(node).await.send(write(node, &stale_fence, 0)).await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST);
    }
    let (status, _) = to(secondary)
        .await
        .request(Method::GET, &key, Bytes::new())
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing written");
    // The primary at the right fence applies it, and refuses one based on an older read.
    let (status, _, _) = to(primary).await.send(write(primary, &fence, 0)).await;
    assert_eq!(status, StatusCode::OK);
    let mut newer = write(primary, &fence, 0);
    newer
        .headers_mut()
        .insert("x-larder-doc-version", (2u64 << 16).into());
    let (status, headers, _) = to(primary).await.send(newer).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        headers["x-larder-doc-version"],
        (1u64 << 16).to_string().as_str()
    );
}
