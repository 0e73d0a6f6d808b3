//! Small PUTs travel to storage nodes in batches while other requests to those nodes are on
//! the way (`larder-router`'s `put_batch.rs`, `larder-proto`'s `batch.rs`): every blob of a
//! batch is on every replica and durable when it is acknowledged (storage nodes SIGKILLed and
//! restarted), and a storage node answers each blob of a batch as it would a PUT of it alone.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::h2::H2Client;
use common::{internal, Cluster};
use http::{Method, StatusCode};
use larder_cluster::{BlobId, BlobKind};
use larder_proto::PutItem;

/// One request in flight per node: any concurrency makes batches.
const BATCHING: &str = "[router]\nput_requests_in_flight = 1\n";

fn blob(i: usize) -> Bytes {
    Bytes::from(
        (0..500 + i * 13)
            .map(|j| (i * 17 + j * 3) as u8)
            .collect::<Vec<u8>>(),
    )
}

async fn put_concurrently(
    client: &H2Client,
    range: std::ops::Range<usize>,
) -> Vec<(usize, String)> {
    let tasks: Vec<_> = range
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let (status, id, json) = client.put(blob(i)).await;
                assert_eq!(status, StatusCode::CREATED, "{json}");
                (i, id.unwrap())
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

fn frontend_count(cluster: &Cluster, series: &str) -> f64 {
    let text = common::metrics::scrape_frontend(cluster.frontend_addr).unwrap();
    common::metrics::value(&text, series).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_small_puts_go_in_batches_and_reach_every_replica() {
    let cluster = Cluster::start_with(3, 8, BATCHING);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let blobs = put_concurrently(&client, 0..300).await;

    let batches = frontend_count(&cluster, "larder_frontend_put_batches_total");
    let batched = frontend_count(&cluster, "larder_frontend_put_batched_blobs_total");
    assert!(batches >= 1.0, "no batch was sent");
    assert!(
        batched >= 2.0 * batches,
        "{batched} blobs in {batches} batches"
    );
    assert!(batched <= 900.0, "{batched} copies of 300 blobs");

    for (i, id) in &blobs {
        let (status, body) = client.get(id).await;
        assert_eq!((status, body), (StatusCode::OK, blob(*i)), "blob {i}");
    }
    // The third copy of each is written after its quorum answered: allow it a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for (i, id) in &blobs {
        while tokio::task::block_in_place(|| cluster.replicas_holding(id)) < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "blob {i} is not on every replica"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Acknowledged means synced, batch or not: every storage node SIGKILLed right after the
/// answers, then restarted, still has every acknowledged blob.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_batched_puts_survive_every_node_killed() {
    let mut cluster = Cluster::start_with(3, 8, BATCHING);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let blobs = put_concurrently(&client, 0..300).await;
    assert!(frontend_count(&cluster, "larder_frontend_put_batches_total") >= 1.0);
    for i in 0..3 {
        cluster.kill_node(i);
    }
    for i in 0..3 {
        cluster.restart_node(i);
    }
    for (i, id) in &blobs {
        let (status, body) = client.get(id).await;
        assert_eq!((status, body), (StatusCode::OK, blob(*i)), "blob {i}");
    }
}

fn item(partition: u32, data: &'static [u8]) -> PutItem {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    PutItem {
        partition,
        key: BlobId::mint(BlobKind::Simple, 0, partition).to_string(),
        props: Bytes::from(format!("1;{now};;-;")),
        crc32c: crc32c::crc32c(data),
        data: Bytes::from_static(data),
    }
}

/// A storage node's batch endpoint, asked directly: each blob answered as a PUT of it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_node_answers_each_blob_of_a_batch_as_alone() {
    let cluster = Cluster::start(3, 2);
    let secret = cluster.dir.path().join(common::SECRET_FILE);
    let addr = cluster.node_addr(0);
    let send = |method: Method, path: String, body: Bytes| {
        let secret = secret.clone();
        async move {
            let (status, _, body) = internal::send(&secret, addr, method, &path, &[], body).await;
            (status, body)
        }
    };

    let stored = item(1, b"first blob");
    let mut wrong_crc = item(0, b"damaged on the way");
    wrong_crc.crc32c ^= 1;
    let not_here = item(7, b"no such partition on this node");
    let mut bad_props = item(0, b"unreadable properties");
    bad_props.props = Bytes::from_static(b"2;1;;-;");
    let deleted = item(0, b"deleted before it came");
    let delete = larder_proto::blob_path(0, &deleted.key);
    let time = format!(
        "{}",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    let (status, _, _) = internal::send(
        &secret,
        addr,
        Method::DELETE,
        &delete,
        &[("x-larder-time-ms", time)],
        Bytes::new(),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);

    let items = [
        &stored, &stored, &wrong_crc, &not_here, &bad_props, &deleted,
    ];
    let body = larder_proto::encode_put_batch(&items);
    let (status, answer) = send(
        Method::POST,
        larder_proto::PUT_BATCH_PATH.into(),
        body.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer:?}");
    let answers = larder_proto::decode_answers(&answer, items.len()).unwrap();
    let statuses: Vec<u16> = answers.iter().map(|a| a.status.as_u16()).collect();
    assert_eq!(statuses, [201, 200, 400, 404, 400, 410], "{answers:?}");
    assert!(
        answers[2].message.starts_with("ChecksumMismatch"),
        "{answers:?}"
    );
    assert!(
        answers[3].message.starts_with("PartitionNotHere"),
        "{answers:?}"
    );
    assert!(
        answers[4].message.starts_with("BadProperties"),
        "{answers:?}"
    );

    let (status, data) = send(
        Method::GET,
        larder_proto::blob_path(1, &stored.key),
        Bytes::new(),
    )
    .await;
    assert_eq!((status, data), (StatusCode::OK, stored.data.clone()));
    for refused in [&wrong_crc, &bad_props] {
        let path = larder_proto::blob_path(refused.partition, &refused.key);
        let (status, _) = send(Method::GET, path, Bytes::new()).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "nothing stored for a refused blob"
        );
    }

    // A batch the node cannot read is refused whole, and stores nothing.
    let fresh = item(0, b"in a batch cut short");
    let cut = larder_proto::encode_put_batch(&[&fresh]);
    let (status, answer) = send(
        Method::POST,
        larder_proto::PUT_BATCH_PATH.into(),
        cut.slice(..cut.len() - 1),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let json: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(json["error"]["code"], "BadBatch");
    let (status, _) = send(
        Method::GET,
        larder_proto::blob_path(0, &fresh.key),
        Bytes::new(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = send(
        Method::GET,
        larder_proto::PUT_BATCH_PATH.into(),
        Bytes::new(),
    )
    .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    // Past the batch's limit (8 MiB): refused before it is read, whatever a record may be.
    let too_large = Bytes::from(vec![1u8; larder_proto::BATCH_MAX_BODY + 1]);
    let (status, answer) = send(Method::POST, larder_proto::PUT_BATCH_PATH.into(), too_large).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer:?}");
}
