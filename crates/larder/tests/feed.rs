//! `larder feed` against a real cluster: per-document order under injected 429/503 answers (the
//! final state of every document must be what the feed's operations on it, in feed order, make),
//! JSON arrays on stdin, per-status outcomes, and malformed input reported with line numbers.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Output, Stdio};

use common::{h2::H2Client, Cluster, LARDER};
use http::{Method, StatusCode};
use serde_json::{json, Value};

fn feed(cluster: &Cluster, args: &[&str], stdin: Option<&str>) -> Output {
    let endpoint = cluster.url("/");
    let mut command = Command::new(LARDER);
    command
        .args(["feed", "--endpoint", &endpoint])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn summary(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON summary ({e}); stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// Reads every document back over one HTTP/2 connection.
fn read_back(cluster: &Cluster, ids: &[String]) -> BTreeMap<String, Option<Value>> {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = H2Client::connect(cluster.frontend_addr).await;
        let mut out = BTreeMap::new();
        for id in ids {
            let key = id.rsplit("::").next().unwrap();
            let path = format!("/document/v1/ns/doc/docid/{key}");
            // The fault injector answers reads too: retry those answers.
            let (status, body) = loop {
                let (status, body) = client.request(Method::GET, &path, Default::default()).await;
                if !matches!(status.as_u16(), 429 | 503) {
                    break (status, body);
                }
            };
            let fields = match status {
                StatusCode::OK => {
                    Some(serde_json::from_slice::<Value>(&body).unwrap()["fields"].clone())
                }
                StatusCode::NOT_FOUND => None,
                other => panic!("GET {path}: {other}"),
            };
            out.insert(id.clone(), fields);
        }
        out
    })
}

#[test]
fn per_document_order_holds_under_injected_overload() {
    let cluster = Cluster::start_with(3, 8, "[documents]\ntesting_reject_ratio = 0.3\n");
    // 60 documents, 25 operations each, interleaved at random. Increments and appends are not
    // idempotent and do not commute with puts and removes, so any reordering or repetition of
    // operations on one document shows in its final state.
    let ids: Vec<String> = (0..60).map(|i| format!("id:ns:doc::d{i}")).collect();
    let mut model: BTreeMap<String, Option<serde_json::Map<String, Value>>> = BTreeMap::new();
    let mut lines = Vec::new();
    for step in 0..1500u32 {
        let id = &ids[rand::random_range(0..ids.len())];
        let state = model.entry(id.clone()).or_insert(None);
        let op = match rand::random_range(0..10) {
            0..=2 => {
                let fields = json!({"n": step, "log": [step]});
                *state = Some(fields.as_object().unwrap().clone());
                json!({"put": id, "fields": fields})
            }
            3..=7 => {
                let fields = state.get_or_insert_with(Default::default);
                let n = fields.get("n").and_then(Value::as_i64).unwrap_or(0);
                fields.insert("n".into(), json!(n + 1));
                let mut log = fields.get("log").cloned().unwrap_or(json!([]));
                log.as_array_mut().unwrap().push(json!(step));
                fields.insert("log".into(), log);
                json!({"update": id, "create": true,
                       "fields": {"n": {"increment": 1}, "log": {"add": [step]}}})
            }
            _ => {
                *state = None;
                json!({"remove": id})
            }
        };
        lines.push(op.to_string());
    }
    let file = cluster.path("ordered.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let output = feed(
        &cluster,
        &[
            "--file",
            &file,
            "--json",
            "--max-retries",
            "100",
            "--connections",
            "2",
        ],
        None,
    );
    let s = summary(&output);
    assert!(output.status.success(), "{s}");
    assert_eq!(s["operations"], 1500, "{s}");
    assert_eq!(s["succeeded"], 1500, "{s}");
    assert_eq!(s["statuses"], json!({"200": 1500}), "{s}");
    assert!(
        s["retries"].as_u64().unwrap() > 100,
        "the injector made clients retry: {s}"
    );
    for key in ["p50", "p95", "p99"] {
        assert!(s["latency_ms"][key].as_f64().unwrap() > 0.0, "{s}");
    }
    let stored = read_back(&cluster, &model.keys().cloned().collect::<Vec<_>>());
    for (id, expected) in &model {
        let expected = expected.clone().map(Value::Object);
        assert_eq!(stored[id], expected, "{id}");
    }
}

#[test]
fn arrays_on_stdin_outcomes_per_status_and_malformed_lines() {
    let cluster = Cluster::start(3, 4);
    let array = r#"[
        {"put": "id:ns:doc::a", "fields": {"x": 1}},
        {"update": "id:ns:doc::a", "fields": {"x": {"increment": 2}}},
        {"put": "id:ns:doc::b", "fields": {"x": 1}, "condition": "doc.x == 5"},
        {"update": "id:ns:doc::a", "fields": {"x": {"explode": 1}}},
        {"remove": "id:ns:doc::c"}
    ]"#;
    let output = feed(&cluster, &["--stdin", "--json"], Some(array));
    let s = summary(&output);
    assert_eq!(output.status.code(), Some(1), "a 400 is a failure: {s}");
    assert_eq!(s["statuses"], json!({"200": 3, "400": 1, "412": 1}), "{s}");
    assert_eq!(
        (s["succeeded"].as_u64(), s["failed"].as_u64()),
        (Some(4), Some(1))
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("id:ns:doc::a (line 5): status 400"),
        "{stderr}"
    );
    let stored = read_back(&cluster, &["id:ns:doc::a".into(), "id:ns:doc::b".into()]);
    assert_eq!(stored["id:ns:doc::a"], Some(json!({"x": 3})));
    assert_eq!(stored["id:ns:doc::b"], None);

    let lines = [
        r#"{"put": "id:ns:doc::m1", "fields": {"ok": true}}"#,
        r#"{"put": "id:ns:doc::m2", "fields": {"ok": true}"#,
        "",
        "this is not JSON",
        r#"{"put": "not-an-id", "fields": {}}"#,
        r#"{"remove": "id:ns:doc::m1"}"#,
        r#"{"put": "id:ns:doc::m3", "fields": {"ok": true}}"#,
    ];
    let file = cluster.path("malformed.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let output = feed(&cluster, &["--file", &file, "--json"], None);
    let s = summary(&output);
    assert_eq!(output.status.code(), Some(1), "{s}");
    assert_eq!(
        (s["malformed"].as_u64(), s["succeeded"].as_u64()),
        (Some(3), Some(3)),
        "{s}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The feed file's own positions (the JSON parser's, within one operation, are converted),
    // each error printed once.
    for line in ["line 2, column 47: ", "line 4, column 2: ", "line 5: "] {
        assert_eq!(stderr.matches(line).count(), 1, "{line} once in {stderr}");
    }
    assert!(!stderr.contains(" at line "), "{stderr}");
    // The text summary counts the errors without printing them a second time.
    let output = feed(&cluster, &["--file", &file], None);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("3 malformed"), "{stderr}");
    assert_eq!(stderr.matches("line 4, column 2: ").count(), 1, "{stderr}");
    let stored = read_back(&cluster, &["id:ns:doc::m1".into(), "id:ns:doc::m3".into()]);
    assert_eq!(stored["id:ns:doc::m1"], None);
    assert_eq!(stored["id:ns:doc::m3"], Some(json!({"ok": true})));
    // The exit status threshold is configurable; --benchmark prints the text summary on stdout.
    let output = feed(
        &cluster,
        &["--file", &file, "--max-failures", "3", "--benchmark"],
        None,
    );
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("ops/s") && stdout.contains("p99"),
        "{stdout}"
    );
    // A directory is not a feed (it used to pass for an empty one, with exit status 0).
    let output = feed(
        &cluster,
        &["--file", cluster.dir.path().to_str().unwrap()],
        None,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is a directory"), "{stderr}");
    // An endpoint nobody listens on fails fast.
    let output = Command::new(LARDER)
        .args(["feed", "--endpoint", "http://127.0.0.1:1/", "--stdin"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
}

#[test]
fn compressed_feeds_send_fewer_bytes_and_land_the_same_documents() {
    let cluster = Cluster::start(3, 4);
    let text = "the same words again and again ".repeat(40);
    let docs = |prefix: &str| -> String {
        (0..50)
            .map(|i| json!({"put": format!("id:ns:doc::{prefix}{i}"), "fields": {"text": text, "i": i}}))
            .map(|op| op.to_string() + "\n")
            .collect()
    };
    let mut sent = BTreeMap::new();
    for mode in ["none", "gzip", "auto"] {
        let output = feed(
            &cluster,
            &["--stdin", "--json", "--compression", mode],
            Some(&docs(mode)),
        );
        let s = summary(&output);
        assert!(output.status.success(), "{mode}: {s}");
        assert_eq!(s["succeeded"], 50, "{mode}: {s}");
        sent.insert(mode, s["bytes_sent"].as_u64().unwrap());
        let ids: Vec<String> = (0..50).map(|i| format!("id:ns:doc::{mode}{i}")).collect();
        for (id, stored) in read_back(&cluster, &ids) {
            let stored = stored.unwrap_or_else(|| panic!("{mode}: {id} missing"));
            assert_eq!(stored["text"], text.as_str(), "{mode}");
        }
    }
    // Documents of ~1.3 KB of repeated words: gzip (and auto, above 512 bytes) send a fraction.
    assert!(sent["gzip"] * 5 < sent["none"], "{sent:?}");
    assert!(sent["auto"] * 5 < sent["none"], "{sent:?}");
}
