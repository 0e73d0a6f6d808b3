//! Command-line interface: parse, then hand typed values to the library crates.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use larder_cluster::{init_map, LayoutSpec};

use crate::{configs, dev, signals};

#[derive(Parser)]
#[command(
    name = "larder",
    version,
    about = "A blob and document store whose every hop is HTTP/2"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a whole local cluster (storage nodes as child processes, one frontend) on loopback.
    Dev(dev::DevArgs),
    /// Run a storage node.
    Storage {
        /// The node's TOML config (`larder config defaults` lists every setting).
        #[arg(long)]
        config: PathBuf,
    },
    /// Run a frontend.
    Frontend {
        /// The frontend's TOML config (`larder config defaults` lists every setting).
        #[arg(long)]
        config: PathBuf,
    },
    /// Cluster map commands.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Configuration commands.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Upload a file (or standard input) as a blob; prints its ID.
    Put(crate::blob_cmd::PutArgs),
    /// Download a blob to a file (or standard output).
    Get(crate::blob_cmd::GetArgs),
    /// Delete a blob (and, for a large one, its chunks).
    Delete(crate::blob_cmd::DeleteArgs),
    /// Load generators for the benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Feed Vespa feed-format operations (JSON array or JSON lines) to a /document/v1 endpoint.
    Feed(crate::feed::FeedArgs),
    /// Visit documents from a /document/v1 endpoint in parallel slices, as JSON lines.
    Visit(crate::visit::VisitArgs),
    /// A storage node's compaction: garbage per replica, and compacting it now.
    #[command(subcommand)]
    Compaction(crate::compaction_cmd::CompactionCommand),
    /// The S3 API: access keys.
    #[command(subcommand)]
    S3(crate::s3_cmd::S3Command),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// GET blobs by ID over one HTTP/2 connection; prints latency percentiles as JSON.
    Get(crate::bench::BenchGetArgs),
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Write a balanced cluster map.
    Init(InitArgs),
    #[command(flatten)]
    Change(crate::cluster_cmd::ClusterChange),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print every configuration setting with its default value.
    Defaults,
}

#[derive(Args)]
pub struct InitArgs {
    /// Storage nodes (dealt round-robin to the datacenters).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Partitions: the units of placement and replication.
    #[arg(long, default_value_t = 32)]
    partitions: u32,
    /// Replicas of each partition in each datacenter.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Comma-separated datacenter names.
    #[arg(long, default_value = "dc1", value_delimiter = ',')]
    datacenters: Vec<String>,
    /// Node i listens on HOST:(BASE_PORT + i).
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Port of the first node; the others follow.
    #[arg(long, default_value_t = 7101)]
    base_port: u16,
    /// Where to write the map.
    #[arg(long, short, default_value = "cluster.toml")]
    output: PathBuf,
    /// Replace an existing map at --output (its partitions would all move: only for a cluster
    /// that holds no data yet).
    #[arg(long)]
    force: bool,
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Dev(args) => dev::run(args),
        Command::Storage { config } => run_storage(&config),
        Command::Frontend { config } => run_frontend(&config),
        Command::Cluster(ClusterCommand::Init(args)) => cluster_init(args),
        Command::Cluster(ClusterCommand::Change(command)) => crate::cluster_cmd::run(command),
        Command::Bench(BenchCommand::Get(args)) => crate::bench::run(args),
        Command::Put(args) => crate::blob_cmd::put(args),
        Command::Get(args) => crate::blob_cmd::get(args),
        Command::Delete(args) => crate::blob_cmd::delete(args),
        Command::Feed(args) => std::process::exit(crate::feed::run(args)?),
        Command::Visit(args) => std::process::exit(crate::visit::run(args)?),
        Command::Compaction(command) => crate::compaction_cmd::run(command),
        Command::S3(command) => crate::s3_cmd::run(command),
        Command::Config(ConfigCommand::Defaults) => print_defaults(),
    }
}

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn run_storage(path: &std::path::Path) -> anyhow::Result<()> {
    let (config, map) = configs::storage(path)?;
    let node = map
        .node(&config.node_id)
        .with_context(|| format!("node {:?} is not in the cluster map", config.node_id))?;
    let addr = config.listen.unwrap_or(node.address);
    runtime()?.block_on(async move {
        // Handlers first: once the port answers, SIGHUP must reload, not kill (its default).
        // The node binds its port itself, once its replicas are open.
        let signals = signals::storage();
        larder_storage::serve(config, map, addr, signals)
            .await
            .map_err(anyhow::Error::msg)
    })
}

fn run_frontend(path: &std::path::Path) -> anyhow::Result<()> {
    let (config, map) = configs::frontend(path)?;
    runtime()?.block_on(async move {
        let signals = signals::frontend();
        let listeners = bind_frontend(&config).await?;
        larder_frontend::serve(config, map, listeners, signals)
            .await
            .map_err(anyhow::Error::msg)
    })
}

async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))
}

/// The cleartext listener, and the TLS one when the config has `[tls]`.
pub async fn bind_frontend(
    config: &larder_frontend::FrontendConfig,
) -> anyhow::Result<larder_frontend::Listeners> {
    let tls = match &config.tls {
        Some(tls) => Some(bind(tls.listen).await?),
        None => None,
    };
    let s3 = match &config.s3 {
        Some(s3) => Some(bind(s3.listen).await?),
        None => None,
    };
    let s3_tls = match config.s3.as_ref().and_then(|s3| s3.tls_listen) {
        Some(addr) => Some(bind(addr).await?),
        None => None,
    };
    Ok(larder_frontend::Listeners {
        cleartext: bind(config.listen).await?,
        tls,
        s3,
        s3_tls,
    })
}

fn cluster_init(args: InitArgs) -> anyhow::Result<()> {
    // Checked first, so that nothing is generated for a map that will not be written.
    anyhow::ensure!(
        args.force || !args.output.exists(),
        "{} already exists; a new map would move every partition of the cluster it describes \
         (pass --force to replace it, or --output to write elsewhere)",
        args.output.display()
    );
    let spec = LayoutSpec {
        datacenters: args.datacenters,
        node_addresses: (0..args.nodes)
            .map(|i| nth_address(SocketAddr::new(args.host, args.base_port), i))
            .collect::<anyhow::Result<_>>()?,
        partitions: args.partitions,
        replicas_per_datacenter: args.replicas,
    };
    let map = init_map(&spec)?;
    map.save(&args.output)?;
    println!(
        "wrote {} ({} nodes, {} partitions)",
        args.output.display(),
        map.nodes.len(),
        map.partitions.len()
    );
    let (secret, written) = configs::ensure_secret_next_to(&args.output)?;
    if written {
        println!(
            "wrote {} (the cluster secret: copy it, mode 0600, to every node and frontend, and set [auth] secret_file)",
            secret.display()
        );
    }
    Ok(())
}

/// `first` with its port moved up by `i`: the address of the i-th of consecutive listeners.
pub fn nth_address(first: SocketAddr, i: usize) -> anyhow::Result<SocketAddr> {
    let port = u16::try_from(i)
        .ok()
        .and_then(|i| first.port().checked_add(i))
        .with_context(|| format!("{first} + {i} ports is past port 65535"))?;
    Ok(SocketAddr::new(first.ip(), port))
}

/// Sections without defaults (absent means off), shown so that `config defaults` lists every key.
const OPTIONAL_SECTIONS: &str = "\
# Optional sections (absent: off). Paths are relative to the config file.
# Frontend: a TLS port next to the cleartext one (ALPN h2 and http/1.1); SIGHUP re-reads cert/key.
#   [tls]
#   listen = \"0.0.0.0:8443\"
#   cert = \"tls/frontend.pem\"
#   key = \"tls/frontend-key.pem\"
# Frontend: mutual TLS to the storage nodes; SIGHUP re-reads ca/cert/key for new connections.
#   [pool.tls]
#   ca = \"tls/ca.pem\"
#   cert = \"tls/frontend-client.pem\"
#   key = \"tls/frontend-client-key.pem\"
# Storage node: mutual TLS (only clients with a certificate from the CA are served); SIGHUP
# re-reads ca/cert/key here and in the storage node's [pool.tls] (replication from peers).
#   [tls]
#   ca = \"tls/ca.pem\"
#   cert = \"tls/storage.pem\"
#   key = \"tls/storage-key.pem\"
# Frontend: the S3-compatible API on its own port (HTTP/1.1 and h2c); keys: `larder s3 key`.
#   [s3]
#   listen = \"127.0.0.1:9000\"
#   tls_listen = \"127.0.0.1:9443\"   # optional: S3 over TLS with [tls]'s certificate
#   replaced_blob_grace = \"15m\"
#   sweep_interval = \"1m\"";

/// Every setting with its default, on stdout. A reader that stops early (`| head`, an `awk`
/// that exits at its match) is not an error: a closed pipe ends the output quietly
/// (`println!` panicked on it, and a benchmark script's smoke run failed CI so).
fn print_defaults() -> anyhow::Result<()> {
    use std::io::Write;
    let frontend =
        toml::to_string_pretty(&larder_frontend::FrontendConfig::example()).expect("serialisable");
    let storage =
        toml::to_string_pretty(&larder_storage::StorageConfig::example()).expect("serialisable");
    let text = format!(
        "# Frontend (`larder frontend --config F`): every setting with its default.\n{frontend}\n\
         # Storage node (`larder storage --config F`): every setting with its default.\n{storage}\n\
         {OPTIONAL_SECTIONS}\n"
    );
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every subcommand, flag and argument of `larder` has a help line, so that `--help` explains
    /// everything it lists.
    #[test]
    fn every_command_flag_and_argument_has_help() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                let sub_path = format!("{path} {}", sub.get_name());
                if sub.get_name() != "help" && sub.get_about().is_none() {
                    missing.push(format!("{sub_path} (the command itself)"));
                }
                walk(sub, &sub_path, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "larder", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }
}
