//! The S3 layer across two datacenters. A bucket's index is one record; each datacenter used
//! to decide its own read-modify-writes of it at its own partition primary, so PUTs and
//! DELETEs through two datacenters at once each wrote a whole new index from what they had
//! seen, and last-writer-wins replication kept one and dropped the other's names (and brought
//! back deleted ones: the nemesis found it through the sweeper of another datacenter). Now
//! every datacenter's frontend reads and changes S3 records in one home datacenter. The
//! frontends fold the bucket's names into a base blob every change or two (`index_delta_bytes =
//! 256`, `larder-s3/src/leaf_base.rs`), so each reads bases the other wrote, and their folds
//! race at the primary.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use common::Cluster;

const BUCKET: &str = "shared";

struct Key {
    id: String,
    secret: String,
}

fn url(s3: SocketAddr, key: &Key, method: &str, object: &str, query: &[(&str, &str)]) -> String {
    let endpoint = format!("http://{s3}");
    larder_s3::presign_with_query(
        &larder_s3::Presign {
            method,
            endpoint: &endpoint,
            bucket: BUCKET,
            key: object,
            access_key_id: &key.id,
            secret: &key.secret,
            region: "us-east-1",
            expires: Duration::from_secs(600),
            now: SystemTime::now(),
        },
        query,
    )
    .unwrap()
}

fn listed(dir: &Path, s3: SocketAddr, key: &Key) -> BTreeSet<String> {
    let list = url(s3, key, "GET", "", &[("list-type", "2")]);
    let answer = common::curl(dir, &[&list]);
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let text = String::from_utf8(answer.body).unwrap();
    text.split("<Key>")
        .skip(1)
        .map(|rest| rest.split("</Key>").next().unwrap().to_owned())
        .collect()
}

/// Puts `dc-00`..`dc-24` through `s3`, deleting every fifth right after; returns the names
/// that should stay.
fn write_names(dir: &Path, s3: SocketAddr, key: &Key, dc: &str) -> Vec<String> {
    let mut kept = Vec::new();
    for n in 0..25 {
        let name = format!("{dc}-{n:02}");
        let put = url(s3, key, "PUT", &name, &[]);
        let answer = common::curl(dir, &["-X", "PUT", "--data-binary", &name, &put]);
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        if n % 5 == 0 {
            let delete = url(s3, key, "DELETE", &name, &[]);
            assert_eq!(common::curl(dir, &["-X", "DELETE", &delete]).status, 204);
        } else {
            kept.push(name);
        }
    }
    kept
}

/// A cluster of two datacenters, a frontend with an S3 port in each (returned in order), a key
/// made through dc1, and the bucket made through dc2.
fn two_datacenters_with_a_bucket() -> (Cluster, Vec<SocketAddr>, Key) {
    let mut cluster = Cluster::start_in(&["dc1", "dc2"], 6, 4, "");
    let s3 = common::free_addresses(2);
    for (i, addr) in s3.iter().enumerate() {
        let extra = format!(
            "[s3]\nlisten = \"{addr}\"\nsweep_interval = \"1s\"\nreplaced_blob_grace = \"1s\"\n\
             index_delta_bytes = 256\n"
        );
        cluster.reconfigure_frontend(i, &extra);
        common::wait_for_port(*addr);
    }
    let (id, secret) = common::s3_key(&cluster, &["*:owner"]);
    let key = Key { id, secret };
    // The key made through dc1 signs at once in dc2, and the bucket made there is dc1's too.
    let create = url(s3[1], &key, "PUT", "", &[]);
    let answer = common::curl(cluster.dir.path(), &["-X", "PUT", &create]);
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    (cluster, s3, key)
}

/// A frontend's count of index record reads answered by the copy it kept (`record_cache.rs`).
fn reads_from_kept_copies(cluster: &Cluster, frontend: usize) -> u64 {
    counted(
        cluster,
        frontend,
        "larder_frontend_s3_index_cache_reads_total{outcome=\"unchanged\"}",
    )
}

/// A frontend's count of GETs whose body it kept by blob ID (`body_cache.rs`).
fn bodies_from_memory(cluster: &Cluster, frontend: usize) -> u64 {
    counted(
        cluster,
        frontend,
        "larder_frontend_s3_body_cache_reads_total{outcome=\"hit\"}",
    )
}

fn counted(cluster: &Cluster, frontend: usize, series: &str) -> u64 {
    let metrics = format!("http://{}/metrics", cluster.frontend_addrs[frontend]);
    let answer = common::curl(cluster.dir.path(), &[&metrics]);
    let text = String::from_utf8(answer.body).unwrap();
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// A frontend keeps the index records it read, by version, and asks the quorum only whether
/// they changed: a name rewritten or deleted through another frontend (another datacenter's)
/// reads as it now is at once, never from the kept copy.
#[test]
fn a_kept_index_record_never_hides_a_write_through_another_frontend() {
    let (cluster, s3, key) = two_datacenters_with_a_bucket();
    let dir = cluster.dir.path().to_path_buf();
    let put = |body: &str| {
        let put = url(s3[0], &key, "PUT", "name", &[]);
        let answer = common::curl(&dir, &["-X", "PUT", "--data-binary", body, &put]);
        assert_eq!(answer.status, 200);
    };
    let get = || common::curl(&dir, &[&url(s3[1], &key, "GET", "name", &[])]);
    put("one");
    for _ in 0..3 {
        assert_eq!(get().body, b"one");
    }
    let kept = reads_from_kept_copies(&cluster, 1);
    assert!(
        kept >= 2,
        "the reads after the first used the kept copy ({kept})"
    );
    let bodies = bodies_from_memory(&cluster, 1);
    assert!(bodies >= 2, "the body was kept too ({bodies})");
    put("two");
    assert_eq!(
        get().body,
        b"two",
        "read-after-write through another frontend"
    );
    // The new body is read, kept, and ranges of it are served from what is kept.
    let range = || {
        let get = url(s3[1], &key, "GET", "name", &[]);
        common::curl(&dir, &["-H", "Range: bytes=1-2", &get])
    };
    for _ in 0..2 {
        let answer = range();
        assert_eq!((answer.status, answer.body.as_slice()), (206, &b"wo"[..]));
    }
    assert!(bodies_from_memory(&cluster, 1) > bodies);
    let delete = url(s3[0], &key, "DELETE", "name", &[]);
    assert_eq!(common::curl(&dir, &["-X", "DELETE", &delete]).status, 204);
    assert_eq!(get().status, 404);
    assert!(!listed(&dir, s3[1], &key).contains("name"));
}

#[test]
fn two_datacenters_writing_one_bucket_lose_no_name_and_bring_back_no_delete() {
    let (cluster, s3, key) = two_datacenters_with_a_bucket();
    let dir = cluster.dir.path().to_path_buf();
    assert!(listed(&dir, s3[0], &key).is_empty());

    let key = std::sync::Arc::new(key);
    let writers: Vec<_> = [("dc1", s3[0]), ("dc2", s3[1])]
        .into_iter()
        .map(|(dc, addr)| {
            let (dir, key) = (dir.clone(), key.clone());
            std::thread::spawn(move || write_names(&dir, addr, &key, dc))
        })
        .collect();
    let expected: BTreeSet<String> = writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    // Strong list-after-write through either datacenter, with nothing to wait for; and still
    // so once the sweepers of both datacenters have run (1 s) and replication has settled.
    for round in 0..2 {
        for addr in &s3 {
            assert_eq!(
                listed(&dir, *addr, &key),
                expected,
                "round {round}, through {addr}"
            );
        }
        std::thread::sleep(Duration::from_secs(3));
    }
    let folds: u64 = (0..2)
        .map(|i| counted(&cluster, i, "larder_frontend_s3_index_leaf_folds_total"))
        .sum();
    assert!(
        folds > 0,
        "the bucket's names were never folded into a base"
    );
    // Each object reads back through the other datacenter.
    for name in expected.iter().step_by(7) {
        let other = if name.starts_with("dc1") {
            s3[1]
        } else {
            s3[0]
        };
        let answer = common::curl(&dir, &[&url(other, &key, "GET", name, &[])]);
        assert_eq!(
            (answer.status, answer.body),
            (200, name.clone().into_bytes())
        );
    }
}
