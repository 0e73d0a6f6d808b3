//! The upload journal: a frontend's durable list of the IDs each chunked upload in progress has
//! minted, so that the chunks of an upload cut short by a crash are tombstoned when the frontend
//! starts again. (An upload that fails while the process lives cleans up after itself; see
//! `UploadState`.)
//!
//! One file per upload, `<dir>/<random>.upload`, one blob ID per line. An ID is appended and
//! synced *before* its blob is sent, so no stored blob is ever missing from the file; the file is
//! removed, and the removal synced, before the upload is acknowledged, so a committed blob is
//! never cleaned up. A torn last line (crash mid-append) names a blob that was never sent.
//!
//! An entry can be *held for a name* (`JournalEntry::hold`): the S3 layer stores an object's
//! body under an entry that stays until the name is known to point at it or not, so that a
//! crash between storing a body and linking its name leaks nothing. Such a leftover is not
//! the router's to clean up (its blob may be named); its holder settles it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use larder_cluster::BlobId;
use parking_lot::Mutex;

const SUFFIX: &str = "upload";

/// The journal directory, locked for this process: two frontends sharing one would clean up
/// each other's uploads in progress.
pub struct UploadJournal {
    dir: PathBuf,
    _lock: File,
}

impl UploadJournal {
    pub fn open(dir: &Path) -> io::Result<UploadJournal> {
        std::fs::create_dir_all(dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))?;
        lock.try_lock().map_err(|_| {
            io::Error::other(format!(
                "{} is the upload journal of another running frontend",
                dir.display()
            ))
        })?;
        Ok(UploadJournal {
            dir: dir.to_owned(),
            _lock: lock,
        })
    }

    /// Starts the record of one upload.
    pub fn begin(&self) -> io::Result<JournalEntry> {
        let name = format!("{:016x}.{SUFFIX}", rand::random::<u64>());
        let path = self.dir.join(name);
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)?;
        Ok(JournalEntry {
            inner: Arc::new(Entry {
                path,
                dir: self.dir.clone(),
                file: Mutex::new(file),
                ids: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Uploads a previous run left unfinished: each file with the IDs it lists.
    pub fn leftovers(&self) -> io::Result<Vec<Leftover>> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if path.extension().and_then(|e| e.to_str()) != Some(SUFFIX) {
                continue;
            }
            let text = std::fs::read_to_string(&path)?;
            // Only complete lines: a torn one was never sent.
            let lines = text
                .split_inclusive('\n')
                .filter_map(|line| line.strip_suffix('\n'));
            let mut leftover = Leftover {
                path,
                ids: Vec::new(),
                held_for: None,
            };
            for line in lines {
                match line.strip_prefix(HELD) {
                    Some(hex) => leftover.held_for = from_hex(hex),
                    None => leftover.ids.extend(line.parse::<BlobId>().ok()),
                }
            }
            found.push(leftover);
        }
        Ok(found)
    }
}

/// Marks an entry held for a name: the name follows, in hex (any bytes, no line breaks).
const HELD: &str = "held ";

/// An entry a previous run left.
#[derive(Debug)]
pub struct Leftover {
    pub path: PathBuf,
    /// Every blob of it that may exist on storage nodes.
    pub ids: Vec<BlobId>,
    /// The name it was held for (`JournalEntry::hold`), if any.
    pub held_for: Option<String>,
}

impl Leftover {
    /// Forgets the entry, durably (settled: its blobs named, or all tombstoned).
    pub fn remove(&self) -> io::Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        remove_durably(&self.path, dir)
    }
}

fn to_hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(hex: &str) -> Option<String> {
    if !hex.len().is_multiple_of(2) || hex.len() > 8192 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// The record of one upload in progress; cheap to clone into the chunk tasks.
#[derive(Clone)]
pub struct JournalEntry {
    inner: Arc<Entry>,
}

struct Entry {
    path: PathBuf,
    dir: PathBuf,
    file: Mutex<File>,
    /// What the file lists, for cleanup while the process lives.
    ids: Mutex<Vec<BlobId>>,
}

impl JournalEntry {
    /// Appends `id` and waits until it is on disk. Call before the blob is sent.
    pub async fn record(&self, id: &BlobId) -> io::Result<()> {
        let inner = self.inner.clone();
        let line = format!("{id}\n");
        blocking(move || {
            let mut file = inner.file.lock();
            file.write_all(line.as_bytes())?;
            file.sync_data()
        })
        .await?;
        self.inner.ids.lock().push(*id);
        Ok(())
    }

    /// Marks the entry held for `name`: a leftover of it is settled by whoever holds such
    /// names, never cleaned up blindly. Written now and synced with the first ID (which is
    /// recorded before anything is sent), so call it before the first `record`.
    pub async fn hold(&self, name: &str) -> io::Result<()> {
        let inner = self.inner.clone();
        let line = format!("{HELD}{}\n", to_hex(name));
        blocking(move || inner.file.lock().write_all(line.as_bytes())).await
    }

    /// [`hold`](Self::hold) for an entry that will list no ID, whose existence is the record
    /// (a CompleteMultipartUpload's): the file and its name in the directory are synced now.
    pub async fn hold_durably(&self, name: &str) -> io::Result<()> {
        let inner = self.inner.clone();
        let line = format!("{HELD}{}\n", to_hex(name));
        blocking(move || {
            let mut file = inner.file.lock();
            file.write_all(line.as_bytes())?;
            file.sync_data()?;
            File::open(&inner.dir)?.sync_all()
        })
        .await
    }

    /// Every ID recorded so far: whatever of the upload may exist on storage nodes.
    pub fn ids(&self) -> Vec<BlobId> {
        self.inner.ids.lock().clone()
    }

    /// Forgets the upload (committed, or its blobs all tombstoned), durably.
    pub async fn remove(&self) -> io::Result<()> {
        let inner = self.inner.clone();
        blocking(move || remove_durably(&inner.path, &inner.dir)).await
    }
}

/// Removes a journal file and syncs its directory, so that it cannot reappear after a crash.
pub fn remove_durably(path: &Path, dir: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    }
    File::open(dir)?.sync_all()
}

async fn blocking(f: impl FnOnce() -> io::Result<()> + Send + 'static) -> io::Result<()> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(io::Error::other)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use larder_cluster::BlobKind;

    #[tokio::test]
    async fn lists_recorded_ids_until_removed_and_skips_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let journal = UploadJournal::open(dir.path()).unwrap();
        assert!(
            UploadJournal::open(dir.path()).is_err(),
            "a second frontend is refused"
        );
        let ids: Vec<BlobId> = (0..3)
            .map(|p| BlobId::mint(BlobKind::Chunk, 1, p))
            .collect();
        let (open, done) = (journal.begin().unwrap(), journal.begin().unwrap());
        for id in &ids {
            open.record(id).await.unwrap();
            done.record(id).await.unwrap();
        }
        done.remove().await.unwrap();
        // A crash in the middle of an append.
        let torn = &ids[0].to_string()[..10];
        open.inner.file.lock().write_all(torn.as_bytes()).unwrap();
        let left = journal.leftovers().unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].ids, ids);
        assert_eq!(left[0].held_for, None);
    }

    #[tokio::test]
    async fn a_held_entry_names_what_it_was_held_for() {
        let dir = tempfile::tempdir().unwrap();
        let journal = UploadJournal::open(dir.path()).unwrap();
        let held = journal.begin().unwrap();
        held.hold("bucket/a key\nwith a line break").await.unwrap();
        let id = BlobId::mint(BlobKind::Simple, 1, 0);
        held.record(&id).await.unwrap();
        let left = journal.leftovers().unwrap();
        assert_eq!(left[0].ids, [id]);
        assert_eq!(
            left[0].held_for.as_deref(),
            Some("bucket/a key\nwith a line break")
        );
        left[0].remove().unwrap();
        assert!(journal.leftovers().unwrap().is_empty());
    }
}
