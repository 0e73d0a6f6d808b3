//! Hedged reads and datacenters with real processes: a storage node that is alive but silent
//! (SIGSTOP) does not slow reads down to the request timeout; a blob written in one datacenter is
//! readable from a frontend in the other, and replication brings it to every remote replica.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::h2::H2Client;
use common::Cluster;
use http::{Method, StatusCode};
use larder_cluster::BlobId;

const SIGSTOP: i32 = 19;
const SIGCONT: i32 = 18;

async fn timed_gets(client: &H2Client, ids: &[String], rounds: usize) -> Vec<Duration> {
    let mut latencies = Vec::new();
    for _ in 0..rounds {
        for id in ids {
            let started = Instant::now();
            let (status, body) = client.get(id).await;
            latencies.push(started.elapsed());
            assert_eq!(status, StatusCode::OK, "{id}");
            assert_eq!(body.len(), 1024);
        }
    }
    latencies.sort();
    latencies
}

fn p99(sorted: &[Duration]) -> Duration {
    sorted[(sorted.len() - 1) * 99 / 100]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_replica_does_not_stall_reads() {
    // A long request timeout makes the difference plain: without hedging, every read that asks
    // the stalled node first would wait the full 5 s.
    let cluster = Cluster::start_with(3, 6, "[router]\nrequest_timeout = \"5s\"\n");
    let client = H2Client::connect(cluster.frontend_addr).await;
    let mut ids = Vec::new();
    for i in 0..30u8 {
        let (status, id, _) = client.put(Bytes::from(vec![i; 1024])).await;
        assert_eq!(status, StatusCode::CREATED);
        ids.push(id.unwrap());
    }
    let healthy = timed_gets(&client, &ids, 5).await;
    cluster.signal_node(0, SIGSTOP);
    let stalled = timed_gets(&client, &ids, 5).await;
    cluster.signal_node(0, SIGCONT);
    let (healthy_p99, stalled_p99) = (p99(&healthy), p99(&stalled));
    eprintln!("GET p99 healthy {healthy_p99:?}, one replica stopped {stalled_p99:?}");
    assert!(
        stalled_p99 < Duration::from_secs(1),
        "p99 {stalled_p99:?} is near the 5 s request timeout: hedging did not help"
    );
    let metrics = client
        .request(Method::GET, "/metrics", Bytes::new())
        .await
        .1;
    let text = String::from_utf8_lossy(&metrics);
    let won: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("larder_frontend_hedges_won_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("hedges_won metric");
    assert!(
        won > 0.0,
        "no hedge won while a replica was stopped:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_written_in_one_datacenter_is_read_in_the_other() {
    let cluster = Cluster::start_in(&["east", "west"], 6, 6, "");
    let east = H2Client::connect(cluster.frontend_addrs[0]).await;
    let west = H2Client::connect(cluster.frontend_addrs[1]).await;
    let data = Bytes::from_static(b"written in the east");
    let (status, id, _) = east.put(data.clone()).await;
    assert_eq!(status, StatusCode::CREATED);
    let id = id.unwrap();
    let (status, body) = west.get(&id).await;
    assert_eq!(
        (status, body),
        (StatusCode::OK, data.clone()),
        "read from the west frontend"
    );

    // Replication brings the blob to every replica in the west.
    let parsed: BlobId = id.parse().unwrap();
    let path = larder_proto::blob_path(parsed.partition, &id);
    let deadline = Instant::now() + Duration::from_secs(20);
    for replica in &cluster.map.partition(parsed.partition).unwrap().replicas {
        let index = cluster
            .map
            .nodes
            .iter()
            .position(|n| n.id == replica.node)
            .unwrap();
        let node = cluster.node_client(cluster.node_addr(index)).await;
        loop {
            let (status, body) = node.request(Method::GET, &path, Bytes::new()).await;
            if status == StatusCode::OK {
                assert_eq!(body, data);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "replica on {} never received the blob",
                replica.node
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Deleting in the west reaches the east: no datacenter resurrects it.
    let (status, _) = west
        .request(Method::DELETE, &format!("/v1/blobs/{id}"), Bytes::new())
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // The delete went to every replica; the east ones may answer a moment after the west quorum.
    let deadline = Instant::now() + Duration::from_secs(10);
    while east.get(&id).await.0 != StatusCode::GONE {
        assert!(
            Instant::now() < deadline,
            "the east still serves a blob deleted in the west"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
