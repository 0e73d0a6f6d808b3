//! A disk: the journal and the commit thread that every store on one disk shares, so that one
//! `fdatasync` (of the journal) makes the writes of every store on the disk durable, however many
//! logs they went to.
//!
//! Writers only copy small records into their log's batch and mark the log dirty here. Each round
//! of the commit thread takes every dirty log, writes its batch to its segment (page cache only),
//! appends the same bytes as framed records to the journal, syncs the journal once (plus the rare
//! segment file that got a record too large to batch, or was sealed), then publishes each log's
//! records to its index and completes its writers' completions. Recovery (`Disk::open`, before
//! any store of the disk opens) writes back every journaled record whose bytes its segment lost.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::commit::{Collected, Frame, JOURNALED_LARGE_PER_ROUND};
use crate::engine::Engine;
use crate::journal::{
    encode_file_header, encode_frame_head_of_pieces, journal_name, parse_journal_name,
    JournalReader, Target, FILE_HEADER_LEN, JOURNAL_LOCK, MAX_PATH_LEN,
};
use crate::segment::{fdatasync, io_error, segment_name, sync_dir, write_all_vectored_at};
use crate::types::{DiskOptions, DiskStats, Error, Result};

/// How long a rotated journal file's release waits for a round sync still holding it.
const JOURNAL_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The journal and commit thread of one disk directory. Open it once per disk and pass it to
/// every [`crate::Store`] opened below it ([`crate::Store::open_on`]). Cheap to clone; the
/// commit thread stops once the last clone and the last store using it are gone, after syncing
/// every segment the journal covers and emptying the journal (a clean close).
#[derive(Clone)]
pub struct Disk {
    handle: Arc<Handle>,
}

struct Handle {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

pub(crate) struct Shared {
    root: PathBuf,
    /// Logs waiting for the next round. Tests hold it to keep rounds from starting.
    pub(crate) queue: Mutex<Queue>,
    wake: Condvar,
    failed: Mutex<Option<String>>,
    /// The sync stage's threads, which must not wait for the commit thread (see `Handle::stop`).
    sync_threads: Mutex<Vec<std::thread::ThreadId>>,
    journal_syncs: AtomicU64,
    segment_syncs: AtomicU64,
    /// Segment files with records in the current journal file: all must be synced before it
    /// goes. Shared (not the commit thread's own) so that compaction can drop a file it deleted:
    /// held here, its disk space would not come back until the journal file rotates.
    touched: Mutex<HashMap<usize, Arc<File>>>,
    rounds: AtomicU64,
    /// Rounds made durable by syncing their segments because the journal append failed.
    unjournaled_rounds: AtomicU64,
    /// The rounds' syncs as compaction's write-back sees them (`sync_watch.rs`).
    pub(crate) syncs: crate::sync_watch::SyncWatch,
    /// Synced large records still cached, dropped oldest first (`uncache.rs`).
    recent_large: crate::uncache::RecentLarge,
    opts: DiskOptions,
    /// Faults of the disk itself (the stores' own fault points are consulted too).
    #[cfg(test)]
    pub fail: crate::failpoint::FailPoints,
}

#[derive(Default)]
pub(crate) struct Queue {
    dirty: Vec<Arc<Engine>>,
    /// Callers of `Disk::rotate_journal` waiting for the next rotation.
    rotations: Vec<std::sync::mpsc::SyncSender<std::result::Result<(), String>>>,
    stop: bool,
}

impl Disk {
    /// Opens the disk rooted at `root` (creating it): replays its journal into the segments of
    /// the stores below it, syncs them, empties the journal and starts the commit thread.
    pub fn open(root: impl AsRef<Path>, opts: DiskOptions) -> Result<Disk> {
        let root = root.as_ref().to_path_buf();
        crate::segment::create_dir_all_durable(&root)?;
        let lock = crate::lock::lock_file(&root.join(JOURNAL_LOCK), &root)?;
        let journal = match replay(&root)? {
            Replayed::Emptied { number, file } => JournalFile::reuse(&root, number, file, lock),
            Replayed::Nothing => JournalFile::create(&root, 1, lock)?,
        };
        let shared = Arc::new(Shared {
            root,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            failed: Mutex::new(None),
            sync_threads: Mutex::new(Vec::new()),
            journal_syncs: AtomicU64::new(0),
            segment_syncs: AtomicU64::new(0),
            touched: Mutex::new(HashMap::new()),
            rounds: AtomicU64::new(0),
            unjournaled_rounds: AtomicU64::new(0),
            syncs: Default::default(),
            recent_large: crate::uncache::RecentLarge::new(opts.uncache_after_recent),
            opts,
            #[cfg(test)]
            fail: Default::default(),
        });
        let for_thread = shared.clone();
        let thread = std::thread::Builder::new()
            .name("larder-commit".into())
            .spawn(move || run(for_thread, journal))?;
        Ok(Disk {
            handle: Arc::new(Handle {
                shared,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    pub fn root(&self) -> &Path {
        &self.handle.shared.root
    }

    /// Why this disk refuses writes, if it does: once an `fdatasync` failed (or the journal
    /// could not be cut back after a failed write), until the process restarts and recovers.
    pub fn refusing_writes(&self) -> Option<String> {
        self.handle.shared.failed()
    }

    /// Counters of this disk: its commit rounds and fdatasyncs.
    pub fn stats(&self) -> DiskStats {
        self.handle.shared.stats()
    }

    /// Stops the commit thread after the rounds already queued, syncs the segments the journal
    /// covers and empties it, and releases the journal directory. For a store's private disk,
    /// when the store closes. Any later write on the disk is refused.
    pub(crate) fn shut_down(&self) {
        self.handle.stop();
        self.handle
            .shared
            .failed
            .lock()
            .get_or_insert_with(|| "the disk was closed".into());
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.handle.shared
    }

    /// Replaces the journal file now: every segment file it holds records of is synced, the
    /// next file is started and this one deleted (as when it passes `journal_file_size`).
    /// Returns once done. After a store of this disk was closed, no journal frame names its
    /// segments any more, so its directory may be deleted and a new store created at the same
    /// path without a crash's replay writing the old store's bytes into the new one's
    /// segments (`FORMAT.md`, "Disk journal").
    pub fn rotate_journal(&self) -> Result<()> {
        let shared = &self.handle.shared;
        if let Some(why) = shared.failed() {
            return Err(Error::Unavailable(why));
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        {
            let mut queue = shared.queue.lock();
            if queue.stop {
                return Err(Error::Unavailable("the disk was closed".into()));
            }
            queue.rotations.push(tx);
        }
        shared.wake.notify_all();
        match rx.recv() {
            Ok(outcome) => outcome.map_err(Error::Unavailable),
            Err(_) => Err(Error::Unavailable("the commit thread stopped".into())),
        }
    }

    /// The path of `dir` below the root, as a frame names it; `dir` must be the root or below it.
    pub(crate) fn relative_path(&self, dir: &Path) -> Result<Vec<u8>> {
        let bad = || {
            Error::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is not a directory below the disk {}",
                    dir.display(),
                    self.root().display()
                ),
            ))
        };
        let rel = dir.strip_prefix(self.root()).map_err(|_| bad())?;
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(bad());
        }
        let bytes = rel.as_os_str().as_bytes().to_vec();
        if bytes.len() > MAX_PATH_LEN {
            return Err(bad());
        }
        Ok(bytes)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Handle {
    /// Stops the commit thread once its queue is empty; it then closes the journal cleanly.
    fn stop(&self) {
        self.shared.queue.lock().stop = true;
        self.shared.wake.notify_all();
        // The last store may be dropped by the commit or a sync thread itself (it held the store
        // during a round): then the commit thread stops on its own once the queue is empty (and
        // waits for the sync threads, which must therefore not wait for it).
        let me = std::thread::current().id();
        if self.shared.sync_threads.lock().contains(&me) {
            return;
        }
        if let Some(thread) = self.thread.lock().take() {
            if thread.thread().id() != me {
                let _ = thread.join();
            }
        }
    }
}

impl Shared {
    /// Queues a log for the next round (the caller marks its log dirty once per round).
    pub(crate) fn mark_dirty(&self, engine: Arc<Engine>) {
        let mut queue = self.queue.lock();
        queue.dirty.push(engine);
        if queue.dirty.len() == 1 {
            self.wake.notify_one();
        }
    }

    /// Why writes on this disk are refused, once a journal write or sync failed.
    pub(crate) fn failed(&self) -> Option<String> {
        self.failed.lock().clone()
    }

    fn fail(&self, why: String) {
        tracing::error!(disk = %self.root.display(), %why, "disk commit failed; refusing writes");
        self.failed.lock().get_or_insert(why);
    }

    pub(crate) fn stats(&self) -> DiskStats {
        let (sync_time, syncs_during_writeback, writeback_bytes_during_syncs) =
            self.syncs.counters();
        DiskStats {
            rounds: self.rounds.load(Ordering::Relaxed),
            unjournaled_rounds: self.unjournaled_rounds.load(Ordering::Relaxed),
            journal_syncs: self.journal_syncs.load(Ordering::Relaxed),
            segment_syncs: self.segment_syncs.load(Ordering::Relaxed),
            sync_time,
            syncs_during_writeback,
            writeback_bytes_during_syncs,
        }
    }

    /// Forgets `file`, a segment compaction deleted after syncing its replacement: no journal
    /// frame needs to replay into it any more (replay skips frames whose segment is gone).
    pub(crate) fn forget_deleted_segment(&self, file: &Arc<File>) {
        self.touched.lock().remove(&(Arc::as_ptr(file) as usize));
    }

    pub(crate) fn sync_segment(&self, file: &File) -> io::Result<()> {
        self.segment_syncs.fetch_add(1, Ordering::Relaxed);
        fdatasync(file)
    }
}

/// The journal file being appended to, and the segment files it holds records of.
struct JournalFile {
    dir: PathBuf,
    number: u32,
    file: Arc<File>,
    len: u64,
    /// The previous file, rotated out when it grew full: its segment files being synced, then
    /// it is deleted (`rotate_when_full`); why that failed, if it did. At most one at a time.
    retiring: Option<std::thread::JoinHandle<std::result::Result<(), String>>>,
    _lock: File,
}

impl JournalFile {
    fn create(dir: &Path, number: u32, lock: File) -> Result<JournalFile> {
        let file = Arc::new(new_journal_file(dir, number)?);
        Ok(JournalFile {
            dir: dir.to_path_buf(),
            number,
            file,
            len: FILE_HEADER_LEN,
            retiring: None,
            _lock: lock,
        })
    }

    /// The journal file `number`, emptied by replay (`Replayed::Emptied`), appended to again.
    fn reuse(dir: &Path, number: u32, file: File, lock: File) -> JournalFile {
        JournalFile {
            dir: dir.to_path_buf(),
            number,
            file: Arc::new(file),
            len: FILE_HEADER_LEN,
            retiring: None,
            _lock: lock,
        }
    }

    /// Syncs every segment file this journal file covers: after that nothing needs it.
    fn sync_touched(&mut self, shared: &Shared) -> io::Result<()> {
        self.wait_retired()?;
        let mut touched = shared.touched.lock();
        sync_segments(shared, &touched)?;
        touched.clear();
        Ok(())
    }

    /// Starts the next journal file and deletes this one, once nothing needs it. When the next
    /// file cannot be created (a full disk), this one is emptied in place instead, as a clean
    /// close does: that needs no free space, and nothing in it is needed any more.
    fn rotate(&mut self, shared: &Shared) -> io::Result<()> {
        self.sync_touched(shared)?;
        let next = self.number + 1;
        let file = match self.create_next(shared, next) {
            Ok(file) => Arc::new(file),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the next journal file; emptying this one");
                let _ = std::fs::remove_file(self.dir.join(journal_name(next)));
                return self.cut_back_to(FILE_HEADER_LEN);
            }
        };
        let old = std::mem::replace(&mut self.file, file);
        delete_retired(&self.dir.join(journal_name(self.number)), old)?;
        self.number = next;
        self.len = FILE_HEADER_LEN;
        Ok(())
    }

    /// Waits until the file rotated out before this one is retired: synced away and deleted,
    /// or, when that failed, kept (for recovery to replay) with the disk refusing writes, and
    /// the error returned, so that no rotation reports success while its frames remain.
    fn wait_retired(&mut self) -> io::Result<()> {
        let Some(thread) = self.retiring.take() else {
            return Ok(());
        };
        match thread.join() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(io::Error::other(why)),
            Err(_) => Err(io::Error::other("the journal retiring thread panicked")),
        }
    }

    /// `rotate` for a file grown to `journal_file_size`, without holding up the rounds: the
    /// next file is started at once, and this one's segment files are synced and it is deleted
    /// on a thread of its own, while later rounds go to the next file. Until then both files
    /// are on disk, and recovery replays both, in order. Syncing a file's segments (one
    /// `fdatasync` per partition log written since the last rotation) stalled every writer of
    /// the disk for as long, once per 64 MiB journaled.
    fn rotate_when_full(&mut self, shared: &Arc<Shared>) -> io::Result<()> {
        self.wait_retired()?;
        let next = self.number + 1;
        let Ok(file) = self.create_next(shared, next) else {
            return self.rotate(shared); // which empties this file in place instead
        };
        let touched = std::mem::take(&mut *shared.touched.lock());
        let old = std::mem::replace(&mut self.file, Arc::new(file));
        let old_path = self.dir.join(journal_name(self.number));
        self.number = next;
        self.len = FILE_HEADER_LEN;
        let shared = shared.clone();
        let retire = move || {
            let failed = |why: String| {
                // The journal file stays: recovery replays it.
                shared.fail(why.clone());
                Err(why)
            };
            #[cfg(test)]
            if shared.fail.retirement_fails() {
                return failed("syncing a rotated journal's segments failed: (test)".into());
            }
            if let Err(e) = sync_segments(&shared, &touched) {
                return failed(format!("syncing a rotated journal's segments failed: {e}"));
            }
            // Deleted durably, or the disk stops (`delete_retired` says why).
            if let Err(e) = delete_retired(&old_path, old) {
                let journal = old_path.display();
                return failed(format!("cannot delete rotated journal file {journal}: {e}"));
            }
            Ok(())
        };
        // Kept reachable so that it runs here when no thread can be started.
        let work = Arc::new(Mutex::new(Some(retire)));
        let for_thread = work.clone();
        let spawned = std::thread::Builder::new()
            .name("larder-journal-retire".into())
            .spawn(move || for_thread.lock().take().map_or(Ok(()), |retire| retire()));
        match spawned {
            Ok(thread) => self.retiring = Some(thread),
            Err(_) => {
                let retired = work.lock().take().map_or(Ok(()), |retire| retire());
                retired.map_err(io::Error::other)?;
            }
        }
        Ok(())
    }

    fn create_next(&self, shared: &Shared, next: u32) -> Result<File> {
        #[cfg(test)]
        if shared.fail.journal_create_fails() {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC).into());
        }
        let _ = shared;
        new_journal_file(&self.dir, next)
    }

    /// Cuts the file back to `len` (the end of its last complete append) and syncs that, so
    /// that no frame of a failed append is left to be replayed over later records.
    fn cut_back_to(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)?;
        fdatasync(&self.file)?;
        self.len = len;
        Ok(())
    }

    /// Appends one frame per batch (or large record) with one `pwritev` (no copy of the bytes).
    fn append(&mut self, shared: &Shared, rounds: &[(Arc<Engine>, Collected)]) -> io::Result<()> {
        let mut heads = Vec::new();
        let mut touched = shared.touched.lock();
        for (engine, collected) in rounds {
            for frame in &collected.frames {
                let target = Target {
                    path: &engine.rel_path,
                    segment: frame.segment,
                    offset: frame.offset,
                };
                let pieces: Vec<&[u8]> = frame.pieces.iter().map(|p| &p[..]).collect();
                heads.push(encode_frame_head_of_pieces(&target, &pieces));
                touched
                    .entry(Arc::as_ptr(&frame.file) as usize)
                    .or_insert_with(|| frame.file.clone());
            }
        }
        drop(touched);
        if heads.is_empty() {
            return Ok(());
        }
        let mut bufs: Vec<&[u8]> = Vec::with_capacity(heads.len() * 2);
        let frames = rounds.iter().flat_map(|(_, c)| c.frames.iter());
        for (head, frame) in heads.iter().zip(frames) {
            bufs.push(head);
            bufs.extend(frame.pieces.iter().map(|p| &p[..]));
        }
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        #[cfg(test)]
        if let Some(e) = shared.fail.partial_write(&self.file, self.len, &bufs) {
            return Err(e);
        }
        write_all_vectored_at(&self.file, self.len, &bufs)?;
        self.len += len;
        Ok(())
    }
}

fn new_journal_file(dir: &Path, number: u32) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(dir.join(journal_name(number)))?;
    file.write_all_at(&encode_file_header(), 0)?;
    file.sync_all()?;
    sync_dir(dir)?;
    Ok(file)
}

/// A round written to the journal, on its way to the sync stage.
struct Written {
    collected: Vec<(Arc<Engine>, Collected)>,
    /// The journal file its frames went to (a rotation may have replaced it since).
    journal: Arc<File>,
    /// Why the round already failed (a failed rotation, or an earlier failure).
    failed: Option<String>,
    /// Its frames could not be appended to the journal (a full disk): the sync stage makes it
    /// durable by syncing its segment files instead, one `fdatasync` per file.
    unjournaled: bool,
}

/// The commit thread: rounds while there is work; on stop a clean close of the journal.
///
/// A round runs in two stages, so that the next round is collected and written while earlier
/// ones' `fdatasync`s are in flight: this thread collects the dirty logs and writes their frames
/// to the journal, the sync threads (`sync_stage`) sync rounds and complete them in order. One
/// `fdatasync` covers every byte written before it, so a round that waited behind another's sync
/// has more company, not more syncs.
fn run(shared: Arc<Shared>, mut journal: JournalFile) {
    // Capacity 1: at most one written round waits while others sync; beyond that the writer
    // stage waits too, and the dirty logs pile up into one larger round.
    let (tx, rx) = std::sync::mpsc::sync_channel::<(u64, Written)>(1);
    let stage = Arc::new(SyncStage {
        rounds: Mutex::new(rx),
        in_order: Mutex::new(InOrder::default()),
    });
    let mut sync_threads = Vec::new();
    let mut spawn_error = None;
    // Concurrent `fdatasync`s of one file are fine: the kernel sorts out which flush covers what.
    for _ in 0..shared.opts.sync_threads.max(1) {
        let (for_thread, stage) = (shared.clone(), stage.clone());
        let spawned = std::thread::Builder::new()
            .name("larder-sync".into())
            .spawn(move || sync_stage(&for_thread, &stage));
        match spawned {
            Ok(t) => sync_threads.push(t),
            Err(e) => spawn_error = Some(e), // fewer sync threads are slower, not wrong
        }
    }
    if sync_threads.is_empty() {
        let e = spawn_error.map_or_else(String::new, |e| e.to_string());
        shared.fail(format!("cannot start a sync thread: {e}"));
        // Without a sync stage every round fails at once, here.
        write_stage(&shared, &mut journal, None);
        let _ = journal.wait_retired();
        return;
    }
    write_stage(&shared, &mut journal, Some(&tx));
    drop(tx);
    for thread in sync_threads {
        let _ = thread.join();
    }
    if shared.failed().is_some() {
        // The journal stays for recovery to replay; a retirement under way ends first, so that
        // nothing of this disk is still at work once its last handle is gone.
        let _ = journal.wait_retired();
        return;
    }
    // Every store is gone: make their segments durable so the journal is no longer needed.
    match journal.sync_touched(&shared) {
        // Emptied, not removed: the next open appends to it again, which needs no free
        // space (a node restarted on a full disk still opens).
        Ok(()) => {
            let emptied = journal.file.set_len(FILE_HEADER_LEN);
            if let Err(e) = emptied.and_then(|()| journal.file.sync_all()) {
                tracing::warn!(error = %e, "emptying the journal at close failed");
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "syncing segments at close failed; keeping the journal")
        }
    }
}

/// Collects and writes rounds until stopped with nothing queued.
fn write_stage(
    shared: &Arc<Shared>,
    journal: &mut JournalFile,
    tx: Option<&std::sync::mpsc::SyncSender<(u64, Written)>>,
) {
    let mut number: u64 = 0;
    // When the last round started (`DiskOptions::min_round_interval`).
    let mut last_round: Option<std::time::Instant> = None;
    loop {
        let (dirty, rotations) = {
            let mut queue = shared.queue.lock();
            while queue.dirty.is_empty() && queue.rotations.is_empty() && !queue.stop {
                shared.wake.wait(&mut queue);
            }
            if queue.dirty.is_empty() && queue.rotations.is_empty() {
                return;
            }
            let interval = shared.opts.min_round_interval;
            let since = last_round.map(|t| t.elapsed());
            let wait = since.and_then(|s| interval.checked_sub(s));
            if let Some(wait) = wait.filter(|w| !w.is_zero()) {
                if !queue.stop {
                    // More writers join this round meanwhile; none is turned away.
                    drop(queue);
                    std::thread::sleep(wait);
                    queue = shared.queue.lock();
                }
            }
            last_round = Some(std::time::Instant::now());
            let rotations = std::mem::take(&mut queue.rotations);
            (std::mem::take(&mut queue.dirty), rotations)
        };
        if !rotations.is_empty() {
            // Before the round: its frames go to the new file, which names only stores that
            // are still writing.
            rotate_for(shared, journal, rotations);
        }
        if dirty.is_empty() {
            continue;
        }
        let mut collected: Vec<(Arc<Engine>, Collected)> = dirty
            .into_iter()
            .map(|engine| {
                let c = engine.collect_for_round();
                (engine, c)
            })
            .collect();
        journal_or_sync_large(&mut collected);
        let (failed, unjournaled) = match shared.failed() {
            Some(why) => (Some(why), false),
            None => write_round(shared, journal, &collected),
        };
        let written = Written {
            collected,
            journal: journal.file.clone(),
            failed,
            unjournaled,
        };
        match tx {
            Some(tx) => {
                if let Err(back) = tx.send((number, written)) {
                    finish(shared, back.0 .1, Some("the sync threads are gone".into()));
                }
                number += 1;
            }
            None => {
                let why = shared.failed();
                finish(shared, written, why);
            }
        }
    }
}

/// Decides for the round's large records (written to their segments by their writers): all go to
/// the journal when that saves `fdatasync`s and costs little, otherwise none does and their
/// segment files are synced.
///
/// Journaled, the round costs one `fdatasync` (the journal's) instead of one per segment file
/// besides the journal's, in series: a storage node's PUTs of 64 KiB land on a different
/// partition log each. But every journaled byte is written twice, by the one commit thread, so
/// only while the large records add up to at most `JOURNALED_LARGE_PER_ROUND`; and not when
/// they are all in one segment file and nothing else needs the journal, where syncing that file
/// is the round's only `fdatasync` anyway (one log with many writers of large records: journaling
/// them cost it a quarter of its rate).
fn journal_or_sync_large(collected: &mut [(Arc<Engine>, Collected)]) {
    let large = collected.iter().flat_map(|(_, c)| &c.large);
    let bytes: usize = large.clone().map(Frame::len).sum();
    let mut files: Vec<*const File> = large.map(|f| Arc::as_ptr(&f.file)).collect();
    files.sort_unstable();
    files.dedup();
    let journal_written = collected.iter().any(|(_, c)| !c.frames.is_empty());
    let journaled = bytes <= JOURNALED_LARGE_PER_ROUND && (files.len() > 1 || journal_written);
    for (engine, c) in collected.iter_mut() {
        let journal_large = journaled && !c.large.is_empty();
        for frame in std::mem::take(&mut c.large) {
            if journaled {
                c.frames.push(frame);
                continue;
            }
            let len = frame.len() as u64;
            if engine.uncaches(len) {
                c.uncache.push((frame.file.clone(), frame.offset, len));
            }
            if !c.sync.iter().any(|f| Arc::ptr_eq(f, &frame.file)) {
                c.sync.push(frame.file);
            }
        }
        if journal_large {
            // In log order: replay stops a log at the first frame past its segment's end, so a
            // batch written after a large record must not come before it in the journal.
            c.frames.sort_by_key(|f| (f.segment, f.offset));
        }
    }
}

/// Syncs the segment files a journal file covers: after that nothing needs its frames.
fn sync_segments(shared: &Shared, touched: &HashMap<usize, Arc<File>>) -> io::Result<()> {
    touched
        .values()
        .try_for_each(|file| shared.sync_segment(file))
}

/// Deletes a retired journal file (its segments synced) and makes the deletion durable: after a
/// power loss its frames would otherwise be replayed over whatever a store rebuilt in place
/// wrote since (`Disk::rotate_journal`). Its handle is freed in the background: the commit
/// thread's next round sync would wait for the release of its pages.
fn delete_retired(path: &Path, file: Arc<File>) -> io::Result<()> {
    std::fs::remove_file(path)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    sync_dir(dir)?;
    crate::release::release_in_background(file, JOURNAL_RELEASE_WAIT);
    Ok(())
}

/// Rotates the journal for the callers of `Disk::rotate_journal` and tells each the outcome.
fn rotate_for(
    shared: &Shared,
    journal: &mut JournalFile,
    callers: Vec<std::sync::mpsc::SyncSender<std::result::Result<(), String>>>,
) {
    let outcome = match shared.failed() {
        Some(why) => Err(why),
        None => journal.rotate(shared).map_err(|e| {
            let why = format!("journal rotation failed: {e}");
            shared.fail(why.clone());
            why
        }),
    };
    for caller in callers {
        let _ = caller.send(outcome.clone());
    }
}

/// Rotates the journal when it is due, then appends the round's frames. Returns why the round
/// failed (the disk then refuses writes), and whether it must be synced without the journal.
///
/// A failed append (ENOSPC, EIO on write) fails nothing: the round's bytes are in its segment
/// files already, so syncing those makes it as durable as the journal would have; the journal
/// is cut back so no frame of the failed append stays in it. Only a failed sync (the page
/// cache's state is then unknown) or a journal that cannot be cut back stops the disk.
fn write_round(
    shared: &Arc<Shared>,
    journal: &mut JournalFile,
    collected: &[(Arc<Engine>, Collected)],
) -> (Option<String>, bool) {
    let fail = |why: String| {
        shared.fail(why.clone());
        (Some(why), false)
    };
    if journal.len >= shared.opts.journal_file_size {
        if let Err(e) = journal.rotate_when_full(shared) {
            return fail(format!("journal rotation failed: {e}"));
        }
    }
    let before = journal.len;
    let Err(e) = journal.append(shared, collected) else {
        return (None, false);
    };
    match journal.cut_back_to(before) {
        Ok(()) => {
            tracing::warn!(error = %e, "journal write failed; syncing the round's segments instead");
            shared.unjournaled_rounds.fetch_add(1, Ordering::Relaxed);
            (None, true)
        }
        Err(te) => fail(format!(
            "journal write failed ({e}), and cutting the journal back failed: {te}"
        )),
    }
}

/// What the sync threads share: the written rounds to take, and the synced ones waiting for
/// their turn to complete.
struct SyncStage {
    rounds: Mutex<std::sync::mpsc::Receiver<(u64, Written)>>,
    in_order: Mutex<InOrder>,
}

/// Synced rounds wait here until every earlier round is complete: a round is completed only
/// after all before it, so a failure is never followed by a success (a later round's records
/// sit after the failed round's in their logs, and recovery could not keep them without it).
#[derive(Default)]
struct InOrder {
    next: u64,
    synced: std::collections::BTreeMap<u64, (Written, Option<String>)>,
}

/// Syncs written rounds, each sync thread its own, and completes them in order.
fn sync_stage(shared: &Shared, stage: &SyncStage) {
    shared.sync_threads.lock().push(std::thread::current().id());
    loop {
        let taken = stage.rounds.lock().recv();
        let Ok((number, mut written)) = taken else {
            return;
        };
        let failed = match written.failed.clone().or_else(|| shared.failed()) {
            Some(why) => Some(why),
            None => sync_round(shared, &written).err().map(|e| {
                let why = format!("fdatasync failed: {e}");
                shared.fail(why.clone());
                why
            }),
        };
        // Taken now, handed to the window of recent large records (`uncache.rs`) after the
        // lock, never before this round's own sync has succeeded.
        let uncache: Vec<_> = match failed {
            Some(_) => Vec::new(),
            None => written
                .collected
                .iter_mut()
                .flat_map(|(_, c)| std::mem::take(&mut c.uncache))
                .collect(),
        };
        // Completing under the lock keeps the order when both threads have rounds ready.
        let mut in_order = stage.in_order.lock();
        in_order.synced.insert(number, (written, failed));
        while let Some((written, failed)) = {
            let next = in_order.next;
            in_order.synced.remove(&next)
        } {
            in_order.next += 1;
            // An earlier round's failure fails this one too, even if its own sync succeeded.
            let failed = failed.or_else(|| shared.failed());
            finish(shared, written, failed);
        }
        drop(in_order);
        shared.recent_large.synced(uncache);
    }
}

/// Syncs the segment files the round needs synced, then the journal.
fn sync_round(shared: &Shared, written: &Written) -> io::Result<()> {
    // Writers wait for this: compaction issues no write-back meanwhile.
    let _syncing = shared.syncs.sync();
    let mut synced: Vec<*const File> = Vec::new();
    for (_, c) in &written.collected {
        let framed = c.frames.iter().map(|f| &f.file);
        let unjournaled = framed.filter(|_| written.unjournaled);
        for file in c.sync.iter().chain(unjournaled) {
            if !synced.contains(&Arc::as_ptr(file)) {
                shared.sync_segment(file)?;
                synced.push(Arc::as_ptr(file));
            }
        }
    }
    #[cfg(test)]
    {
        let stores = written.collected.iter().map(|(e, _)| &e.fail);
        for fail in std::iter::once(&shared.fail).chain(stores) {
            if let Some(e) = fail.sync() {
                return Err(e);
            }
        }
    }
    if written.unjournaled {
        return Ok(());
    }
    shared.journal_syncs.fetch_add(1, Ordering::Relaxed);
    fdatasync(&written.journal)
}

/// Publishes (or fails) the round's records in each log and tells their writers.
fn finish(shared: &Shared, written: Written, failed: Option<String>) {
    shared.rounds.fetch_add(1, Ordering::Relaxed);
    let mut done = Vec::new();
    for (engine, c) in &written.collected {
        done.extend(engine.finish_round(c.goal, failed.as_ref()));
    }
    // The stores are let go before their writers hear back, so a writer that returns and drops
    // its store is never the one keeping it open.
    drop(written);
    for (completer, outcome) in done {
        completer.complete(outcome);
    }
}

/// Replays every journal file under `root` into the segments it names, syncs them, removes
/// the older journal files and empties the newest, which the disk appends to next.
fn replay(root: &Path) -> Result<Replayed> {
    let dir = root;
    let mut numbers: Vec<u32> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(parse_journal_name))
        .collect();
    numbers.sort_unstable();
    let mut segments = SegmentFiles::default();
    for &n in &numbers {
        let path = dir.join(journal_name(n));
        let file = File::open(&path)?;
        let Some(mut reader) = JournalReader::new(&file)? else {
            tracing::warn!(journal = %path.display(), "journal file without a valid header; ignored");
            continue;
        };
        let mut restored = 0u64;
        while let Some((target, data)) = reader.next_frame()? {
            if segments.restore(root, &target, data)? {
                restored += 1;
            }
        }
        if reader.has_tail() {
            // A frame cut short by the crash: its round never completed, so nobody was told.
            tracing::warn!(journal = %path.display(), at = reader.valid_len(), "torn journal tail cut");
        }
        if restored > 0 {
            tracing::info!(journal = %path.display(), restored, "journal records written back");
        }
    }
    segments.sync_all()?;
    let Some((&last, older)) = numbers.split_last() else {
        return Ok(Replayed::Nothing);
    };
    for &n in older {
        std::fs::remove_file(dir.join(journal_name(n)))?;
    }
    if !older.is_empty() {
        sync_dir(dir)?;
    }
    // The newest file is emptied in place rather than replaced by a new one: shrinking needs
    // no free space, so a node whose disk is full still opens (and serves reads, refusing
    // writes as out of space) instead of failing to create its journal.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join(journal_name(last)))?;
    file.set_len(FILE_HEADER_LEN)?;
    file.write_all_at(&encode_file_header(), 0)?;
    file.sync_all()?;
    sync_dir(dir)?;
    Ok(Replayed::Emptied { number: last, file })
}

/// What replay left for the journal.
enum Replayed {
    /// No journal file: a new disk.
    Nothing,
    /// Journal file `number`, emptied (only its header), to be appended to.
    Emptied { number: u32, file: File },
}

/// The segment files replay touched, open until they are synced.
#[derive(Default)]
struct SegmentFiles {
    open: HashMap<PathBuf, Option<File>>,
}

impl SegmentFiles {
    /// Writes `data` at its place unless the segment already holds exactly those bytes. Returns
    /// whether it wrote. A segment that is gone (its store was deleted, or compaction removed it
    /// after syncing it) or that ends before the frame's offset (the frame followed a record that
    /// was never made durable, so it was never acknowledged) is skipped.
    fn restore(&mut self, root: &Path, target: &Target<'_>, data: &[u8]) -> Result<bool> {
        let Some(store_dir) = store_dir(root, target.path) else {
            tracing::warn!("journal frame names a path outside the disk; skipped");
            return Ok(false);
        };
        let path = store_dir.join(segment_name(target.segment));
        let file = match self.open.entry(path) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let file = match OpenOptions::new().read(true).write(true).open(v.key()) {
                    Ok(f) => Some(f),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                    Err(e) => return Err(Error::Io(e)),
                };
                v.insert(file)
            }
        };
        let Some(file) = file else { return Ok(false) };
        let len = file.metadata()?.len();
        if len < target.offset {
            return Ok(false);
        }
        let have = (len - target.offset).min(data.len() as u64) as usize;
        let mut existing = vec![0u8; have];
        file.read_exact_at(&mut existing, target.offset)?;
        if existing == data {
            return Ok(false);
        }
        file.write_all_at(data, target.offset).map_err(io_error)?;
        Ok(true)
    }

    /// Every segment the journal named may hold records only the page cache had: sync them all.
    fn sync_all(&self) -> Result<()> {
        for file in self.open.values().flatten() {
            fdatasync(file)?;
        }
        Ok(())
    }
}

/// The store directory a frame's path names, if it stays below `root`.
fn store_dir(root: &Path, rel: &[u8]) -> Option<PathBuf> {
    let rel = Path::new(std::ffi::OsStr::from_bytes(rel));
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(root.join(rel))
}
