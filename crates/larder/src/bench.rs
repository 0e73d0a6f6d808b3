//! `larder bench get`: a latency-measuring GET load over HTTP/2, for the benchmarks that need
//! percentiles (h2load reports only mean and spread).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};

#[derive(Args)]
pub struct BenchGetArgs {
    /// Frontend base URL (h2c prior knowledge).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    endpoint: String,
    /// File with one blob ID per line; requests cycle through them.
    #[arg(long)]
    ids: PathBuf,
    /// Requests in flight at once (streams on one connection).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Total requests.
    #[arg(long, default_value_t = 1000)]
    requests: usize,
}

pub fn run(args: BenchGetArgs) -> anyhow::Result<()> {
    let ids: Vec<String> = std::fs::read_to_string(&args.ids)
        .with_context(|| format!("reading {}", args.ids.display()))?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    anyhow::ensure!(!ids.is_empty(), "no blob IDs in {}", args.ids.display());
    // Checked here, so that every request URI below is valid.
    for id in &ids {
        larder_client::blob_path(id).with_context(|| format!("in {}", args.ids.display()))?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(measure(&args, Arc::new(ids)))?;
    println!("{report}");
    Ok(())
}

async fn measure(args: &BenchGetArgs, ids: Arc<Vec<String>>) -> anyhow::Result<serde_json::Value> {
    let uri: hyper::Uri = args.endpoint.parse().context("endpoint is not a URL")?;
    let authority = uri.authority().context("endpoint has no host")?.to_string();
    let stream = tokio::net::TcpStream::connect(&authority).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(4 << 20)
        .initial_connection_window_size(16 << 20)
        .max_frame_size(1 << 20)
        .handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
        .await?;
    tokio::spawn(connection);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (sender, ids, next, total) = (sender.clone(), ids.clone(), next.clone(), args.requests);
        let base = args.endpoint.trim_end_matches('/').to_owned();
        workers.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut errors = 0usize;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let url = format!("{base}/v1/blobs/{}", ids[i % ids.len()]);
                let request = hyper::Request::get(url)
                    .body(Empty::<Bytes>::new())
                    .expect("an endpoint that parsed and a checked blob ID make a valid URI");
                let t = Instant::now();
                let ok = match sender.clone().send_request(request).await {
                    Ok(response) if response.status().is_success() => {
                        response.into_body().collect().await.is_ok()
                    }
                    _ => false,
                };
                if ok {
                    samples.push(t.elapsed());
                } else {
                    errors += 1;
                }
            }
            (samples, errors)
        }));
    }
    let mut samples: Vec<Duration> = Vec::new();
    let mut errors = 0;
    for worker in workers {
        let (s, e) = worker.await?;
        samples.extend(s);
        errors += e;
    }
    let elapsed = started.elapsed();
    samples.sort();
    let pct = |p: f64| {
        samples
            .get(((samples.len().max(1) - 1) as f64 * p) as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Ok(serde_json::json!({
        "requests": args.requests, "ok": samples.len(), "errors": errors,
        "seconds": elapsed.as_secs_f64(), "rps": samples.len() as f64 / elapsed.as_secs_f64(),
        "p50_ms": pct(0.50), "p95_ms": pct(0.95), "p99_ms": pct(0.99), "max_ms": pct(1.0),
    }))
}
