//! `larder cluster add-node|drain-node|replace-node|cancel-moves|status|push-map`: changing a running
//! cluster's shape over the internal API. Credentials and the starting map come from a storage
//! node's config, as for `larder compaction`. A change is planned from the newest map any node
//! runs (`larder_cluster::plan`), sent to the map authority as a compare-and-set
//! (`PUT /internal/v1/map?change`), then to every node, and written to the config's map file.
//! The plan itself runs in the cluster (the authority completes moves as new replicas catch
//! up): this command can exit, or die, at any time after the change is accepted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use http_body_util::BodyExt;
use larder_cluster::{plan, ClusterMap, Node, Operation, ReplicaState};
use larder_pool::StoragePool;

use crate::configs;

#[derive(Subcommand)]
pub enum ClusterChange {
    /// Add a storage node and move a balanced share of its datacenter's replicas to it.
    AddNode(AddNodeArgs),
    /// Move every replica off a node (then it can be stopped).
    DrainNode(DrainArgs),
    /// Rebuild a dead node's replicas on a new node, from the surviving replicas.
    ReplaceNode(ReplaceArgs),
    /// Cancel every move to a node: its bootstrapping replicas go (their copies are deleted)
    /// and the replicas they were to replace stay.
    CancelMoves(CancelArgs),
    /// Map revision per node (and frontend), moves in progress, replicas per node.
    Status(StatusArgs),
    /// Offer a whole map file to the map authority (its revision must be the next one).
    PushMap(PushArgs),
}

#[derive(Args)]
pub struct Target {
    /// A storage node's config (`larder dev` writes `<data-dir>/s1.toml`...): the cluster map
    /// file and the credentials are taken from it, and the accepted map is written back to
    /// that map file.
    #[arg(long)]
    config: PathBuf,
}

#[derive(Args)]
pub struct AddNodeArgs {
    #[command(flatten)]
    target: Target,
    /// The new node's id ([A-Za-z0-9_-]).
    id: String,
    /// The new node's internal API address.
    #[arg(long)]
    address: SocketAddr,
    /// The new node's datacenter; default the first in the map.
    #[arg(long)]
    datacenter: Option<String>,
    /// Disk names of the new node (comma-separated); default disk0.
    #[arg(long, value_delimiter = ',', default_value = "disk0")]
    disk: Vec<String>,
}

#[derive(Args)]
pub struct DrainArgs {
    #[command(flatten)]
    target: Target,
    /// The node to empty.
    node: String,
}

#[derive(Args)]
pub struct ReplaceArgs {
    #[command(flatten)]
    target: Target,
    /// The dead node.
    dead: String,
    /// The new node's id.
    new: String,
    /// The new node's internal API address.
    #[arg(long)]
    address: SocketAddr,
    /// Disk names of the new node (comma-separated); default disk0.
    #[arg(long, value_delimiter = ',', default_value = "disk0")]
    disk: Vec<String>,
}

#[derive(Args)]
pub struct CancelArgs {
    #[command(flatten)]
    target: Target,
    /// The node the moves go to.
    node: String,
}

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    target: Target,
    /// A frontend's public URL (http://host:port) whose map revision to show; repeatable.
    #[arg(long)]
    frontend: Vec<String>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct PushArgs {
    #[command(flatten)]
    target: Target,
    /// The map file to offer.
    file: PathBuf,
}

/// One request to a node.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

pub fn run(command: ClusterChange) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match command {
            ClusterChange::Status(args) => status(args).await,
            ClusterChange::PushMap(args) => {
                let cluster = Cluster::connect(&args.target).await?;
                let map = ClusterMap::load(&args.file)?;
                cluster.change(map).await
            }
            ClusterChange::AddNode(args) => {
                let cluster = Cluster::connect(&args.target).await?;
                let datacenter = match args.datacenter {
                    Some(dc) => dc,
                    None => cluster.map.datacenters[0].name.clone(),
                };
                let node = Node {
                    id: args.id,
                    datacenter,
                    address: args.address,
                    disks: args.disk,
                };
                cluster.plan_and_change(&Operation::AddNode(node)).await
            }
            ClusterChange::DrainNode(args) => {
                let cluster = Cluster::connect(&args.target).await?;
                cluster
                    .plan_and_change(&Operation::DrainNode(args.node))
                    .await
            }
            ClusterChange::ReplaceNode(args) => {
                let cluster = Cluster::connect(&args.target).await?;
                let datacenter = cluster
                    .map
                    .datacenter_of(&args.dead)
                    .with_context(|| format!("node {:?} is not in the map", args.dead))?
                    .to_owned();
                let new = Node {
                    id: args.new,
                    datacenter,
                    address: args.address,
                    disks: args.disk,
                };
                let op = Operation::ReplaceNode {
                    dead: args.dead,
                    new,
                };
                cluster.plan_and_change(&op).await
            }
            ClusterChange::CancelMoves(args) => {
                let cluster = Cluster::connect(&args.target).await?;
                let next = plan(&cluster.map, &Operation::CancelMovesTo(args.node.clone()))?;
                let cancelled = bootstrapping(&cluster.map) - bootstrapping(&next);
                cluster.change(next).await?;
                println!(
                    "{cancelled} replica moves to {} cancelled; its copies of them are deleted",
                    args.node
                );
                Ok(())
            }
        }
    })
}

/// Replicas of the map that are bootstrapping (moves in progress).
fn bootstrapping(map: &ClusterMap) -> usize {
    map.partitions
        .iter()
        .flat_map(|p| &p.replicas)
        .filter(|r| r.state == ReplicaState::Bootstrapping)
        .count()
}

/// The cluster as the newest map any node runs shows it, and connections to its nodes.
struct Cluster {
    map: ClusterMap,
    pool: StoragePool,
    map_file: PathBuf,
    /// The config's `[redistribution] auto_replace_after` (zero: off).
    auto_replace_after: Duration,
}

impl Cluster {
    async fn connect(target: &Target) -> anyhow::Result<Cluster> {
        let (config, file_map) = configs::storage(&target.config)?;
        let credentials = match &config.auth.secret_file {
            Some(path) => Some(Arc::new(
                larder_auth::Credentials::load(path)
                    .with_context(|| format!("loading the cluster secret {}", path.display()))?,
            )),
            None => None,
        };
        let pool = StoragePool::new(addresses(&file_map), config.pool.clone(), credentials)?;
        let mut map = file_map;
        // The file may be behind the cluster: take the newest revision any node runs.
        for node in map.nodes.clone() {
            if let Ok(theirs) = fetch_map(&pool, &node.id).await {
                if theirs.revision > map.revision {
                    map = theirs;
                }
            }
        }
        pool.set_nodes(addresses(&map));
        Ok(Cluster {
            map,
            pool,
            map_file: config.cluster_map,
            auto_replace_after: config.redistribution.auto_replace_after,
        })
    }

    async fn plan_and_change(&self, op: &Operation) -> anyhow::Result<()> {
        let next = plan(&self.map, op)?;
        let moves = bootstrapping(&next);
        self.change(next).await?;
        println!(
            "{moves} replica moves started; `larder cluster status` shows their progress (they go on without this command)"
        );
        Ok(())
    }

    /// Offers `next` to the map authority; once accepted, to every node and the map file.
    async fn change(&self, next: ClusterMap) -> anyhow::Result<()> {
        next.validate()?;
        let pool = &self.pool;
        pool.set_nodes(addresses(&self.map).into_iter().chain(addresses(&next)));
        let text = next.to_toml();
        // The authority of the current map decides; when it is the dead node being replaced,
        // the authority of the new map does.
        let mut deciders: Vec<String> = self
            .map
            .authority()
            .map(str::to_owned)
            .into_iter()
            .collect();
        if let Some(after) = next
            .authority()
            .filter(|a| !deciders.iter().any(|d| d == a))
        {
            deciders.push(after.to_owned());
        }
        let mut refusals = Vec::new();
        let mut accepted_by = None;
        for node in &deciders {
            match put_map(pool, node, &text, true).await {
                Ok((status, _)) if status.is_success() => {
                    accepted_by = Some(node.clone());
                    break;
                }
                Ok((status, message)) => {
                    anyhow::bail!(
                        "the map authority {node} refused revision {}: {status}: {message}",
                        next.revision
                    )
                }
                Err(err) => refusals.push(format!("{node}: {err:#}")),
            }
        }
        let Some(authority) = accepted_by else {
            anyhow::bail!(
                "no map authority could be reached ({}); map changes wait for it, serving goes on",
                refusals.join("; ")
            );
        };
        println!(
            "map revision {} accepted by the map authority {authority}",
            next.revision
        );
        for node in next.nodes.iter().filter(|n| n.id != authority) {
            if let Err(err) = put_map(pool, &node.id, &text, false).await {
                // The authority keeps sending it until the node has it.
                eprintln!(
                    "node {} does not have it yet ({err:#}); the authority will retry",
                    node.id
                );
            }
        }
        let file_revision = ClusterMap::load(&self.map_file)
            .map(|m| m.revision)
            .unwrap_or(0);
        if file_revision < next.revision {
            next.save_durably(&self.map_file)?;
            println!("wrote {}", self.map_file.display());
        }
        Ok(())
    }
}

fn addresses(map: &ClusterMap) -> Vec<(String, SocketAddr)> {
    map.nodes
        .iter()
        .map(|n| (n.id.clone(), n.address))
        .collect()
}

async fn exchange(
    pool: &StoragePool,
    node: &str,
    request: http::Request<larder_pool::Body>,
) -> anyhow::Result<(http::StatusCode, Option<u64>, hyper::body::Bytes)> {
    let work = async {
        let response = pool.send(node, request).await?;
        let status = response.status();
        let revision = larder_proto::map_revision(response.headers());
        let limit = usize::try_from(larder_cluster::MAX_MAP_BYTES).unwrap_or(usize::MAX);
        let body = http_body_util::Limited::new(response.into_body(), limit)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .to_bytes();
        Ok::<_, anyhow::Error>((status, revision, body))
    };
    tokio::time::timeout(ASK_TIMEOUT, work)
        .await
        .with_context(|| format!("{node} did not answer within {ASK_TIMEOUT:?}"))?
}

async fn fetch_map(pool: &StoragePool, node: &str) -> anyhow::Result<ClusterMap> {
    let request = http::Request::get(larder_proto::MAP_PATH).body(larder_pool::empty())?;
    let (status, _, body) = exchange(pool, node, request).await?;
    anyhow::ensure!(status.is_success(), "{node} answered {status}");
    Ok(ClusterMap::from_toml(std::str::from_utf8(&body)?)?)
}

/// `PUT` of a map: a change (`?change`, the authority) or a distribution.
async fn put_map(
    pool: &StoragePool,
    node: &str,
    text: &str,
    change: bool,
) -> anyhow::Result<(http::StatusCode, String)> {
    let path = if change {
        format!("{}?change", larder_proto::MAP_PATH)
    } else {
        larder_proto::MAP_PATH.to_owned()
    };
    let request = http::Request::put(path).body(larder_pool::full(text.to_owned()))?;
    let (status, _, body) = exchange(pool, node, request).await?;
    let message = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
    Ok((status, message))
}

/// A bootstrapping replica's progress, as its node reports it.
struct Progress {
    state: String,
    done: Option<u64>,
    left: Option<u64>,
    at: Instant,
}

async fn progress(pool: &StoragePool, node: &str, partition: u32) -> Progress {
    let path = format!("/internal/v1/partitions/{partition}/replica");
    let answer = match http::Request::get(path).body(larder_pool::empty()) {
        Ok(request) => exchange(pool, node, request).await.ok(),
        Err(_) => None,
    };
    let value = answer
        .filter(|(status, ..)| status.is_success())
        .and_then(|(_, _, body)| serde_json::from_slice::<serde_json::Value>(&body).ok());
    Progress {
        state: value
            .as_ref()
            .and_then(|v| v["state"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "unknown".into()),
        done: value.as_ref().and_then(|v| v["bytes_done"].as_u64()),
        left: value.as_ref().and_then(|v| v["bytes_left"].as_u64()),
        at: Instant::now(),
    }
}

async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let cluster = Cluster::connect(&args.target).await?;
    let map = &cluster.map;
    let mut nodes = Vec::new();
    let mut down = Vec::new();
    let mut rebuilding = Vec::new();
    for node in &map.nodes {
        let request = http::Request::get(larder_proto::HEALTH_PATH).body(larder_pool::empty())?;
        let revision = match exchange(&cluster.pool, &node.id, request).await {
            Ok((_, revision, body)) => {
                rebuilding.extend(rebuilds_of(&node.id, &body));
                revision.map_or("?".into(), |r| r.to_string())
            }
            Err(_) => {
                down.push(node.id.clone());
                "down".to_owned()
            }
        };
        let count = |state: ReplicaState| {
            map.partitions
                .iter()
                .flat_map(|p| &p.replicas)
                .filter(|r| r.node == node.id && r.state == state)
                .count()
        };
        nodes.push(
            serde_json::json!({"id": node.id, "address": node.address.to_string(),
            "datacenter": node.datacenter, "map_revision": revision,
            "live": count(ReplicaState::Live), "bootstrapping": count(ReplicaState::Bootstrapping),
            "leaving": count(ReplicaState::Leaving)}),
        );
    }
    let moves = moves_in_progress(&cluster).await;
    let frontends: Vec<_> = args
        .frontend
        .iter()
        .map(|url| {
            serde_json::json!({"url": url, "map_revision": frontend_revision(url)
            .map_or_else(|e| format!("? ({e:#})"), |r| r.to_string())})
        })
        .collect();
    let auto_replace = auto_replace_report(&cluster, &down).await;
    let report = serde_json::json!({"map_revision": map.revision,
        "authority": map.authority(), "nodes": nodes, "moves": moves, "frontends": frontends,
        "auto_replace": auto_replace, "rebuilding": rebuilding});
    if args.json {
        println!("{report}");
        return Ok(());
    }
    print_status(&report);
    Ok(())
}

/// The replicas `node` is rebuilding from their peers (`rebuilding` in its health answer):
/// partition, phase, since when, and the bulk copy's bytes done and left once it started.
fn rebuilds_of(node: &str, health: &[u8]) -> Vec<serde_json::Value> {
    let Ok(health) = serde_json::from_slice::<serde_json::Value>(health) else {
        return Vec::new();
    };
    let Some(rebuilds) = health["rebuilding"].as_object() else {
        return Vec::new();
    };
    rebuilds
        .iter()
        .map(|(partition, r)| {
            serde_json::json!({"partition": partition.parse::<u32>().ok(), "node": node,
                "phase": r["phase"], "since": r["since"],
                "bytes_done": r["bytes_done"], "bytes_left": r["bytes_left"]})
        })
        .collect()
}

/// Automatic re-replication as this config sets it and the map authority reports it (its
/// `larder_storage_auto_replace_*` metrics), and for every node down now that still holds
/// replicas, whether they can be rebuilt on the other nodes (the plan the authority would make,
/// or why there is none).
async fn auto_replace_report(cluster: &Cluster, down: &[String]) -> serde_json::Value {
    let after = match cluster.auto_replace_after.is_zero() {
        true => "off".to_owned(),
        false => format!("{:?}", cluster.auto_replace_after),
    };
    let authority = match cluster.map.authority() {
        Some(node) => authority_metrics(&cluster.pool, node).await,
        None => serde_json::Value::Null,
    };
    let dead: Vec<serde_json::Value> = down
        .iter()
        .filter(|node| !cluster.map.replicas_on(node).is_empty())
        .map(|node| {
            let op = Operation::RebuildElsewhere {
                dead: node.clone(),
                unavailable: down.to_vec(),
            };
            let rebuild = match plan(&cluster.map, &op) {
                Ok(_) => "possible".to_owned(),
                Err(err) => format!("impossible: {err}"),
            };
            serde_json::json!({"node": node, "replicas": cluster.map.replicas_on(node).len(),
                "rebuild_elsewhere": rebuild})
        })
        .collect();
    serde_json::json!({"after": after, "authority": authority, "down_with_replicas": dead})
}

/// The authority's `larder_storage_auto_replace_*` metrics (null when it does not answer).
async fn authority_metrics(pool: &StoragePool, node: &str) -> serde_json::Value {
    let Ok(request) = http::Request::get(larder_proto::METRICS_PATH).body(larder_pool::empty())
    else {
        return serde_json::Value::Null;
    };
    let Ok((status, _, body)) = exchange(pool, node, request).await else {
        return serde_json::Value::Null;
    };
    if !status.is_success() {
        return serde_json::Value::Null;
    }
    let text = String::from_utf8_lossy(&body);
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
    };
    serde_json::json!({"node": node,
        "nodes_down": value("larder_storage_auto_replace_nodes_down"),
        "blocked": value("larder_storage_auto_replace_blocked"),
        "plans": value("larder_storage_auto_replace_plans_total")})
}

/// Every bootstrapping replica with bytes done and left, and a rate from two samples a second
/// apart.
async fn moves_in_progress(cluster: &Cluster) -> Vec<serde_json::Value> {
    let moving: Vec<(u32, String, Vec<String>)> = cluster
        .map
        .partitions
        .iter()
        .flat_map(|p| {
            let leaving: Vec<String> = p
                .replicas
                .iter()
                .filter(|r| r.state == ReplicaState::Leaving)
                .map(|r| r.node.clone())
                .collect();
            p.replicas
                .iter()
                .filter(|r| r.state == ReplicaState::Bootstrapping)
                .map(move |r| (p.id, r.node.clone(), leaving.clone()))
        })
        .collect();
    let mut first = Vec::new();
    for (p, node, _) in &moving {
        first.push(progress(&cluster.pool, node, *p).await);
    }
    if !moving.is_empty() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut out = Vec::new();
    for ((p, node, from), before) in moving.iter().zip(first) {
        let now = progress(&cluster.pool, node, *p).await;
        let rate = match (before.done, now.done) {
            (Some(a), Some(b)) if b >= a => {
                let secs = now.at.duration_since(before.at).as_secs_f64().max(0.001);
                Some((b - a) as f64 / secs)
            }
            _ => None,
        };
        out.push(serde_json::json!({"partition": p, "to": node, "from": from,
            "state": now.state, "bytes_done": now.done, "bytes_left": now.left,
            "bytes_per_second": rate.map(|r| r.round() as u64)}));
    }
    out
}

/// A frontend's map revision, from its `/v1/cluster` (HTTP/1.1, one request).
fn frontend_revision(url: &str) -> anyhow::Result<u64> {
    use std::io::{Read, Write};
    let authority = url
        .strip_prefix("http://")
        .context("only http:// frontend URLs")?
        .trim_end_matches('/');
    let addr: SocketAddr = authority
        .parse()
        .or_else(|_| {
            use std::net::ToSocketAddrs;
            authority
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| std::io::Error::other("no address"))
        })
        .with_context(|| format!("resolving {authority}"))?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, ASK_TIMEOUT)?;
    stream.set_read_timeout(Some(ASK_TIMEOUT))?;
    write!(
        stream,
        "GET /v1/cluster HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream.take(4 << 20).read_to_end(&mut answer)?;
    let text = String::from_utf8_lossy(&answer);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let start = body.find('{').context("no JSON in the answer")?;
    let end = body.rfind('}').context("no JSON in the answer")?;
    let value: serde_json::Value = serde_json::from_str(&body[start..=end])?;
    value["map_revision"]
        .as_u64()
        .context("the frontend does not report map_revision")
}

fn print_status(report: &serde_json::Value) {
    println!(
        "map revision {} (map authority {})",
        report["map_revision"],
        report["authority"].as_str().unwrap_or("none")
    );
    println!(
        "{:<10} {:<22} {:<8} {:>8} {:>5} {:>13} {:>7}",
        "node", "address", "dc", "revision", "live", "bootstrapping", "leaving"
    );
    for n in report["nodes"].as_array().into_iter().flatten() {
        println!(
            "{:<10} {:<22} {:<8} {:>8} {:>5} {:>13} {:>7}",
            n["id"].as_str().unwrap_or(""),
            n["address"].as_str().unwrap_or(""),
            n["datacenter"].as_str().unwrap_or(""),
            n["map_revision"].as_str().unwrap_or(""),
            n["live"],
            n["bootstrapping"],
            n["leaving"]
        );
    }
    for f in report["frontends"].as_array().into_iter().flatten() {
        println!(
            "frontend {}: map revision {}",
            f["url"].as_str().unwrap_or(""),
            f["map_revision"].as_str().unwrap_or("")
        );
    }
    print_auto_replace(&report["auto_replace"]);
    print_rebuilding(&report["rebuilding"]);
    let moves = report["moves"].as_array().cloned().unwrap_or_default();
    if moves.is_empty() {
        println!("no moves in progress");
        return;
    }
    println!("{} moves in progress:", moves.len());
    let mb = |v: &serde_json::Value| {
        v.as_u64()
            .map_or("-".to_owned(), |b| format!("{:.1} MB", b as f64 / 1e6))
    };
    for m in moves {
        println!(
            "  partition {:>4}: {} -> {} ({}), {} done, {} left, {}",
            m["partition"],
            m["from"]
                .as_array()
                .map(|f| f
                    .iter()
                    .filter_map(|v| v.as_str())
                    .collect::<Vec<_>>()
                    .join(","))
                .unwrap_or_default(),
            m["to"].as_str().unwrap_or(""),
            m["state"].as_str().unwrap_or(""),
            mb(&m["bytes_done"]),
            mb(&m["bytes_left"]),
            m["bytes_per_second"]
                .as_u64()
                .map_or("rate -".to_owned(), |r| format!(
                    "{:.1} MB/s",
                    r as f64 / 1e6
                )),
        );
    }
}

fn print_rebuilding(rebuilding: &serde_json::Value) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mb = |v: &serde_json::Value| {
        v.as_u64()
            .map_or("-".to_owned(), |b| format!("{:.1} MB", b as f64 / 1e6))
    };
    for r in rebuilding.as_array().into_iter().flatten() {
        let since = r["since"].as_u64().unwrap_or(now);
        println!(
            "rebuilding partition {} on {} from its peers ({}) for {}s, {} done, {} left",
            r["partition"],
            r["node"].as_str().unwrap_or(""),
            r["phase"].as_str().unwrap_or(""),
            now.saturating_sub(since),
            mb(&r["bytes_done"]),
            mb(&r["bytes_left"]),
        );
    }
}

fn print_auto_replace(auto: &serde_json::Value) {
    let after = auto["after"].as_str().unwrap_or("off");
    let authority = &auto["authority"];
    let count = |key: &str| authority[key].as_u64().unwrap_or(0);
    match (after, authority.is_null()) {
        ("off", _) => println!("automatic re-replication: off in this config"),
        (_, true) => println!("automatic re-replication after {after} (the map authority does not answer)"),
        (_, false) => println!(
            "automatic re-replication after {after}: the map authority {} sees {} node(s) down, {} blocked, {} plan(s) made",
            authority["node"].as_str().unwrap_or(""),
            count("nodes_down"),
            count("blocked"),
            count("plans"),
        ),
    }
    for dead in auto["down_with_replicas"].as_array().into_iter().flatten() {
        println!(
            "node {} is down and holds {} replicas; rebuilding them on the other nodes is {}",
            dead["node"].as_str().unwrap_or(""),
            dead["replicas"],
            dead["rebuild_elsewhere"].as_str().unwrap_or("")
        );
    }
}
