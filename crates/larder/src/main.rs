//! `larder`: one binary for every role. Argument parsing and process wiring only; the work lives
//! in the library crates.

mod alloc_count;
mod allocator;
mod bench;
mod blob_cmd;
mod cli;
mod client_tls;
mod cluster_cmd;
mod compaction_cmd;
mod configs;
mod dev;
mod dev_certs;
mod feed;
mod s3_cmd;
mod signals;
mod visit;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

/// mimalloc, counted only when a benchmark asks (`LARDER_ALLOC_COUNT_FILE`,
/// `benchmarks/b6-connections`).
#[global_allocator]
static ALLOCATOR: alloc_count::Counting<mimalloc::MiMalloc> =
    alloc_count::Counting(mimalloc::MiMalloc);

fn main() -> ExitCode {
    allocator::configure();
    let cli = cli::Cli::parse();
    alloc_count::start_reporting_from_env();
    // Every role logs through this one subscriber (`larder dev`'s storage nodes are this binary
    // too, with stderr inherited), so colours are decided here: only for a terminal, never for a
    // file such as `larder dev 2> dev.log`.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LARDER_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line, each cause once ("uploading x: …"), and no backtrace for a user's mistake
            // even when RUST_BACKTRACE is set.
            eprintln!("larder: {error:#}");
            ExitCode::FAILURE
        }
    }
}
