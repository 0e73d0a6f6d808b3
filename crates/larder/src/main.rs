//! `larder`: one binary for every role. Argument parsing and process wiring only; the work lives
//! in the library crates.

mod bench;
mod blob_cmd;
mod cli;
mod client_tls;
mod configs;
mod dev;
mod dev_certs;
mod feed;
mod signals;

use clap::Parser;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LARDER_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    cli::run(cli)
}
