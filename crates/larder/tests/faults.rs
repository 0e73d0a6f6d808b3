//! Storage nodes killed for real (SIGKILL) under a real frontend: quorum writes keep working with
//! one node down, fail clearly with two down, and every acknowledged blob is back after restart.

mod common;

use bytes::Bytes;
use common::h2::H2Client;
use common::Cluster;
use http::StatusCode;

fn blob(i: usize) -> Bytes {
    Bytes::from(
        (0..1000 + i * 37)
            .map(|j| (i * 31 + j * 7) as u8)
            .collect::<Vec<u8>>(),
    )
}

async fn put_many(client: &H2Client, range: std::ops::Range<usize>) -> Vec<(usize, String)> {
    let mut tasks = Vec::new();
    for i in range {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let (status, id, json) = client.put(blob(i)).await;
            assert_eq!(status, StatusCode::CREATED, "{json}");
            (i, id.unwrap())
        }));
    }
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

async fn assert_all_readable(client: &H2Client, blobs: &[(usize, String)]) {
    for (i, id) in blobs {
        let (status, body) = client.get(id).await;
        assert_eq!(status, StatusCode::OK, "blob {i} ({id})");
        assert_eq!(body, blob(*i), "blob {i} content");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_survives_one_dead_node_and_refuses_with_two() {
    let mut cluster = Cluster::start(3, 6);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let mut acknowledged = put_many(&client, 0..40).await;

    cluster.kill_node(0);
    acknowledged.extend(put_many(&client, 40..80).await);
    assert_all_readable(&client, &acknowledged).await;

    cluster.kill_node(1);
    let (status, id, json) = client.put(blob(999)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{json}");
    assert!(id.is_none());
    assert_eq!(json["error"]["code"], "NotEnoughReplicas");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(message.contains("acknowledged"), "{message}");
    // With two of three replicas gone, reads either return the right bytes or fail; never wrong data.
    for (i, id) in &acknowledged {
        let (status, body) = client.get(id).await;
        if status == StatusCode::OK {
            assert_eq!(body, blob(*i));
        } else {
            assert!(
                status == StatusCode::SERVICE_UNAVAILABLE,
                "blob {i}: {status}"
            );
        }
    }

    cluster.restart_node(0);
    cluster.restart_node(1);
    // The restarted nodes recovered their logs without a clean shutdown.
    assert_all_readable(&client, &acknowledged).await;
    acknowledged.extend(put_many(&client, 80..100).await);
    assert_all_readable(&client, &acknowledged).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_carries_hundreds_of_concurrent_streams() {
    let cluster = Cluster::start(3, 8);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let blobs = put_many(&client, 0..300).await;
    let mut tasks = Vec::new();
    for (i, id) in blobs {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let (status, body) = client.get(&id).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(body, blob(i));
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_shutdown_and_restart_keeps_everything() {
    let mut cluster = Cluster::start(3, 4);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let blobs = put_many(&client, 0..30).await;
    for i in 0..3 {
        cluster.stop_node(i);
    }
    for i in 0..3 {
        cluster.restart_node(i);
    }
    assert_all_readable(&client, &blobs).await;
}
