//! `larder dev`: a whole cluster on loopback from one command. Storage nodes run as child
//! processes (so they can be killed and restarted like real ones); the frontend runs in this
//! process. Everything lives under one data directory and is found again after a restart.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::num::NonZeroUsize;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use larder_cluster::{init_map, ClusterMap, LayoutSpec};

use crate::dev_certs::{self, DevCerts};
use crate::{cli, configs, signals};

#[derive(Args)]
pub struct DevArgs {
    /// Where the cluster keeps its map, configs and data.
    #[arg(long, default_value = "larder-data")]
    data_dir: PathBuf,
    /// Address of the frontend (HTTP/1.1 and h2c).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Storage nodes, for a new cluster (an existing one keeps its map, with a warning);
    /// default 3 per datacenter.
    #[arg(long)]
    nodes: Option<usize>,
    /// Partitions (units of placement), for a new cluster; default 32.
    #[arg(long)]
    partitions: Option<u32>,
    /// Replicas of each partition in each datacenter, for a new cluster; default 3.
    #[arg(long)]
    replicas: Option<usize>,
    /// Comma-separated datacenter names, for a new cluster; default dc1. Each datacenter gets a
    /// frontend: the first on `--listen`, the next ones on the following ports.
    #[arg(long, value_delimiter = ',')]
    datacenters: Option<Vec<String>>,
    /// Run with TLS: a throwaway CA in <data-dir>/tls, mutual TLS between frontends and storage
    /// nodes (and between storage nodes), and an HTTPS port (ALPN h2, http/1.1) on each frontend.
    #[arg(long)]
    tls: bool,
    /// Address of the first frontend's HTTPS port (with --tls); the next ones follow.
    #[arg(long, default_value = "127.0.0.1:8443")]
    tls_listen: SocketAddr,
    /// Address of the first frontend's S3 API port (HTTP/1.1 and h2c; printed at start); the
    /// next ones follow. Port 0 (the default): a free port for each, so that several `larder
    /// dev` can run side by side. Keys: `larder s3 key create --config <data-dir>/frontend-dc1.toml`.
    #[arg(long, default_value = "127.0.0.1:0")]
    s3_listen: SocketAddr,
    /// Async worker threads of each storage node; default: the machine's cores shared among
    /// the nodes and the frontend, at least one each (see `worker_share`).
    #[arg(long)]
    node_threads: Option<NonZeroUsize>,
    /// Async worker threads of the frontend process; default: one per core.
    #[arg(long)]
    frontend_threads: Option<NonZeroUsize>,
    /// A TOML file of settings for every storage node (as in `larder storage`'s config:
    /// `[store]`, `[limits]`, ...), merged over the configs `larder dev` writes anew at each
    /// start, table by table: a key given here wins. Paths in it are relative to the data dir.
    #[arg(long, value_name = "FILE")]
    storage_settings: Option<PathBuf>,
    /// The same for every frontend (as in `larder frontend`'s config: `[s3]`, `[limits]`, ...).
    #[arg(long, value_name = "FILE")]
    frontend_settings: Option<PathBuf>,
}

pub fn run(args: DevArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data_dir = args.data_dir.canonicalize()?;
    let map = load_or_init_map(&args, &data_dir)?;
    let certs = match args.tls {
        true => {
            let ips: Vec<_> = map.nodes.iter().map(|n| n.address.ip()).collect();
            Some(dev_certs::ensure(&data_dir, &ips)?)
        }
        false => None,
    };
    // Also for a data dir made before the internal API required credentials.
    configs::ensure_secret_next_to(&data_dir.join("cluster.toml"))?;
    let storage_settings = load_settings(args.storage_settings.as_deref())?;
    let frontend_settings = load_settings(args.frontend_settings.as_deref())?;
    let storage = (certs.as_ref(), storage_settings.as_ref());
    let storage_configs = write_storage_configs(&map.nodes, &data_dir, storage)?;
    let frontend = (certs.as_ref(), frontend_settings.as_ref());
    let frontend_configs = write_frontend_configs(&map, &data_dir, &args, frontend)?;
    let node_threads = args
        .node_threads
        .map_or_else(|| worker_share(storage_configs.len()), NonZeroUsize::get);
    let mut children = Vec::new();
    for (node, config) in &storage_configs {
        children.push((node.clone(), spawn_storage(config, node_threads)?));
    }
    let children = Arc::new(Mutex::new(children));
    let stop = Arc::new(AtomicBool::new(false));
    let follower = {
        let (children, stop) = (children.clone(), stop.clone());
        std::thread::spawn(move || {
            let storage = (certs.as_ref(), storage_settings.as_ref());
            start_added_nodes(&data_dir, storage, node_threads, &children, &stop)
        })
    };
    let result = serve_frontends(&frontend_configs, &map, args.frontend_threads);
    stop.store(true, Ordering::Release);
    let _ = follower.join();
    stop_children(&mut children.lock().unwrap_or_else(|e| e.into_inner()));
    result
}

/// Starts a storage node process for every node added to the cluster map while `larder dev`
/// runs (`larder cluster add-node` / `replace-node` write the accepted map to
/// `<data-dir>/cluster.toml`), checking once a second until `stop`.
fn start_added_nodes(
    data_dir: &Path,
    storage: (Option<&DevCerts>, Option<&toml::Table>),
    node_threads: usize,
    children: &Mutex<Vec<(String, Child)>>,
    stop: &AtomicBool,
) {
    let path = data_dir.join("cluster.toml");
    let mut file = larder_cluster::FileWatch::seen_now(&path);
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_secs(1));
        let Some(Ok(map)) = file.changed(&path) else {
            continue;
        };
        let mut children = children.lock().unwrap_or_else(|e| e.into_inner());
        let added: Vec<_> = map
            .nodes
            .iter()
            .filter(|n| !children.iter().any(|(id, _)| *id == n.id))
            .cloned()
            .collect();
        let started = write_storage_configs(&added, data_dir, storage).and_then(|configs| {
            for (node, config) in configs {
                eprintln!("larder dev: starting storage node {node} (added to the cluster map)");
                children.push((node, spawn_storage(&config, node_threads)?));
            }
            Ok(())
        });
        if let Err(err) = started {
            eprintln!("larder dev: cannot start an added storage node: {err:#}");
        }
    }
}

fn load_or_init_map(args: &DevArgs, data_dir: &Path) -> anyhow::Result<ClusterMap> {
    let path = data_dir.join("cluster.toml");
    if path.exists() {
        eprintln!(
            "larder dev: using the existing cluster in {}",
            data_dir.display()
        );
        let map = ClusterMap::load(&path)?;
        warn_ignored_layout_flags(args, &map, data_dir);
        return Ok(map);
    }
    let datacenters = args
        .datacenters
        .clone()
        .unwrap_or_else(|| vec!["dc1".to_owned()]);
    let spec = LayoutSpec {
        node_addresses: free_loopback_addresses(
            args.nodes.unwrap_or(3 * datacenters.len()),
            &frontend_ports(args, datacenters.len()),
        )?,
        datacenters,
        partitions: args.partitions.unwrap_or(32),
        replicas_per_datacenter: args.replicas.unwrap_or(3),
    };
    let map = init_map(&spec)?;
    map.save(&path)?;
    Ok(map)
}

/// Layout flags shape a new cluster only: an existing map is kept (changing it would move every
/// partition), so a flag that asks for something else is named, with what the cluster has.
fn warn_ignored_layout_flags(args: &DevArgs, map: &ClusterMap, data_dir: &Path) {
    let names: Vec<String> = map.datacenters.iter().map(|d| d.name.clone()).collect();
    let replicas = map.partitions.first().map_or(0, |p| {
        let first_dc = names.first().map(String::as_str);
        p.replicas
            .iter()
            .filter(|r| map.datacenter_of(&r.node) == first_dc)
            .count()
    });
    let mismatches = [
        (
            "--nodes",
            args.nodes.map(|n| n.to_string()),
            map.nodes.len().to_string(),
        ),
        (
            "--partitions",
            args.partitions.map(|n| n.to_string()),
            map.partitions.len().to_string(),
        ),
        (
            "--replicas",
            args.replicas.map(|n| n.to_string()),
            replicas.to_string(),
        ),
        (
            "--datacenters",
            args.datacenters.as_ref().map(|d| d.join(",")),
            names.join(","),
        ),
    ];
    for (flag, asked, existing) in mismatches {
        if let Some(asked) = asked.filter(|asked| *asked != existing) {
            eprintln!(
                "larder dev: warning: {flag} {asked} ignored: the existing cluster in {} has {existing} \
                 (a cluster's layout is fixed when it is created; use a new --data-dir for another)",
                data_dir.display()
            );
        }
    }
}

/// The ports the frontends will listen on: `--listen`, `--tls-listen` and `--s3-listen`, one more of each per
/// further datacenter.
fn frontend_ports(args: &DevArgs, datacenters: usize) -> Vec<u16> {
    let following = |first: u16| (0..datacenters).filter_map(move |i| first.checked_add(i as u16));
    let mut ports: Vec<u16> = following(args.listen.port()).collect();
    ports.extend(following(args.tls_listen.port()));
    ports.extend(following(args.s3_listen.port()));
    ports
}

/// Asks the kernel for `n` free loopback ports (all held at once so they differ), none of them
/// one of `reserved`: a free port such as `--listen` can be handed out again by the kernel, and a
/// storage node on it would keep the frontend from starting.
fn free_loopback_addresses(n: usize, reserved: &[u16]) -> anyhow::Result<Vec<SocketAddr>> {
    let mut held = Vec::new();
    let mut out = Vec::new();
    while out.len() < n {
        let listener = StdListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        if !reserved.contains(&addr.port()) {
            out.push(addr);
        }
        held.push(listener);
    }
    Ok(out)
}

/// Every internal connection proves the cluster secret (with `--tls`, mutual TLS does and the
/// secret is unused, so the same cluster can be started either way).
fn auth_section() -> String {
    format!("\n[auth]\nsecret_file = {:?}\n", configs::SECRET_FILE)
}

/// A `[tls]`-style section naming a CA, a certificate and a key.
fn mutual_tls_section(header: &str, ca: &Path, (cert, key): &(PathBuf, PathBuf)) -> String {
    format!("\n[{header}]\nca = {ca:?}\ncert = {cert:?}\nkey = {key:?}\n")
}

/// Storage configs are rewritten on every start (`larder dev` owns them), so that `--tls` can be
/// switched on and off for the same cluster.
fn write_storage_configs(
    nodes: &[larder_cluster::Node],
    data_dir: &Path,
    (certs, settings): (Option<&DevCerts>, Option<&toml::Table>),
) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for node in nodes {
        let path = data_dir.join(format!("{}.toml", node.id));
        let mut text = format!(
            "node_id = {:?}\ncluster_map = \"cluster.toml\"\ndata_dir = {:?}\n",
            node.id, node.id
        );
        text.push_str(&auth_section());
        // A dev cluster's nodes come and go with the laptop: never rebuild them elsewhere.
        text.push_str("\n[redistribution]\nauto_replace_after = \"0s\"\n");
        if let Some(certs) = certs {
            // Served over mutual TLS, and replicating from peers over mutual TLS.
            text.push_str(&mutual_tls_section("tls", &certs.ca, &certs.storage));
            text.push_str(&mutual_tls_section("pool.tls", &certs.ca, &certs.storage));
        }
        std::fs::write(&path, with_settings(&text, settings)?)?;
        out.push((node.id.clone(), path));
    }
    Ok(out)
}

/// One frontend config per datacenter, on consecutive ports from `--listen` (and `--tls-listen`).
fn write_frontend_configs(
    map: &ClusterMap,
    data_dir: &Path,
    args: &DevArgs,
    (certs, settings): (Option<&DevCerts>, Option<&toml::Table>),
) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for (i, dc) in map.datacenters.iter().enumerate() {
        let next = |addr: SocketAddr| cli::nth_address(addr, i);
        let path = data_dir.join(format!("frontend-{}.toml", dc.name));
        let mut text = format!(
            "listen = \"{}\"\ncluster_map = \"cluster.toml\"\ndatacenter = {:?}\nupload_journal_dir = \"frontend-{}-uploads\"\n",
            next(args.listen)?,
            dc.name,
            dc.name
        );
        text.push_str(&auth_section());
        let s3 = match args.s3_listen.port() {
            0 => args.s3_listen,
            _ => next(args.s3_listen)?,
        };
        text.push_str(&format!("\n[s3]\nlisten = \"{s3}\"\n"));
        if let Some(certs) = certs {
            let (cert, key) = &certs.frontend;
            text.push_str(&format!(
                "\n[tls]\nlisten = \"{}\"\ncert = {cert:?}\nkey = {key:?}\n",
                next(args.tls_listen)?
            ));
            text.push_str(&mutual_tls_section(
                "pool.tls",
                &certs.ca,
                &certs.frontend_client,
            ));
        }
        std::fs::write(&path, with_settings(&text, settings)?)?;
        out.push(path);
    }
    Ok(out)
}

/// The settings of `--storage-settings` or `--frontend-settings`, read once at start.
fn load_settings(path: Option<&Path>) -> anyhow::Result<Option<toml::Table>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading settings {}", path.display()))?;
    let table = text
        .parse::<toml::Table>()
        .with_context(|| format!("parsing settings {}", path.display()))?;
    Ok(Some(table))
}

/// The config `text` with `settings` merged over it, table by table (a key of `settings`
/// wins); `text` itself without settings.
fn with_settings(text: &str, settings: Option<&toml::Table>) -> anyhow::Result<String> {
    let Some(settings) = settings else {
        return Ok(text.to_owned());
    };
    let mut config: toml::Table = text.parse()?;
    merge_tables(&mut config, settings);
    Ok(toml::to_string(&config)?)
}

/// Sets every key of `from` in `into`; where both hold a table, key by key.
fn merge_tables(into: &mut toml::Table, from: &toml::Table) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(toml::Value::Table(mine)), toml::Value::Table(theirs)) => {
                merge_tables(mine, theirs)
            }
            _ => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

/// Async worker threads for each of `nodes` storage node processes when the machine's cores
/// are shared by them and a frontend: `larder dev` runs them all on one machine, and a
/// runtime per process with a worker per core puts several times as many workers as cores
/// to wake and park each other (futex and epoll wake-ups were a sixth of a storage node's
/// CPU under GET; `benchmarks/cpu-per-request/STORAGE-WAKEUPS.md`).
fn worker_share(nodes: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    share_of(cores, nodes)
}

fn share_of(cores: usize, nodes: usize) -> usize {
    (cores / (nodes + 1)).max(1)
}

fn spawn_storage(config: &Path, worker_threads: usize) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("finding the larder binary")?;
    let mut command = Command::new(exe);
    command.arg("storage").arg("--config").arg(config);
    // tokio's multi-thread runtime reads its worker count from here (`cli::runtime`).
    command.env("TOKIO_WORKER_THREADS", worker_threads.to_string());
    // If this process dies without cleaning up (even by SIGKILL), the kernel tells the children.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
        .spawn()
        .with_context(|| format!("starting storage node {}", config.display()))
}

/// Runs one frontend per datacenter in this process until SIGTERM/SIGINT stops them all.
fn serve_frontends(
    config_paths: &[PathBuf],
    map: &ClusterMap,
    worker_threads: Option<NonZeroUsize>,
) -> anyhow::Result<()> {
    let configs = config_paths
        .iter()
        .map(|p| configs::frontend(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    wait_for_storage(map);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = worker_threads {
        runtime.worker_threads(threads.get());
    }
    runtime.enable_all().build()?.block_on(async move {
        // Listening before the banner: whoever reads it may stop us at once.
        let terminate = signals::terminate();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut frontends = Vec::new();
        for ((config, map), path) in configs.into_iter().zip(config_paths) {
            let reload = signals::reload();
            let listeners = cli::bind_frontend(&config).await?;
            print_urls(&listeners, &config.datacenter, path)?;
            let mut stop = stop_rx.clone();
            let shutdown = Box::pin(async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            });
            let signals = larder_frontend::Signals { shutdown, reload };
            frontends.push(tokio::spawn(larder_frontend::serve(
                config, map, listeners, signals,
            )));
        }
        terminate.await;
        let _ = stop_tx.send(true);
        for frontend in frontends {
            frontend.await?.map_err(anyhow::Error::msg)?;
        }
        Ok(())
    })
}

fn print_urls(
    listeners: &larder_frontend::Listeners,
    datacenter: &str,
    config_path: &Path,
) -> anyhow::Result<()> {
    let url = format!("http://{}", listeners.cleartext.local_addr()?);
    println!("Larder is running: {url}  (datacenter {datacenter}; HTTP/1.1 and h2c; Ctrl-C stops everything)");
    if let Some(tls) = &listeners.tls {
        let ca = config_path.with_file_name("tls").join("ca.pem");
        let https = format!("https://localhost:{}", tls.local_addr()?.port());
        println!("                   {https}  (HTTP/1.1 and HTTP/2 by ALPN; storage hops are mutual TLS)");
        println!("  curl -sS --cacert {} {https}/healthz", ca.display());
    }
    println!("  curl -sS --data-binary @README.md -H 'Content-Type: text/markdown' {url}/v1/blobs");
    println!("  curl -sS {url}/v1/blobs/<id>");
    if let Some(s3) = &listeners.s3 {
        let s3 = format!("http://{}", s3.local_addr()?);
        println!(
            "  S3 API: {s3}  (keys: larder s3 key create --config {} --grant '*:owner')",
            config_path.display()
        );
        println!("  aws --endpoint-url {s3} s3 ls");
    }
    Ok(())
}

/// Waits (up to 30 s) until every storage node accepts connections, so the first requests succeed.
fn wait_for_storage(map: &ClusterMap) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for node in &map.nodes {
        while std::net::TcpStream::connect_timeout(&node.address, Duration::from_millis(200))
            .is_err()
        {
            if Instant::now() > deadline {
                eprintln!(
                    "larder dev: storage node {} is not answering on {}",
                    node.id, node.address
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// SIGTERM to every child (a clean shutdown: sync and checkpoint), SIGKILL after 20 s.
fn stop_children(children: &mut [(String, Child)]) {
    for (_, child) in children.iter() {
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for (node, child) in children.iter_mut() {
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        eprintln!("larder dev: storage node {node} exited with {status}");
                    }
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    eprintln!("larder dev: storage node {node} did not stop; killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{share_of, with_settings};

    #[test]
    fn settings_are_merged_over_the_written_config_table_by_table() {
        let written = "node_id = \"s1\"\ndata_dir = \"s1\"\n\n[auth]\nsecret_file = \"x\"\n\n\
                       [pool.tls]\nca = \"ca.pem\"\n";
        assert_eq!(with_settings(written, None).unwrap(), written);
        let settings: toml::Table =
            "data_dir = \"elsewhere\"\n[store]\ndirect_cold_reads_from = 0\n\
                                     [pool.tls]\ncert = \"c.pem\"\n"
                .parse()
                .unwrap();
        let merged: toml::Table = with_settings(written, Some(&settings))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(merged["node_id"].as_str(), Some("s1"), "kept");
        assert_eq!(
            merged["data_dir"].as_str(),
            Some("elsewhere"),
            "the setting wins"
        );
        assert_eq!(merged["auth"]["secret_file"].as_str(), Some("x"));
        assert_eq!(
            merged["store"]["direct_cold_reads_from"].as_integer(),
            Some(0)
        );
        let tls = &merged["pool"]["tls"];
        assert_eq!(
            tls["ca"].as_str(),
            Some("ca.pem"),
            "a table is merged key by key"
        );
        assert_eq!(tls["cert"].as_str(), Some("c.pem"));
    }

    #[test]
    fn each_node_gets_its_share_of_the_cores_and_at_least_one_worker() {
        assert_eq!(share_of(2, 3), 1);
        assert_eq!(share_of(16, 3), 4);
        assert_eq!(share_of(64, 1), 32);
        assert_eq!(share_of(1, 5), 1);
    }
}
