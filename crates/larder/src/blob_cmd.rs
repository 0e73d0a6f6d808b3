//! `larder put`, `larder get` and `larder delete`: argument parsing over `larder-client`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use larder_client::{Client, Progress};

const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:8080";

#[derive(Args)]
pub struct Endpoint {
    /// The frontend to talk to: https://host:port (TLS, HTTP/2 by ALPN) or http://host:port
    /// (HTTP/2 prior knowledge).
    #[arg(long, default_value = DEFAULT_ENDPOINT)]
    endpoint: String,
    #[command(flatten)]
    tls: crate::client_tls::ClientTlsArgs,
    /// Never draw a progress bar (it is only drawn on a terminal anyway).
    #[arg(long)]
    no_progress: bool,
}

#[derive(Args)]
pub struct PutArgs {
    /// The file to upload; `-` reads standard input.
    file: PathBuf,
    #[command(flatten)]
    endpoint: Endpoint,
}

#[derive(Args)]
pub struct GetArgs {
    /// The blob's ID, as `larder put` printed it.
    id: String,
    /// Where to write the blob; standard output when omitted.
    #[arg(short, long)]
    output: Option<PathBuf>,
    #[command(flatten)]
    endpoint: Endpoint,
}

#[derive(Args)]
pub struct DeleteArgs {
    /// The blob's ID, as `larder put` printed it.
    id: String,
    #[command(flatten)]
    endpoint: Endpoint,
}

impl Endpoint {
    fn progress(&self) -> Progress {
        if self.no_progress {
            Progress::Hidden
        } else {
            Progress::Auto
        }
    }

    async fn connect(&self) -> anyhow::Result<Client> {
        Ok(Client::connect_with(&self.endpoint, &self.tls.settings()).await?)
    }
}

fn block_on<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(f)
}

/// Prints the new blob's ID on standard output (alone, for scripts). The file is opened first: a
/// missing file or a directory is an error before any network I/O.
pub fn put(args: PutArgs) -> anyhow::Result<()> {
    block_on(async {
        let upload = larder_client::open_upload(&args.file).await?;
        let client = args.endpoint.connect().await?;
        let stored = larder_client::put_source(&client, upload, args.endpoint.progress())
            .await
            .with_context(|| format!("uploading {}", args.file.display()))?;
        println!("{}", stored.id);
        Ok(())
    })
}

/// Checks the ID and the output file before connecting; a failed download leaves an existing
/// output file as it was.
pub fn get(args: GetArgs) -> anyhow::Result<()> {
    block_on(async {
        larder_client::blob_path(&args.id)?;
        let output = match &args.output {
            Some(path) => Some(larder_client::create_output(path).await?),
            None => None,
        };
        let client = args.endpoint.connect().await?;
        let progress = args.endpoint.progress();
        match output {
            Some(output) => larder_client::get_into_file(&client, &args.id, output, progress).await,
            None => larder_client::get_to(&client, &args.id, None, progress).await,
        }
        .with_context(|| format!("downloading {}", args.id))?;
        Ok(())
    })
}

pub fn delete(args: DeleteArgs) -> anyhow::Result<()> {
    block_on(async {
        larder_client::blob_path(&args.id)?;
        let client = args.endpoint.connect().await?;
        client
            .delete(&args.id)
            .await
            .with_context(|| format!("deleting {}", args.id))?;
        Ok(())
    })
}
