//! Abuse resistance of the public listener, with a frame-level attacker (common/frames.rs) and a
//! raw-socket slowloris. For each attack: the attacker's connection is limited or closed, the
//! frontend's memory (VmRSS) stays bounded, and a well-behaved HTTP/2 client on another connection
//! keeps getting its blob throughout. Every attack is bounded in count and time.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::frames::*;
use common::h2::H2Client;
use common::{curl, file_with, random_bytes, rss_kib, Cluster};

/// Short timeouts so that the idle and slow-client defences act within the test's time bound.
const LIMITS: &str = "[limits]\nidle_timeout = \"2s\"\nheader_read_timeout = \"2s\"\n";
/// How much the frontend's RSS may grow during an attack.
const RSS_GROWTH_LIMIT_KIB: u64 = 64 * 1024;

struct Report {
    served: usize,
    failures: Vec<String>,
    slowest: Duration,
    rss_growth_kib: u64,
}

/// Starts a cluster, stores a blob, runs `attack` while a good client fetches the blob over its
/// own HTTP/2 connection every 10 ms and the frontend's RSS is sampled; then checks the good
/// client was served throughout and memory stayed bounded.
fn under_attack(attack: impl FnOnce(&Cluster)) {
    let cluster = Cluster::start_with(3, 4, LIMITS);
    let data = random_bytes(1024);
    let file = format!("@{}", file_with(cluster.dir.path(), &data));
    let put = curl(
        cluster.dir.path(),
        &["--data-binary", &file, &cluster.url("/v1/blobs")],
    );
    assert_eq!(put.status, 201);
    let path = format!("/v1/blobs/{}", put.json()["id"].as_str().unwrap());
    let pid = cluster.frontend_pid();
    let baseline = rss_kib(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let good = {
        let (stop, addr) = (stop.clone(), cluster.frontend_addr);
        std::thread::spawn(move || good_client(addr, &path, data, pid, &stop))
    };
    std::thread::sleep(Duration::from_millis(200));
    attack(&cluster);
    // And a while after the attacker was cut off.
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let mut report = good.join().unwrap();
    report.rss_growth_kib = report.rss_growth_kib.saturating_sub(baseline);
    assert!(
        report.failures.is_empty(),
        "good client failed: {:?}",
        report.failures
    );
    assert!(
        report.served >= 10,
        "good client served only {} times",
        report.served
    );
    assert!(
        report.slowest < Duration::from_secs(2),
        "good client waited {:?}",
        report.slowest
    );
    assert!(
        report.rss_growth_kib < RSS_GROWTH_LIMIT_KIB,
        "frontend RSS grew by {} KiB",
        report.rss_growth_kib
    );
    // New connections are still accepted after the attack.
    let after = curl(
        cluster.dir.path(),
        &["--http2-prior-knowledge", &cluster.url("/healthz")],
    );
    assert_eq!(after.status, 200);
}

fn good_client(
    addr: std::net::SocketAddr,
    path: &str,
    data: Vec<u8>,
    pid: u32,
    stop: &AtomicBool,
) -> Report {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = H2Client::connect(addr).await;
        let mut report = Report {
            served: 0,
            failures: Vec::new(),
            slowest: Duration::ZERO,
            rss_growth_kib: 0,
        };
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let fetch = client.request(http::Method::GET, path, bytes::Bytes::new());
            match tokio::time::timeout(Duration::from_secs(5), fetch).await {
                Ok((status, body)) if status == 200 && body == data => report.served += 1,
                Ok((status, _)) => report.failures.push(format!("status {status}")),
                Err(_) => report.failures.push("timed out".into()),
            }
            report.slowest = report.slowest.max(started.elapsed());
            report.rss_growth_kib = report.rss_growth_kib.max(rss_kib(pid));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        report
    })
}

/// Sends frames from `next` until it returns `None`, the server stops reading (a write blocks
/// for 2 s: backpressure), the connection breaks, or `limit` passes. Returns frames written.
fn flood(
    attacker: &mut RawH2,
    limit: Duration,
    mut next: impl FnMut(u32) -> Option<Vec<u8>>,
) -> u32 {
    let started = Instant::now();
    let mut sent = 0;
    let mut batch = Vec::new();
    while started.elapsed() < limit {
        batch.clear();
        for _ in 0..64 {
            match next(sent) {
                Some(bytes) => batch.extend_from_slice(&bytes),
                None => break,
            }
            sent += 1;
        }
        if batch.is_empty() || attacker.stream.write_all(&batch).is_err() {
            break;
        }
    }
    sent
}

fn wait_closed(attacker: &RawH2, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if attacker.closed() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn rapid_reset_gets_goaway_enhance_your_calm() {
    under_attack(|cluster| {
        let mut attacker = RawH2::connect(cluster.frontend_addr, true);
        let request = get("/healthz");
        let sent = flood(&mut attacker, Duration::from_secs(10), |i| {
            let id = 2 * i + 1;
            (i < 200_000).then(|| {
                let mut bytes = frame(HEADERS, END_STREAM | END_HEADERS, id, &request);
                bytes.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
                bytes
            })
        });
        assert!(
            wait_closed(&attacker, Duration::from_secs(5)),
            "attacker still connected after {sent} resets"
        );
        assert_eq!(
            attacker.goaway(),
            Some(ENHANCE_YOUR_CALM),
            "after {sent} resets"
        );
        assert!(sent < 200_000, "all {sent} rapid resets were accepted");
    });
}

#[test]
fn continuation_flood_is_cut_off() {
    under_attack(|cluster| {
        let mut attacker = RawH2::connect(cluster.frontend_addr, true);
        // A header whose value claims 100 MiB, then CONTINUATION frames that never end it.
        let mut block = get("/healthz");
        block.push(0x00);
        integer(&mut block, 5, 7, 0);
        block.extend_from_slice(b"x-big");
        integer(&mut block, 100 << 20, 7, 0);
        attacker.send(HEADERS, 0, 1, &block).unwrap();
        let chunk = vec![b'a'; 16_384];
        let sent = flood(&mut attacker, Duration::from_secs(10), |i| {
            (i < 6_400).then(|| frame(CONTINUATION, 0, 1, &chunk))
        });
        assert!(
            wait_closed(&attacker, Duration::from_secs(5)),
            "attacker still connected after {sent} CONTINUATIONs"
        );
        assert!(attacker.goaway().is_some(), "no GOAWAY");
        assert!(sent < 6_400, "the whole 100 MiB header block was accepted");
    });
}

#[test]
fn oversized_header_block_is_refused() {
    under_attack(|cluster| {
        let mut attacker = RawH2::connect(cluster.frontend_addr, true);
        // 100 KiB of headers (over the 64 KiB limit), correctly framed and ended.
        let big = "v".repeat(10_000);
        let mut fields = vec![
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/healthz"),
            (":authority", "localhost"),
        ];
        let names: Vec<String> = (0..10).map(|i| format!("x-filler-{i}")).collect();
        for name in &names {
            fields.push((name, &big));
        }
        let block = hpack(&fields);
        let mut chunks = block.chunks(16_384).peekable();
        let first = chunks.next().unwrap();
        attacker.send(HEADERS, END_STREAM, 1, first).unwrap();
        while let Some(chunk) = chunks.next() {
            let flags = if chunks.peek().is_none() {
                END_HEADERS
            } else {
                0
            };
            if attacker.send(CONTINUATION, flags, 1, chunk).is_err() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        // Refused one way or another: a 431, a stream reset, or a GOAWAY; never a 200.
        let answered_ok = attacker
            .frames_of(HEADERS)
            .iter()
            .any(|f| f.stream == 1 && f.payload.first() == Some(&0x88));
        assert!(!answered_ok, "an oversized request was served");
        let refused = !attacker.frames_of(HEADERS).is_empty()
            || !attacker.frames_of(RST_STREAM).is_empty()
            || attacker.goaway().is_some();
        assert!(refused, "no answer to an oversized header block");
        // curl sees the same limit as a 431 on both protocols.
        let huge = format!("x-huge: {}", "h".repeat(100_000));
        for flag in ["--http2-prior-knowledge", "--http1.1"] {
            let out = std::process::Command::new("curl")
                .args([
                    "-s",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    flag,
                    "-H",
                    &huge,
                ])
                .arg(cluster.url("/healthz"))
                .output()
                .unwrap();
            let code = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(code == "431" || code == "000", "{flag}: status {code}");
        }
    });
}

#[test]
fn ping_flood_is_throttled_by_backpressure() {
    under_attack(|cluster| {
        // Nobody reads the PONGs: the server must stop reading rather than queue them.
        let mut attacker = RawH2::connect(cluster.frontend_addr, false);
        let ping = frame(PING, 0, 0, &[7; 8]);
        let sent = flood(&mut attacker, Duration::from_secs(8), |i| {
            (i < 2_000_000).then(|| ping.clone())
        });
        assert!(
            sent < 2_000_000,
            "two million unanswered PINGs were all read"
        );
    });
}

#[test]
fn settings_flood_is_throttled_by_backpressure() {
    under_attack(|cluster| {
        let mut attacker = RawH2::connect(cluster.frontend_addr, false);
        let settings = frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]);
        let sent = flood(&mut attacker, Duration::from_secs(8), |i| {
            (i < 2_000_000).then(|| settings.clone())
        });
        assert!(
            sent < 2_000_000,
            "two million unacknowledged SETTINGS were all read"
        );
    });
}

#[test]
fn ten_thousand_abandoned_streams_are_refused_then_reaped() {
    under_attack(|cluster| {
        let mut attacker = RawH2::connect(cluster.frontend_addr, true);
        let upload = hpack(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/v1/blobs"),
            (":authority", "localhost"),
            ("content-length", "1000"),
        ]);
        // Open 10,000 uploads and never send a body byte.
        let sent = flood(&mut attacker, Duration::from_secs(10), |i| {
            (i < 10_000).then(|| frame(HEADERS, END_HEADERS, 2 * i + 1, &upload))
        });
        // Beyond the 1024-stream limit they are refused; the silent connection is then closed by
        // the idle timeout (2 s, then 2 s more to drop the held streams).
        assert!(
            wait_closed(&attacker, Duration::from_secs(10)),
            "attacker still connected after {sent} streams"
        );
        let refused = attacker.frames_of(RST_STREAM).len();
        assert!(
            refused > 0 || attacker.goaway().is_some(),
            "no stream was refused"
        );
    });
}

#[test]
fn slowloris_http1_connections_are_closed() {
    under_attack(|cluster| {
        let mut slow: Vec<std::net::TcpStream> = (0..200)
            .map(|_| {
                let mut s = std::net::TcpStream::connect(cluster.frontend_addr).unwrap();
                s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                    .unwrap();
                s
            })
            .collect();
        // One header byte a second from each: never completing the request head.
        let started = Instant::now();
        let mut open = slow.len();
        while open > 0 && started.elapsed() < Duration::from_secs(8) {
            std::thread::sleep(Duration::from_secs(1));
            open = slow
                .iter_mut()
                .filter(|s| (&**s).write_all(b"X").is_ok())
                .count();
        }
        // The 2 s header-read timeout closed them (a write after close fails once the RST is in).
        assert_eq!(
            open,
            0,
            "{open} slowloris connections still open after {:?}",
            started.elapsed()
        );
    });
}

/// An upload whose body stops arriving is answered 408 after `limits.body_read_timeout`, on
/// HTTP/2 while the same connection stays busy with other requests (so the idle timeout cannot
/// be what ends it), and on HTTP/1.1; the connection goes on serving.
#[test]
fn stalled_upload_bodies_get_408() {
    let cluster = Cluster::start_with(3, 4, "[limits]\nbody_read_timeout = \"1s\"\n");
    let addr = cluster.frontend_addr;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use http_body_util::{channel::Channel, BodyExt};
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let io = hyper_util::rt::TokioIo::new(stream);
        let (sender, connection) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .unwrap();
        tokio::spawn(connection);
        let (mut body_tx, body) = Channel::<bytes::Bytes, std::convert::Infallible>::new(1);
        let upload = http::Request::post(format!("http://{addr}/v1/blobs"))
            .header("content-length", "1000000")
            .body(body)
            .unwrap();
        let started = Instant::now();
        let response = tokio::spawn(sender.clone().send_request(upload));
        body_tx.send_data(vec![7u8; 1000].into()).await.unwrap();
        // Keep the connection busy while the upload stalls. (A dropped sender ends a body.)
        let healthz = || {
            let request = http::Request::get(format!("http://{addr}/healthz"))
                .body(Channel::<bytes::Bytes, std::convert::Infallible>::new(1).1)
                .unwrap();
            sender.clone().send_request(request)
        };
        while !response.is_finished() && started.elapsed() < Duration::from_secs(10) {
            assert_eq!(healthz().await.unwrap().status(), 200);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            response.is_finished(),
            "stalled HTTP/2 upload never answered"
        );
        let response = response.await.unwrap().unwrap();
        assert_eq!(response.status(), 408, "stalled HTTP/2 upload");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(900) && waited < Duration::from_secs(8),
            "answered after {waited:?} with a 1 s body-read timeout"
        );
        let text = response.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&text).contains("BodyTimeout"));
        drop(body_tx);
        assert_eq!(
            healthz().await.unwrap().status(),
            200,
            "connection still serves"
        );
    });

    let mut http1 = std::net::TcpStream::connect(addr).unwrap();
    http1
        .write_all(b"POST /v1/blobs HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
        .unwrap();
    http1
        .set_read_timeout(Some(Duration::from_secs(8)))
        .unwrap();
    let mut answer = [0u8; 12];
    std::io::Read::read_exact(&mut http1, &mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 408", "stalled HTTP/1.1 upload");
}

/// The windows the frontend advertises to clients are `[limits]`'s, not the storage pool's: a
/// pool tuned for storage nodes must not change what the public port lets clients send.
#[test]
fn public_flow_control_windows_come_from_limits() {
    let config = "[limits]\nstream_window = \"1 MiB\"\nconnection_window = \"2 MiB\"\n\
                  [pool]\nstream_window = \"8 MiB\"\nconnection_window = \"32 MiB\"\n";
    let cluster = Cluster::start_with(3, 4, config);
    let client = RawH2::connect(cluster.frontend_addr, true);
    let deadline = Instant::now() + Duration::from_secs(5);
    let (mut stream_window, mut connection_increment) = (None, None);
    while (stream_window.is_none() || connection_increment.is_none()) && Instant::now() < deadline {
        for settings in client.frames_of(SETTINGS) {
            for pair in settings.payload.chunks_exact(6) {
                if u16::from_be_bytes([pair[0], pair[1]]) == 0x4 {
                    stream_window = Some(u32::from_be_bytes(pair[2..6].try_into().unwrap()));
                }
            }
        }
        connection_increment = client
            .frames_of(8) // WINDOW_UPDATE
            .iter()
            .find(|f| f.stream == 0)
            .map(|f| u32::from_be_bytes(f.payload[..4].try_into().unwrap()) & 0x7fff_ffff);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(stream_window, Some(1 << 20), "SETTINGS_INITIAL_WINDOW_SIZE");
    assert_eq!(
        connection_increment,
        Some((2 << 20) - 65_535),
        "connection window raised to 2 MiB"
    );
}
