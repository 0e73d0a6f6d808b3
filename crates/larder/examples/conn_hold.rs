//! The client of benchmark B6 (`benchmarks/b6-connections`): holds N connections to one server
//! (HTTP/1.1 or h2c with prior knowledge), idle, then drives requests across all of them, so the
//! benchmark can read the server's memory and allocations per idle connection and per request.
//!
//! Each connection is opened from one of `--sources` loopback addresses (127.0.0.2, .3, …), so
//! 16,384 connections (and the TIME_WAIT left by a previous run) never exhaust one address's
//! ephemeral ports, and sends one request before it counts as open (the server has then set it
//! up completely). Then the program prints `open <ok> <failed>` and obeys lines on stdin:
//!
//! - `get SECONDS` / `put SECONDS`: every connection sends one request after another (one in
//!   flight per connection) for that long; prints `done <2xx> <other> <errors>`.
//! - `close` (or end of input): drops every connection and exits.
//!
//! Usage: `conn_hold --connect 127.0.0.1:PORT --connections N --http 1|2 --get-path PATH
//! [--put-path PATH --put-method POST|PUT --put-size BYTES] [--sources 16]`

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper::{Method, Request};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpSocket;

struct Options {
    connect: SocketAddr,
    connections: usize,
    http2: bool,
    sources: u8,
    get_path: String,
    put_path: String,
    put_method: Method,
    put_body: Bytes,
}

enum Sender {
    Http1(http1::SendRequest<Full<Bytes>>),
    Http2(http2::SendRequest<Full<Bytes>>),
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    other: AtomicU64,
    errors: AtomicU64,
}

fn parse() -> anyhow::Result<Options> {
    let mut args = std::env::args().skip(1);
    let mut o = Options {
        connect: "127.0.0.1:8080".parse()?,
        connections: 1024,
        http2: true,
        sources: 16,
        get_path: "/".into(),
        put_path: "/".into(),
        put_method: Method::POST,
        put_body: Bytes::from(vec![b'x'; 1024]),
    };
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--connect" => o.connect = value.parse()?,
            "--connections" => o.connections = value.parse()?,
            "--http" => o.http2 = value == "2",
            "--sources" => o.sources = value.parse::<u8>()?.clamp(1, 200),
            "--get-path" => o.get_path = value,
            "--put-path" => o.put_path = value,
            "--put-method" => o.put_method = value.parse()?,
            "--put-size" => o.put_body = Bytes::from(vec![b'x'; value.parse()?]),
            _ => anyhow::bail!("unknown flag {flag}"),
        }
    }
    Ok(o)
}

async fn open(o: &Options, i: usize) -> anyhow::Result<Sender> {
    let source = Ipv4Addr::new(127, 0, 0, 2 + (i % usize::from(o.sources)) as u8);
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source.into(), 0))?;
    let stream = socket.connect(o.connect).await?;
    stream.set_nodelay(true)?;
    let io = TokioIo::new(stream);
    let mut sender = if o.http2 {
        let (sender, connection) = http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(connection);
        Sender::Http2(sender)
    } else {
        let (sender, connection) = http1::handshake(io).await?;
        tokio::spawn(connection);
        Sender::Http1(sender)
    };
    let status = send(o, &mut sender, false).await?;
    anyhow::ensure!(status < 300, "first request answered {status}");
    Ok(sender)
}

async fn send(o: &Options, sender: &mut Sender, put: bool) -> anyhow::Result<u16> {
    let (method, path, body) = match put {
        true => (o.put_method.clone(), &o.put_path, o.put_body.clone()),
        false => (Method::GET, &o.get_path, Bytes::new()),
    };
    // h2 takes the scheme and authority from the URI (its pseudo-headers; nginx refuses a
    // `host` header beside them); HTTP/1.1 wants the origin form and a `host` header.
    let request = match sender {
        Sender::Http2(_) => Request::builder().uri(format!("http://{}{}", o.connect, path)),
        Sender::Http1(_) => Request::builder()
            .uri(path.as_str())
            .header("host", o.connect.to_string()),
    }
    .method(method)
    .body(Full::new(body))?;
    let response = match sender {
        Sender::Http1(s) => {
            s.ready().await?;
            s.send_request(request).await?
        }
        Sender::Http2(s) => {
            s.ready().await?;
            s.send_request(request).await?
        }
    };
    let status = response.status().as_u16();
    response.into_body().collect().await?;
    Ok(status)
}

async fn drive(o: &Options, senders: &mut [Sender], put: bool, seconds: u64) -> Arc<Tally> {
    let tally = Arc::new(Tally::default());
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let each = senders.iter_mut().map(|sender| {
        let tally = tally.clone();
        async move {
            while Instant::now() < deadline {
                match send(o, sender, put).await {
                    Ok(s) if s < 300 => tally.ok.fetch_add(1, Ordering::Relaxed),
                    Ok(_) => tally.other.fetch_add(1, Ordering::Relaxed),
                    Err(_) => {
                        tally.errors.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                };
            }
        }
    });
    futures_util::future::join_all(each).await;
    tally
}

// One thread: the client takes one core at most and leaves the other to the server.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let o = parse()?;
    let opened: Vec<_> = stream::iter(0..o.connections)
        .map(|i| open(&o, i))
        .buffer_unordered(256)
        .collect()
        .await;
    let failed = opened.iter().filter(|r| r.is_err()).count();
    if let Some(Err(e)) = opened.iter().find(|r| r.is_err()) {
        eprintln!("conn_hold: a connection failed: {e:#}");
    }
    let mut senders: Vec<Sender> = opened.into_iter().filter_map(Result::ok).collect();
    println!("open {} {failed}", senders.len());
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let mut words = line.split_whitespace();
        let put = match words.next() {
            Some("get") => false,
            Some("put") => true,
            _ => break,
        };
        let seconds = words.next().and_then(|s| s.parse().ok()).unwrap_or(5);
        let t = drive(&o, &mut senders, put, seconds).await;
        println!(
            "done {} {} {}",
            t.ok.load(Ordering::Relaxed),
            t.other.load(Ordering::Relaxed),
            t.errors.load(Ordering::Relaxed)
        );
    }
    Ok(())
}
