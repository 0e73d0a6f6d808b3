//! The visit client against a scripted HTTP/2 server that answers Vespa's visiting wire format
//! (the format is Vespa's; this server only plays it back): every slice's pages are followed to
//! the end, every document is written once, the parameters reach the server encoded, 503s are
//! retried, and a 400 stops the visit with the server's message. End-to-end tests against a real
//! cluster are in `crates/larder/tests/`.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};

const DOCUMENTS: usize = 101;
const PAGE: usize = 7;

struct Script {
    /// Every 5th request is answered 503.
    requests: AtomicUsize,
    queries: parking_lot::Mutex<Vec<HashMap<String, String>>>,
}

fn query_map(query: &str) -> HashMap<String, String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), percent_decode(v)))
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// Slice `s` of `n` holds the documents whose number is `s` modulo `n`; a continuation is the
/// offset of the next page within the slice.
fn answer(script: &Script, req: &Request<Incoming>) -> (StatusCode, Value) {
    let query = query_map(req.uri().query().unwrap_or(""));
    script.queries.lock().push(query.clone());
    if script.requests.fetch_add(1, Relaxed) % 5 == 4 {
        return (StatusCode::SERVICE_UNAVAILABLE, json!({"message": "busy"}));
    }
    if query.get("selection").map(String::as_str) == Some("bad") {
        return (
            StatusCode::BAD_REQUEST,
            json!({"message": "bad selection: unexpected end at byte 3"}),
        );
    }
    let slices: usize = query.get("slices").map_or(1, |s| s.parse().unwrap());
    let slice: usize = query.get("sliceId").map_or(0, |s| s.parse().unwrap());
    let offset: usize = query.get("continuation").map_or(0, |c| c.parse().unwrap());
    let mine: Vec<usize> = (0..DOCUMENTS).filter(|d| d % slices == slice).collect();
    let page: Vec<Value> = mine
        .iter()
        .skip(offset)
        .take(PAGE)
        .map(|d| json!({"id": format!("id:ns:t::{d}"), "fields": {"n": d}}))
        .collect();
    let mut body =
        json!({"pathId": req.uri().path(), "documentCount": page.len(), "documents": page});
    if offset + PAGE < mine.len() {
        body["continuation"] = json!((offset + PAGE).to_string());
    }
    (StatusCode::OK, body)
}

async fn serve(script: Arc<Script>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let script = script.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (status, body) = answer(&script, &req);
                    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
                    *response.status_mut() = status;
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn script() -> Arc<Script> {
    Arc::new(Script {
        requests: AtomicUsize::new(0),
        queries: parking_lot::Mutex::new(Vec::new()),
    })
}

#[tokio::test]
async fn every_slice_is_followed_to_the_end_and_every_document_written_once() {
    for slices in [1, 4] {
        let script = script();
        let addr = serve(script.clone()).await;
        let mut config = larder_feed::VisitConfig::new(&format!("http://{addr}/")).unwrap();
        config.slices = slices;
        config.selection = Some("t.n >= 0 and id = 'id:ns:*'".into());
        config.field_set = Some("t:[document]".into());
        config.wanted_document_count = Some(PAGE as u32);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let file = std::fs::File::create(&path).unwrap();
        let summary = larder_feed::visit(config, file).await.unwrap();
        assert_eq!(summary.documents, DOCUMENTS as u64);
        assert!(summary.retries > 0, "503s were retried");

        let text = std::fs::read_to_string(&path).unwrap();
        let mut seen = BTreeMap::new();
        for line in text.lines() {
            let doc: Value = serde_json::from_str(line).unwrap();
            *seen
                .entry(doc["fields"]["n"].as_u64().unwrap())
                .or_insert(0) += 1;
        }
        assert_eq!(
            seen.len(),
            DOCUMENTS,
            "every document, with {slices} slices"
        );
        assert!(seen.values().all(|&count| count == 1), "each exactly once");

        let queries = script.queries.lock();
        for q in queries.iter() {
            assert_eq!(q["selection"], "t.n >= 0 and id = 'id:ns:*'");
            assert_eq!(q["fieldSet"], "t:[document]");
            assert_eq!(q["stream"], "true");
            assert_eq!(q["wantedDocumentCount"], PAGE.to_string());
            assert_eq!(q.get("slices").is_some(), slices > 1);
        }
    }
}

#[tokio::test]
async fn a_refused_page_stops_the_visit_with_the_servers_message() {
    let addr = serve(script()).await;
    let mut config = larder_feed::VisitConfig::new(&format!("http://{addr}/")).unwrap();
    config.selection = Some("bad".into());
    let err = larder_feed::visit(config, std::io::sink())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("at byte 3"), "{err}");
}

/// A response body sent chunk by chunk, as a streaming server sends a page.
struct Chunks(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(hyper::body::Frame::data(c))))
    }
}

/// Serves one page whose body is whatever the test sends on the returned channel.
async fn serve_one_streamed_page() -> (SocketAddr, tokio::sync::mpsc::Sender<Bytes>) {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let rx = Arc::new(parking_lot::Mutex::new(Some(rx)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
            let body = Chunks(rx.lock().take().expect("one page only"));
            async move { Ok::<_, Infallible>(Response::new(body)) }
        });
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(stream), service)
            .await;
    });
    (addr, tx)
}

/// A shared output the test can read while the visit writes it.
#[derive(Clone, Default)]
struct Shared(Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn documents_are_written_while_their_page_is_still_streaming() {
    let (addr, page) = serve_one_streamed_page().await;
    let mut config = larder_feed::VisitConfig::new(&format!("http://{addr}/")).unwrap();
    config.slices = 1;
    let output = Shared::default();
    let visit = tokio::spawn(larder_feed::visit(config, output.clone()));
    let first = r#"{"pathId":"/document/v1/","documents":[{"id":"id:ns:t::1","fields":{"n":1}},"#;
    page.send(Bytes::from(first)).await.unwrap();
    // The page is not over, yet its first document must already be out.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while output.0.lock().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing written mid-page"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        &output.0.lock()[..],
        b"{\"id\":\"id:ns:t::1\",\"fields\":{\"n\":1}}\n"
    );
    let rest = r#"{"id":"id:ns:t::2","fields":{}}],"documentCount":2}"#;
    page.send(Bytes::from(rest)).await.unwrap();
    drop(page);
    let summary = visit.await.unwrap().unwrap();
    assert_eq!(summary.documents, 2);
    assert_eq!(output.0.lock().iter().filter(|&&b| b == b'\n').count(), 2);
}
