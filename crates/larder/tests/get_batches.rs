//! Whole-blob GETs travel to storage nodes in batches while other GETs to those nodes are on
//! the way (`larder-router`'s `get_batch.rs`, `larder-proto`'s `get_batch.rs`): every read gets
//! what it would have got alone (bytes, properties, 404, 410), blobs past the batch's size are
//! asked for alone, reads fail over when a node dies, and a storage node answers each blob of a
//! batch as it would a GET of it alone, never with bytes whose checksum fails.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::h2::H2Client;
use common::{internal, Cluster};
use http::{Method, StatusCode};
use http_body_util::Full;
use larder_cluster::{BlobId, BlobKind};
use larder_proto::{header as h, GetItem, GetItemAnswer};

/// One GET in flight per node: any concurrency makes batches; blobs past 4 KiB go alone.
const BATCHING: &str = "[router]\nget_requests_in_flight = 1\nbatch_gets_up_to = \"4KiB\"\n";

fn blob(i: usize) -> Bytes {
    // Every tenth blob is past the batch's 4 KiB, one is empty.
    let len = match i {
        0 => 0,
        i if i % 10 == 3 => 10_000 + i,
        i => 300 + i * 7,
    };
    Bytes::from((0..len).map(|j| (i * 31 + j) as u8).collect::<Vec<u8>>())
}

/// What a GET of a blob answers, as the test expects it.
#[derive(Clone, Debug, PartialEq)]
enum Expect {
    Bytes(Bytes),
    Status(StatusCode),
}

async fn put_with_type(client: &H2Client, i: usize) -> String {
    let request = http::Request::post("http://frontend/v1/blobs")
        .header(http::header::CONTENT_TYPE, format!("text/x-blob-{i}"))
        .header(format!("{}n", h::META_PREFIX), i.to_string())
        .body(Full::new(blob(i)))
        .unwrap();
    let (status, _, body) = client.send(request).await;
    assert_eq!(status, StatusCode::CREATED, "{body:?}");
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    json["id"].as_str().unwrap().to_owned()
}

/// Reads every blob `rounds` times at once and checks each answer: status, bytes and the
/// properties that come back as headers.
async fn read_all_at_once(client: &H2Client, blobs: &[(usize, String, Expect)], rounds: usize) {
    let tasks: Vec<_> = (0..rounds)
        .flat_map(|_| blobs.iter().cloned())
        .map(|(i, id, expect)| {
            let client = client.clone();
            tokio::spawn(async move {
                let request = http::Request::get(format!("http://frontend/v1/blobs/{id}"))
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                let (status, headers, body) = client.send(request).await;
                match expect {
                    Expect::Bytes(data) => {
                        assert_eq!((status, body), (StatusCode::OK, data), "blob {i}");
                        let content_type = headers.get(http::header::CONTENT_TYPE).unwrap();
                        assert_eq!(content_type, &format!("text/x-blob-{i}"));
                        let meta = headers.get(format!("{}n", h::META_PREFIX)).unwrap();
                        assert_eq!(meta, &i.to_string());
                    }
                    Expect::Status(expected) => assert_eq!(status, expected, "blob {i}"),
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

fn frontend_count(cluster: &Cluster, series: &str) -> f64 {
    let text = common::metrics::scrape_frontend(cluster.frontend_addr).unwrap();
    common::metrics::value(&text, series).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_gets_go_in_batches_and_answer_as_alone() {
    let mut cluster = Cluster::start_with(3, 8, BATCHING);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let mut blobs = Vec::new();
    for i in 0..40 {
        let id = put_with_type(&client, i).await;
        blobs.push((i, id, Expect::Bytes(blob(i))));
    }
    // Deleted ones answer 410, and IDs never stored 404, from within batches too.
    for (_, id, expect) in blobs.iter_mut().skip(30).take(4) {
        let path = format!("/v1/blobs/{id}");
        let (status, _) = client.request(Method::DELETE, &path, Bytes::new()).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        *expect = Expect::Status(StatusCode::GONE);
    }
    for (i, partition) in [(100, 1), (101, 5)] {
        let id = BlobId::mint(BlobKind::Simple, 0, partition).to_string();
        blobs.push((i, id, Expect::Status(StatusCode::NOT_FOUND)));
    }

    read_all_at_once(&client, &blobs, 8).await;
    let batches = frontend_count(&cluster, "larder_frontend_get_batches_total");
    let batched = frontend_count(&cluster, "larder_frontend_get_batched_blobs_total");
    assert!(batches >= 1.0, "no batch was sent");
    assert!(
        batched >= 2.0 * batches,
        "{batched} reads in {batches} batches"
    );

    // A node gone: batched reads sent to it fail over to the other replicas.
    cluster.kill_node(0);
    let before = frontend_count(&cluster, "larder_frontend_get_batches_total");
    read_all_at_once(&client, &blobs, 8).await;
    assert!(frontend_count(&cluster, "larder_frontend_get_batches_total") > before);
}

/// Reads waiting for batches to nodes that stopped answering (SIGSTOP) end at the operation's
/// deadline, not at the far longer request timeout: the read's one timer ends every wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_reads_of_stalled_nodes_end_at_the_deadline() {
    const SIGSTOP: i32 = 19;
    let settings = format!("{BATCHING}operation_timeout = \"2s\"\nrequest_timeout = \"60s\"\n");
    let cluster = Cluster::start_with(3, 4, &settings);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let mut ids = Vec::new();
    for i in 1..5 {
        ids.push(put_with_type(&client, i).await);
    }
    for node in 0..3 {
        cluster.signal_node(node, SIGSTOP);
    }
    for node in 0..3 {
        wait_until_stopped(cluster.node_pid(node).unwrap());
    }
    let started = std::time::Instant::now();
    let reads: Vec<_> = (0..6)
        .flat_map(|_| ids.iter().cloned())
        .map(|id| {
            let client = client.clone();
            tokio::spawn(async move {
                let path = format!("/v1/blobs/{id}");
                client.request(Method::GET, &path, Bytes::new()).await.0
            })
        })
        .collect();
    for read in reads {
        let status = read.await.unwrap();
        assert!(
            status.is_server_error(),
            "a read of a stopped cluster answered {status}"
        );
    }
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(8),
        "reads took {took:?}"
    );
    assert!(frontend_count(&cluster, "larder_frontend_get_batched_blobs_total") >= 1.0);
}

/// Waits until every thread of process `pid` is stopped: `kill` returns once SIGSTOP is
/// queued, and a thread still running could answer a read that the test means to stall.
fn wait_until_stopped(pid: u32) {
    let stopped = || {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        tasks.flatten().all(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state follows the command name, which is in parentheses.
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !stopped() {
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} did not stop"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A storage node's GET batch endpoint, asked directly: each blob answered as a GET of it alone,
/// a blob past the batch's size left to be asked alone, damaged bytes never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_node_answers_each_read_of_a_batch_as_alone() {
    let cluster = Cluster::start(3, 2);
    let secret = cluster.dir.path().join(common::SECRET_FILE);
    let addr = cluster.node_addr(0);
    let send = |method: Method, path: String, headers: Vec<(&'static str, String)>, body| {
        let secret = secret.clone();
        async move { internal::send(&secret, addr, method, &path, &headers, body).await }
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    let put = |partition: u32, data: Vec<u8>| {
        let send = &send;
        let now = now.clone();
        async move {
            let key = BlobId::mint(BlobKind::Simple, 0, partition).to_string();
            let path = larder_proto::blob_path(partition, &key);
            let props = vec![(h::PROPS, format!("1;{now};;-;"))];
            let (status, _, _) = send(Method::PUT, path, props, Bytes::from(data)).await;
            assert_eq!(status, StatusCode::CREATED);
            GetItem { partition, key }
        }
    };
    let small = put(1, b"a small blob".to_vec()).await;
    let large = put(0, vec![7; 5000]).await;
    let damaged_data = b"a blob whose bytes are damaged on disk".to_vec();
    let damaged = put(0, damaged_data.clone()).await;
    let deleted = put(1, b"deleted".to_vec()).await;
    let path = larder_proto::blob_path(1, &deleted.key);
    let time = vec![(h::TIME_MS, now.clone())];
    let (status, _, _) = send(Method::DELETE, path, time, Bytes::new()).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let missing = GetItem {
        partition: 0,
        key: BlobId::mint(BlobKind::Simple, 0, 0).to_string(),
    };
    let not_here = GetItem {
        partition: 7,
        key: BlobId::mint(BlobKind::Simple, 0, 7).to_string(),
    };
    let damaged_path = larder_proto::blob_path(0, &damaged.key);
    common::damage(&cluster, 0, &damaged_path, &damaged_data[..20]);

    let items = [&small, &large, &damaged, &deleted, &missing, &not_here];
    let body = larder_proto::encode_get_batch(4096, &items);
    let path = larder_proto::GET_BATCH_PATH.to_owned();
    let (status, _, answer) = send(Method::POST, path.clone(), vec![], body).await;
    assert_eq!(status, StatusCode::OK, "{answer:?}");
    let answers = larder_proto::decode_get_answers(&answer, items.len()).unwrap();
    let summary: Vec<(u16, Bytes)> = answers
        .iter()
        .map(|a| match a {
            GetItemAnswer::Alone => (0, Bytes::new()),
            GetItemAnswer::Answered { status, body, .. } => (status.as_u16(), body.clone()),
        })
        .collect();
    assert_eq!(summary[0], (200, Bytes::from_static(b"a small blob")));
    assert_eq!(summary[1].0, 0, "past the batch's 4 KiB: asked alone");
    assert_eq!(summary[2].0, 500, "damaged bytes are never sent");
    assert!(
        !summary[2].1.windows(11).any(|w| w == b"whose bytes"),
        "{:?}",
        summary[2].1
    );
    assert_eq!(summary[3].0, 410);
    assert_eq!(summary[4].0, 404);
    assert_eq!(summary[5].0, 404);
    let GetItemAnswer::Answered { headers, .. } = &answers[0] else {
        unreachable!()
    };
    assert_eq!(headers[h::BLOB_SIZE], "12");
    assert!(headers[h::PROPS].to_str().unwrap().starts_with("1;"));
    let GetItemAnswer::Answered { headers, body, .. } = &answers[3] else {
        unreachable!()
    };
    assert_eq!(headers[h::GONE_REASON], "deleted");
    assert!(headers.contains_key(h::TIME_MS));
    let GetItemAnswer::Answered { body: not_here, .. } = &answers[5] else {
        unreachable!()
    };
    let json: serde_json::Value = serde_json::from_slice(not_here).unwrap();
    assert_eq!(json["error"]["code"], "PartitionNotHere", "{body:?}");

    // A batch the node cannot read is refused whole; a GET of the path, and a body past the
    // limit, are refused too.
    let cut = larder_proto::encode_get_batch(4096, &[&small]);
    let cut = cut.slice(..cut.len() - 1);
    let (status, _, answer) = send(Method::POST, path.clone(), vec![], cut).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let json: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(json["error"]["code"], "BadBatch");
    let (status, _, _) = send(Method::GET, path.clone(), vec![], Bytes::new()).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let too_large = Bytes::from(vec![1u8; larder_proto::GET_BATCH_MAX_BODY + 1]);
    let (status, _, _) = send(Method::POST, path, vec![], too_large).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}
