//! `/document/v1` driven by curl over HTTP/1.1 and h2c against a real three-node cluster: every
//! operation, the path forms, encoded IDs, gzip bodies, conditions, timeouts and Vespa's statuses.

mod common;

use common::{curl, file_with, Cluster, CurlResponse};
use serde_json::{json, Value};

const DOCS: &str = "[documents]\nmax_document_size = \"4 KiB\"\n";

fn request(cluster: &Cluster, method: &str, path: &str, body: Option<&Value>) -> CurlResponse {
    let body = body.map(|b| b.to_string().into_bytes());
    common::json_request(cluster, method, path, body.as_deref())
}

fn fields(cluster: &Cluster, path: &str) -> Option<Value> {
    let r = request(cluster, "GET", path, None);
    match r.status {
        200 => Some(r.json()["fields"].clone()),
        404 => None,
        other => panic!("GET {path}: {other} {}", String::from_utf8_lossy(&r.body)),
    }
}

/// Like `fields`, waiting out 503s while a restarted node's connections come back.
fn fields_eventually(cluster: &Cluster, path: &str) -> Option<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let r = request(cluster, "GET", path, None);
        if r.status != 503 || std::time::Instant::now() > deadline {
            return match r.status {
                200 => Some(r.json()["fields"].clone()),
                404 => None,
                other => panic!("GET {path}: {other} {}", String::from_utf8_lossy(&r.body)),
            };
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn handshake_put_get_update_remove_and_the_path_forms() {
    let cluster = Cluster::start_with(3, 8, DOCS);
    let dir = cluster.dir.path();

    // The Java client's handshake: a dry-run put without a body, over h2c.
    let url = cluster.url("/document/v1/feeder/handshake/docid/dummy?dryRun=true&timeout=29995ms");
    let r = curl(dir, &["--http2-prior-knowledge", "-X", "POST", &url]);
    assert_eq!((r.status, r.version.as_str()), (200, "HTTP/2"));
    assert_eq!(r.json()["id"], "id:feeder:handshake::dummy");
    assert_eq!(
        fields(&cluster, "/document/v1/feeder/handshake/docid/dummy"),
        None
    );

    let path = "/document/v1/music/song/docid/1";
    let doc = json!({"fields": {"title": "Hello", "year": 2001, "tags": ["a"], "plays": 10}});
    let r = request(&cluster, "POST", path, Some(&doc));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json(), json!({"pathId": path, "id": "id:music:song::1"}));
    let got = request(&cluster, "GET", path, None);
    assert_eq!(got.status, 200);
    assert_eq!(got.header("content-type"), Some("application/json"));
    assert_eq!(
        got.json(),
        json!({"pathId": path, "id": "id:music:song::1", "fields": doc["fields"]})
    );

    let update = json!({"fields": {
        "title": {"assign": "Hi"}, "tags": {"add": ["b"]}, "plays": {"increment": 5},
        "year": {"decrement": 1}, "score": {"increment": 2}}});
    assert_eq!(request(&cluster, "PUT", path, Some(&update)).status, 200);
    let update = json!({"fields": {"plays": {"multiply": 3}, "score": {"divide": 2}, "tags": {"remove": ["a"]}}});
    assert_eq!(request(&cluster, "PUT", path, Some(&update)).status, 200);
    assert_eq!(
        fields(&cluster, path),
        Some(json!({"title": "Hi", "year": 2000, "tags": ["b"], "plays": 45, "score": 1}))
    );

    let r = request(&cluster, "DELETE", path, None);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["id"], "id:music:song::1");
    let r = request(&cluster, "GET", path, None);
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["id"], "id:music:song::1");
    assert!(r.json()["message"].is_string());
    // Removing again, or a document never written, is a 200 (a versioned tombstone).
    assert_eq!(request(&cluster, "DELETE", path, None).status, 200);
    assert_eq!(
        request(
            &cluster,
            "DELETE",
            "/document/v1/music/song/docid/never",
            None
        )
        .status,
        200
    );

    // Updates of a missing document: ignored without create, a new document with it.
    let path = "/document/v1/music/song/docid/2";
    let update = json!({"fields": {"n": {"increment": 1}}});
    assert_eq!(request(&cluster, "PUT", path, Some(&update)).status, 200);
    assert_eq!(fields(&cluster, path), None);
    let created = request(
        &cluster,
        "PUT",
        &format!("{path}?create=true"),
        Some(&update),
    );
    assert_eq!(created.status, 200);
    assert_eq!(fields(&cluster, path), Some(json!({"n": 1})));

    // number and group forms, and IDs that need encoding (Java's URLEncoder writes ' ' as '+').
    for (path, id) in [
        (
            "/document/v1/music/song/number/42/a",
            "id:music:song:n=42:a",
        ),
        (
            "/document/v1/music/song/group/g%20x/a",
            "id:music:song:g=g x:a",
        ),
        (
            "/document/v1/music/song/docid/a%2Fb+c%2Bd%3F%C3%A9",
            "id:music:song::a/b c+d?é",
        ),
    ] {
        let body = json!({"fields": {"id": id}});
        let r = request(&cluster, "POST", path, Some(&body));
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.json()["id"], id);
        assert_eq!(fields(&cluster, path), Some(json!({"id": id})), "{path}");
    }
    // The same ID spelled another way is the same document.
    assert_eq!(
        fields(
            &cluster,
            "/document/v1/music/song/docid/a%2Fb%20c%2Bd%3F%C3%A9"
        ),
        Some(json!({"id": "id:music:song::a/b c+d?é"}))
    );
    assert_eq!(
        fields(&cluster, "/document/v1/music/song/group/g%20x/b"),
        None
    );
}

#[test]
fn conditions_parameters_gzip_and_statuses() {
    let cluster = Cluster::start_with(3, 8, DOCS);
    let dir = cluster.dir.path();
    let path = "/document/v1/music/song/docid/c";
    let put = |fields: Value, query: &str| {
        request(
            &cluster,
            "POST",
            &format!("{path}{query}"),
            Some(&json!({"fields": fields})),
        )
        .status
    };
    // Conditional put on a missing document: 412, unless create=true.
    assert_eq!(put(json!({"year": 1990}), "?condition=song.year%3E1"), 412);
    assert_eq!(
        put(
            json!({"year": 1990}),
            "?condition=song.year%3E1&create=true"
        ),
        200
    );
    let q = |c: &str| {
        format!(
            "?condition={}",
            c.replace(' ', "%20")
                .replace('>', "%3E")
                .replace('<', "%3C")
                .replace('=', "%3D")
        )
    };
    assert_eq!(put(json!({"year": 2000}), &q("song.year > 1995")), 412);
    assert_eq!(
        put(
            json!({"year": 2000}),
            &q("song.year < 1995 and not song.missing")
        ),
        200
    );
    let update = json!({"fields": {"year": {"increment": 1}}, "condition": "song.year == 1999"});
    assert_eq!(request(&cluster, "PUT", path, Some(&update)).status, 412);
    let update = json!({"fields": {"year": {"increment": 1}}, "condition": "song.year == 2000"});
    assert_eq!(request(&cluster, "PUT", path, Some(&update)).status, 200);
    assert_eq!(fields(&cluster, path), Some(json!({"year": 2001})));
    let remove = |c: &str| request(&cluster, "DELETE", &format!("{path}{}", q(c)), None).status;
    assert_eq!(remove("song.year == 1"), 412);
    assert_eq!(remove("song.year == 2001"), 200);
    assert_eq!(
        remove("song.year == 2001"),
        412,
        "a conditional remove of nothing"
    );
    let bad = request(
        &cluster,
        "POST",
        &format!("{path}?condition=song.year%20%3E%3E%201"),
        Some(&json!({"fields": {}})),
    );
    assert_eq!(bad.status, 400, "bad condition");
    // The answer says where the condition went wrong: the second '>' is byte 11.
    let message = bad.json()["message"].as_str().unwrap().to_owned();
    assert!(message.contains("at byte 11"), "{message}");

    // dryRun parses and answers but stores nothing; route and tracelevel are accepted.
    assert_eq!(put(json!({"x": 1}), "?dryRun=true"), 200);
    assert_eq!(fields(&cluster, path), None);
    assert_eq!(
        put(
            json!({"x": 1}),
            "?route=default&tracelevel=5&timeout=899999ms"
        ),
        200
    );
    for timeout in ["5s", "2.5", "1m"] {
        assert_eq!(
            put(json!({"x": 1}), &format!("?timeout={timeout}")),
            200,
            "{timeout}"
        );
    }
    assert_eq!(put(json!({"x": 1}), "?timeout=soon"), 400);
    let r = request(&cluster, "GET", &format!("{path}?timeout=0.000001"), None);
    assert_eq!(r.status, 504);
    assert!(r.json()["message"].as_str().unwrap().contains("timed out"));

    // A gzipped body, as the Java client sends for bodies over 512 bytes.
    let doc = json!({"fields": {"text": "z".repeat(2000)}});
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, doc.to_string().as_bytes()).unwrap();
    let file = format!("@{}", file_with(dir, &gz.finish().unwrap()));
    let url = cluster.url("/document/v1/music/song/docid/gz");
    let r = curl(
        dir,
        &[
            "--http2-prior-knowledge",
            "-H",
            "Content-Encoding: gzip",
            "--data-binary",
            &file,
            &url,
        ],
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        fields(&cluster, "/document/v1/music/song/docid/gz"),
        Some(doc["fields"].clone())
    );

    // Vespa's error statuses, each with a JSON object body carrying a message.
    let big = json!({"fields": {"text": "z".repeat(5000)}});
    let cases: Vec<(u16, CurlResponse)> = vec![
        (
            413,
            request(
                &cluster,
                "POST",
                "/document/v1/music/song/docid/big",
                Some(&big),
            ),
        ),
        (
            400,
            curl(
                dir,
                &[
                    "--http2-prior-knowledge",
                    "--data-binary",
                    "{not json",
                    &cluster.url(path),
                ],
            ),
        ),
        (
            400,
            request(&cluster, "POST", path, Some(&json!({"nofields": 1}))),
        ),
        (
            400,
            request(
                &cluster,
                "PUT",
                path,
                Some(&json!({"fields": {"x": {"explode": 1}}})),
            ),
        ),
        (
            400,
            request(
                &cluster,
                "POST",
                "/document/v1/music/song/number/x/1",
                Some(&json!({"fields": {}})),
            ),
        ),
        (
            400,
            // Visiting is served now: a bad selection is its 400.
            request(
                &cluster,
                "GET",
                "/document/v1/music/song/docid?selection=song.x%20%3D%3D",
                None,
            ),
        ),
        (
            404,
            request(
                &cluster,
                "GET",
                "/document/v1/music/song/docid/nothing",
                None,
            ),
        ),
        (405, request(&cluster, "PATCH", path, None)),
    ];
    for (expected, r) in cases {
        assert_eq!(r.status, expected, "{}", String::from_utf8_lossy(&r.body));
        let body = r.json();
        assert!(body.is_object() && body["pathId"].is_string(), "{body}");
        if expected != 404 {
            assert!(body["message"].is_string(), "{body}");
        }
    }
    // HTTP/1.1 works too.
    let r = curl(
        dir,
        &[
            "--http1.1",
            &cluster.url("/document/v1/music/song/docid/gz"),
        ],
    );
    assert_eq!((r.status, r.version.as_str()), (200, "HTTP/1.1"));
}

#[test]
fn fault_injection_answers_429_and_503() {
    let cluster = Cluster::start_with(3, 4, "[documents]\ntesting_reject_ratio = 1.0\n");
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..40 {
        let r = request(
            &cluster,
            "POST",
            &format!("/document/v1/n/t/docid/{i}"),
            Some(&json!({"fields": {}})),
        );
        assert!(r.json()["message"]
            .as_str()
            .unwrap()
            .contains("testing_reject_ratio"));
        assert_eq!(r.header("retry-after"), Some("1"));
        seen.insert(r.status);
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![429, 503]);
}

#[test]
fn reads_return_the_newest_version_a_quorum_holds() {
    let mut cluster = Cluster::start_with(3, 1, DOCS);
    let path = "/document/v1/n/t/docid/q";
    let put = |cluster: &Cluster, v: u32| {
        let r = request(cluster, "POST", path, Some(&json!({"fields": {"v": v}})));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    };
    put(&cluster, 1);
    // Node 0 misses version 2; then node 1 goes away: the quorum {0, 2} must answer 2, not 1.
    cluster.stop_node(0);
    put(&cluster, 2);
    cluster.restart_node(0);
    cluster.stop_node(1);
    assert_eq!(fields_eventually(&cluster, path), Some(json!({"v": 2})));
    // Read repair wrote version 2 to node 0, so the pair {0, 1} also agrees on it now.
    std::thread::sleep(std::time::Duration::from_millis(300));
    cluster.restart_node(1);
    cluster.stop_node(2);
    assert_eq!(fields_eventually(&cluster, path), Some(json!({"v": 2})));
    // Without a quorum the answer is 503, never a stale document.
    cluster.stop_node(1);
    assert_eq!(request(&cluster, "GET", path, None).status, 503);
}

#[test]
fn replication_brings_a_returning_node_the_newest_versions() {
    let mut cluster = Cluster::start_with(3, 1, DOCS);
    let (kept, removed) = ("/document/v1/n/t/docid/kept", "/document/v1/n/t/docid/gone");
    let ok = |r: CurlResponse| assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    ok(request(
        &cluster,
        "POST",
        removed,
        Some(&json!({"fields": {"v": 0}})),
    ));
    // A node that is not the partition's primary: the update below needs the primary.
    let primary = cluster.map.primary_of(0, "dc1").unwrap();
    let returning = (0..3)
        .find(|i| cluster.map.nodes[*i].id != primary)
        .unwrap();
    cluster.stop_node(returning);
    ok(request(
        &cluster,
        "POST",
        kept,
        Some(&json!({"fields": {"v": 1}})),
    ));
    let update = json!({"fields": {"v": {"increment": 1}}});
    ok(request(&cluster, "PUT", kept, Some(&update)));
    ok(request(&cluster, "DELETE", removed, None));
    cluster.restart_node(returning);
    // The returning node missed all three writes; it pulls them from its peers' change feeds.
    let internal = |key: &str| {
        let path = larder_proto::doc_path(0, key);
        cluster.internal_request(cluster.node_addr(returning), "GET", &path)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (k, g) = (internal("id:n:t::kept"), internal("id:n:t::gone"));
        if k.0 == 200 && g.0 == 410 {
            let fields: serde_json::Value = serde_json::from_slice(&k.1).unwrap();
            assert_eq!(fields, json!({"v": 2}));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node {returning} did not converge: {} {}",
            k.0,
            g.0
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Updates are read-modify-write at the frontend: concurrent increments of one document through
/// one frontend must all count (none may read the same version as another and overwrite it).
#[test]
fn concurrent_updates_of_one_document_all_apply() {
    let cluster = Cluster::start(3, 2);
    let path = "/document/v1/n/t/docid/counter";
    assert_eq!(
        request(&cluster, "POST", path, Some(&json!({"fields": {"n": 0}}))).status,
        200
    );
    let (clients, each) = (16, 10);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = common::h2::H2Client::connect(cluster.frontend_addr).await;
        let increment = bytes::Bytes::from(json!({"fields": {"n": {"increment": 1}}}).to_string());
        let tasks: Vec<_> = (0..clients)
            .map(|_| {
                let (client, body) = (client.clone(), increment.clone());
                tokio::spawn(async move {
                    for _ in 0..each {
                        let (status, answer) =
                            client.request(http::Method::PUT, path, body.clone()).await;
                        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    let got = request(&cluster, "GET", path, None);
    assert_eq!(got.json()["fields"]["n"], clients * each, "lost updates");
}

/// The internal document read's `x-larder-doc-known` (`INTERNAL_API.md`): a replica holding
/// exactly the named version, live or removed, answers 304 with that version and no body;
/// any other version gets the whole answer.
#[test]
fn a_replica_answers_304_only_for_the_version_the_reader_holds() {
    let cluster = Cluster::start_with(3, 1, DOCS);
    let path = "/document/v1/n/t/docid/known";
    let r = request(&cluster, "POST", path, Some(&json!({"fields": {"v": 1}})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let internal = larder_proto::doc_path(0, "id:n:t::known");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let get = |known: Option<u64>| {
        runtime.block_on(async {
            let client = cluster.node_client(cluster.node_addr(0)).await;
            let mut request = http::Request::get(&internal);
            if let Some(known) = known {
                request = request.header(larder_proto::doc_header::KNOWN, known);
            }
            let request = request
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            let (status, headers, body) = client.send(request).await;
            let version = headers
                .get(larder_proto::doc_header::VERSION)
                .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
            (status.as_u16(), version, body)
        })
    };
    // The write was acknowledged by a quorum; node 0 may still be applying it.
    let settled = |want: u16| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let answer = get(None);
            if answer.0 == want || std::time::Instant::now() > deadline {
                return answer;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let (status, version, body) = settled(200);
    assert_eq!(status, 200);
    assert!(!body.is_empty());
    let version = version.unwrap();
    assert_eq!(
        get(Some(version)),
        (304, Some(version), bytes::Bytes::new())
    );
    let (status, _, body) = get(Some(version - 1));
    assert_eq!((status, body.is_empty()), (200, false), "another version");
    assert_eq!(request(&cluster, "DELETE", path, None).status, 200);
    let (status, removed, _) = settled(410);
    assert_eq!(status, 410);
    let removed = removed.unwrap();
    assert!(removed > version);
    assert_eq!(get(Some(removed)).0, 304, "the removal's own version");
    assert_eq!(get(Some(version)).0, 410, "the live version it replaced");
}
