//! `vespa visit` (Vespa's own command-line tool, Go; PyPI `vespacli`) against a real cluster:
//! the whole corpus across many pages (continuations), a selection, slices that split the
//! corpus between independent visitors, and field sets.
//!
//! Skipped when the tool is not installed, unless `LARDER_REQUIRE_INTEROP=1` (see
//! `common::vespa_cli`).

mod common;

use std::collections::BTreeSet;

use common::vespa_cli::VespaCli;
use common::Cluster;
use serde_json::{json, Value};

const DOCUMENTS: usize = 400;

/// The documents `vespa visit` printed (one JSON object per line).
fn printed(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn ids(docs: &[Value]) -> Vec<String> {
    docs.iter()
        .map(|d| d["id"].as_str().expect("a document has an id").to_owned())
        .collect()
}

fn expected(filter: impl Fn(usize) -> bool) -> BTreeSet<String> {
    (0..DOCUMENTS)
        .filter(|i| filter(*i))
        .map(|i| format!("id:music:song::{i}"))
        .collect()
}

fn as_set(ids: &[String]) -> BTreeSet<String> {
    let set: BTreeSet<String> = ids.iter().cloned().collect();
    assert_eq!(set.len(), ids.len(), "a document was printed twice");
    set
}

#[test]
fn vespa_visit_with_pages_selection_slices_and_field_sets() {
    let cluster = Cluster::start_with(3, 8, "");
    let Some(vespa) = VespaCli::new(&cluster) else {
        return;
    };
    let feed: Vec<String> = (0..DOCUMENTS)
        .map(|i| {
            json!({"put": format!("id:music:song::{i}"), "fields": {"n": i, "odd": i % 2 == 1}})
                .to_string()
        })
        .collect();
    let file = cluster.path("feed.jsonl");
    std::fs::write(&file, feed.join("\n")).unwrap();
    vespa.run_ok(&["feed", &file]);

    // Many pages of 37: every continuation carried by the tool itself.
    let all = printed(&vespa.run_ok(&["visit", "--chunk-count", "37"]));
    assert_eq!(as_set(&ids(&all)), expected(|_| true));
    assert!(
        all.iter().all(|d| d["fields"]["n"].is_number()),
        "{:?}",
        all.first()
    );

    let selected =
        printed(&vespa.run_ok(&["visit", "--selection", "song.n < 100 and song.odd == true"]));
    assert_eq!(as_set(&ids(&selected)), expected(|i| i < 100 && i % 2 == 1));

    let mut union = BTreeSet::new();
    for slice in 0..3 {
        let slice = slice.to_string();
        let part = printed(&vespa.run_ok(&[
            "visit",
            "--slices",
            "3",
            "--slice-id",
            &slice,
            "--chunk-count",
            "50",
        ]));
        for id in ids(&part) {
            assert!(union.insert(id), "slices overlap");
        }
    }
    assert_eq!(union, expected(|_| true));

    let named = printed(&vespa.run_ok(&["visit", "--field-set", "song:n"]));
    assert_eq!(named.len(), DOCUMENTS);
    assert!(named.iter().all(|d| d["fields"]
        .as_object()
        .is_some_and(|f| f.len() == 1 && f.contains_key("n"))));
    let only_ids = printed(&vespa.run_ok(&["visit", "--field-set", "[id]"]));
    assert_eq!(as_set(&ids(&only_ids)), expected(|_| true));
    assert!(only_ids.iter().all(|d| d
        .get("fields")
        .is_none_or(|f| f.as_object().is_some_and(|f| f.is_empty()))));

    // A selection the language refuses is the tool's error, with the server's message.
    let bad = vespa.run(&["visit", "--selection", "song.n <"]);
    assert!(!bad.status.success());
}
