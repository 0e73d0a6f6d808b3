//! Tombstones are dropped, safely, with real storage nodes (`larder-store/FORMAT.md`, "Dropping
//! tombstones"): once every replica has replicated past them and `tombstone_retention` (1 s
//! here) has passed, compaction drops them; deleted blobs then answer 404 (never found again),
//! also after restarts and on a replica rebuilt from scratch. A replica that has not pulled
//! keeps every drop waiting; one whose data went back behind the drops (restored from a copy)
//! is refused, hands nothing back, and rebuilds itself from its peers.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::h2::H2Client;
use common::Cluster;
use http::{Method, StatusCode};
use larder_cluster::BlobId;

const STORAGE: &str = "[compaction]\nenabled = false\ntombstone_retention = \"1s\"\n";

fn blob(i: usize) -> Bytes {
    Bytes::from(format!("tombstone test blob {i} ").repeat(1 + i % 40))
}

async fn put_blobs(client: &H2Client, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let (status, id, json) = client.put(blob(i)).await;
        assert_eq!(status, StatusCode::CREATED, "{json}");
        ids.push(id.unwrap());
    }
    ids
}

async fn delete(client: &H2Client, ids: &[String]) {
    for id in ids {
        let path = format!("/v1/blobs/{id}");
        let (status, _) = client.request(Method::DELETE, &path, Bytes::new()).await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
}

/// `HEAD` of `id` on storage node `i`, through the internal API.
async fn on_node(cluster: &Cluster, i: usize, id: &str) -> StatusCode {
    let parsed: BlobId = id.parse().unwrap();
    let path = larder_proto::blob_path(parsed.partition, id);
    let client = cluster.node_client(cluster.node_addr(i)).await;
    client.request(Method::HEAD, &path, Bytes::new()).await.0
}

/// Waits until `id` answers `want` on node `i` for every id.
async fn wait_for(cluster: &Cluster, nodes: &[usize], ids: &[String], want: StatusCode) {
    let started = Instant::now();
    for &i in nodes {
        for id in ids {
            loop {
                let got = on_node(cluster, i, id).await;
                if got == want {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "node {i}, {id}: {got}, want {want}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// `POST /internal/v1/compaction` on node `i`: the tombstones it dropped.
async fn compact(cluster: &Cluster, i: usize) -> u64 {
    let client = cluster.node_client(cluster.node_addr(i)).await;
    let (status, body) = client
        .request(Method::POST, "/internal/v1/compaction", Bytes::new())
        .await;
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::OK, "{text}");
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let partitions = json["partitions"].as_object().unwrap();
    partitions
        .values()
        .map(|p| p["tombstones_dropped"].as_u64().unwrap_or(0))
        .sum()
}

/// Compacts `nodes` until every one answers 404 for every deleted blob: their tombstones went
/// (once the peers pulled past them and the retention passed). Returns the tombstones each
/// node's compaction reports dropped, at least one per deleted blob (a put attempt the router
/// gave up on leaves a tombstone too, and a replica that dropped one may pull it again from a
/// peer that had not yet: it goes at the next pass).
async fn compact_until_gone(cluster: &Cluster, nodes: &[usize], deleted: &[String]) -> Vec<u64> {
    let started = Instant::now();
    let mut dropped = vec![0; nodes.len()];
    loop {
        for (n, &i) in nodes.iter().enumerate() {
            dropped[n] += compact(cluster, i).await;
        }
        let mut left = 0;
        for &i in nodes {
            for id in deleted {
                left += (on_node(cluster, i, id).await != StatusCode::NOT_FOUND) as usize;
            }
        }
        if left == 0 {
            return dropped;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{left} tombstones left; dropped {dropped:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn data_dir(cluster: &Cluster, i: usize) -> std::path::PathBuf {
    cluster.dir.path().join(&cluster.map.nodes[i].id)
}

async fn check_public(client: &H2Client, ids: &[String], deleted: &[String], gone: StatusCode) {
    for (i, id) in ids.iter().enumerate() {
        let (status, body) = client.get(id).await;
        if deleted.contains(id) {
            assert_eq!(status, gone, "deleted blob {i}");
        } else {
            assert_eq!(status, StatusCode::OK, "blob {i}");
            assert!(body == blob(i), "blob {i} differs");
        }
    }
}

/// Node 2 loses its disk and comes back empty: it gets the survivors back from its peers (the
/// `ids` after the first `deleted.len()`, which are `deleted`), and no deleted blob.
async fn node_2_comes_back_empty(
    cluster: &mut Cluster,
    client: &H2Client,
    ids: &[String],
    deleted: &[String],
) {
    cluster.stop_node(2);
    std::fs::remove_dir_all(data_dir(cluster, 2)).unwrap();
    cluster.restart_node(2);
    wait_for(cluster, &[2], &ids[deleted.len()..], StatusCode::OK).await;
    wait_for(cluster, &[0, 1, 2], deleted, StatusCode::NOT_FOUND).await;
    check_public(client, ids, deleted, StatusCode::NOT_FOUND).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_go_once_every_replica_has_them_and_deleted_blobs_stay_gone() {
    let mut cluster = Cluster::start_full(3, 2, "", STORAGE);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let ids = put_blobs(&client, 12).await;
    let deleted: Vec<String> = ids[..6].to_vec();
    delete(&client, &deleted).await;
    wait_for(&cluster, &[0, 1, 2], &deleted, StatusCode::GONE).await;
    // Every node holds a replica of every partition: 6 tombstones each (at least), and the
    // compaction report counts them.
    let dropped = compact_until_gone(&cluster, &[0, 1, 2], &deleted).await;
    assert!(
        dropped.iter().all(|d| *d >= deleted.len() as u64),
        "{dropped:?}"
    );
    // Gone from every index: a deleted blob is now just not found (404), like one never written.
    wait_for(&cluster, &[0, 1, 2], &deleted, StatusCode::NOT_FOUND).await;
    check_public(&client, &ids, &deleted, StatusCode::NOT_FOUND).await;
    // Nothing comes back from a replay.
    for i in 0..3 {
        cluster.stop_node(i);
        cluster.restart_node(i);
    }
    wait_for(&cluster, &[0, 1, 2], &deleted, StatusCode::NOT_FOUND).await;
    // A replica rebuilt from scratch pulls its peers' feeds from the beginning: the survivors
    // come back to it, the deleted blobs do not.
    node_2_comes_back_empty(&mut cluster, &client, &ids, &deleted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_did_not_pull_holds_drops_back_and_one_behind_them_is_rebuilt() {
    let mut cluster = Cluster::start_full(3, 2, "", STORAGE);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let ids = put_blobs(&client, 8).await;
    let deleted: Vec<String> = ids[..4].to_vec();
    wait_for(&cluster, &[2], &ids, StatusCode::OK).await;
    // Node 2 has pulled from each peer (a saved cursor per partition and peer): a replica
    // restored without them could not be told from a new one (`FORMAT.md`, "Not covered").
    let cursors = data_dir(&cluster, 2).join("replication");
    let started = Instant::now();
    let pulled = |e: &std::fs::DirEntry| {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        e.file_name().to_string_lossy().ends_with(".cursor")
            // Either slot (the file keeps the last two saves) past the start.
            && text
                .lines()
                .filter_map(|slot| slot.split_whitespace().next())
                .any(|cursor| !cursor.starts_with("0000000000000000."))
    };
    while std::fs::read_dir(&cursors).map_or(0, |d| d.flatten().filter(pulled).count()) < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no cursors saved"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Node 2 goes away with the blobs; a copy of its data is kept (a backup to restore later).
    cluster.stop_node(2);
    let backup = tempfile::tempdir().unwrap();
    copy_tree(&data_dir(&cluster, 2), backup.path());
    delete(&client, &deleted).await;
    wait_for(&cluster, &[0, 1], &deleted, StatusCode::GONE).await;
    // Past the retention, but node 2 has not replicated the deletes: nothing is dropped.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..3 {
        compact(&cluster, 0).await;
        compact(&cluster, 1).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for i in [0, 1] {
        for id in &deleted {
            assert_eq!(on_node(&cluster, i, id).await, StatusCode::GONE, "node {i}");
        }
    }
    // Node 2 comes back, replicates the deletes, and then they can go everywhere.
    cluster.restart_node(2);
    wait_for(&cluster, &[2], &deleted, StatusCode::GONE).await;
    compact_until_gone(&cluster, &[0, 1, 2], &deleted).await;
    // Node 2's data goes back to before the deletes: it still holds the blobs, and their puts
    // are in its feed. It asks its peers from before their drops, is refused, hands nothing
    // back, and rebuilds itself.
    cluster.stop_node(2);
    std::fs::remove_dir_all(data_dir(&cluster, 2)).unwrap();
    copy_tree(backup.path(), &data_dir(&cluster, 2));
    // Its cursors for node 0's feeds are lost too: from the beginning it would look new to node
    // 0, so it must find out by itself (data, but no saved position there). Those for node 1
    // are kept: node 1 tells it (409).
    let first = cluster.map.nodes[0].id.clone();
    for entry in std::fs::read_dir(data_dir(&cluster, 2).join("replication"))
        .unwrap()
        .flatten()
    {
        if entry
            .file_name()
            .to_string_lossy()
            .ends_with(&format!("-{first}.cursor"))
        {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
    cluster.restart_node(2);
    // Its peers never get the blobs back (a tombstone they pulled again from each other while
    // dropping is still a delete: 404 or 410, never 200); node 2 learns that it is behind
    // (from node 1's 409, and by itself for node 0) and rebuilds itself from them
    // (`rebuild.rs`): the survivors come back to it, the deleted blobs do not.
    for _ in 0..15 {
        for i in [0, 1] {
            for id in &deleted {
                let status = on_node(&cluster, i, id).await;
                assert!(
                    status == StatusCode::NOT_FOUND || status == StatusCode::GONE,
                    "node {i} serves deleted {id} again: {status}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_for(&cluster, &[2], &ids[4..], StatusCode::OK).await;
    wait_for(&cluster, &[2], &deleted, StatusCode::NOT_FOUND).await;
    check_public(&client, &ids, &deleted, StatusCode::NOT_FOUND).await;
    // Rebuilt, it serves its feed to its peers again.
    let parsed: BlobId = deleted[0].parse().unwrap();
    let node2 = cluster.node_client(cluster.node_addr(2)).await;
    for peer in [0, 1] {
        let path = format!(
            "{}&replica={}",
            larder_proto::changes_path(parsed.partition, "0000000000000000.0", 10),
            cluster.map.nodes[peer].id
        );
        let started = Instant::now();
        loop {
            let (status, body) = node2.request(Method::GET, &path, Bytes::new()).await;
            if status == StatusCode::OK {
                break;
            }
            let text = String::from_utf8_lossy(&body);
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "peer {peer}: {status} {text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A rebuilt replica's first scan of a peer's feed passes below the peer's dropped tombstones
/// page after page: that is not a position that went back. With pages of 2 changes, the first
/// page of a feed whose tombstones were dropped ends below the drops; the peer refused the next
/// pull (409), and the replica rebuilt itself, started its scan over, was refused again, and
/// never caught up (the nemesis, seed 1: a replace-node move that never finished).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_replica_scanning_below_the_drops_page_by_page_catches_up() {
    let small_pages = format!("{STORAGE}\n[replication]\npage_size = 2\n");
    let mut cluster = Cluster::start_full(3, 1, "", &small_pages);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let ids = put_blobs(&client, 12).await;
    let deleted: Vec<String> = ids[..6].to_vec();
    delete(&client, &deleted).await;
    wait_for(&cluster, &[0, 1, 2], &deleted, StatusCode::GONE).await;
    compact_until_gone(&cluster, &[0, 1, 2], &deleted).await;
    // Its pulls start at the beginning of each peer's feed, whose drops lie pages ahead.
    node_2_comes_back_empty(&mut cluster, &client, &ids, &deleted).await;
}

/// Pulls each partition's feed on node `i` by hand as peer `peer`, from the feed's head
/// (`after`) but naming `saved` as the position its restart would resume from: `None` names the
/// head there too.
async fn pull_as(cluster: &Cluster, i: usize, peer: &str, saved: Option<&str>) {
    let client = cluster.node_client(cluster.node_addr(i)).await;
    for partition in 0..2u32 {
        let start = larder_proto::changes_path(partition, "0000000000000000.0", 10_000);
        let (status, body) = client.request(Method::GET, &start, Bytes::new()).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let page: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let head = page["head"].as_str().unwrap();
        let start_of_feed = format!("{}.0", head.split_once('.').unwrap().0);
        let saved = saved.map_or(head.to_owned(), |s| s.replace("START", &start_of_feed));
        let path = format!(
            "{}&replica={peer}&saved={saved}",
            larder_proto::changes_path(partition, head, 10)
        );
        // 200, or 425 while this node has not pulled from that peer since it started: the
        // position counts either way.
        let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
        assert!(
            status == StatusCode::OK || status == StatusCode::TOO_EARLY,
            "{status} {}",
            String::from_utf8_lossy(&body)
        );
    }
}

/// A peer's position for the tombstone horizon is the one it says it saved, not where it pulls
/// from: its pulls run ahead of its saves (`cursor_save_every`), and a restart resumes from the
/// save. While node 2 (stopped) last said it saved the start of each feed, nothing is dropped
/// although its pull began at the head; once it says it saved the head, the tombstones go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_horizon_follows_the_position_a_peer_saved_not_the_one_it_pulls_from() {
    let mut cluster = Cluster::start_full(3, 2, "", STORAGE);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let ids = put_blobs(&client, 8).await;
    let deleted: Vec<String> = ids[..4].to_vec();
    delete(&client, &deleted).await;
    wait_for(&cluster, &[0, 1, 2], &deleted, StatusCode::GONE).await;
    cluster.stop_node(2);
    let node2 = cluster.map.nodes[2].id.clone();
    for i in [0, 1] {
        pull_as(&cluster, i, &node2, Some("START")).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..3 {
        for i in [0, 1] {
            assert_eq!(compact(&cluster, i).await, 0, "node {i} dropped tombstones");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    wait_for(&cluster, &[0, 1], &deleted, StatusCode::GONE).await;
    for i in [0, 1] {
        pull_as(&cluster, i, &node2, None).await;
    }
    compact_until_gone(&cluster, &[0, 1], &deleted).await;
}
