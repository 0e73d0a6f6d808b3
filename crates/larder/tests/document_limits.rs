//! `/document/v1` against hostile input, on a real three-node cluster: nesting that used to
//! overflow the frontend's stack (conditions in the query string and in bodies, deep documents),
//! work that used to be quadratic (globs, removes) measured in the frontend's CPU time while
//! `/healthz` keeps answering, the memory budget for buffered bodies under many slow uploads,
//! multi-member gzip bodies, and integer arithmetic at the 64-bit edges.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{curl, file_with, Cluster, CurlResponse};
use serde_json::{json, Value};

fn send(cluster: &Cluster, method: &str, path: &str, body: Option<&[u8]>) -> CurlResponse {
    common::json_request(cluster, method, path, body)
}

fn send_json(cluster: &Cluster, method: &str, path: &str, body: &Value) -> CurlResponse {
    send(cluster, method, path, Some(body.to_string().as_bytes()))
}

fn assert_status(r: &CurlResponse, status: u16, what: &str) {
    assert_eq!(
        r.status,
        status,
        "{what}: {}",
        String::from_utf8_lossy(&r.body)
    );
}

fn healthy(cluster: &Cluster) -> bool {
    let url = cluster.url("/healthz");
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
            &url,
        ])
        .output()
        .expect("curl is installed");
    out.stdout == b"200"
}

/// User plus system CPU time a process has used, from /proc.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // Linux reports in USER_HZ, which is 100 on every architecture Larder runs on.
    Duration::from_millis(ticks * 10)
}

fn nested(depth: usize, inner: &str) -> String {
    format!("{}{inner}{}", "(".repeat(depth), ")".repeat(depth))
}

#[test]
fn deep_nesting_is_refused_and_the_frontend_stays_up() {
    let cluster = Cluster::start(3, 4);
    let doc = "/document/v1/ns/t/docid/a";
    // The condition of issue 12: 2,000 parentheses overflowed the worker's stack.
    let condition = nested(2_000, "t.x").replace('(', "%28").replace(')', "%29");
    let r = send(
        &cluster,
        "DELETE",
        &format!("{doc}?dryRun=true&condition={condition}"),
        None,
    );
    assert_status(&r, 400, "deep condition in the query string");
    assert!(r.json()["message"]
        .as_str()
        .unwrap()
        .contains("nests deeper"));
    assert!(healthy(&cluster), "frontend died");

    // The same in feed bodies (a put's and an update's "condition").
    let deep = nested(2_000, "t.x");
    let put = json!({"condition": deep, "fields": {"x": 1}});
    assert_status(
        &send_json(&cluster, "POST", doc, &put),
        400,
        "put condition",
    );
    let update = json!({"condition": deep, "fields": {"x": {"assign": 2}}});
    assert_status(
        &send_json(&cluster, "PUT", doc, &update),
        400,
        "update condition",
    );
    let not = format!("{}t.x", "not ".repeat(5_000));
    let update = json!({"condition": not, "fields": {"x": {"assign": 2}}});
    assert_status(&send_json(&cluster, "PUT", doc, &update), 400, "not chain");
    assert!(healthy(&cluster), "frontend died");

    // A 100,000-deep document was stored, and every later update of it was a 500.
    let deep_doc = format!(
        r#"{{"fields":{{"f":{}1{}}}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let r = send(&cluster, "POST", doc, Some(deep_doc.as_bytes()));
    assert_status(&r, 400, "deep document");
    let deep_update = format!(
        r#"{{"fields":{{"f":{{"assign":{}1{}}}}}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let r = send(
        &cluster,
        "PUT",
        &format!("{doc}?create=true"),
        Some(deep_update.as_bytes()),
    );
    assert_status(&r, 400, "deep update");
    // A document at the limit is accepted, and can be updated and read.
    let at_limit = format!(
        r#"{{"fields":{{"f":{}1{}}}}}"#,
        "[".repeat(63),
        "]".repeat(63)
    );
    assert_status(
        &send(&cluster, "POST", doc, Some(at_limit.as_bytes())),
        200,
        "at limit",
    );
    let bump = json!({"fields": {"n": {"increment": 1}}});
    assert_status(
        &send_json(&cluster, "PUT", doc, &bump),
        200,
        "update at limit",
    );
    let r = send(&cluster, "GET", doc, None);
    assert_status(&r, 200, "read at limit");
    assert_eq!(r.json()["fields"]["n"], json!(1));
    assert!(healthy(&cluster), "frontend died");
}

#[test]
fn pathological_globs_and_removes_cost_little_cpu_and_others_are_served() {
    let cluster = Cluster::start(3, 4);
    let pid = cluster.frontend_pid();
    let doc = "/document/v1/ns/t/docid/big";
    let text = "a".repeat(1 << 20);
    let items: Vec<u32> = (0..40_000).collect();
    let put = json!({"fields": {"text": text, "items": items}});
    assert_status(&send_json(&cluster, "POST", doc, &put), 200, "put");

    // Quadratic for a backtracking matcher: every position of the text matched ~1,000
    // characters before failing. Four at once: more than the frontend's async workers.
    let patterns = [
        format!("*{}b*", "a".repeat(998)),
        format!("*{}b*", "a?".repeat(499)),
    ];
    let before = cpu_time(pid);
    let slowest_health = std::thread::scope(|scope| {
        let mut running = Vec::new();
        for i in 0..4 {
            let pattern = &patterns[i % 2];
            let cluster = &cluster;
            running.push(scope.spawn(move || {
                let update = json!({
                    "condition": format!("t.text = '{pattern}'"),
                    "fields": {"n": {"increment": 1}},
                });
                let r = send_json(cluster, "PUT", doc, &update);
                assert_status(&r, 412, "glob does not match");
            }));
        }
        let mut slowest = Duration::ZERO;
        while running.iter().any(|t| !t.is_finished()) {
            let started = Instant::now();
            assert!(healthy(&cluster), "healthz failed");
            slowest = slowest.max(started.elapsed());
            std::thread::sleep(Duration::from_millis(50));
        }
        running.into_iter().for_each(|t| t.join().unwrap());
        slowest
    });
    let glob_cpu = cpu_time(pid) - before;
    // Generous bounds: the quadratic matcher used tens of seconds of CPU here and held both
    // workers, so /healthz waited as long.
    assert!(
        glob_cpu < Duration::from_secs(8),
        "globs used {glob_cpu:?} of CPU"
    );
    assert!(
        slowest_health < Duration::from_secs(2),
        "/healthz took {slowest_health:?}"
    );

    // Remove 40,000 elements from 40,000: pairwise comparison took seconds of CPU.
    let before = cpu_time(pid);
    let remove = json!({"fields": {"items": {"remove": items}}});
    assert_status(&send_json(&cluster, "PUT", doc, &remove), 200, "remove");
    let remove_cpu = cpu_time(pid) - before;
    assert!(
        remove_cpu < Duration::from_secs(3),
        "remove used {remove_cpu:?} of CPU"
    );
    let r = send(&cluster, "GET", doc, None);
    assert_eq!(r.json()["fields"]["items"], json!([]));
    // A field as a glob pattern would be compiled per evaluation: refused.
    let update = json!({"condition": "t.text = t.other", "fields": {"n": {"increment": 1}}});
    assert_status(
        &send_json(&cluster, "PUT", doc, &update),
        400,
        "field as pattern",
    );
}

const BUDGET: &str = "[documents]\nmax_document_size = \"1 MiB\"\n\
    [limits]\nbuffered_bodies_per_connection = \"4 MiB\"\nbuffered_bodies_per_process = \"6 MiB\"\n";

/// One slow upload: a ~900 KiB document in 64 KiB pieces, `pause` apart. Returns the status
/// and whether a `Retry-After` came with it.
async fn slow_put(
    sender: hyper::client::conn::http2::SendRequest<common::stream::Body>,
    url: String,
    pause: Duration,
) -> (u16, bool) {
    use futures_util::StreamExt;
    use http_body_util::{BodyExt, StreamBody};
    // Generated as sent: a thousand of these must not fill the test's own memory.
    static FILLER: [u8; 64 << 10] = [b'x'; 64 << 10];
    let pieces = std::iter::once(Bytes::from_static(br#"{"fields":{"f":""#))
        .chain(std::iter::repeat_n(Bytes::from_static(&FILLER), 14))
        .chain(std::iter::once(Bytes::from_static(br#""}}"#)));
    let stream = futures_util::stream::iter(pieces).then(move |piece| async move {
        tokio::time::sleep(pause).await;
        Ok::<_, common::stream::BoxError>(hyper::body::Frame::data(piece))
    });
    let request = http::Request::post(url)
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .unwrap();
    let response = sender.clone().send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response.headers().contains_key("retry-after");
    let _ = response.into_body().collect().await;
    (status, retry_after)
}

#[test]
fn buffered_bodies_stay_within_their_budget() {
    let cluster = Cluster::start_with(3, 4, BUDGET);
    let pid = cluster.frontend_pid();
    let before = common::rss_kib(pid);
    let addr = cluster.frontend_addr;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let results = runtime.block_on(async {
        let watch = {
            let peak = peak.clone();
            tokio::spawn(async move {
                loop {
                    peak.fetch_max(common::rss_kib(pid), std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        // 5 connections x 200 streams x 900 KiB: 880 MiB the frontend would have buffered.
        let mut uploads = Vec::new();
        for c in 0..5 {
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (sender, connection) =
                hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .max_concurrent_reset_streams(1000)
                    .handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(connection);
            for s in 0..200 {
                let url = format!("http://{addr}/document/v1/ns/t/docid/slow-{c}-{s}");
                let pause = Duration::from_millis(40);
                uploads.push(tokio::spawn(slow_put(sender.clone(), url, pause)));
            }
        }
        let mut results = Vec::new();
        for upload in uploads {
            results.push(upload.await.unwrap());
        }
        watch.abort();
        results
    });
    let grown_mib = peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(before)
        >> 10;
    eprintln!("frontend RSS grew by {grown_mib} MiB at most");
    let refused = results.iter().filter(|(s, _)| *s == 429).count();
    let stored = results.iter().filter(|(s, _)| *s == 200).count();
    assert!(refused > 0, "no upload was refused: {results:?}");
    assert!(stored > 0, "no upload completed: {results:?}");
    assert_eq!(
        refused + stored,
        results.len(),
        "only 200 and 429: {results:?}"
    );
    assert!(
        results.iter().all(|(s, retry)| *s != 429 || *retry),
        "429 without Retry-After"
    );
    // What may legitimately grow: the 6 MiB budget, plus what h2 accepts before the frontend
    // reads (each connection's receive window, 16 MiB by default, 5 connections: 80 MiB), plus
    // some tens for the storage writes and the allocator's retained pages (it keeps freed pages
    // for 10 s). Without a budget, the 1,000 bodies add hundreds of MiB (880 MiB of uploads).
    const CONNECTION_WINDOWS_MIB: u64 = 5 * 16;
    let bound = 6 + CONNECTION_WINDOWS_MIB + 64;
    assert!(
        grown_mib < bound,
        "frontend RSS grew by {grown_mib} MiB (bound {bound})"
    );
    assert!(healthy(&cluster));
}

#[test]
fn gzip_members_and_integer_edges() {
    let cluster = Cluster::start(3, 4);
    let doc = "/document/v1/ns/t/docid/edges";
    // Two gzip members: the second used to be dropped (and the first alone is not JSON).
    let gz = |data: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    };
    let mut body = gz(br#"{"fields":{"u":18446744073709551614,"#);
    body.extend(gz(br#""i":9223372036854775807,"z":5}}"#));
    let dir = cluster.dir.path();
    let file = format!("@{}", file_with(dir, &body));
    let url = cluster.url(doc);
    let r = curl(
        dir,
        &[
            "-X",
            "POST",
            "-H",
            "Content-Encoding: gzip",
            "--data-binary",
            &file,
            &url,
        ],
    );
    assert_status(&r, 200, "two-member gzip");

    // Above i64::MAX stays an integer, exactly; past u64::MAX is a 400, never a float.
    let update = json!({"fields": {"u": {"increment": 1}, "i": {"increment": 1}}});
    assert_status(
        &send_json(&cluster, "PUT", doc, &update),
        200,
        "to the edges",
    );
    let r = send(&cluster, "GET", doc, None);
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert!(text.contains("\"u\":18446744073709551615"), "{text}");
    assert!(text.contains("\"i\":9223372036854775808"), "{text}");
    for (update, what) in [
        (json!({"fields": {"u": {"increment": 1}}}), "past u64::MAX"),
        (
            json!({"fields": {"u": {"multiply": 2}}}),
            "multiply past u64::MAX",
        ),
        (
            json!({"fields": {"z": {"decrement": u64::MAX}}}),
            "below i64::MIN",
        ),
        (json!({"fields": {"z": {"divide": 0}}}), "divide by zero"),
    ] {
        let r = send_json(&cluster, "PUT", doc, &update);
        assert_status(&r, 400, what);
    }
    let r = send(&cluster, "GET", doc, None);
    assert_eq!(
        r.json()["fields"]["z"],
        json!(5),
        "refused updates changed nothing"
    );
}
