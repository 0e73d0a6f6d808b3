//! Interop with Vespa's own command-line tool (`vespa`, Go; PyPI `vespacli`) against a real
//! cluster: `vespa status` (and the `-w` wait every command has, both on `/status.html`),
//! `vespa document put/get/update/remove`, and `vespa feed`. Every document it writes reads back
//! identical through curl. `vespa visit` is tested with visiting (it first reads `/`, which
//! answers a handler list here).
//!
//! Skipped when the tool is not installed, unless `LARDER_REQUIRE_INTEROP=1` (see
//! `common::vespa_cli`).

mod common;

use common::vespa_cli::VespaCli;
use common::{json_request, Cluster};
use serde_json::{json, Value};

const DOCS: &str = "[documents]\nmax_document_size = \"64 KiB\"\n";

fn get(cluster: &Cluster, path: &str) -> Option<Value> {
    let r = json_request(cluster, "GET", path, None);
    match r.status {
        200 => Some(r.json()["fields"].clone()),
        404 => None,
        other => panic!("GET {path}: {other} {}", String::from_utf8_lossy(&r.body)),
    }
}

#[test]
fn status_and_waiting_answer_when_the_cluster_is_ready() {
    let cluster = Cluster::start_with(3, 8, DOCS);
    let Some(vespa) = VespaCli::new(&cluster) else {
        return;
    };
    let out = vespa.run(&["status", "-w", "20"]);
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "vespa status: {printed}");
    assert!(printed.contains("is ready"), "{printed}");
    // What `vespa visit` reads before visiting: a document API handler bound to /document/v1/.
    let root = json_request(&cluster, "GET", "/", None);
    assert_eq!(root.status, 200);
    let handlers = root.json()["handlers"].as_array().cloned().unwrap();
    assert!(handlers.iter().any(|h| {
        h["class"]
            .as_str()
            .unwrap()
            .ends_with("DocumentV1ApiHandler")
            && h["serverBindings"].to_string().contains("/document/v1/")
    }));
}

#[test]
fn document_put_get_update_remove() {
    let cluster = Cluster::start_with(3, 8, DOCS);
    let Some(vespa) = VespaCli::new(&cluster) else {
        return;
    };
    let doc = cluster.path("put.json");
    let fields = json!({"title": "Hello", "plays": 1, "tags": ["a", "é"]});
    std::fs::write(&doc, json!({"fields": fields}).to_string()).unwrap();
    // `-w` waits for /status.html before the operation.
    vespa.run_ok(&["document", "put", "id:music:song::a", &doc, "-w", "20"]);
    assert_eq!(
        get(&cluster, "/document/v1/music/song/docid/a"),
        Some(fields)
    );

    // The tool sends a `+` unencoded in the path; Larder, like Vespa, reads it as a space.
    vespa.run_ok(&["document", "put", "id:music:song::b c+d", &doc]);
    assert!(get(&cluster, "/document/v1/music/song/docid/b%20c%20d").is_some());

    let got: Value = serde_json::from_str(&vespa.run_ok(&["document", "get", "id:music:song::a"]))
        .expect("vespa document get prints JSON");
    assert_eq!(got["id"], "id:music:song::a");
    assert_eq!(got["fields"]["title"], "Hello");

    let update = cluster.path("update.json");
    let body = json!({"update": "id:music:song::a",
        "fields": {"plays": {"increment": 2}, "title": {"assign": "Hi"}}});
    std::fs::write(&update, body.to_string()).unwrap();
    vespa.run_ok(&["document", "update", &update]);
    let updated = get(&cluster, "/document/v1/music/song/docid/a").unwrap();
    assert_eq!(
        (updated["plays"].clone(), updated["title"].clone()),
        (json!(3), json!("Hi"))
    );

    vespa.run_ok(&["document", "remove", "id:music:song::a"]);
    assert_eq!(get(&cluster, "/document/v1/music/song/docid/a"), None);
    let missing = vespa.run(&["document", "get", "id:music:song::a"]);
    assert!(!missing.status.success(), "a removed document is not found");
}

#[test]
fn feed_writes_every_document() {
    let cluster = Cluster::start_with(3, 8, DOCS);
    let Some(vespa) = VespaCli::new(&cluster) else {
        return;
    };
    const DOCUMENTS: usize = 500;
    let feed: Vec<String> = (0..DOCUMENTS)
        .map(|i| json!({"put": format!("id:music:song::{i}"), "fields": {"n": i}}).to_string())
        .collect();
    let file = cluster.path("feed.jsonl");
    std::fs::write(&file, feed.join("\n")).unwrap();
    let summary: Value = serde_json::from_str(&vespa.run_ok(&["feed", &file]))
        .expect("vespa feed prints a JSON summary");
    assert_eq!(summary["feeder.ok.count"], DOCUMENTS, "{summary}");
    assert_eq!(summary["feeder.error.count"], 0, "{summary}");
    for i in (0..DOCUMENTS).step_by(37) {
        let fields = get(&cluster, &format!("/document/v1/music/song/docid/{i}"));
        assert_eq!(fields, Some(json!({"n": i})));
    }
}
