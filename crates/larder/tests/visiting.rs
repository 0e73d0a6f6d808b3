//! Visiting `/document/v1` against a real cluster through two frontends: every live document
//! exactly once for 1, 4 and 16 slices, buffered and streamed, with continuations carried from
//! one frontend to the other and across a frontend restart; documents present for a whole visit
//! exactly once while others are written and removed; bad selections and continuations are
//! 400s; update-where and delete-where change exactly the matching documents.
//!
//! `LARDER_VISIT_DOCS` sets the corpus size (the issue's 20,000 by default).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use common::h2::H2Client;
use common::{Cluster, SecondFrontend};
use futures_util::StreamExt;
use http::{Method, StatusCode};
use serde_json::{json, Value};

fn corpus_size() -> usize {
    std::env::var("LARDER_VISIT_DOCS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000)
}

fn doc_path(i: usize) -> String {
    format!("/document/v1/ns/t/docid/d{i}")
}

fn doc_id(i: usize) -> String {
    format!("id:ns:t::d{i}")
}

/// Query-string encoding: everything but unreserved characters.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Runs `ops` requests with up to 64 in flight; every one must answer 200.
async fn run_all(client: &H2Client, ops: Vec<(Method, String, Bytes)>) {
    let results: Vec<(StatusCode, Bytes, String)> = futures_util::stream::iter(ops)
        .map(|(method, path, body)| async move {
            let (status, answer) = client.request(method, &path, body).await;
            (status, answer, path)
        })
        .buffer_unordered(64)
        .collect()
        .await;
    for (status, body, path) in results {
        assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
    }
}

fn put(i: usize, fields: Value) -> (Method, String, Bytes) {
    let body = json!({ "fields": fields }).to_string();
    (Method::POST, doc_path(i), Bytes::from(body))
}

/// Visits one slice to its end, alternating between `clients` request by request (the
/// continuation carried over); returns the IDs in the order they came.
async fn visit_slice(clients: &[H2Client], base: &str, query: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut continuation: Option<String> = None;
    for round in 0.. {
        assert!(round < 10_000, "the visit never ends");
        let mut path = format!("{base}?{query}");
        if let Some(token) = &continuation {
            path.push_str(&format!("&continuation={}", encode(token)));
        }
        let client = &clients[round % clients.len()];
        let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
        assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
        let answer: Value = serde_json::from_slice(&body).expect("a visit answers valid JSON");
        assert!(answer.get("message").is_none(), "{answer}");
        let docs = answer["documents"].as_array().unwrap();
        assert_eq!(answer["documentCount"], docs.len());
        ids.extend(docs.iter().map(|d| d["id"].as_str().unwrap().to_owned()));
        match answer["continuation"].as_str() {
            Some(token) => continuation = Some(token.to_owned()),
            None => break,
        }
    }
    ids
}

/// Visits all `slices` at once; returns every ID returned, in all.
async fn visit_all(clients: &[H2Client], slices: u32, extra: &str) -> Vec<String> {
    let tasks: Vec<_> = (0..slices)
        .map(|id| {
            let clients = clients.to_vec();
            let query = format!("slices={slices}&sliceId={id}&wantedDocumentCount=300{extra}");
            tokio::spawn(
                async move { visit_slice(&clients, "/document/v1/ns/t/docid", &query).await },
            )
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all
}

/// The DATA frames of a streamed visit, as they arrive.
async fn streamed_frames(addr: SocketAddr, path: &str) -> Vec<Bytes> {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let request = http::Request::get(format!("http://{addr}{path}"))
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            frames.push(data);
        }
    }
    frames
}

fn assert_exactly(ids: &[String], expected: &BTreeSet<String>, what: &str) {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for id in ids {
        *counts.entry(id).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(
        twice.is_empty(),
        "{what}: returned more than once: {twice:?}"
    );
    let missing: Vec<_> = expected
        .iter()
        .filter(|id| !counts.contains_key(id.as_str()))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "{what}: missing {missing:?}");
    let extra: Vec<_> = counts
        .keys()
        .filter(|id| !expected.contains(**id))
        .take(5)
        .collect();
    assert!(extra.is_empty(), "{what}: not live: {extra:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_live_document_exactly_once_through_two_frontends() {
    let mut cluster = Cluster::start(3, 8);
    let second = SecondFrontend::start(&cluster);
    let first = H2Client::connect(cluster.frontend_addr).await;
    let other = H2Client::connect(second.addr).await;
    let clients = [first.clone(), other.clone()];

    let n = corpus_size();
    let started = Instant::now();
    let puts = (0..n)
        .map(|i| put(i, json!({"i": i, "group": i % 10})))
        .collect();
    run_all(&first, puts).await;
    eprintln!("fed {n} documents in {:?}", started.elapsed());
    let removes = (0..n)
        .filter(|i| i % 7 == 0)
        .map(|i| (Method::DELETE, doc_path(i), Bytes::new()))
        .collect();
    run_all(&other, removes).await;
    let live: BTreeSet<String> = (0..n).filter(|i| i % 7 != 0).map(doc_id).collect();

    for slices in [1, 4, 16] {
        for stream in ["", "&stream=true"] {
            let started = Instant::now();
            let ids = visit_all(&clients, slices, stream).await;
            eprintln!(
                "{slices} slices{stream}: {} documents in {:?}",
                ids.len(),
                started.elapsed()
            );
            assert_exactly(&ids, &live, &format!("{slices} slices{stream}"));
        }
    }

    // `concurrency` fetches the next partitions' pages ahead and changes nothing a client
    // sees: the same documents in the same order, the same continuations (chunks of 997 end
    // mid-partition, dropping pages fetched ahead).
    let base = "/document/v1/ns/t/docid";
    let one = visit_slice(&clients, base, "concurrency=1&wantedDocumentCount=997").await;
    let eight = visit_slice(&clients, base, "concurrency=8&wantedDocumentCount=997").await;
    assert_exactly(&eight, &live, "concurrency=8");
    assert!(one == eight, "concurrency changed the order of a visit");

    // A streamed answer starts before any page is read (its first frame is the JSON's head)
    // and comes page by page, one frame each; together they are one valid JSON object.
    let path = "/document/v1/ns/t/docid?stream=true&wantedDocumentCount=1000000";
    let frames = streamed_frames(cluster.frontend_addr, path).await;
    assert_eq!(
        &frames[0][..],
        br#"{"pathId":"/document/v1/ns/t/docid","documents":["#
    );
    assert!(
        frames.len() > 8,
        "one frame per page, not one for the answer: {}",
        frames.len()
    );
    let whole: Value = serde_json::from_slice(&frames.concat()).unwrap();
    assert_eq!(whole["documentCount"], live.len());

    // Field sets: IDs only, and named fields.
    let ids_only = visit_slice(
        &clients,
        "/document/v1/ns/t/docid",
        "fieldSet=%5Bid%5D&wantedDocumentCount=1000",
    )
    .await;
    assert_exactly(&ids_only, &live, "[id]");
    let (_, body) = first
        .request(
            Method::GET,
            "/document/v1/ns/t/docid?fieldSet=t%3Agroup&wantedDocumentCount=3",
            Bytes::new(),
        )
        .await;
    let answer: Value = serde_json::from_slice(&body).unwrap();
    for doc in answer["documents"].as_array().unwrap() {
        assert_eq!(
            doc["fields"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["group"]
        );
    }

    // While documents are written and removed, those present throughout appear exactly once.
    let churn = |i: usize| i % 5 == 1;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (client, stop) = (other.clone(), stop.clone());
        tokio::spawn(async move {
            let mut round = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut ops = Vec::new();
                for i in (0..n).filter(|i| churn(*i)).skip(round * 50 % n).take(50) {
                    if round % 2 == 0 {
                        ops.push((Method::DELETE, doc_path(i), Bytes::new()));
                    } else {
                        ops.push(put(i, json!({"i": i, "group": i % 10, "round": round})));
                    }
                }
                // Documents present throughout are rewritten too: an update must not move them.
                for i in (0..n)
                    .filter(|i| i % 5 == 2 && i % 7 != 0)
                    .skip(round * 50 % n)
                    .take(50)
                {
                    ops.push(put(i, json!({"i": i, "group": i % 10, "round": round})));
                }
                for k in 0..20 {
                    ops.push(put(n + round * 20 + k, json!({"new": true})));
                }
                run_all(&client, ops).await;
                round += 1;
            }
            round
        })
    };
    let ids = visit_all(&clients, 4, "&stream=true").await;
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.await.unwrap();
    eprintln!(
        "visit during {rounds} rounds of writes: {} documents",
        ids.len()
    );
    assert!(rounds > 0, "the writer ran during the visit");
    let throughout: BTreeSet<String> = (0..n)
        .filter(|i| i % 7 != 0 && !churn(*i))
        .map(doc_id)
        .collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for id in &ids {
        *counts.entry(id).or_default() += 1;
    }
    assert!(counts.values().all(|c| *c == 1), "a document came twice");
    for id in &throughout {
        assert_eq!(counts.get(id.as_str()), Some(&1), "{id} present throughout");
    }

    // A continuation survives the frontend that made it.
    let (status, body) = first
        .request(
            Method::GET,
            "/document/v1/ns/t/docid?wantedDocumentCount=100",
            Bytes::new(),
        )
        .await;
    assert_eq!(status, 200);
    let answer: Value = serde_json::from_slice(&body).unwrap();
    let mut before: Vec<String> = answer["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect();
    let token = answer["continuation"].as_str().unwrap().to_owned();
    cluster.kill_and_restart_frontend();
    let restarted = H2Client::connect(cluster.frontend_addr).await;
    let query = format!("continuation={}", encode(&token));
    before.extend(
        visit_slice(
            std::slice::from_ref(&restarted),
            "/document/v1/ns/t/docid",
            &query,
        )
        .await,
    );
    let mut seen = BTreeSet::new();
    assert!(
        before.iter().all(|id| seen.insert(id.clone())),
        "a document came twice"
    );
    assert!(throughout.is_subset(&seen));

    // Bad selections and continuations are the client's fault.
    for query in [
        "selection=t.group%20%3D%3D",
        "selection=%28%28",
        "continuation=AAAA",
        "continuation=%21%21",
        "slices=4",
        "slices=4&sliceId=4",
    ] {
        let path = format!("/document/v1/ns/t/docid?{query}");
        let (status, body) = restarted.request(Method::GET, &path, Bytes::new()).await;
        assert_eq!(status, 400, "{path}: {}", String::from_utf8_lossy(&body));
    }
    // A slice's continuation is refused for another slice.
    let (_, body) = restarted
        .request(
            Method::GET,
            "/document/v1/ns/t/docid?slices=2&sliceId=0&wantedDocumentCount=1",
            Bytes::new(),
        )
        .await;
    let token = serde_json::from_slice::<Value>(&body).unwrap()["continuation"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!(
        "/document/v1/ns/t/docid?slices=2&sliceId=1&continuation={}",
        encode(&token)
    );
    assert_eq!(
        restarted.request(Method::GET, &path, Bytes::new()).await.0,
        400
    );

    // A selection visit returns exactly the matching live documents.
    let clients = [restarted.clone(), other.clone()];
    let selected = visit_slice(
        &clients,
        "/document/v1/ns/t/docid",
        "selection=t.group%3D%3D3",
    )
    .await;
    let group3: BTreeSet<String> = (0..n)
        .filter(|i| i % 7 != 0 && !churn(*i) && i % 10 == 3)
        .map(doc_id)
        .collect();
    let selected_set: BTreeSet<String> = selected.iter().cloned().collect();
    assert_eq!(selected_set.len(), selected.len());
    assert!(group3.is_subset(&selected_set));
    assert!(selected.iter().all(|id| id.starts_with("id:ns:t::d")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_where_and_delete_where_change_exactly_the_matching_documents() {
    let cluster = Cluster::start(3, 8);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let n = 600;
    run_all(
        &client,
        (0..n)
            .map(|i| put(i, json!({"i": i, "group": i % 6})))
            .collect(),
    )
    .await;
    let base = "/document/v1/ns/t/docid";

    // Vespa requires a cluster (and a selection) for writes through a selection.
    let update = Bytes::from(json!({"fields": {"tag": {"assign": "x"}}}).to_string());
    let (status, _) = client
        .request(
            Method::PUT,
            &format!("{base}?selection=t.group%3D%3D1"),
            update.clone(),
        )
        .await;
    assert_eq!(status, 400);

    let path = format!("{base}?selection=t.group%3D%3D1&cluster=c");
    let (status, _) = client
        .request(Method::PUT, &path, Bytes::from_static(b"{not json"))
        .await;
    assert_eq!(status, 400);
    let (status, body) = client.request(Method::PUT, &path, update).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["documentCount"], 100);
    assert!(answer.get("continuation").is_none());
    let tagged = visit_slice(
        std::slice::from_ref(&client),
        base,
        "selection=t.tag%3D%3D%22x%22",
    )
    .await;
    let expected: BTreeSet<String> = (0..n).filter(|i| i % 6 == 1).map(doc_id).collect();
    assert_exactly(&tagged, &expected, "updated");

    let path = format!("{base}?selection=t.group%3D%3D2&cluster=c");
    let (status, body) = client.request(Method::DELETE, &path, Bytes::new()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["documentCount"],
        100
    );
    // timeChunk ends a chunk after its time, whatever wantedDocumentCount says.
    let (_, body) = client
        .request(Method::GET, &format!("{base}?timeChunk=1ms"), Bytes::new())
        .await;
    let first: Value = serde_json::from_slice(&body).unwrap();
    assert!(first["continuation"].is_string(), "{first}");
    assert!(first["documentCount"].as_u64().unwrap() < 500);
    let left = visit_slice(std::slice::from_ref(&client), base, "timeChunk=1ms").await;
    let expected: BTreeSet<String> = (0..n).filter(|i| i % 6 != 2).map(doc_id).collect();
    assert_exactly(&left, &expected, "after delete-where");
}

/// Visits the whole corpus on one frontend, waiting out 503s (a node coming back, another
/// going away); returns each document's ID and fields.
async fn visit_settled(client: &H2Client) -> Vec<(String, Value)> {
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    'again: loop {
        let mut docs = Vec::new();
        let mut continuation: Option<String> = None;
        loop {
            let mut path = "/document/v1/ns/t/docid?wantedDocumentCount=100".to_owned();
            if let Some(token) = &continuation {
                path.push_str(&format!("&continuation={}", encode(token)));
            }
            let (status, body) = client.request(Method::GET, &path, Bytes::new()).await;
            if status == 503 && Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue 'again;
            }
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
            let answer: Value = serde_json::from_slice(&body).unwrap();
            for doc in answer["documents"].as_array().unwrap() {
                docs.push((
                    doc["id"].as_str().unwrap().to_owned(),
                    doc["fields"].clone(),
                ));
            }
            match answer["continuation"].as_str() {
                Some(token) => continuation = Some(token.to_owned()),
                None => return docs,
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_missed_writes_does_not_change_what_a_visit_returns() {
    // No replication: the replica that was down stays behind for the whole test.
    let mut cluster = Cluster::start_full(3, 4, "", "[replication]\nenabled = false\n");
    let client = H2Client::connect(cluster.frontend_addr).await;
    let n = 400;
    run_all(&client, (0..n).map(|i| put(i, json!({"i": i}))).collect()).await;
    // Let the third replica's writes (answered after the quorum) land.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    cluster.kill_node(0);
    let mut ops: Vec<_> = (0..n)
        .filter(|i| i % 4 == 0)
        .map(|i| (Method::DELETE, doc_path(i), Bytes::new()))
        .collect();
    ops.extend(
        (0..n)
            .filter(|i| i % 4 == 1)
            .map(|i| put(i, json!({"i": i, "v": 2}))),
    );
    ops.extend((n..n + 100).map(|i| put(i, json!({"i": i}))));
    run_all(&client, ops).await;
    // Now the only quorum is the stale replica and one that has every write.
    cluster.restart_node(0);
    cluster.kill_node(1);
    let docs = visit_settled(&client).await;
    let ids: Vec<String> = docs.iter().map(|(id, _)| id.clone()).collect();
    let expected: BTreeSet<String> = (0..n + 100)
        .filter(|i| *i >= n || i % 4 != 0)
        .map(doc_id)
        .collect();
    assert_exactly(&ids, &expected, "stale replica");
    for (id, fields) in &docs {
        let i: usize = id.trim_start_matches("id:ns:t::d").parse().unwrap();
        if i < n && i % 4 == 1 {
            assert_eq!(fields["v"], 2, "{id}: the newest version wins");
        }
    }
}
