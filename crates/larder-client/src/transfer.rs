//! Files and standard streams to and from blobs, streamed, with a progress bar for large ones.

use std::path::Path;
use std::time::Instant;

use futures_util::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::io::ReaderStream;

use crate::{Client, ClientError, Stored};

/// Transfers at least this large (or of unknown size) get a progress bar.
const PROGRESS_FROM: u64 = 4 * 1024 * 1024;
/// Read size for uploads: large reads make large HTTP/2 DATA frames.
const READ_SIZE: usize = 1024 * 1024;

/// Whether to show progress on standard error (only ever drawn when it is a terminal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    Auto,
    Hidden,
}

fn progress_bar(progress: Progress, total: Option<u64>, verb: &str) -> ProgressBar {
    let large = total.is_none_or(|t| t >= PROGRESS_FROM);
    if progress == Progress::Hidden || !large {
        return ProgressBar::hidden();
    }
    let bar = match total {
        Some(total) => ProgressBar::new(total).with_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{msg} {spinner} {binary_bytes} {binary_bytes_per_sec}")
                .expect("valid template"),
        ),
    };
    bar.set_message(verb.to_owned());
    bar
}

/// Uploads the file at `path` (`-` for standard input). Returns what was stored.
pub async fn put_from(
    client: &Client,
    path: &Path,
    progress: Progress,
) -> Result<Stored, ClientError> {
    if path == Path::new("-") {
        return put_reader(client, tokio::io::stdin(), None, progress).await;
    }
    let file = tokio::fs::File::open(path).await?;
    let size = file.metadata().await?.len();
    put_reader(client, file, Some(size), progress).await
}

async fn put_reader(
    client: &Client,
    reader: impl AsyncRead + Send + Sync + 'static,
    size: Option<u64>,
    progress: Progress,
) -> Result<Stored, ClientError> {
    let bar = progress_bar(progress, size, "put");
    let counter = bar.clone();
    let frames = ReaderStream::with_capacity(reader, READ_SIZE).map(move |chunk| {
        let chunk = chunk?;
        counter.inc(chunk.len() as u64);
        Ok(Frame::data(chunk))
    });
    let body = BodyExt::boxed(StreamBody::new(frames));
    let started = Instant::now();
    let stored = client.put(body, size).await;
    bar.finish_and_clear();
    let stored = stored?;
    summary("stored", stored.size, started);
    Ok(stored)
}

/// Downloads blob `id` into the file at `output`, or to standard output when `None`. Returns the
/// number of bytes written. A partial file is removed when the transfer fails.
pub async fn get_to(
    client: &Client,
    id: &str,
    output: Option<&Path>,
    progress: Progress,
) -> Result<u64, ClientError> {
    match output {
        None => get_into(client, id, tokio::io::stdout(), progress).await,
        Some(path) => {
            let file = tokio::fs::File::create(path).await?;
            let result = get_into(client, id, file, progress).await;
            if result.is_err() {
                let _ = tokio::fs::remove_file(path).await;
            }
            result
        }
    }
}

async fn get_into(
    client: &Client,
    id: &str,
    mut out: impl AsyncWrite + Unpin,
    progress: Progress,
) -> Result<u64, ClientError> {
    let started = Instant::now();
    let response = client.get(id).await?;
    let expected = response
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let bar = progress_bar(progress, expected, "get");
    let mut body = response.into_body();
    let mut written = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            out.write_all(&data).await?;
            written += data.len() as u64;
            bar.inc(data.len() as u64);
        }
    }
    out.flush().await?;
    bar.finish_and_clear();
    if expected.is_some_and(|e| e != written) {
        return Err(ClientError::Protocol(format!(
            "download ended after {written} of {} bytes",
            expected.unwrap_or_default()
        )));
    }
    summary("fetched", written, started);
    Ok(written)
}

fn summary(verb: &str, bytes: u64, started: Instant) {
    if bytes < PROGRESS_FROM {
        return;
    }
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "{verb} {:.1} MiB in {seconds:.1} s ({:.0} MiB/s)",
        bytes as f64 / (1 << 20) as f64,
        bytes as f64 / (1 << 20) as f64 / seconds.max(1e-9)
    );
}
