//! Files and standard streams to and from blobs, streamed, with a progress bar for large ones.

use std::path::{Path, PathBuf};
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
    put_source(client, open_upload(path).await?, progress).await
}

/// A local file (or standard input) opened for upload. Opening comes before any network I/O, so
/// a missing file or a directory is reported as such, with its path, without contacting anyone.
pub struct Upload {
    reader: Box<dyn AsyncRead + Send + Sync + Unpin>,
    /// Known for regular files (sent as Content-Length); pipes and devices stream to their end.
    size: Option<u64>,
}

/// Opens `path` (`-` for standard input) for [`put_source`].
pub async fn open_upload(path: &Path) -> Result<Upload, ClientError> {
    if path == Path::new("-") {
        return Ok(Upload {
            reader: Box::new(tokio::io::stdin()),
            size: None,
        });
    }
    let file_error = |detail: String| ClientError::File {
        path: path.display().to_string(),
        detail,
    };
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| file_error(io_detail(&e)))?;
    let metadata = file
        .metadata()
        .await
        .map_err(|e| file_error(io_detail(&e)))?;
    if metadata.is_dir() {
        return Err(file_error("is a directory, not a file".into()));
    }
    Ok(Upload {
        reader: Box::new(file),
        size: metadata.is_file().then_some(metadata.len()),
    })
}

/// Uploads what [`open_upload`] opened. Returns what was stored.
pub async fn put_source(
    client: &Client,
    upload: Upload,
    progress: Progress,
) -> Result<Stored, ClientError> {
    put_reader(client, upload.reader, upload.size, progress).await
}

/// An I/O error's description without Rust's "(os error N)" suffix.
fn io_detail(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

async fn put_reader(
    client: &Client,
    reader: impl AsyncRead + Send + Sync + Unpin + 'static,
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
/// number of bytes written. An existing file at `output` is replaced only by a complete download.
pub async fn get_to(
    client: &Client,
    id: &str,
    output: Option<&Path>,
    progress: Progress,
) -> Result<u64, ClientError> {
    match output {
        None => get_into(client, id, tokio::io::stdout(), progress).await,
        Some(path) => get_into_file(client, id, create_output(path).await?, progress).await,
    }
}

/// Where a download goes: a temporary file next to `path`, renamed over it once complete (so a
/// failed download never truncates or removes what was there).
pub struct OutputFile {
    path: PathBuf,
    partial: Partial,
    file: tokio::fs::File,
}

/// The temporary file of a download, removed when dropped unless it was moved into place (also
/// when the download never starts, e.g. because the frontend is unreachable).
struct Partial {
    path: PathBuf,
    moved: bool,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.moved {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Creates the temporary file of a download to `path`; fails, naming `path`, when it cannot be
/// written (a directory, a missing parent, no permission) before any network I/O.
pub async fn create_output(path: &Path) -> Result<OutputFile, ClientError> {
    let file_error = |detail: String| ClientError::File {
        path: path.display().to_string(),
        detail,
    };
    if tokio::fs::metadata(path).await.is_ok_and(|m| m.is_dir()) {
        return Err(file_error("is a directory, not a file".into()));
    }
    let name = path
        .file_name()
        .ok_or_else(|| file_error("names no file".into()))?;
    let mut partial_name = std::ffi::OsString::from(".");
    partial_name.push(name);
    partial_name.push(format!(".larder-partial-{}", std::process::id()));
    let partial = path.with_file_name(partial_name);
    let file = tokio::fs::File::create(&partial)
        .await
        .map_err(|e| file_error(io_detail(&e)))?;
    Ok(OutputFile {
        path: path.to_owned(),
        partial: Partial {
            path: partial,
            moved: false,
        },
        file,
    })
}

/// Downloads blob `id` into `output`, then moves it into place.
pub async fn get_into_file(
    client: &Client,
    id: &str,
    output: OutputFile,
    progress: Progress,
) -> Result<u64, ClientError> {
    let OutputFile {
        path,
        mut partial,
        file,
    } = output;
    let written = get_into(client, id, file, progress).await?;
    tokio::fs::rename(&partial.path, &path)
        .await
        .map_err(|e| ClientError::File {
            path: path.display().to_string(),
            detail: io_detail(&e),
        })?;
    partial.moved = true;
    Ok(written)
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
