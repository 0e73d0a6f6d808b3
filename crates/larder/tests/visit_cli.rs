//! `larder visit` against a real cluster: 3,000 documents fed with `larder feed`, then visited
//! with 1, 4 and 16 slices, streamed and not, and by 3 processes of one `--slice-id` each:
//! every document exactly once, as stored. A
//! selection and a field set narrow the output; a bad selection fails with the server's byte
//! position and exit status 1. Also `vespa visit` (Vespa's CLI) over the same documents.

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Output};

use common::vespa_cli::VespaCli;
use common::{Cluster, LARDER};
use serde_json::{json, Value};

const DOCUMENTS: usize = 3_000;

fn larder(args: &[&str]) -> Output {
    Command::new(LARDER).args(args).output().unwrap()
}

fn fed_cluster() -> Cluster {
    let cluster = Cluster::start(3, 8);
    let feed: Vec<String> = (0..DOCUMENTS)
        .map(|i| {
            let id = format!("id:music:song::{i}");
            json!({"put": id, "fields": {"n": i, "title": format!("song {i}")}}).to_string()
        })
        .collect();
    let file = cluster.path("feed.jsonl");
    std::fs::write(&file, feed.join("\n")).unwrap();
    let out = larder(&["feed", "--endpoint", &cluster.url("/"), "--file", &file]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cluster
}

/// Visits with `args`; every line of the output by document ID, and how often each came.
fn visit(cluster: &Cluster, args: &[&str]) -> BTreeMap<String, (Value, usize)> {
    let output = cluster.path("visit.jsonl");
    let endpoint = cluster.url("/");
    let mut all = vec!["visit", "--endpoint", &endpoint, "--output", &output];
    all.extend(args);
    let out = larder(&all);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "larder visit {args:?}: {stderr}");
    assert!(stderr.contains("visited"), "a summary: {stderr}");
    let mut seen: BTreeMap<String, (Value, usize)> = BTreeMap::new();
    for line in std::fs::read_to_string(&output).unwrap().lines() {
        let doc: Value = serde_json::from_str(line).unwrap();
        let id = doc["id"].as_str().unwrap().to_owned();
        seen.entry(id).or_insert((doc["fields"].clone(), 0)).1 += 1;
    }
    seen
}

fn check_every_document_once(seen: &BTreeMap<String, (Value, usize)>, what: &str) {
    assert_eq!(seen.len(), DOCUMENTS, "{what}: every document");
    for (id, (fields, count)) in seen {
        assert_eq!(*count, 1, "{what}: {id} exactly once");
        let n: usize = id.rsplit("::").next().unwrap().parse().unwrap();
        assert_eq!(
            fields,
            &json!({"n": n, "title": format!("song {n}")}),
            "{what}: {id}"
        );
    }
}

#[test]
fn sliced_streamed_and_whole_visits_return_every_document_once() {
    let cluster = fed_cluster();
    for slices in ["1", "4", "16"] {
        for stream in ["true", "false"] {
            let seen = visit(&cluster, &["--slices", slices, "--stream", stream]);
            check_every_document_once(&seen, &format!("{slices} slices, stream={stream}"));
        }
    }
    // Small pages: many continuations per slice.
    let seen = visit(
        &cluster,
        &["--slices", "2", "--wanted-document-count", "100"],
    );
    check_every_document_once(&seen, "pages of 100");

    // One slice per process (as on N client machines): together, every document once.
    let mut union: BTreeMap<String, (Value, usize)> = BTreeMap::new();
    for id in ["0", "1", "2"] {
        let slice = visit(&cluster, &["--slices", "3", "--slice-id", id]);
        assert!(slice.len() < DOCUMENTS, "slice {id} is a part, not all");
        for (doc, (fields, count)) in slice {
            union.entry(doc).or_insert((fields, 0)).1 += count;
        }
    }
    check_every_document_once(&union, "3 processes, one slice each");
    let endpoint = cluster.url("/");
    let out = larder(&[
        "visit",
        "--endpoint",
        &endpoint,
        "--slices",
        "3",
        "--slice-id",
        "3",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--slice-id 3 is not below --slices 3"),
        "{stderr}"
    );
}

#[test]
fn selections_field_sets_and_bad_selections() {
    let cluster = fed_cluster();
    let selection = "song.n < 100 and song.title =~ '^song [0-9]+$' and id.namespace == 'music'";
    let seen = visit(
        &cluster,
        &[
            "--selection",
            selection,
            "--field-set",
            "song:title",
            "--slices",
            "3",
        ],
    );
    assert_eq!(seen.len(), 100);
    for (id, (fields, count)) in &seen {
        let n = id.rsplit("::").next().unwrap();
        assert_eq!(
            (fields, *count),
            (&json!({"title": format!("song {n}")}), 1)
        );
    }

    let endpoint = cluster.url("/");
    let out = larder(&["visit", "--endpoint", &endpoint, "--selection", "song.n <"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("400") && stderr.contains("at byte 8"),
        "{stderr}"
    );
}

#[test]
fn vespa_visit_reads_every_document() {
    let cluster = fed_cluster();
    let Some(vespa) = VespaCli::new(&cluster) else {
        return;
    };
    // Vespa's tool visits its cluster's "default" bucket space; Larder has one content cluster.
    let mut ids = BTreeMap::new();
    for slice in ["0", "1"] {
        let args = [
            "visit",
            "--content-cluster",
            "larder",
            "--bucket-space",
            "default",
            "--slices",
            "2",
            "--slice-id",
            slice,
            "--field-set",
            "[id]",
        ];
        for line in vespa.run_ok(&args).lines() {
            let doc: Value = serde_json::from_str(line).unwrap();
            *ids.entry(doc["id"].as_str().unwrap().to_owned())
                .or_insert(0) += 1;
        }
    }
    assert_eq!(ids.len(), DOCUMENTS);
    assert!(ids.values().all(|&count| count == 1));
}
