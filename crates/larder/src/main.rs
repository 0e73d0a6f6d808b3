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

/// `LARDER_LOG`'s directives (else `info`), with s3s switched off unless they name it: s3s
/// logs every S3 answer that is not a success at ERROR (a GET of a missing key, a wrong
/// signature), one line per client mistake, as many as clients care to send. The S3 port counts
/// them in its metrics; Larder logs its own failures itself.
fn log_filter(asked: Option<&str>) -> tracing_subscriber::EnvFilter {
    let directives = log_directives(asked);
    tracing_subscriber::EnvFilter::try_new(&directives)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(log_directives(None)))
}

fn log_directives(asked: Option<&str>) -> String {
    let asked = asked
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .unwrap_or("info");
    match asked.contains("s3s") {
        true => asked.to_owned(),
        false => format!("{asked},s3s=off"),
    }
}

fn main() -> ExitCode {
    allocator::configure();
    let cli = cli::Cli::parse();
    alloc_count::start_reporting_from_env();
    // Every role logs through this one subscriber (`larder dev`'s storage nodes are this binary
    // too, with stderr inherited), so colours are decided here: only for a terminal, never for a
    // file such as `larder dev 2> dev.log`.
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(std::env::var("LARDER_LOG").ok().as_deref()))
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

#[cfg(test)]
mod tests {
    use super::log_directives;

    #[test]
    fn s3s_is_quiet_unless_asked_for() {
        assert_eq!(log_directives(None), "info,s3s=off");
        assert_eq!(log_directives(Some(" ")), "info,s3s=off");
        assert_eq!(log_directives(Some("warn")), "warn,s3s=off");
        assert_eq!(log_directives(Some("info,s3s=debug")), "info,s3s=debug");
    }
}
