//! Index leaves written as deltas from base blobs (`larder-s3/src/leaf_base.rs`), made to fold
//! early (`[s3] index_delta_bytes = 512`: a leaf of ~2 KB of names gets a base, and a write
//! changing more than ~2 names folds it again): concurrent PUTs, overwrites and deletes land;
//! listings and reads see every name as changed, from the frontend that wrote them and from one
//! started cold (which reads each base from storage); and a frontend that dies with a new base
//! stored leaks it not (tombstoned at the next start unless its leaf names it) and loses no
//! name. Real processes, curl with presigned URLs.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Cluster;

struct Signer {
    urls: common::Presigner,
    dir: std::path::PathBuf,
}

impl Signer {
    fn url(&self, method: &str, object: &str, query: &[(&str, &str)]) -> String {
        self.urls.url(method, "bases", object, query)
    }

    fn put(&self, object: &str, body: &str) -> u16 {
        let url = self.url("PUT", object, &[]);
        let args = ["-X", "PUT", "--data-binary", body, url.as_str()];
        common::curl(&self.dir, &args).status
    }

    fn get(&self, object: &str) -> (u16, Vec<u8>) {
        let got = common::curl(&self.dir, &[&self.url("GET", object, &[])]);
        (got.status, got.body)
    }

    fn delete(&self, object: &str) -> u16 {
        let url = self.url("DELETE", object, &[]);
        common::curl(&self.dir, &["-X", "DELETE", &url]).status
    }

    /// Every key, in pages of `page`, by continuation token.
    fn list(&self, page: usize) -> Vec<String> {
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        let page = page.to_string();
        loop {
            let mut query = vec![("list-type", "2"), ("max-keys", page.as_str())];
            if let Some(token) = &token {
                query.push(("continuation-token", token.as_str()));
            }
            let got = common::curl(&self.dir, &[&self.url("GET", "", &query)]);
            assert_eq!(got.status, 200, "{}", String::from_utf8_lossy(&got.body));
            let text = String::from_utf8(got.body).unwrap();
            keys.extend(between(&text, "<Key>", "</Key>"));
            token = between(&text, "<NextContinuationToken>", "</NextContinuationToken>")
                .into_iter()
                .next();
            if token.is_none() {
                return keys;
            }
        }
    }
}

fn between(text: &str, open: &str, close: &str) -> Vec<String> {
    text.split(open)
        .skip(1)
        .filter_map(|s| s.split(close).next().map(str::to_owned))
        .collect()
}

const EXTRA: &str = "index_delta_bytes = 512\n\
                     replaced_blob_grace = \"1s\"\nsweep_interval = \"1s\"\n";

/// A cluster whose frontend splits index records past `leaf_entries` names.
fn start(leaf_entries: usize) -> (Cluster, Arc<Signer>, std::net::SocketAddr) {
    let s3 = common::free_addresses(1)[0];
    let extra = format!(
        "upload_journal_dir = \"frontend-uploads\"\n[s3]\nlisten = \"{s3}\"\n{EXTRA}\
         index_leaf_entries = {leaf_entries}\n"
    );
    let cluster = Cluster::start_with(3, 4, &extra);
    common::wait_for_port(s3);
    let signer = Signer {
        urls: common::Presigner::new(&cluster, s3, &["*:owner"]),
        dir: cluster.dir.path().to_path_buf(),
    };
    let made = common::curl(&signer.dir, &["-X", "PUT", &signer.url("PUT", "", &[])]);
    assert_eq!(made.status, 200);
    (cluster, Arc::new(signer), s3)
}

/// The frontend's count of leaf folds.
fn folds(cluster: &Cluster) -> u64 {
    let got = common::curl(cluster.dir.path(), &[&cluster.url("/metrics")]);
    let text = String::from_utf8(got.body).unwrap();
    text.lines()
        .find(|l| l.starts_with("larder_frontend_s3_index_leaf_folds_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no fold count in /metrics"))
}

fn name(i: usize) -> String {
    format!("{}/{i:04}", ["a", "b", "c"][i % 3])
}

/// Checks a listing (whole and in pages of 7) and every 5th name's body against `expected`.
fn check(signer: &Signer, expected: &BTreeMap<String, String>) {
    let keys: Vec<String> = expected.keys().cloned().collect();
    assert_eq!(signer.list(1000), keys);
    assert_eq!(signer.list(7), keys, "pages of 7 add up to the whole");
    for (key, body) in expected.iter().step_by(5) {
        let (status, got) = signer.get(key);
        assert_eq!(status, 200, "{key}");
        assert_eq!(String::from_utf8(got).unwrap(), *body, "{key}");
    }
}

#[test]
fn leaves_written_as_deltas_read_and_list_as_written_even_from_a_cold_frontend() {
    let (mut cluster, signer, s3) = start(64);
    let names = 300;
    let mut threads = Vec::new();
    for t in 0..8 {
        let s = signer.clone();
        threads.push(std::thread::spawn(move || {
            for i in (t..names).step_by(8) {
                assert_eq!(s.put(&name(i), &format!("one {}", name(i))), 200);
            }
            // Overwrite every 4th and delete every 5th (not overwritten) of this thread's.
            for i in (t..names).step_by(8) {
                if i % 4 == 0 {
                    assert_eq!(s.put(&name(i), &format!("two {}", name(i))), 200);
                } else if i % 5 == 0 {
                    assert_eq!(s.delete(&name(i)), 204);
                }
            }
        }));
    }
    for thread in threads {
        thread.join().unwrap();
    }
    let mut expected = BTreeMap::new();
    for i in 0..names {
        match (i % 4, i % 5) {
            (0, _) => expected.insert(name(i), format!("two {}", name(i))),
            (_, 0) => None,
            _ => expected.insert(name(i), format!("one {}", name(i))),
        };
    }
    let folded = folds(&cluster);
    assert!(folded > 0, "no leaf was folded into a base");
    check(&signer, &expected);

    // A cold frontend reads every base from storage.
    cluster.kill_and_restart_frontend();
    common::wait_for_port(s3);
    check(&signer, &expected);
    // And changes leaves it read cold.
    for i in (0..names).step_by(3) {
        assert_eq!(signer.put(&name(i), "three"), 200);
        expected.insert(name(i), "three".into());
    }
    check(&signer, &expected);

    // Bases replaced by folds are tombstoned after their grace; every name still reads.
    std::thread::sleep(Duration::from_secs(3));
    check(&signer, &expected);
}

/// A bucket that never splits: its root holds its names, in a base past ~2 KB of them.
#[test]
fn a_small_buckets_root_is_written_as_deltas_too() {
    let (mut cluster, signer, s3) = start(1000);
    let mut expected = BTreeMap::new();
    for i in 0..60 {
        assert_eq!(signer.put(&name(i), &format!("one {i}")), 200);
        expected.insert(name(i), format!("one {i}"));
    }
    for i in (0..60).step_by(4) {
        assert_eq!(signer.put(&name(i), &format!("two {i}")), 200);
        expected.insert(name(i), format!("two {i}"));
    }
    for i in (1..60).step_by(6) {
        assert_eq!(signer.delete(&name(i)), 204);
        expected.remove(&name(i));
    }
    assert!(folds(&cluster) > 0, "the root was never folded into a base");
    check(&signer, &expected);
    cluster.kill_and_restart_frontend();
    common::wait_for_port(s3);
    check(&signer, &expected);
    // Emptied, the bucket deletes (its root removed with its base) and is made again empty.
    let keys: Vec<String> = expected.keys().cloned().collect();
    for key in keys {
        assert_eq!(signer.delete(&key), 204);
    }
    let bucket = signer.url("DELETE", "", &[]);
    assert_eq!(
        common::curl(&signer.dir, &["-X", "DELETE", &bucket]).status,
        204
    );
    let made = common::curl(&signer.dir, &["-X", "PUT", &signer.url("PUT", "", &[])]);
    assert_eq!(made.status, 200);
    assert!(signer.list(100).is_empty());
    assert_eq!(signer.get(&name(0)).0, 404);
}

/// The journal's open entries held for a leaf's base: their blob IDs.
fn base_entries(journal: &Path) -> Vec<Vec<String>> {
    if !journal.exists() {
        return Vec::new();
    }
    larder_router::UploadJournal::inspect(journal)
        .unwrap()
        .into_iter()
        .filter(|e| {
            e.held_for
                .as_deref()
                .is_some_and(|h| h.starts_with("base:"))
        })
        .map(|e| e.ids.iter().map(|id| id.to_string()).collect())
        .collect()
}

/// PUTs new names through a frontend that exits at `crash` until one PUT is not answered;
/// returns the names answered (and so linked) and the base blob held in the journal.
fn put_until_the_crash(
    cluster: &mut Cluster,
    signer: &Signer,
    (s3, crash, from): (std::net::SocketAddr, &str, usize),
) -> (Vec<String>, String) {
    let journal = cluster.dir.path().join("frontend-uploads");
    cluster.restart_frontend_with_env(&[("LARDER_S3_CRASH", crash)]);
    common::wait_for_port(s3);
    let mut linked = Vec::new();
    for i in from..from + 400 {
        let key = format!("crash/{i:04}");
        let url = signer.url("PUT", &key, &[]);
        match common::status_if_answered(&signer.dir, &["-X", "PUT", "--data-binary", "x", &url]) {
            Some(200) => linked.push(key),
            Some(other) => panic!("{key}: {other}"),
            None => {
                let held = base_entries(&journal);
                assert_eq!(held.len(), 1, "one held base: {held:?}");
                assert_eq!(held[0].len(), 1, "{held:?}");
                return (linked, held[0][0].clone());
            }
        }
    }
    panic!("no fold in 400 PUTs ({crash})");
}

fn wait_until_no_base_is_held(journal: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !base_entries(journal).is_empty() {
        assert!(Instant::now() < deadline, "a held base was never settled");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_crash_after_a_base_is_stored_leaks_it_not_and_loses_no_name() {
    let (mut cluster, signer, s3) = start(64);
    let journal = cluster.dir.path().join("frontend-uploads");

    // Died with the new base stored, before its leaf was written: the base goes.
    let (mut linked, base) =
        put_until_the_crash(&mut cluster, &signer, (s3, "after-base-stored", 0));
    assert!(
        cluster.replicas_holding(&base) >= 2,
        "stored before the crash"
    );
    cluster.restart_frontend_with_env(&[]);
    common::wait_for_port(s3);
    wait_until_no_base_is_held(&journal);
    assert_eq!(
        cluster.replicas_holding(&base),
        0,
        "the unnamed base was tombstoned"
    );
    linked.sort();
    assert_eq!(signer.list(1000), linked);

    // Died after the leaf naming the new base was written: the base stays, and reads.
    let (more, base) = put_until_the_crash(&mut cluster, &signer, (s3, "after-base-write", 1000));
    linked.extend(more);
    cluster.restart_frontend_with_env(&[]);
    common::wait_for_port(s3);
    wait_until_no_base_is_held(&journal);
    assert!(cluster.replicas_holding(&base) >= 2, "a named base is kept");
    let listed = signer.list(1000);
    for key in &linked {
        assert!(listed.contains(key), "{key} lost: {listed:?}");
    }
    for key in linked.iter().step_by(3) {
        assert_eq!(signer.get(key), (200, b"x".to_vec()), "{key}");
    }
}
