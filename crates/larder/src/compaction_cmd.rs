//! `larder compaction status|run`: an operator's view of a storage node's compaction (garbage
//! per replica, lag) and its "compact now", over the internal API. Credentials come from a
//! storage node's config, as a peer's would: its cluster secret (`[auth] secret_file`), or its
//! `[pool.tls]` client certificate when the cluster runs mutual TLS.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use http_body_util::BodyExt;

use crate::configs;

#[derive(Subcommand)]
pub enum CompactionCommand {
    /// Show each replica's garbage ratio (as the last pass measured it) and compaction lag.
    Status(Target),
    /// Compact every replica of the node now (seal the active segment, rewrite every sealed
    /// segment holding any garbage); prints what each reclaimed.
    Run(RunArgs),
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    target: Target,
    /// Copy at most this many MB/s (10^6 bytes); default: as fast as the disk goes.
    #[arg(long)]
    rate: Option<u64>,
}

#[derive(Args)]
pub struct Target {
    /// A storage node's config (`larder dev` writes `<data-dir>/s1.toml`...): the cluster map
    /// and the credentials are taken from it.
    #[arg(long)]
    config: PathBuf,
    /// The node to ask: an id from the cluster map or an address; default the config's own node.
    #[arg(long, conflicts_with = "all")]
    node: Option<String>,
    /// Ask every node of the cluster map, one after the other.
    #[arg(long)]
    all: bool,
    /// Print the node's JSON answer instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(command: CompactionCommand) -> anyhow::Result<()> {
    let (target, method, path) = match &command {
        CompactionCommand::Status(t) => {
            (t, http::Method::GET, larder_proto::COMPACTION_PATH.into())
        }
        CompactionCommand::Run(run) => {
            let path = match run.rate {
                Some(rate) => format!("{}?rate_mb_per_s={rate}", larder_proto::COMPACTION_PATH),
                None => larder_proto::COMPACTION_PATH.to_owned(),
            };
            (&run.target, http::Method::POST, path)
        }
    };
    let (config, map) = configs::storage(&target.config)?;
    let nodes: Vec<(String, std::net::SocketAddr)> = if target.all {
        map.nodes
            .iter()
            .map(|n| (n.id.clone(), n.address))
            .collect()
    } else {
        let wanted = target.node.as_deref().unwrap_or(&config.node_id);
        let node = match map.nodes.iter().find(|n| n.id == wanted) {
            Some(node) => (node.id.clone(), node.address),
            None => {
                let addr = wanted
                    .parse()
                    .with_context(|| format!("{wanted:?} is neither a node id nor an address"))?;
                (wanted.to_owned(), addr)
            }
        };
        vec![node]
    };
    let credentials = match &config.auth.secret_file {
        Some(path) => Some(Arc::new(
            larder_auth::Credentials::load(path)
                .with_context(|| format!("loading the cluster secret {}", path.display()))?,
        )),
        None => None,
    };
    let pool = larder_pool::StoragePool::new(nodes.clone(), config.pool.clone(), credentials)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mut failed = false;
    for (id, addr) in &nodes {
        let (status, answer) = runtime
            .block_on(ask(&pool, id, method.clone(), &path))
            .with_context(|| format!("asking node {id} ({addr})"))?;
        failed |= !status.is_success();
        if target.json {
            println!("{answer}");
        } else {
            match &command {
                CompactionCommand::Status(_) => print_status(id, *addr, &answer),
                CompactionCommand::Run(_) => print_run(id, *addr, &answer),
            }
        }
    }
    anyhow::ensure!(!failed, "a node answered with an error (see above)");
    Ok(())
}

async fn ask(
    pool: &larder_pool::StoragePool,
    node: &str,
    method: http::Method,
    path: &str,
) -> anyhow::Result<(http::StatusCode, serde_json::Value)> {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .body(larder_pool::empty())?;
    let response = pool.send(node, request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    let answer = serde_json::from_slice(&body).with_context(|| {
        format!(
            "{status}: not JSON: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        )
    })?;
    Ok((status, answer))
}

/// Partitions in numeric order.
fn partitions(answer: &serde_json::Value) -> Vec<(u64, &serde_json::Value)> {
    let mut out: Vec<(u64, &serde_json::Value)> = answer["partitions"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(p, v)| Some((p.parse().ok()?, v)))
                .collect()
        })
        .unwrap_or_default();
    out.sort_by_key(|(p, _)| *p);
    out
}

fn mib(value: &serde_json::Value) -> String {
    match value.as_u64() {
        Some(bytes) => format!("{:.1}", bytes as f64 / (1 << 20) as f64),
        None => "-".into(),
    }
}

fn print_status(id: &str, addr: std::net::SocketAddr, answer: &serde_json::Value) {
    let enabled = answer["enabled"].as_bool().unwrap_or(false);
    println!(
        "node {id} ({addr}): background compaction {}, every {}s, segments past {} garbage, {} MB/s; \
         busy above {} requests; {}",
        if enabled { "on" } else { "off" },
        answer["interval_seconds"],
        answer["min_garbage_ratio"],
        answer["rate_mb_per_s"],
        answer["busy_requests"],
        if answer["running"].as_bool() == Some(true) {
            "a pass is running"
        } else {
            "idle"
        },
    );
    println!(
        "{:>9}  {:>7}  {:>11}  {:>10}  {:>11}  {:>9}",
        "partition", "garbage", "garbage MiB", "sealed MiB", "on disk MiB", "lag s"
    );
    for (p, v) in partitions(answer) {
        let ratio = v["garbage_ratio"]
            .as_f64()
            .map_or("-".into(), |r| format!("{:.1}%", r * 100.0));
        let last = &v["last_pass"];
        println!(
            "{p:>9}  {ratio:>7}  {:>11}  {:>10}  {:>11}  {:>9.0}{}",
            mib(&last["garbage_bytes"]),
            mib(&last["sealed_bytes"]),
            mib(&v["bytes_on_disk"]),
            v["lag_seconds"].as_f64().unwrap_or(0.0),
            v["last_error"]
                .as_str()
                .map_or(String::new(), |e| format!("  last pass failed: {e}")),
        );
    }
}

fn print_run(id: &str, addr: std::net::SocketAddr, answer: &serde_json::Value) {
    let mut reclaimed = 0;
    let mut copied = 0;
    let mut segments = 0;
    for (p, v) in partitions(answer) {
        if let Some(error) = v["error"].as_str() {
            println!("node {id}: partition {p} failed: {error}");
        }
        reclaimed += v["bytes_reclaimed"].as_u64().unwrap_or(0);
        copied += v["live_bytes_copied"].as_u64().unwrap_or(0);
        segments += v["segments_compacted"].as_u64().unwrap_or(0);
    }
    println!(
        "node {id} ({addr}): {segments} segments compacted, {reclaimed} bytes reclaimed, {copied} live bytes copied"
    );
}
