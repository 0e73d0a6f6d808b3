//! `larder feed`: arguments (named like vespa-feed-client's where they mean the same), validated
//! into a `larder_feed::FeedConfig`, then the feed and its summary.

use std::io::{BufRead, BufReader, IsTerminal};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

#[derive(Args)]
#[command(group = clap::ArgGroup::new("input").required(true).args(["file", "stdin"]))]
pub struct FeedArgs {
    /// The /document/v1 endpoint: https://host:port/ (TLS, HTTP/2 by ALPN) or
    /// http://127.0.0.1:8080/ (HTTP/2 with prior knowledge).
    #[arg(long)]
    endpoint: String,
    #[command(flatten)]
    tls: crate::client_tls::ClientTlsArgs,
    /// A feed file: a JSON array of operations or JSON lines.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Read the feed from standard input.
    #[arg(long)]
    stdin: bool,
    /// HTTP/2 connections to open.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Streams per connection: with --connections, the most operations in flight.
    #[arg(long, default_value_t = 256)]
    max_streams_per_connection: usize,
    /// Deadline of each operation in seconds, retries included.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// Retries of one operation after 503 or a transport error (429 retries until the timeout).
    #[arg(long, default_value_t = 10)]
    max_retries: u32,
    /// Extra request header, "Name: value" (repeatable).
    #[arg(long = "header")]
    headers: Vec<String>,
    /// Gzip request bodies: none, gzip (all), or auto (those over 512 bytes, vespa-feed-client's
    /// default). Saves bandwidth, costs client CPU.
    #[arg(long, value_enum, default_value_t = CompressionArg::None)]
    compression: CompressionArg,
    /// Print the full summary on stdout when done (as vespa-feed-client's --benchmark).
    #[arg(long)]
    benchmark: bool,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Show a progress line on stderr (default: when stderr is a terminal).
    #[arg(long)]
    progress: bool,
    /// Exit with status 1 when more than this many operations failed or input lines were malformed.
    #[arg(long, default_value_t = 0)]
    max_failures: u64,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum CompressionArg {
    None,
    Gzip,
    Auto,
}

/// Runs a feed; returns the process exit code.
pub fn run(args: FeedArgs) -> anyhow::Result<i32> {
    let mut config = larder_feed::FeedConfig::new(&args.endpoint)?;
    config.connections = args.connections.max(1);
    config.max_streams_per_connection = args.max_streams_per_connection.max(1);
    anyhow::ensure!(
        args.timeout.is_finite() && args.timeout > 0.0,
        "--timeout must be a positive number of seconds"
    );
    config.timeout = Duration::from_secs_f64(args.timeout);
    config.max_retries = args.max_retries;
    config.tls = args.tls.settings();
    config.compression = match args.compression {
        CompressionArg::None => larder_feed::Compression::None,
        CompressionArg::Gzip => larder_feed::Compression::Gzip,
        CompressionArg::Auto => larder_feed::Compression::Auto,
    };
    config.progress = args.progress || std::io::stderr().is_terminal();
    for header in &args.headers {
        config.add_header(header)?;
    }
    config.on_error = Some(Arc::new(|message: &str| eprintln!("{message}")));
    let input: Box<dyn BufRead + Send> = match &args.file {
        Some(path) => Box::new(BufReader::with_capacity(1 << 16, open_feed_file(path)?)),
        None => Box::new(BufReader::with_capacity(1 << 16, std::io::stdin())),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let summary = runtime.block_on(larder_feed::feed(config, input))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(exit_code(&summary, &args));
    }
    // Every error was printed on stderr as it happened: the text summary only counts them.
    let counts = larder_feed::Summary {
        errors: Vec::new(),
        ..summary.clone()
    };
    if args.benchmark {
        println!("{counts}");
    } else {
        eprintln!("{counts}");
    }
    Ok(exit_code(&summary, &args))
}

/// Opens the feed file before any connection is made; a directory is refused here (reading one
/// fails only later).
fn open_feed_file(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let is_dir = file.metadata().is_ok_and(|m| m.is_dir());
    anyhow::ensure!(
        !is_dir,
        "{} is a directory, not a feed file",
        path.display()
    );
    Ok(file)
}

fn exit_code(summary: &larder_feed::Summary, args: &FeedArgs) -> i32 {
    let failures = summary.failed + summary.malformed;
    if failures > args.max_failures {
        1
    } else {
        0
    }
}
