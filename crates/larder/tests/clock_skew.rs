//! A frontend whose clock jumps (libfaketime, `LD_PRELOAD`, on the frontend process only):
//! document versions come from its clock, and storage nodes refuse a version ahead of their own
//! clock by more than `max_clock_skew`. The nemesis suite found that such a refusal reached the
//! client as a 400 (the request was fine: the frontend's clock was not), and that once the clock
//! was set back, the frontend kept minting versions from the future, so every document write
//! failed for as long as the jump had been. And that a storage node whose clock lagged skipped,
//! for good, every replicated change it refused as "from the future" while it lagged.

mod common;

use std::path::Path;

use bytes::Bytes;
use common::h2::H2Client;
use common::Cluster;
use http::{Method, StatusCode};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

async fn put_doc(client: &H2Client, id: &str, value: &str) -> (StatusCode, String) {
    let path = format!("/document/v1/ns/doc/docid/{id}");
    let body = format!(r#"{{"fields":{{"v":"{value}"}}}}"#);
    let (status, body) = client.request(Method::POST, &path, Bytes::from(body)).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The environment that runs a process on the clock `file` says (an offset such as `-600`).
fn faked_clock(file: &str) -> [(&str, &str); 4] {
    [
        ("LD_PRELOAD", LIBFAKETIME),
        ("FAKETIME_TIMESTAMP_FILE", file),
        // Read the file at every clock reading: the jumps happen exactly when the test says.
        ("FAKETIME_NO_CACHE", "1"),
        // Timers and deadlines run on the monotonic clock, which stays true.
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ]
}

async fn get_doc(client: &H2Client, id: &str) -> String {
    let path = format!("/document/v1/ns/doc/docid/{id}");
    let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
    assert_eq!(status, StatusCode::OK);
    String::from_utf8_lossy(&body).into_owned()
}

/// Sets the offset the faked clock reads from now on.
fn set_offset(file: &Path, offset: &str) {
    std::fs::write(file, format!("{offset}\n")).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_clock_jump_is_a_503_while_it_lasts_and_nothing_after() {
    if !Path::new(LIBFAKETIME).exists() {
        // scripts/test installs it (apt package libfaketime); a developer's machine may not.
        eprintln!("skipped: {LIBFAKETIME} is missing (apt-get install libfaketime)");
        return;
    }
    let mut cluster = Cluster::start(3, 4);
    let clock = cluster.dir.path().join("frontend-clock");
    std::fs::write(&clock, "+0\n").unwrap();
    let clock_file = clock.to_str().unwrap().to_owned();
    cluster.restart_frontend_with_env(&faked_clock(&clock_file));
    let client = H2Client::connect(cluster.frontend_addr).await;
    let (status, body) = put_doc(&client, "a", "before").await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // An hour ahead: far past the nodes' max_clock_skew (5 min).
    set_offset(&clock, "+3600");
    let (status, body) = put_doc(&client, "a", "during").await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the client's request was fine: {body}"
    );
    assert!(body.contains("clock"), "the answer names the cause: {body}");

    // Set back: writes work again at once, and the last one wins.
    set_offset(&clock, "+0");
    let (status, body) = put_doc(&client, "a", "after").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = put_doc(&client, "b", "after").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(get_doc(&client, "a").await.contains("after"));

    // A jump back within the skew: a write is still ordered after the previous one.
    set_offset(&clock, "-120");
    let (status, body) = put_doc(&client, "a", "behind").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(get_doc(&client, "a").await.contains("behind"));
}

/// GET `path` on storage node `i`'s internal API: the status.
async fn on_node(cluster: &Cluster, i: usize, path: &str) -> StatusCode {
    let client = cluster.node_client(cluster.node_addr(i)).await;
    client.request(Method::GET, path, Bytes::new()).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_node_whose_clock_lagged_gets_what_it_refused_once_it_is_right() {
    if !Path::new(LIBFAKETIME).exists() {
        eprintln!("skipped: {LIBFAKETIME} is missing (apt-get install libfaketime)");
        return;
    }
    let mut cluster = Cluster::start(3, 1);
    let clock = cluster.dir.path().join("node-clock");
    // Ten minutes behind: past the nodes' max_clock_skew (5 min), so node 0 refuses every
    // version and operation time minted now, from the frontend and from its peers alike.
    std::fs::write(&clock, "-600\n").unwrap();
    let clock_file = clock.to_str().unwrap().to_owned();
    cluster.kill_node(0);
    cluster.restart_node_with_env(0, &faked_clock(&clock_file));

    let client = H2Client::connect(cluster.frontend_addr).await;
    let (status, body) = put_doc(&client, "lagged", "written while node 0 lagged").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, blob, json) = client.put(Bytes::from_static(b"a blob")).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    let blob_id: larder_cluster::BlobId = blob.unwrap().parse().unwrap();
    let doc_path = larder_proto::doc_path(0, "id:ns:doc::lagged");
    let blob_path = larder_proto::blob_path(blob_id.partition, &blob_id.to_string());
    // Its peers have both; node 0 refuses them (a replication round or two).
    for i in [1, 2] {
        assert_eq!(on_node(&cluster, i, &doc_path).await, StatusCode::OK);
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(on_node(&cluster, 0, &doc_path).await, StatusCode::NOT_FOUND);

    // Its clock is set right: replication brings it what it refused.
    set_offset(&clock, "+0");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let doc = on_node(&cluster, 0, &doc_path).await;
        let blob = on_node(&cluster, 0, &blob_path).await;
        if (doc, blob) == (StatusCode::OK, StatusCode::OK) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node 0 never got what it refused while its clock lagged: document {doc}, blob {blob}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
