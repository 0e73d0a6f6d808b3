//! A bucket whose index splits into leaves (`larder-s3/src/index_tree.rs`), made to split
//! early (`[s3] index_leaf_entries = 4`, so every record past 16 names would be refused if
//! splits did not happen): concurrent PUTs land, listings page across leaves without losing
//! or repeating a name (prefix, delimiter, small pages), reads find every name, DeleteBucket
//! of a split bucket refuses while any leaf holds a name and leaves it writable, succeeds once
//! all are deleted, and races with PUTs linearizably; leaves emptied by deletes are merged, so
//! a listing does not walk them, while PUTs and DELETEs race the merges, and the blobs their
//! deleted names held are tombstoned after the grace all the same. curl with presigned URLs.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::Cluster;

struct Signer {
    urls: common::Presigner,
    dir: PathBuf,
}

impl Signer {
    fn url(&self, method: &str, bucket: &str, object: &str, query: &[(&str, &str)]) -> String {
        self.urls.url(method, bucket, object, query)
    }

    fn call(&self, method: &str, bucket: &str, object: &str) -> common::CurlResponse {
        let url = self.url(method, bucket, object, &[]);
        match method {
            "PUT" if !object.is_empty() => common::curl(
                &self.dir,
                &[
                    "-X",
                    "PUT",
                    "--data-binary",
                    &format!("body of {object}"),
                    &url,
                ],
            ),
            "HEAD" => common::curl(&self.dir, &["-I", &url]),
            _ => common::curl(&self.dir, &["-X", method, &url]),
        }
    }

    fn status(&self, method: &str, bucket: &str, object: &str) -> u16 {
        self.call(method, bucket, object).status
    }

    /// Every key and common prefix of a v2 listing, page by page, in the order returned.
    fn list(&self, bucket: &str, prefix: &str, delimiter: &str, max: usize) -> Vec<String> {
        let max = max.to_string();
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..1000 {
            let mut query = vec![("list-type", "2"), ("max-keys", max.as_str())];
            query.push(("prefix", prefix));
            if !delimiter.is_empty() {
                query.push(("delimiter", delimiter));
            }
            if let Some(t) = &token {
                query.push(("continuation-token", t.as_str()));
            }
            let answer = common::curl(&self.dir, &[&self.url("GET", bucket, "", &query)]);
            let text = String::from_utf8(answer.body).unwrap();
            assert_eq!(answer.status, 200, "{text}");
            out.extend(between(&text, "<Key>", "</Key>"));
            out.extend(between(&text, "<CommonPrefixes><Prefix>", "</Prefix>"));
            match between(&text, "<NextContinuationToken>", "</NextContinuationToken>").pop() {
                Some(next) => token = Some(next),
                None => return out,
            }
        }
        panic!("a listing did not end in 1000 pages");
    }

    /// The same with ListObjects v1, resuming as boto3 does: from `NextMarker`, else from the
    /// page's last key.
    fn list_v1(&self, bucket: &str, prefix: &str, delimiter: &str, max: usize) -> Vec<String> {
        let max = max.to_string();
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        for _ in 0..1000 {
            let mut query = vec![("max-keys", max.as_str()), ("prefix", prefix)];
            if !delimiter.is_empty() {
                query.push(("delimiter", delimiter));
            }
            if let Some(m) = &marker {
                query.push(("marker", m.as_str()));
            }
            let answer = common::curl(&self.dir, &[&self.url("GET", bucket, "", &query)]);
            let text = String::from_utf8(answer.body).unwrap();
            assert_eq!(answer.status, 200, "{text}");
            let keys = between(&text, "<Key>", "</Key>");
            out.extend(keys.iter().cloned());
            out.extend(between(&text, "<CommonPrefixes><Prefix>", "</Prefix>"));
            if !text.contains("<IsTruncated>true</IsTruncated>") {
                return out;
            }
            let next = between(&text, "<NextMarker>", "</NextMarker>").pop();
            marker = Some(
                next.or_else(|| keys.last().cloned())
                    .expect("a marker to go on"),
            );
        }
        panic!("a v1 listing did not end in 1000 pages");
    }
}

fn between(text: &str, open: &str, close: &str) -> Vec<String> {
    text.split(open)
        .skip(1)
        .map(|rest| rest.split(close).next().unwrap().to_owned())
        .collect()
}

fn at_once<T: Send + 'static>(n: usize, f: impl Fn(usize) -> T + Send + Sync + 'static) -> Vec<T> {
    let f = Arc::new(f);
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let f = f.clone();
            std::thread::spawn(move || f(i))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// The 120 names: three prefixes, some nested.
fn name(i: usize) -> String {
    match i % 3 {
        0 => format!("a/{i:03}"),
        1 => format!("b/{}/{i:03}", i % 4),
        _ => format!("c{i:03}"),
    }
}

const NAMES: usize = 120;

fn start() -> (Cluster, Arc<Signer>) {
    start_with("")
}

/// `start`, with more `[s3]` settings.
fn start_with(s3_extra: &str) -> (Cluster, Arc<Signer>) {
    start_with_leaves(4, s3_extra)
}

/// `start_with`, with leaves of `leaf_entries` names.
fn start_with_leaves(leaf_entries: usize, s3_extra: &str) -> (Cluster, Arc<Signer>) {
    let s3 = common::free_addresses(1)[0];
    let extra = format!("[s3]\nlisten = \"{s3}\"\nindex_leaf_entries = {leaf_entries}\n{s3_extra}");
    let cluster = Cluster::start_with(3, 4, &extra);
    common::wait_for_port(s3);
    let signer = Signer {
        urls: common::Presigner::new(&cluster, s3, &["*:owner"]),
        dir: cluster.dir.path().to_path_buf(),
    };
    (cluster, Arc::new(signer))
}

/// Puts the 120 names into `bucket` from 8 threads; every one must land.
fn fill(signer: &Arc<Signer>, bucket: &'static str) {
    let s = signer.clone();
    let statuses = at_once(8, move |t| {
        (t..NAMES)
            .step_by(8)
            .map(|i| s.call("PUT", bucket, &name(i)))
            .filter(|answer| answer.status != 200)
            .map(|answer| {
                format!(
                    "{} {}",
                    answer.status,
                    String::from_utf8_lossy(&answer.body)
                )
            })
            .collect::<Vec<_>>()
    });
    let failed: Vec<String> = statuses.into_iter().flatten().collect();
    assert!(failed.is_empty(), "{failed:?}");
}

/// PutBucketTagging with `tags` (XML through curl): the status.
fn tag_bucket(signer: &Signer, bucket: &str, tags: &[(&str, &str)]) -> u16 {
    let set: String = tags
        .iter()
        .map(|(k, v)| format!("<Tag><Key>{k}</Key><Value>{v}</Value></Tag>"))
        .collect();
    let xml = format!("<Tagging><TagSet>{set}</TagSet></Tagging>");
    let url = signer.url("PUT", bucket, "", &[("tagging", "")]);
    common::curl(&signer.dir, &["-X", "PUT", "--data-binary", &xml, &url]).status
}

/// GetBucketTagging: the status and the body.
fn bucket_tags(signer: &Signer, bucket: &str) -> (u16, String) {
    let url = signer.url("GET", bucket, "", &[("tagging", "")]);
    let answer = common::curl(&signer.dir, &[&url]);
    (answer.status, String::from_utf8(answer.body).unwrap())
}

#[test]
fn a_split_index_lists_reads_and_deletes_like_one_record() {
    let (cluster, signer) = start();
    assert_eq!(signer.status("PUT", "big", ""), 200);
    // The bucket's tags live in its root, which every write rewrites until it splits.
    assert_eq!(tag_bucket(&signer, "big", &[("team", "storage")]), 200);
    fill(&signer, "big");
    let root = record(&cluster, "larder-s3:bucket:big").expect("a root");
    assert!(root["leaves"].as_object().is_some_and(|l| l.len() > 1));
    assert_eq!(root["tags"]["team"], "storage", "{root}");
    let (status, tags) = bucket_tags(&signer, "big");
    assert_eq!(status, 200, "{tags}");
    assert!(
        tags.contains("<Key>team</Key><Value>storage</Value>"),
        "{tags}"
    );

    // Listings across leaves: whole, in small pages, by prefix, folded by a delimiter.
    let all: Vec<String> = (0..NAMES)
        .map(name)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(signer.list("big", "", "", 1000), all);
    assert_eq!(
        signer.list("big", "", "", 7),
        all,
        "pages of 7 add up to the whole"
    );
    let b: Vec<String> = all
        .iter()
        .filter(|n| n.starts_with("b/"))
        .cloned()
        .collect();
    assert_eq!(signer.list("big", "b/", "", 3), b);
    let folded = signer.list("big", "", "/", 2);
    let mut expected: Vec<String> = vec!["a/".into(), "b/".into()];
    expected.extend(all.iter().filter(|n| n.starts_with('c')).cloned());
    let mut got = folded.clone();
    got.sort();
    expected.sort();
    assert_eq!(got, expected, "common prefixes span leaves once each");
    let b_folded = signer.list("big", "b/", "/", 1);
    assert_eq!(b_folded, ["b/0/", "b/1/", "b/2/", "b/3/"]);
    // ListObjects v1 pages from markers to the same listings.
    assert_eq!(signer.list_v1("big", "", "", 7), all);
    assert_eq!(signer.list_v1("big", "", "/", 2), folded);
    assert_eq!(signer.list_v1("big", "b/", "/", 1), b_folded);

    // Every name reads back, wherever its leaf is.
    for i in (0..NAMES).step_by(7) {
        let got = signer.call("GET", "big", &name(i));
        assert_eq!(got.status, 200);
        assert_eq!(got.body, format!("body of {}", name(i)).into_bytes());
    }
    assert_eq!(signer.status("GET", "big", "a/999"), 404);

    // Not empty: refused, and every leaf stays writable after the cancelled delete.
    assert_eq!(signer.status("DELETE", "big", ""), 409);
    assert_eq!(signer.status("PUT", "big", "a/000"), 200);
    assert_eq!(signer.status("PUT", "big", "zz-after"), 200);
    assert_eq!(signer.list("big", "", "", 1000).len(), NAMES + 1);

    // Emptied from 8 threads (names in every leaf), then deleted; made again, it is empty.
    let s = signer.clone();
    let statuses = at_once(8, move |t| {
        (t..NAMES)
            .step_by(8)
            .map(|i| s.status("DELETE", "big", &name(i)))
            .collect::<Vec<_>>()
    });
    assert!(statuses.into_iter().flatten().all(|s| s == 204));
    assert_eq!(signer.status("DELETE", "big", "zz-after"), 204);
    assert!(
        signer.list("big", "", "", 5).is_empty(),
        "a page over empty leaves"
    );
    assert!(signer.list_v1("big", "", "/", 5).is_empty());
    assert_eq!(signer.status("DELETE", "big", ""), 204);
    assert_eq!(signer.status("HEAD", "big", ""), 404);
    assert_eq!(signer.status("GET", "big", &name(0)), 404);
    assert_eq!(signer.status("PUT", "big", ""), 200);
    assert!(signer.list("big", "", "", 1000).is_empty());
    let (status, tags) = bucket_tags(&signer, "big");
    assert_eq!(status, 404, "a bucket made again has no tags: {tags}");
    assert!(tags.contains("NoSuchTagSet"), "{tags}");
    assert_eq!(signer.status("GET", "big", &name(0)), 404);
    assert_eq!(signer.status("PUT", "big", "again"), 200);
    assert_eq!(signer.list("big", "", "", 1000), ["again"]);
}

#[test]
fn delete_bucket_of_a_split_bucket_races_puts_linearizably() {
    let (_cluster, signer) = start();
    for round in 0..3 {
        assert_eq!(signer.status("PUT", "race", ""), 200, "round {round}");
        fill(&signer, "race");
        for i in 0..NAMES {
            assert_eq!(signer.status("DELETE", "race", &name(i)), 204);
        }
        // Empty but split; now a delete and puts spread over its run (round 0), in its
        // middle (1), after it (2).
        let s = signer.clone();
        let statuses = at_once(9, move |t| match t {
            0 => s.status("DELETE", "race", ""),
            _ => {
                let delay = [15 * t as u64, 40 + 5 * t as u64, 600][round];
                std::thread::sleep(Duration::from_millis(delay));
                s.status("PUT", "race", &format!("new/{round}/{t}"))
            }
        });
        let deleted = statuses[0];
        eprintln!(
            "round {round}: DeleteBucket {deleted}, PUTs {:?}",
            &statuses[1..]
        );
        let landed: BTreeSet<String> = (1..9)
            .filter(|t| statuses[*t] == 200)
            .map(|t| format!("new/{round}/{t}"))
            .collect();
        match deleted {
            204 => {
                assert!(
                    landed.is_empty(),
                    "a PUT landed in a deleted bucket: {statuses:?}"
                );
                assert!(statuses[1..].iter().all(|s| *s == 404), "{statuses:?}");
            }
            409 => {
                assert!(
                    !landed.is_empty(),
                    "a refused delete saw a name: {statuses:?}"
                );
                let listed: BTreeSet<String> =
                    signer.list("race", "", "", 1000).into_iter().collect();
                assert_eq!(listed, landed, "{statuses:?}");
                for name in &landed {
                    assert_eq!(signer.status("DELETE", "race", name), 204);
                }
                assert_eq!(signer.status("DELETE", "race", ""), 204);
            }
            other => panic!("DeleteBucket answered {other}: {statuses:?}"),
        }
    }
}

/// Two writers racing the merges in `bucket`: each PUTs `rounds` names of its own
/// (`name(writer, round)`), reads each back at once, and deletes those of even rounds again.
/// What each saw wrong (every answer must be as if no merge were under way).
fn race_merges(
    signer: &Arc<Signer>,
    bucket: &'static str,
    rounds: usize,
    name: fn(usize, usize) -> String,
) -> Vec<Vec<String>> {
    let s = signer.clone();
    at_once(2, move |t| {
        let mut wrong = Vec::new();
        for round in 0..rounds {
            let key = name(t, round);
            let put = s.call("PUT", bucket, &key);
            let got = s.call("GET", bucket, &key);
            let body = format!("body of {key}").into_bytes();
            if put.status != 200 || got.status != 200 || got.body != body {
                let why = String::from_utf8_lossy(&put.body).into_owned();
                wrong.push(format!(
                    "{key}: PUT {} GET {} {why}",
                    put.status, got.status
                ));
            }
            if round % 2 == 0 && s.status("DELETE", bucket, &key) != 204 {
                wrong.push(format!("{key}: DELETE"));
            }
        }
        wrong
    })
}

/// The frontend's count of index leaves merged.
fn merged(cluster: &Cluster) -> u64 {
    metric(cluster, "larder_frontend_s3_index_leaves_merged_total")
}

/// The frontend's counter `name`.
fn metric(cluster: &Cluster, name: &str) -> u64 {
    let got = common::curl(cluster.dir.path(), &[&cluster.url("/metrics")]);
    let text = String::from_utf8(got.body).unwrap();
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// One ListObjectsV2 page of up to 1,000 keys: its keys, and whether it was truncated.
fn one_page(signer: &Signer, bucket: &str) -> (Vec<String>, bool) {
    let query = [("list-type", "2"), ("max-keys", "1000")];
    let answer = common::curl(&signer.dir, &[&signer.url("GET", bucket, "", &query)]);
    let text = String::from_utf8(answer.body).unwrap();
    assert_eq!(answer.status, 200, "{text}");
    let truncated = text.contains("<IsTruncated>true</IsTruncated>");
    (between(&text, "<Key>", "</Key>"), truncated)
}

#[test]
fn leaves_emptied_by_deletes_are_merged_while_writes_race_them() {
    let (cluster, signer) = start();
    let many = |i: usize| format!("m/{i:04}");
    const MANY: usize = 400;
    assert_eq!(signer.status("PUT", "merge", ""), 200);
    let s = signer.clone();
    let put = at_once(8, move |t| {
        (t..MANY)
            .step_by(8)
            .all(|i| s.status("PUT", "merge", &many(i)) == 200)
    });
    assert!(put.into_iter().all(|ok| ok));
    let before = merged(&cluster);
    let root = record(&cluster, "larder-s3:bucket:merge").unwrap();
    let created_ms = root["created_ms"].as_u64().unwrap();
    let leaf_ids: Vec<String> = leaves(&cluster, "merge")
        .into_iter()
        .map(|(id, _)| id)
        .collect();

    // Every name but the first and last ten goes (well over 64 leaves' worth at 4 names a
    // leaf), while other threads write and delete names inside that range.
    let kept: BTreeSet<usize> = (0..10).chain(MANY - 10..MANY).collect();
    let s = signer.clone();
    let gone = kept.clone();
    let deletes = std::thread::spawn(move || {
        let s2 = s.clone();
        let gone2 = gone.clone();
        at_once(6, move |t| {
            (t..MANY)
                .step_by(6)
                .filter(|i| !gone2.contains(i))
                .all(|i| s2.status("DELETE", "merge", &many(i)) == 204)
        })
        .into_iter()
        .all(|ok| ok)
    });
    // Racing them: names of their own in the emptied range, each PUT then read back at once,
    // then deleted again (each must answer as if no merge were under way).
    let racer =
        |t: usize, round: usize| format!("m/{:04}x{t}", 20 + (round * 37 + t * 101) % (MANY - 40));
    let racing = race_merges(&signer, "merge", 40, racer);
    assert!(deletes.join().unwrap(), "every DELETE answered 204");
    let wrong: Vec<String> = racing.into_iter().flatten().collect();
    assert!(wrong.is_empty(), "{wrong:?}");

    // What is left: the kept names and the racers' odd rounds. Merges follow the deletes
    // (and listings merge the empty leaves they walk), until one page holds everything.
    let mut expected: BTreeSet<String> = kept.iter().map(|&i| many(i)).collect();
    expected.extend((0..2).flat_map(|t| (1..40).step_by(2).map(move |r| racer(t, r))));
    let expected: Vec<String> = expected.into_iter().collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (keys, truncated) = one_page(&signer, "merge");
        if !truncated {
            assert_eq!(keys, expected, "one page lists every name left");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a listing still walks empty leaves: {} keys, truncated",
            keys.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(signer.list("merge", "", "", 3), expected, "small pages too");
    assert!(
        merged(&cluster) - before >= 40,
        "most emptied leaves were merged: {} of them",
        merged(&cluster) - before
    );

    // The merged ranges take names again, read and list them, and the bucket empties and
    // goes as any other.
    for i in (10..MANY - 10).step_by(50) {
        assert_eq!(signer.status("PUT", "merge", &many(i)), 200);
        assert_eq!(signer.call("GET", "merge", &many(i)).status, 200);
    }
    let listed = signer.list("merge", "", "", 1000);
    assert_eq!(
        listed.len(),
        expected.len() + (10..MANY - 10).step_by(50).count()
    );
    for key in listed {
        assert_eq!(signer.status("DELETE", "merge", &key), 204);
    }
    assert_eq!(signer.status("DELETE", "merge", ""), 204);
    assert_eq!(signer.status("HEAD", "merge", ""), 404);
    // Every leaf went with the bucket, the merged ones' stubs too (their grace, 24 h by
    // default, long from over), and the list of them.
    let left: Vec<&String> = leaf_ids
        .iter()
        .filter(|id| record(&cluster, &leaf_doc("merge", id)).is_some())
        .collect();
    assert!(
        left.is_empty(),
        "leaves of the deleted bucket stay: {left:?}"
    );
    let list = format!("larder-s3:merged:merge:{created_ms}");
    assert!(record(&cluster, &list).is_none(), "{list} stays");
}

/// The stubs merged leaves leave are removed by the sweep once `[s3] merged_leaf_grace` is
/// over, and the names around them read and list as before.
#[test]
fn stubs_of_merged_leaves_go_after_their_grace() {
    let (cluster, signer) = start_with("merged_leaf_grace = \"8s\"\nsweep_interval = \"1s\"\n");
    let names = bucket_of(&signer, "stubs", 40);
    let created_ms = record(&cluster, "larder-s3:bucket:stubs").unwrap()["created_ms"]
        .as_u64()
        .unwrap();
    let list = format!("larder-s3:merged:stubs:{created_ms}");
    let before: Vec<String> = leaves(&cluster, "stubs")
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let unlinked_records = |cluster: &Cluster| -> Vec<String> {
        let linked: BTreeSet<String> = leaves(cluster, "stubs")
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        (before.iter())
            .filter(|id| !linked.contains(*id))
            .filter(|id| record(cluster, &leaf_doc("stubs", id)).is_some())
            .cloned()
            .collect()
    };
    // Within their grace the merged leaves' records stay, listed.
    for name in &names[4..20] {
        assert_eq!(signer.status("DELETE", "stubs", name), 204);
    }
    let started = std::time::Instant::now();
    let stubs = loop {
        let stubs = unlinked_records(&cluster);
        if !stubs.is_empty() || started.elapsed() > Duration::from_secs(3) {
            break stubs;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!stubs.is_empty(), "no stub within its grace");
    // Two sweeps later, still well within the grace, they are there.
    std::thread::sleep(Duration::from_secs(2));
    let gone: Vec<&String> = (stubs.iter())
        .filter(|id| record(&cluster, &leaf_doc("stubs", id)).is_none())
        .collect();
    assert!(
        gone.is_empty(),
        "stubs removed within their grace: {gone:?}"
    );
    let listed = record(&cluster, &list).expect("a list of merged leaves");
    let listed: Vec<&str> = (listed["leaves"].as_array().unwrap().iter())
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    assert!(
        stubs.iter().all(|id| listed.contains(&id.as_str())),
        "{stubs:?} listed in {listed:?}"
    );
    for name in &names[20..36] {
        assert_eq!(signer.status("DELETE", "stubs", name), 204);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let removed = loop {
        let linked: BTreeSet<String> = leaves(&cluster, "stubs")
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        let stubs: Vec<&String> = before
            .iter()
            .filter(|id| !linked.contains(*id))
            .filter(|id| record(&cluster, &leaf_doc("stubs", id)).is_some())
            .collect();
        if stubs.is_empty() && linked.len() + 4 <= before.len() {
            break before.len() - linked.len();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "merged leaves' records stay past their grace: {stubs:?} of {} leaves, {} linked",
            before.len(),
            linked.len()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let counted = metric(&cluster, "larder_frontend_s3_index_stubs_removed_total");
    assert!(
        counted >= removed as u64,
        "{counted} counted, {removed} gone"
    );
    // Each taken off the list once removed: the emptied list goes.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while record(&cluster, &list).is_some() {
        assert!(std::time::Instant::now() < deadline, "{list} stays");
        std::thread::sleep(Duration::from_millis(250));
    }
    let expected: Vec<String> = names[..4].iter().chain(&names[36..]).cloned().collect();
    assert_eq!(signer.list("stubs", "", "", 1000), expected);
    assert_eq!(signer.list("stubs", "", "", 3), expected, "small pages too");
    for name in &names {
        let want = if expected.contains(name) { 200 } else { 404 };
        assert_eq!(signer.status("GET", "stubs", name), want, "{name}");
    }
    // The removed leaves' ranges take names again.
    for name in &names[10..12] {
        assert_eq!(signer.status("PUT", "stubs", name), 200);
        assert_eq!(signer.call("GET", "stubs", name).status, 200);
    }
}

/// Record `doc` of the S3 layer as the first storage node holding it has it.
fn record(cluster: &Cluster, doc: &str) -> Option<serde_json::Value> {
    cluster.doc_copies(doc).into_iter().next()
}

/// Makes `bucket` with `n` names `n/00`, `n/01`, ... (in order, one by one): the names.
fn bucket_of(signer: &Signer, bucket: &str, n: usize) -> Vec<String> {
    assert_eq!(signer.status("PUT", bucket, ""), 200);
    let names: Vec<String> = (0..n).map(|i| format!("n/{i:02}")).collect();
    for name in &names {
        assert_eq!(signer.status("PUT", bucket, name), 200);
    }
    names
}

/// `bucket`'s leaves (ID and record), walked from its first leaf by `right` links.
fn leaves(cluster: &Cluster, bucket: &str) -> Vec<(String, serde_json::Value)> {
    let root = record(cluster, &format!("larder-s3:bucket:{bucket}")).expect("a root");
    let mut next = root["leaves"][""].as_str().map(str::to_owned);
    let mut leaves = Vec::new();
    while let Some(id) = next {
        let leaf = record(cluster, &leaf_doc(bucket, &id)).expect("a leaf");
        next = leaf["right"].as_str().map(str::to_owned);
        leaves.push((id, leaf));
    }
    leaves
}

fn leaf_doc(bucket: &str, id: &str) -> String {
    format!("larder-s3:leaf:{bucket}:{id}")
}

/// The blob of each name in `bucket`'s leaves.
fn blobs_by_name(cluster: &Cluster, bucket: &str) -> BTreeMap<String, String> {
    let mut blobs = BTreeMap::new();
    for (_, leaf) in leaves(cluster, bucket) {
        assert!(leaf["base"].is_null(), "leaves this small have no base");
        for (name, entry) in leaf["objects"].as_object().unwrap() {
            let blob = entry["body"][0]["blob"].as_str().unwrap();
            blobs.insert(name.clone(), blob.to_owned());
        }
    }
    blobs
}

/// The blobs of names whose leaves were merged away go as any deleted name's: a merge hands
/// a leaf's list of blobs held through their grace period to the leaf on its left, and the
/// sweep tombstones them from there.
#[test]
fn blobs_of_names_deleted_from_merged_leaves_are_tombstoned_after_the_grace() {
    // A grace long enough that the merges come first, so the blobs are swept from the left
    // leaves' lists; the merged leaves' stubs go before that.
    let (cluster, signer) = start_with(
        "replaced_blob_grace = \"3s\"\nsweep_interval = \"1s\"\nmerged_leaf_grace = \"1s\"\n",
    );
    let names = bucket_of(&signer, "swept", 48);
    let blobs = blobs_by_name(&cluster, "swept");
    assert_eq!(blobs.len(), names.len(), "every name in a leaf: {blobs:?}");
    let before = merged(&cluster);
    let deleted = &names[4..44];
    for name in deleted {
        assert_eq!(signer.status("DELETE", "swept", name), 204);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let live = |cluster: &Cluster| -> Vec<&str> {
        deleted
            .iter()
            .map(|name| blobs[name].as_str())
            .filter(|blob| {
                let url = cluster.url(&format!("/v1/blobs/{blob}"));
                common::curl(cluster.dir.path(), &[&url]).status != 410
            })
            .collect()
    };
    loop {
        let left = live(&cluster);
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "blobs of deleted names still live after 60 s: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        merged(&cluster) - before >= 5,
        "the emptied leaves were merged: {}",
        merged(&cluster) - before
    );
    // The names kept are read as they were.
    for name in names[..4].iter().chain(&names[44..]) {
        let got = signer.call("GET", "swept", name);
        assert_eq!(got.status, 200, "{name}");
        assert_eq!(got.body, format!("body of {name}").into_bytes());
    }
    let expected: Vec<String> = names[..4].iter().chain(&names[44..]).cloned().collect();
    assert_eq!(signer.list("swept", "", "", 1000), expected);
}

/// Leaves thinned by deletes (at most a quarter of `index_leaf_entries` names left) are merged
/// into the leaf on their left when both fit in one, which takes their names: afterwards the
/// index holds every name left exactly once, each reads and lists as before, and no linked
/// leaf is thin with room on its left, while PUTs, GETs and DELETEs race the merges.
#[test]
fn leaves_thinned_by_deletes_are_merged_with_their_names() {
    const ENTRIES: usize = 8;
    const FEW: usize = ENTRIES / 4;
    const MANY: usize = 192;
    let (cluster, signer) = start_with_leaves(ENTRIES, "");
    let many = |i: usize| format!("t/{i:03}");
    assert_eq!(signer.status("PUT", "thin", ""), 200);
    let s = signer.clone();
    let put = at_once(8, move |t| {
        (t..MANY)
            .step_by(8)
            .all(|i| s.status("PUT", "thin", &many(i)) == 200)
    });
    assert!(put.into_iter().all(|ok| ok));
    let before = merged(&cluster);
    let leaf_ids: Vec<String> = leaves(&cluster, "thin")
        .into_iter()
        .map(|(id, _)| id)
        .collect();

    // One name in eight stays: every leaf is left with one or two, or none.
    let kept: BTreeSet<usize> = (0..MANY).step_by(8).collect();
    let gone = kept.clone();
    let s = signer.clone();
    let deletes = std::thread::spawn(move || {
        at_once(6, move |t| {
            (t..MANY)
                .step_by(6)
                .filter(|i| !gone.contains(i))
                .all(|i| s.status("DELETE", "thin", &many(i)) == 204)
        })
        .into_iter()
        .all(|ok| ok)
    });
    let racer = |t: usize, round: usize| format!("t/{:03}y{t}", (round * 37 + t * 101) % MANY);
    let racing = race_merges(&signer, "thin", 20, racer);
    assert!(deletes.join().unwrap(), "every DELETE answered 204");
    let wrong: Vec<String> = racing.into_iter().flatten().collect();
    assert!(wrong.is_empty(), "{wrong:?}");

    let mut expected: BTreeSet<String> = kept.iter().map(|&i| many(i)).collect();
    expected.extend((0..2).flat_map(|t| (1..20).step_by(2).map(move |r| racer(t, r))));
    let expected: Vec<String> = expected.into_iter().collect();
    // Listings merge the thin leaves they walk, until none is left that fits on its left.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let linked = loop {
        let (keys, truncated) = one_page(&signer, "thin");
        assert!(!truncated);
        assert_eq!(keys, expected, "one page lists every name left");
        let linked = leaves(&cluster, "thin");
        let counts: Vec<usize> = (linked.iter())
            .map(|(_, leaf)| {
                assert!(leaf["base"].is_null(), "leaves this small have no base");
                leaf["objects"].as_object().unwrap().len()
            })
            .collect();
        let thin_with_room = counts
            .windows(2)
            .any(|pair| pair[1] <= FEW && pair[0] + pair[1] <= ENTRIES);
        if !thin_with_room {
            break linked;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "thin leaves with room on their left stay: {counts:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // The linked leaves hold each name left once: those of the merged leaves moved, none lost
    // and none twice.
    let mut held: Vec<String> = (linked.iter())
        .flat_map(|(_, leaf)| leaf["objects"].as_object().unwrap().keys().cloned())
        .collect();
    held.sort();
    assert_eq!(held, expected);
    let merges = merged(&cluster) - before;
    assert!(
        (linked.len() as u64) < leaf_ids.len() as u64 && merges >= 10,
        "{merges} merges, {} leaves of {}",
        linked.len(),
        leaf_ids.len()
    );
    // Some merged leaf held names (format 5); its stub keeps them, unread.
    let linked_ids: BTreeSet<&String> = linked.iter().map(|(id, _)| id).collect();
    let with_names = (leaf_ids.iter())
        .filter(|id| !linked_ids.contains(id))
        .filter_map(|id| record(&cluster, &leaf_doc("thin", id)))
        .filter(|stub| stub["v"] == 5 && stub["merging"]["names"] == true)
        .count();
    assert!(with_names > 0, "no leaf was merged with its names");
    for name in &expected {
        let got = signer.call("GET", "thin", name);
        assert_eq!(got.status, 200, "{name}");
        assert_eq!(got.body, format!("body of {name}").into_bytes());
    }
    for i in (1..MANY).step_by(16) {
        assert_eq!(signer.status("GET", "thin", &many(i)), 404, "{}", many(i));
    }
    assert_eq!(signer.list("thin", "", "", 3), expected, "small pages too");
    assert_eq!(
        signer.list("thin", "t/0", "", 1000).len(),
        (0..100).step_by(8).count()
            + expected
                .iter()
                .filter(|k| k.starts_with("t/0") && k.contains('y'))
                .count()
    );

    // The bucket empties and goes as any other, the merged leaves' records with it.
    for key in &expected {
        assert_eq!(signer.status("DELETE", "thin", key), 204);
    }
    assert_eq!(signer.status("DELETE", "thin", ""), 204);
    let left: Vec<&String> = (leaf_ids.iter())
        .filter(|id| record(&cluster, &leaf_doc("thin", id)).is_some())
        .collect();
    assert!(
        left.is_empty(),
        "leaves of the deleted bucket stay: {left:?}"
    );
}

/// A leaf split by size (its entries past 1 MiB, whatever their count) leaves halves of few
/// names that would fit beside each other by count; they are not merged back (which would
/// only split again, over and over, leaving a stub each time).
#[test]
fn a_leaf_split_by_size_is_not_merged_back() {
    let (cluster, signer) = start_with_leaves(2000, "index_merge_entries = 1000\n");
    const MANY: usize = 950;
    // ~1.2 KB an entry: past the 1 MiB a record splits at, far under 2,000 names.
    let long = |i: usize| format!("{i:04}-{}", "x".repeat(1000));
    assert_eq!(signer.status("PUT", "big", ""), 200);
    let s = signer.clone();
    let put = at_once(8, move |t| {
        (t..MANY)
            .step_by(8)
            .all(|i| s.status("PUT", "big", &long(i)) == 200)
    });
    assert!(put.into_iter().all(|ok| ok));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let split = loop {
        let root = record(&cluster, "larder-s3:bucket:big").unwrap();
        if root["leaves"].is_object() {
            let linked = leaves(&cluster, "big");
            if linked.len() >= 2 {
                break linked.len();
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the bucket never split by size"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // Listings walk halves of few names each (at most `index_merge_entries`).
    let before = merged(&cluster);
    for _ in 0..3 {
        let (keys, _) = one_page(&signer, "big");
        assert!(!keys.is_empty());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        merged(&cluster),
        before,
        "a leaf split by size was merged back"
    );
    assert_eq!(leaves(&cluster, "big").len(), split);
    assert_eq!(signer.list("big", "", "", 1000).len(), MANY);
}
