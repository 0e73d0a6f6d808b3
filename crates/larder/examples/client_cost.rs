//! What an HTTP/2 client exchange costs the client process, through hyper's client and through
//! h2 directly: the pool's share of a GET (issue 13). Many tasks share one connection to a
//! server (`hello_h2`), each sending `GET /1024` in a loop; prints the requests answered, their
//! rate and the CPU µs this process spent per request
//! (`benchmarks/cpu-per-request/client-exchange.sh` runs it).
//!
//! Usage: `client_cost ADDR hyper|h2 SECONDS TASKS`

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr: SocketAddr = args[1].parse().unwrap();
    let mode = args[2].clone();
    let seconds: u64 = args[3].parse().unwrap();
    let tasks: usize = args[4].parse().unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let uri: http::Uri = format!("http://{addr}/1024").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut handles = Vec::new();
    let (start_cpu, start) = (cpu_seconds(), Instant::now());
    if mode == "hyper" {
        let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        for _ in 0..tasks {
            let mut sender = sender.clone();
            let (uri, done) = (uri.clone(), done.clone());
            handles.push(tokio::spawn(async move {
                while Instant::now() < deadline {
                    let req = http::Request::get(uri.clone()).body(Empty::new()).unwrap();
                    let res = sender.send_request(req).await.unwrap();
                    let body = res.into_body().collect().await.unwrap().to_bytes();
                    assert_eq!(body.len(), 1024);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    } else {
        // hyper's client defaults, so that both read with the same windows (h2's own 64 KiB
        // windows also give it a small budget of small DATA frames: at 256 tasks it ends the
        // connection, ENHANCE_YOUR_CALM "too_many_data_frames").
        let (sender, conn) = h2::client::Builder::new()
            .initial_window_size(2 << 20)
            .initial_connection_window_size(5 << 20)
            .max_send_buffer_size(1 << 20)
            .handshake::<_, Bytes>(stream)
            .await
            .unwrap();
        tokio::spawn(conn);
        for _ in 0..tasks {
            let sender = sender.clone();
            let (uri, done) = (uri.clone(), done.clone());
            handles.push(tokio::spawn(async move {
                let mut sender = sender.ready().await.unwrap();
                while Instant::now() < deadline {
                    let req = http::Request::get(uri.clone()).body(()).unwrap();
                    sender = sender.ready().await.unwrap();
                    let (res, _) = sender.send_request(req, true).unwrap();
                    let res = res.await.unwrap();
                    let mut body = res.into_body();
                    let mut len = 0;
                    while let Some(chunk) = body.data().await {
                        let chunk = chunk.unwrap();
                        len += chunk.len();
                        let _ = body.flow_control().release_capacity(chunk.len());
                    }
                    assert_eq!(len, 1024);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    for h in handles {
        h.await.unwrap();
    }
    let (cpu, wall) = (cpu_seconds() - start_cpu, start.elapsed().as_secs_f64());
    let n = done.load(Ordering::Relaxed) as f64;
    println!(
        "{mode} requests={n} rate={:.0} client_us={:.2}",
        n / wall,
        cpu * 1e6 / n
    );
}
