//! The upload journal: a frontend's durable list of the IDs each chunked upload in progress has
//! minted, so that the chunks of an upload cut short by a crash are tombstoned when the frontend
//! starts again. (An upload that fails while the process lives cleans up after itself; see
//! `UploadState`.)
//!
//! One append-only log for every entry, in segments `<dir>/<n>.log` (`n` 16 hex digits), a line
//! per change: `<entry> id <blob ID>`, `<entry> held <name in hex>`, `<entry> done`. An ID is
//! appended and synced *before* its blob is sent, so no stored blob is ever missing from the
//! log; `done` is appended and synced before the upload is acknowledged, so a committed blob is
//! never cleaned up. A torn last line (crash mid-append) names a blob that was never sent, and
//! is ignored. The `done` of an entry held for a name (below) is written but not synced on its
//! own: it reaches the disk with the next sync of its segment (or a rotation's snapshot), and a
//! power loss that drops it brings back an entry whose holder settles it again, which is
//! idempotent and never removes a named blob.
//!
//! Why a log, not a file per entry (as before): every S3 PutObject holds its body under an
//! entry, and a file per entry cost a create, a sync, an unlink and a directory sync per PUT,
//! each on a blocking thread: a quarter of the frontend's CPU per 1 KiB PutObject (`perf`,
//! `benchmarks/s3-get-name`). One writer thread appends the lines of every request queued
//! while it was busy in one write and one `fdatasync` (group commit), and an entry is only
//! lines in it.
//!
//! The log is kept small by rotation: once `ROTATE_BYTES` were appended to a segment, the writer
//! writes the lines of the entries still open to a temporary file, syncs it, renames it to the
//! next segment, syncs the directory, and only then deletes the older segments. Replay reads
//! every segment in order (temporaries never), so a crash at any step of a rotation finds each
//! open entry at least once and each closed one closed. A rotation that fails fails the
//! appends waiting for it, and the next write tries again: no append ever goes to a segment
//! that a newer one follows. At open the same
//! happens once: what a previous run left is replayed (and listed by [`UploadJournal::leftovers`]),
//! written into a fresh segment, and the rest deleted. Entries of older builds, a file each
//! (`<random>.upload`), are read the same way and carried into the log (a crash between
//! writing that segment and deleting the files carries them twice, under two entries: each is
//! then settled twice, which is idempotent).
//!
//! An entry can be *held for a name* (`JournalEntry::hold`): the S3 layer stores an object's
//! body under an entry that stays until the name is known to point at it or not, so that a
//! crash between storing a body and linking its name leaks nothing. Such a leftover is not
//! the router's to clean up (its blob may be named); its holder settles it.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use larder_cluster::BlobId;
use parking_lot::Mutex;
use tokio::sync::oneshot;

const SEGMENT_SUFFIX: &str = "log";
/// A rotation's snapshot before it is complete and synced (ignored by replay, deleted at open).
const TEMPORARY_SUFFIX: &str = "tmp";
/// The suffix of an older build's journal files, one per entry.
const LEGACY_SUFFIX: &str = "upload";
/// A segment past this many bytes is replaced by a new one holding only the open entries.
const ROTATE_BYTES: u64 = 1 << 20;
/// Most appends one write carries (a segment ends at most this many appends past its bound).
const MAX_BATCH: usize = 4096;
/// Longest name an entry is held for (hex doubles it); longer ones are refused.
const MAX_HELD_NAME: usize = 4096;

/// The journal directory, locked for this process: two frontends sharing one would clean up
/// each other's uploads in progress.
pub struct UploadJournal {
    log: Arc<Log>,
    leftovers: Vec<Leftover>,
    #[cfg(test)]
    fault: Arc<std::sync::atomic::AtomicU8>,
}

impl UploadJournal {
    /// Opens (or creates) the journal in `dir`: replays what a previous run left, which
    /// [`leftovers`](Self::leftovers) then lists, and starts the writer.
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
        let found = replay(dir)?;
        let next_entry = found.open.keys().max().map_or(1, |max| max + 1);
        let mut writer = Writer {
            dir: dir.to_owned(),
            _lock: lock,
            file: None,
            segment: found.last_segment,
            written: 0,
            snapshot: 0,
            torn: false,
            open: found.open.clone(),
            syncs: Arc::default(),
            #[cfg(test)]
            fault: Default::default(),
        };
        #[cfg(test)]
        let fault = writer.fault.clone();
        writer.rotate(&found.files)?;
        let syncs = writer.syncs.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("upload-journal".into())
            .spawn(move || writer.run(rx))?;
        let log = Arc::new(Log {
            tx,
            next_entry: AtomicU64::new(next_entry),
            syncs,
        });
        let leftovers = found
            .open
            .into_iter()
            .map(|(entry, open)| Leftover {
                entry,
                ids: open.ids,
                held_for: open.held_for,
                reserved: open.reserved,
                log: log.clone(),
            })
            .collect();
        Ok(UploadJournal {
            log,
            leftovers,
            #[cfg(test)]
            fault,
        })
    }

    /// Starts the record of one upload (nothing is written until its first line).
    pub fn begin(&self) -> io::Result<JournalEntry> {
        Ok(self.entry(None))
    }

    /// Entries that each list one of `ids` already, marked *reserved*, appended and synced in
    /// one write: an upload under one sends its blob as that ID without waiting on the
    /// journal ([`JournalEntry::reserved`]). A reserved leftover is not the router's to clean
    /// up, as a held one: its blob, if any replica stored it, says what it was held for (the
    /// S3 layer's `held.rs`).
    pub async fn reserve(&self, ids: &[BlobId]) -> io::Result<Vec<JournalEntry>> {
        let entries: Vec<JournalEntry> = ids.iter().map(|id| self.entry(Some(*id))).collect();
        let lines = entries
            .iter()
            .zip(ids)
            .map(|(e, id)| (e.inner.entry, Op::Reserved(*id)))
            .collect();
        self.log.append_lines(lines, true).await?;
        Ok(entries)
    }

    /// Forgets `entries` (reserved and never used) in one write and one sync.
    pub async fn release(&self, entries: &[JournalEntry]) -> io::Result<()> {
        let lines = entries.iter().map(|e| (e.inner.entry, Op::Done)).collect();
        self.log.append_lines(lines, true).await
    }

    fn entry(&self, reserved: Option<BlobId>) -> JournalEntry {
        let entry = self.log.next_entry.fetch_add(1, Ordering::Relaxed);
        JournalEntry {
            inner: Arc::new(Entry {
                entry,
                log: self.log.clone(),
                ids: Mutex::new(reserved.into_iter().collect()),
                held: AtomicBool::new(reserved.is_some()),
                reserved,
            }),
        }
    }

    /// How many `fdatasync`s appends have cost so far (rotations' syncs not counted).
    pub fn syncs(&self) -> u64 {
        self.log.syncs.load(Ordering::Relaxed)
    }

    /// Uploads a previous run left unfinished, found when the journal was opened: each entry
    /// with the IDs it lists.
    pub fn leftovers(&self) -> io::Result<Vec<Leftover>> {
        Ok(self.leftovers.clone())
    }

    /// The entries open in the journal in `dir` as its files say, for tests and tools: read
    /// only, without the lock (a running frontend may be appending).
    pub fn inspect(dir: &Path) -> io::Result<Vec<OpenEntry>> {
        Ok(replay(dir)?
            .open
            .into_values()
            .map(|open| OpenEntry {
                held_for: open.held_for,
                ids: open.ids,
                reserved: open.reserved,
            })
            .collect())
    }
}

/// An entry open in a journal, as [`UploadJournal::inspect`] finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenEntry {
    /// The name it is held for, if any.
    pub held_for: Option<String>,
    /// Every blob of it that may exist on storage nodes.
    pub ids: Vec<BlobId>,
    /// Reserved ahead of need (`UploadJournal::reserve`).
    pub reserved: bool,
}

/// An entry a previous run left.
#[derive(Clone)]
pub struct Leftover {
    entry: u64,
    /// Every blob of it that may exist on storage nodes.
    pub ids: Vec<BlobId>,
    /// The name it was held for (`JournalEntry::hold`), if any.
    pub held_for: Option<String>,
    /// Reserved ahead of need (`UploadJournal::reserve`): like a held entry, its holder's to
    /// settle; its blob, if any replica stored it, says what it was held for.
    pub reserved: bool,
    log: Arc<Log>,
}

impl std::fmt::Debug for Leftover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leftover")
            .field("entry", &self.name())
            .field("ids", &self.ids)
            .field("held_for", &self.held_for)
            .field("reserved", &self.reserved)
            .finish()
    }
}

impl Leftover {
    /// How logs name the entry.
    pub fn name(&self) -> String {
        format!("{:016x}", self.entry)
    }

    /// Forgets the entry (settled: its blobs named, or all tombstoned); durably unless it was
    /// held for a name or reserved (see [`JournalEntry::remove`]).
    pub async fn remove(&self) -> io::Result<()> {
        let sync = self.held_for.is_none() && !self.reserved;
        self.log.append(self.entry, Op::Done, sync).await
    }
}

fn to_hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(hex: &str) -> Option<String> {
    if !hex.len().is_multiple_of(2) || hex.len() > 2 * MAX_HELD_NAME {
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
    entry: u64,
    log: Arc<Log>,
    /// What the log lists, for cleanup while the process lives.
    ids: Mutex<Vec<BlobId>>,
    /// Held for a name (`hold` appended) or reserved: its `done` needs no sync of its own
    /// (lost, it brings back an entry its holder settles again).
    held: AtomicBool,
    /// The ID listed (and synced) before the entry was handed out (`UploadJournal::reserve`).
    reserved: Option<BlobId>,
}

impl JournalEntry {
    /// Appends `id` and waits until it is on disk. Call before the blob is sent. The entry's
    /// reserved ID is on disk already: recording it costs nothing.
    pub async fn record(&self, id: &BlobId) -> io::Result<()> {
        let inner = &self.inner;
        if inner.reserved == Some(*id) {
            return Ok(());
        }
        inner.log.append(inner.entry, Op::Id(*id), true).await?;
        inner.ids.lock().push(*id);
        Ok(())
    }

    /// Marks the entry held for `name`: a leftover of it is settled by whoever holds such
    /// names, never cleaned up blindly. Written now and synced with the first ID (which is
    /// recorded before anything is sent), so call it before the first `record`.
    pub async fn hold(&self, name: &str) -> io::Result<()> {
        self.hold_synced(name, false).await
    }

    /// The ID this entry was reserved with (`UploadJournal::reserve`), if any: a blob sent as
    /// it needs no `record` first.
    pub fn reserved(&self) -> Option<BlobId> {
        self.inner.reserved
    }

    /// [`hold`](Self::hold) for an entry that will list no ID, whose existence is the record
    /// (a CompleteMultipartUpload's): synced now.
    pub async fn hold_durably(&self, name: &str) -> io::Result<()> {
        self.hold_synced(name, true).await
    }

    async fn hold_synced(&self, name: &str, sync: bool) -> io::Result<()> {
        if name.len() > MAX_HELD_NAME {
            return Err(io::Error::other(
                "the name to hold the entry for is too long",
            ));
        }
        let inner = &self.inner;
        let held = Op::Held(name.to_owned());
        inner.log.append(inner.entry, held, sync).await?;
        inner.held.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Every ID recorded so far: whatever of the upload may exist on storage nodes.
    pub fn ids(&self) -> Vec<BlobId> {
        self.inner.ids.lock().clone()
    }

    /// Forgets the upload (committed, or its blobs all tombstoned): durably, unless the entry
    /// is held for a name. A held entry's `done` that a power loss drops only brings the entry
    /// back for its holder to settle again (the name is read before anything is tombstoned),
    /// so it waits for the next sync instead of costing one (a frontend sync per S3 PUT).
    pub async fn remove(&self) -> io::Result<()> {
        let inner = &self.inner;
        let sync = !inner.held.load(Ordering::Relaxed);
        inner.log.append(inner.entry, Op::Done, sync).await
    }
}

/// One change to an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Id(BlobId),
    /// The first ID of a reserved entry (`UploadJournal::reserve`).
    Reserved(BlobId),
    Held(String),
    Done,
}

impl Op {
    fn line(&self, entry: u64) -> String {
        match self {
            Op::Id(id) => format!("{entry:016x} id {id}\n"),
            Op::Reserved(id) => format!("{entry:016x} reserved {id}\n"),
            Op::Held(name) => format!("{entry:016x} held {}\n", to_hex(name)),
            Op::Done => format!("{entry:016x} done\n"),
        }
    }

    /// A line as `line` wrote it; `None` for anything else.
    fn parse(line: &str) -> Option<(u64, Op)> {
        let (entry, rest) = line.split_once(' ')?;
        let entry = u64::from_str_radix(entry, 16).ok()?;
        let op = match rest.split_once(' ') {
            Some(("id", id)) => Op::Id(id.parse().ok()?),
            Some(("reserved", id)) => Op::Reserved(id.parse().ok()?),
            Some(("held", hex)) => Op::Held(from_hex(hex)?),
            None if rest == "done" => Op::Done,
            _ => return None,
        };
        Some((entry, op))
    }
}

/// What an open entry lists.
#[derive(Clone, Debug, Default)]
struct Open {
    held_for: Option<String>,
    ids: Vec<BlobId>,
    /// Reserved: its first ID was minted before any request (`UploadJournal::reserve`).
    reserved: bool,
}

impl Open {
    fn apply(open: &mut BTreeMap<u64, Open>, entry: u64, op: Op) {
        match op {
            Op::Done => {
                open.remove(&entry);
            }
            Op::Held(name) => open.entry(entry).or_default().held_for = Some(name),
            // Duplicates (replayed twice) are removed at the end of `replay`.
            Op::Id(id) => open.entry(entry).or_default().ids.push(id),
            Op::Reserved(id) => {
                let open = open.entry(entry).or_default();
                open.reserved = true;
                open.ids.push(id);
            }
        }
    }

    /// The lines that open `entry` again in a new segment.
    fn lines(&self, entry: u64) -> String {
        let held = self
            .held_for
            .iter()
            .map(|n| Op::Held(n.clone()).line(entry));
        let ids = self
            .ids
            .iter()
            .enumerate()
            .map(|(i, id)| match i == 0 && self.reserved {
                true => Op::Reserved(*id).line(entry),
                false => Op::Id(*id).line(entry),
            });
        held.chain(ids).collect()
    }
}

/// What the files of a journal directory say.
struct Replayed {
    open: BTreeMap<u64, Open>,
    /// The files read (segments and older builds' entries), to delete once carried over.
    files: Vec<PathBuf>,
    last_segment: u64,
}

fn replay(dir: &Path) -> io::Result<Replayed> {
    let mut segments = BTreeMap::new();
    let mut legacy = Vec::new();
    let mut stale = Vec::new();
    for file in std::fs::read_dir(dir)? {
        let path = file?.path();
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        match path.extension().and_then(|e| e.to_str()) {
            Some(SEGMENT_SUFFIX) => match u64::from_str_radix(stem, 16) {
                Ok(n) => {
                    segments.insert(n, path);
                }
                Err(_) => {
                    tracing::warn!(file = %path.display(), "not an upload journal segment; left alone")
                }
            },
            Some(LEGACY_SUFFIX) => legacy.push(path),
            Some(TEMPORARY_SUFFIX) => stale.push(path),
            _ => {}
        }
    }
    let mut open = BTreeMap::new();
    for path in segments.values() {
        let text = match std::fs::read(path) {
            // Bytes that are not UTF-8 (an unsynced tail after a power loss) spoil only their
            // own line, which then parses as nothing and is skipped.
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            // Rotated away since it was listed (only `inspect` reads beside a writer).
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err),
        };
        // Only complete lines: a torn one was never acknowledged to anyone.
        for line in text
            .split_inclusive('\n')
            .filter_map(|l| l.strip_suffix('\n'))
        {
            match Op::parse(line) {
                Some((entry, op)) => Open::apply(&mut open, entry, op),
                None => {
                    tracing::warn!(file = %path.display(), "an unreadable upload journal line is skipped")
                }
            }
        }
    }
    let first_free = open.keys().max().map_or(1, |max| max + 1);
    for (entry, path) in (first_free..).zip(&legacy) {
        open.insert(entry, read_legacy(path)?);
    }
    // A segment that came back after a rotation's deletion was lost repeats lines.
    for open in open.values_mut() {
        let mut seen = std::collections::HashSet::new();
        open.ids.retain(|id| seen.insert(*id));
    }
    let last_segment = segments.keys().max().copied().unwrap_or(0);
    let files = segments.into_values().chain(legacy).chain(stale).collect();
    Ok(Replayed {
        open,
        files,
        last_segment,
    })
}

/// An older build's entry: one file, a held line (`held <hex>`) and an ID per line.
fn read_legacy(path: &Path) -> io::Result<Open> {
    let text = std::fs::read_to_string(path)?;
    let mut open = Open::default();
    for line in text
        .split_inclusive('\n')
        .filter_map(|l| l.strip_suffix('\n'))
    {
        match line.strip_prefix("held ") {
            Some(hex) => open.held_for = from_hex(hex),
            None => open.ids.extend(line.parse::<BlobId>().ok()),
        }
    }
    Ok(open)
}

/// The handle every entry appends through.
struct Log {
    tx: mpsc::Sender<Append>,
    next_entry: AtomicU64,
    /// `fdatasync`s of appends so far (the writer counts them).
    syncs: Arc<AtomicU64>,
}

struct Append {
    /// Lines of one or more entries, written together.
    lines: Vec<(u64, Op)>,
    sync: bool,
    done: oneshot::Sender<io::Result<()>>,
}

impl Log {
    /// Appends `op` for `entry`; resolves once it is written (and synced, with `sync`).
    async fn append(&self, entry: u64, op: Op, sync: bool) -> io::Result<()> {
        self.append_lines(vec![(entry, op)], sync).await
    }

    /// Appends `lines` in one write (and one sync, with `sync`).
    async fn append_lines(&self, lines: Vec<(u64, Op)>, sync: bool) -> io::Result<()> {
        let (done, answer) = oneshot::channel();
        let append = Append { lines, sync, done };
        let stopped = || io::Error::other("the upload journal's writer has stopped");
        self.tx.send(append).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// The writer thread's state: the one open segment and what is open in the journal.
struct Writer {
    dir: PathBuf,
    /// Held for as long as anything can append.
    _lock: File,
    file: Option<File>,
    segment: u64,
    written: u64,
    /// How much of the segment the open entries took when it began.
    snapshot: u64,
    /// A write or sync failed: what follows it in the segment may join a torn line, so the
    /// next write starts a new segment first (or fails, if it cannot).
    torn: bool,
    open: BTreeMap<u64, Open>,
    syncs: Arc<AtomicU64>,
    /// Failures to inject (tests of the failure paths).
    #[cfg(test)]
    fault: Arc<std::sync::atomic::AtomicU8>,
}

/// What the next write of a test's journal does wrong (`Writer::fault`), once.
#[cfg(test)]
mod fault {
    pub const NONE: u8 = 0;
    /// Half of the batch's bytes are written, then the write fails.
    pub const PARTIAL_WRITE: u8 = 1;
    /// The batch is written; its `fdatasync` fails.
    pub const SYNC: u8 = 2;
    /// Writing the next segment's snapshot fails.
    pub const ROTATION: u8 = 3;
}

impl Writer {
    /// Group commit: every append queued while the last write was under way goes out in one
    /// write and, if any asks for it, one `fdatasync`. Ends when no handle is left.
    fn run(mut self, rx: mpsc::Receiver<Append>) {
        while let Ok(first) = rx.recv() {
            let queued = rx.try_iter().take(MAX_BATCH - 1);
            let batch: Vec<Append> = std::iter::once(first).chain(queued).collect();
            let result = self.write(&batch);
            for append in batch {
                let answer = match &result {
                    Ok(()) => Ok(()),
                    Err(err) => Err(io::Error::new(err.kind(), err.to_string())),
                };
                let _ = append.done.send(answer);
            }
        }
    }

    fn write(&mut self, batch: &[Append]) -> io::Result<()> {
        // Rotated by what was appended since the last snapshot, not by size alone: open
        // entries past the bound (a huge upload's IDs) would otherwise rotate at every write.
        if self.torn || self.written > self.snapshot.saturating_add(ROTATE_BYTES) {
            // A failed rotation fails the batch: a segment it may have left behind would be
            // replayed after the one still being appended to, and reopen what that one closes.
            if let Err(err) = self.rotate(&[]) {
                self.torn = true;
                return Err(err);
            }
            self.torn = false;
        }
        let lines = || batch.iter().flat_map(|a| &a.lines);
        let text: String = lines().map(|(entry, op)| op.line(*entry)).collect();
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| io::Error::other("no segment open"))?;
        let sync = batch.iter().any(|a| a.sync);
        #[cfg(test)]
        let fault = self.fault.swap(fault::NONE, Ordering::Relaxed);
        #[cfg(test)]
        let text = match fault {
            fault::PARTIAL_WRITE => {
                let half = &text.as_bytes()[..text.len() / 2];
                file.write_all(half)?; // then the failure below
                String::new()
            }
            _ => text,
        };
        let written = file.write_all(text.as_bytes()).and_then(|()| {
            #[cfg(test)]
            if fault == fault::PARTIAL_WRITE || fault == fault::SYNC {
                return Err(io::Error::other("injected: the disk failed the write"));
            }
            if sync {
                self.syncs.fetch_add(1, Ordering::Relaxed);
                file.sync_data()
            } else {
                Ok(())
            }
        });
        if let Err(err) = written {
            self.torn = true;
            return Err(err);
        }
        self.written += text.len() as u64;
        // Applied once written: the state a rotation copies is what the disk says.
        for (entry, op) in lines() {
            Open::apply(&mut self.open, *entry, op.clone());
        }
        Ok(())
    }

    /// Starts segment `segment + 1` holding the open entries, makes it durable, then deletes
    /// every older segment (and `also`: files read at open).
    ///
    /// The snapshot is written under a temporary name (which replay ignores) and renamed once
    /// synced, so a segment numbered after the current one is never incomplete. From the rename
    /// on it is the segment appended to; if the directory cannot be synced after it, the error
    /// makes the next write rotate again (its name may not be durable, so nothing relies on it).
    fn rotate(&mut self, also: &[PathBuf]) -> io::Result<()> {
        let next = self.segment + 1;
        let path = self.dir.join(format!("{next:016x}.{SEGMENT_SUFFIX}"));
        let temporary = self.dir.join(format!("{next:016x}.{TEMPORARY_SUFFIX}"));
        let text: String = self.open.iter().map(|(e, o)| o.lines(*e)).collect();
        #[cfg(test)]
        let injected = self
            .fault
            .compare_exchange(
                fault::ROTATION,
                fault::NONE,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok();
        #[cfg(not(test))]
        let injected = false;
        let written = match injected {
            true => std::fs::write(&temporary, &text.as_bytes()[..text.len() / 2]).and(Err(
                io::Error::other("injected: the snapshot's write failed"),
            )),
            false => write_synced(&temporary, text.as_bytes())
                .and_then(|file| std::fs::rename(&temporary, &path).map(|()| file)),
        };
        let file = match written {
            Ok(file) => file,
            Err(err) => {
                let _ = std::fs::remove_file(&temporary);
                return Err(err);
            }
        };
        let older = self.segment_path(self.segment);
        self.file = Some(file);
        self.segment = next;
        self.written = text.len() as u64;
        self.snapshot = self.written;
        File::open(&self.dir)?.sync_all()?;
        for old in std::iter::once(older).chain(also.iter().cloned()) {
            if old == path {
                continue;
            }
            match std::fs::remove_file(&old) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                // It stays until the next start; replayed before the new one, it changes nothing.
                Err(err) => {
                    tracing::warn!(%err, file = %old.display(), "cannot delete an old upload journal segment")
                }
            }
        }
        // Not strictly needed: an old segment that comes back is replayed before this one.
        if let Err(err) = File::open(&self.dir).and_then(|d| d.sync_all()) {
            tracing::warn!(%err, "cannot sync the upload journal's directory after a rotation");
        }
        Ok(())
    }

    fn segment_path(&self, n: u64) -> PathBuf {
        self.dir.join(format!("{n:016x}.{SEGMENT_SUFFIX}"))
    }
}

/// A new file at `path` holding `bytes`, synced.
fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<File> {
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_data()?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use larder_cluster::BlobKind;

    fn ids(n: u32) -> Vec<BlobId> {
        (0..n)
            .map(|p| BlobId::mint(BlobKind::Chunk, 1, p))
            .collect()
    }

    #[tokio::test]
    async fn lists_recorded_ids_until_removed_and_skips_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let ids = ids(3);
        {
            let journal = UploadJournal::open(dir.path()).unwrap();
            assert!(
                UploadJournal::open(dir.path()).is_err(),
                "a second frontend is refused"
            );
            let (open, done) = (journal.begin().unwrap(), journal.begin().unwrap());
            for id in &ids {
                open.record(id).await.unwrap();
                done.record(id).await.unwrap();
            }
            done.remove().await.unwrap();
        }
        // A crash in the middle of an append.
        let segment = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|f| f.path())
            .find(|p| p.extension().is_some_and(|e| e == SEGMENT_SUFFIX))
            .unwrap();
        let torn = format!("{:016x} id {}", 1, &ids[0].to_string()[..10]);
        OpenOptions::new()
            .append(true)
            .open(&segment)
            .unwrap()
            .write_all(torn.as_bytes())
            .unwrap();
        wait_for_unlock(dir.path());
        let journal = UploadJournal::open(dir.path()).unwrap();
        let left = journal.leftovers().unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].ids, ids);
        assert_eq!(left[0].held_for, None);
    }

    /// The writer thread holds the lock until every handle is gone.
    fn wait_for_unlock(dir: &Path) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let lock = OpenOptions::new()
                .write(true)
                .open(dir.join("LOCK"))
                .unwrap();
            if lock.try_lock().is_ok() {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the lock was never released"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[tokio::test]
    async fn a_held_entry_names_what_it_was_held_for_and_is_gone_once_removed() {
        let dir = tempfile::tempdir().unwrap();
        let id = ids(1)[0];
        {
            let journal = UploadJournal::open(dir.path()).unwrap();
            let held = journal.begin().unwrap();
            held.hold("bucket/a key\nwith a line break").await.unwrap();
            held.record(&id).await.unwrap();
        }
        wait_for_unlock(dir.path());
        let journal = UploadJournal::open(dir.path()).unwrap();
        let left = journal.leftovers().unwrap();
        assert_eq!(left[0].ids, [id]);
        assert_eq!(
            left[0].held_for.as_deref(),
            Some("bucket/a key\nwith a line break")
        );
        left[0].remove().await.unwrap();
        assert_eq!(
            journal.syncs(),
            0,
            "a held leftover's done is not synced on its own"
        );
        assert!(UploadJournal::inspect(dir.path()).unwrap().is_empty());
        drop((journal, left));
        wait_for_unlock(dir.path());
        let again = UploadJournal::open(dir.path()).unwrap();
        assert!(again.leftovers().unwrap().is_empty());
    }

    /// A held entry's `done` rides on a later sync (its loss only brings the entry back for its
    /// holder to settle); any other entry's `done` is synced before it is acknowledged.
    #[tokio::test]
    async fn only_the_done_of_an_entry_not_held_costs_a_sync() {
        let dir = tempfile::tempdir().unwrap();
        let ids = ids(2);
        let journal = UploadJournal::open(dir.path()).unwrap();
        let held = journal.begin().unwrap();
        held.hold("bucket/key").await.unwrap();
        assert_eq!(journal.syncs(), 0, "a hold is synced with the first ID");
        held.record(&ids[0]).await.unwrap();
        assert_eq!(journal.syncs(), 1);
        held.remove().await.unwrap();
        assert_eq!(
            journal.syncs(),
            1,
            "a held entry's done is not synced on its own"
        );
        let plain = journal.begin().unwrap();
        plain.record(&ids[1]).await.unwrap();
        plain.remove().await.unwrap();
        assert_eq!(journal.syncs(), 3, "a plain entry's done is synced");
        drop((held, plain, journal));
        wait_for_unlock(dir.path());
        let again = UploadJournal::open(dir.path()).unwrap();
        assert!(
            again.leftovers().unwrap().is_empty(),
            "both done lines were written"
        );
    }

    /// Reserved entries cost one sync for the batch, none when their ID is recorded and none
    /// for their `done`; a restart finds each unfinished one reserved, listing its IDs, also
    /// after a rotation carried it into a new segment.
    #[tokio::test]
    async fn reserved_entries_cost_one_sync_per_batch_and_a_crash_finds_each_reserved() {
        let dir = tempfile::tempdir().unwrap();
        let ids = ids(6);
        {
            let journal = UploadJournal::open(dir.path()).unwrap();
            let reserved = journal.reserve(&ids[..3]).await.unwrap();
            assert_eq!(journal.syncs(), 1, "one sync for the batch");
            assert_eq!(reserved.len(), 3);
            let used = &reserved[1];
            assert_eq!(used.reserved(), Some(ids[1]));
            used.record(&ids[1]).await.unwrap();
            assert_eq!(
                journal.syncs(),
                1,
                "recording the reserved ID writes nothing"
            );
            used.record(&ids[3]).await.unwrap(); // a second attempt's ID
            assert_eq!(journal.syncs(), 2);
            assert_eq!(used.ids(), [ids[1], ids[3]]);
            reserved[2].remove().await.unwrap();
            assert_eq!(journal.syncs(), 2, "a reserved entry's done is not synced");
            let unused = journal.reserve(&ids[4..]).await.unwrap();
            journal.release(&unused).await.unwrap();
            assert_eq!(journal.syncs(), 4, "a batch and its release, a sync each");
        }
        for round in 0..2 {
            wait_for_unlock(dir.path());
            let journal = UploadJournal::open(dir.path()).unwrap(); // rotates
            let left: Vec<(Vec<BlobId>, bool, Option<String>)> = journal
                .leftovers()
                .unwrap()
                .into_iter()
                .map(|l| (l.ids, l.reserved, l.held_for))
                .collect();
            assert_eq!(
                left,
                [
                    (vec![ids[0]], true, None),
                    (vec![ids[1], ids[3]], true, None)
                ],
                "round {round}"
            );
        }
    }

    /// The segments and temporary files in `dir`.
    fn journal_files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|f| f.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "LOCK")
            .collect();
        names.sort();
        names
    }

    /// A write, a sync or a rotation that fails is answered as failed (nothing is acknowledged
    /// that the disk may not have), the next append starts a new segment holding exactly what
    /// was acknowledged, and a restart finds that: nothing of the failed appends, nothing lost.
    #[tokio::test]
    async fn failed_writes_syncs_and_rotations_are_refused_and_leave_what_was_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let ids = ids(8);
        let journal = UploadJournal::open(dir.path()).unwrap();
        let inject = |fault: u8| journal.fault.store(fault, Ordering::Relaxed);
        let (kept, closed) = (journal.begin().unwrap(), journal.begin().unwrap());
        kept.record(&ids[0]).await.unwrap();
        closed.record(&ids[1]).await.unwrap();
        let first = journal_files(dir.path());
        assert_eq!(first.len(), 1, "{first:?}");

        inject(fault::PARTIAL_WRITE);
        assert!(
            kept.record(&ids[2]).await.is_err(),
            "a torn write is refused"
        );
        kept.record(&ids[3]).await.unwrap();
        let second = journal_files(dir.path());
        assert_eq!(second.len(), 1, "the torn segment is gone: {second:?}");
        assert_ne!(
            second, first,
            "the append after a torn write starts a new segment"
        );

        inject(fault::SYNC);
        assert!(
            closed.remove().await.is_err(),
            "an unsynced Done is refused"
        );
        inject(fault::ROTATION);
        assert!(
            kept.record(&ids[4]).await.is_err(),
            "no segment to append to: refused"
        );
        assert_eq!(journal_files(dir.path()), second, "no temporary is left");
        closed.remove().await.unwrap();
        kept.record(&ids[5]).await.unwrap();

        drop((kept, closed, journal));
        wait_for_unlock(dir.path());
        let journal = UploadJournal::open(dir.path()).unwrap();
        let left = journal.leftovers().unwrap();
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(left[0].ids, [ids[0], ids[3], ids[5]]);
    }

    #[tokio::test]
    async fn rotation_keeps_open_entries_and_drops_closed_ones() {
        let dir = tempfile::tempdir().unwrap();
        let journal = UploadJournal::open(dir.path()).unwrap();
        let kept = journal.begin().unwrap();
        let kept_id = ids(1)[0];
        kept.hold("kept").await.unwrap();
        kept.record(&kept_id).await.unwrap();
        // Enough closed entries to pass the rotation bound several times.
        let per_entry = Op::Id(ids(1)[0]).line(1).len() + Op::Done.line(1).len();
        let entries = 3 * ROTATE_BYTES as usize / per_entry;
        let id = ids(1)[0];
        // 256 at a time, so that few are open at any rotation (each begins with the open ones).
        for _ in 0..entries.div_ceil(256) {
            let tasks: Vec<_> = (0..256)
                .map(|_| {
                    let entry = journal.begin().unwrap();
                    tokio::spawn(async move {
                        entry.record(&id).await.unwrap();
                        entry.remove().await.unwrap();
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        }
        let segments: Vec<u64> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|f| f.path().extension().is_some_and(|e| e == SEGMENT_SUFFIX))
            .map(|f| f.metadata().unwrap().len())
            .collect();
        assert_eq!(segments.len(), 1, "older segments are deleted");
        assert!(segments[0] <= 2 * ROTATE_BYTES, "{segments:?}");
        let open = UploadJournal::inspect(dir.path()).unwrap();
        let kept = OpenEntry {
            held_for: Some("kept".to_owned()),
            ids: vec![kept_id],
            reserved: false,
        };
        assert_eq!(open, [kept]);
    }

    /// The number of the one segment in `dir`.
    fn only_segment(dir: &Path) -> u64 {
        let segments: Vec<u64> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|f| f.path())
            .filter(|p| p.extension().is_some_and(|e| e == SEGMENT_SUFFIX))
            .map(|p| u64::from_str_radix(p.file_stem().unwrap().to_str().unwrap(), 16).unwrap())
            .collect();
        assert_eq!(segments.len(), 1, "{segments:?}");
        segments[0]
    }

    #[tokio::test]
    async fn open_entries_past_the_bound_do_not_rotate_every_write() {
        let dir = tempfile::tempdir().unwrap();
        let journal = UploadJournal::open(dir.path()).unwrap();
        let huge = journal.begin().unwrap();
        let line = Op::Id(ids(1)[0]).line(1).len() as u64;
        let all = ids((ROTATE_BYTES / line + 10) as u32);
        for chunk in all.chunks(512) {
            let records = chunk.iter().map(|id| huge.record(id));
            for recorded in futures_util::future::join_all(records).await {
                recorded.unwrap();
            }
        }
        // The next write rotates once (past the bound), then not again for a while.
        let other = journal.begin().unwrap();
        other.record(&ids(1)[0]).await.unwrap();
        let rotated = only_segment(dir.path());
        for id in ids(100) {
            other.record(&id).await.unwrap();
        }
        assert_eq!(only_segment(dir.path()), rotated);
        assert_eq!(UploadJournal::inspect(dir.path()).unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_stale_temporary_and_unreadable_bytes_are_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let id = ids(1)[0];
        // A rotation cut short (never renamed), and a segment with a line that is not UTF-8.
        std::fs::write(
            dir.path().join("0000000000000009.tmp"),
            format!("{:016x} id {id}\n", 7),
        )
        .unwrap();
        let mut bytes = format!("{:016x} id {id}\n", 3).into_bytes();
        bytes.extend_from_slice(b"\xff\xfe id\n");
        std::fs::write(dir.path().join("0000000000000002.log"), bytes).unwrap();
        let journal = UploadJournal::open(dir.path()).unwrap();
        let left = journal.leftovers().unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!((left[0].entry, left[0].ids.clone()), (3, vec![id]));
        assert!(!dir.path().join("0000000000000009.tmp").exists());
        assert_eq!(only_segment(dir.path()), 3);
    }

    #[tokio::test]
    async fn entries_of_an_older_build_are_carried_into_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let id = ids(1)[0];
        let held = format!("held {}\n{id}\n", to_hex("b/k"));
        std::fs::write(dir.path().join("00ab.upload"), held).unwrap();
        std::fs::write(dir.path().join("00cd.upload"), format!("{id}\n")).unwrap();
        let journal = UploadJournal::open(dir.path()).unwrap();
        let mut left: Vec<_> = journal
            .leftovers()
            .unwrap()
            .into_iter()
            .map(|l| (l.held_for, l.ids))
            .collect();
        left.sort_by_key(|(held, _)| held.clone());
        assert_eq!(left, vec![(None, vec![id]), (Some("b/k".into()), vec![id])]);
        let legacy = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|f| f.path().extension().is_some_and(|e| e == LEGACY_SUFFIX))
            .count();
        assert_eq!(legacy, 0, "carried over, then deleted");
        assert_eq!(UploadJournal::inspect(dir.path()).unwrap().len(), 2);
    }

    #[test]
    fn a_line_reads_back_as_written_and_nothing_else_reads_at_all() {
        let id = ids(1)[0];
        for op in [Op::Id(id), Op::Held("a b\nc".into()), Op::Done] {
            let line = op.line(0xab);
            assert_eq!(
                Op::parse(line.strip_suffix('\n').unwrap()),
                Some((0xab, op))
            );
        }
        for bad in [
            "",
            "ab",
            "zz done",
            "ab id nope",
            "ab held 0",
            "ab done x",
            "ab what",
        ] {
            assert_eq!(Op::parse(bad), None, "{bad:?}");
        }
    }
}
