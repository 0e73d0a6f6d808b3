//! `larder visit`: arguments (named like `vespa visit`'s where they mean the same), validated
//! into a `larder_feed::VisitConfig`, then the visit and its summary.

use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

#[derive(Args)]
pub struct VisitArgs {
    /// The /document/v1 endpoint: https://host:port/ (TLS, HTTP/2 by ALPN) or
    /// http://127.0.0.1:8080/ (HTTP/2 with prior knowledge).
    #[arg(long)]
    endpoint: String,
    #[command(flatten)]
    tls: crate::client_tls::ClientTlsArgs,
    /// Independent slices visited in parallel (each one request in flight at a time).
    #[arg(long, default_value_t = 4)]
    slices: u32,
    /// Visit only this slice of --slices (0-based), as one of N processes that together visit
    /// everything once (Vespa's --slice-id).
    #[arg(long)]
    slice_id: Option<u32>,
    /// A document selection, e.g. "music.year > 2000 and id.namespace == 'ns'".
    #[arg(long)]
    selection: Option<String>,
    /// Fields to return: [all], [id], <type>:[document] or <type>:<field>,<field>.
    #[arg(long)]
    field_set: Option<String>,
    /// Visit only this namespace (with --doctype): /document/v1/<namespace>/<doctype>/docid.
    #[arg(long, requires = "doctype")]
    namespace: Option<String>,
    /// Visit only this document type (with --namespace).
    #[arg(long, requires = "namespace")]
    doctype: Option<String>,
    /// Vespa's content cluster name (needed by Vespa when it has several; Larder ignores it).
    #[arg(long)]
    cluster: Option<String>,
    /// Documents per page to ask the server for.
    #[arg(long)]
    wanted_document_count: Option<u32>,
    /// Ask for streamed pages (stream=true); --stream false asks for whole pages.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    stream: bool,
    /// Write the documents to this file (JSON lines) instead of standard output.
    #[arg(long)]
    output: Option<PathBuf>,
    /// HTTP/2 connections to open (at most one per slice).
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Deadline of each page in seconds, retries included.
    #[arg(long, default_value_t = 300.0)]
    timeout: f64,
    /// Retries of one page after 429, 503 or a transport error.
    #[arg(long, default_value_t = 10)]
    max_retries: u32,
    /// Extra request header, "Name: value" (repeatable).
    #[arg(long = "header")]
    headers: Vec<String>,
    /// Show a progress line on stderr (default: when stderr is a terminal).
    #[arg(long)]
    progress: bool,
    /// Print the summary as JSON (on stderr, or on stdout with --output).
    #[arg(long)]
    json: bool,
}

/// Runs a visit; returns the process exit code.
pub fn run(args: VisitArgs) -> anyhow::Result<i32> {
    let mut config = larder_feed::VisitConfig::new(&args.endpoint)?;
    anyhow::ensure!(args.slices >= 1, "--slices must be at least 1");
    anyhow::ensure!(
        args.timeout.is_finite() && args.timeout > 0.0,
        "--timeout must be a positive number of seconds"
    );
    config.slices = args.slices;
    config.slice_id = args.slice_id;
    config.selection = args.selection.clone();
    config.field_set = args.field_set.clone();
    config.cluster = args.cluster.clone();
    config.wanted_document_count = args.wanted_document_count;
    config.stream = args.stream;
    config.scope = args.namespace.clone().zip(args.doctype.clone());
    let connection = &mut config.connection;
    connection.connections = args.connections.max(1);
    connection.timeout = Duration::from_secs_f64(args.timeout);
    connection.max_retries = args.max_retries;
    connection.tls = args.tls.settings();
    connection.progress = args.progress || std::io::stderr().is_terminal();
    for header in &args.headers {
        connection.add_header(header)?;
    }
    // The output is opened before any connection is made, so a bad path fails first.
    let output: Box<dyn Write + Send> = match &args.output {
        Some(path) => Box::new(BufWriter::with_capacity(
            1 << 16,
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(BufWriter::with_capacity(1 << 16, std::io::stdout())),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let summary = match runtime.block_on(larder_feed::visit(config, output)) {
        Ok(summary) => summary,
        Err(e) => {
            eprintln!("larder visit: {e}");
            return Ok(1);
        }
    };
    let text = match args.json {
        true => serde_json::to_string_pretty(&summary)?,
        false => summary.to_string(),
    };
    match args.output.is_some() && args.json {
        true => println!("{text}"),
        false => eprintln!("{text}"),
    }
    Ok(0)
}
