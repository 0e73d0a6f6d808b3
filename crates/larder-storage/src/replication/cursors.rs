//! The cursor files: this replica's saved position in each peer's feed, with when and by which
//! process it was saved (`check_link` reads that to tell a replica that was away), written
//! durably, and into a spare file made ahead of need when the disk is full.
//!
//! A file holds two slots, a page apart (`SLOT_STRIDE`), each a checksummed line with a
//! generation. A save overwrites the older slot in place and syncs its data: one `fdatasync`,
//! with no new file, rename or directory sync, and a write torn by a crash leaves the other
//! slot, the position saved before, which is the last one shown to the peer. Saving through a
//! new file and a rename cost two syncs (each an ext4 journal commit) and four metadata calls,
//! once per link per replication round: about a third of a storage node's syncs under 1 KiB
//! PUTs (`benchmarks/cpu-per-request/PUT-SYNCS.md`).
//! The first save of a link, and a save into a spare, still write a whole new file.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use larder_store::Cursor;

use crate::validate::now_ms;

/// The saved position in a peer's feed and when it was saved, or the start when there is none,
/// it is of the old physical form, or it was saved for another incarnation of the local replica
/// (the replica was rebuilt: what it had pulled is gone, so everything must be pulled again).
/// The peer's own incarnation is inside the cursor: the peer restarts a cursor of another of its
/// incarnations. A file without a time (an older build) counts as saved now.
pub(super) fn load_cursor(path: &Path, local_incarnation: u64) -> (Cursor, Option<Saved>) {
    let Some(text) = read_bounded(path) else {
        return (Cursor::START, None);
    };
    let line = if text.len() == SLOTTED_LEN {
        match newest_slot(&text) {
            Some((_, slot)) => slot.line,
            None => return (Cursor::START, None),
        }
    } else {
        text.as_str()
    };
    parse_line(line, local_incarnation)
}

/// `<cursor> <local incarnation> [<ms> [<process mark>]]`, as `save_cursor` writes it (older
/// builds wrote fewer fields).
fn parse_line(line: &str, local_incarnation: u64) -> (Cursor, Option<Saved>) {
    let mut parts = line.split_whitespace();
    let fields = (parts.next(), parts.next(), parts.next(), parts.next());
    match (fields, parts.next()) {
        ((Some(cursor), Some(local), saved, by), None)
            if local == incarnation_text(local_incarnation) =>
        {
            let ms = saved.map_or(Some(now_ms()), |t| t.parse().ok());
            let here = by == Some(process_text().as_str());
            let saved = ms.map(|ms| Saved { ms, here });
            (cursor.parse().unwrap_or(Cursor::START), saved)
        }
        _ => (Cursor::START, None),
    }
}

/// The file's text, if it is readable, ASCII and no longer than a slotted file: anything else
/// is no cursor this code wrote (read as none: pull from the start).
fn read_bounded(path: &Path) -> Option<String> {
    read_text(&mut std::fs::File::open(path).ok()?)
}

fn read_text(file: &mut std::fs::File) -> Option<String> {
    use std::io::Read;
    let mut bytes = Vec::with_capacity(SLOTTED_LEN);
    file.take(SLOTTED_LEN as u64 + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    (bytes.len() <= SLOTTED_LEN && bytes.is_ascii())
        .then(|| String::from_utf8(bytes).ok())
        .flatten()
}

/// Bytes of one slot: a line, its generation and checksum, padded with spaces, ending in `\n`.
const SLOT_LEN: usize = 128;
/// Where the second slot starts: on another page than the first, so that a torn write of one
/// cannot touch the other.
const SLOT_STRIDE: usize = 4096;
/// The length of a slotted file (a file of the single-line form is never this long).
const SLOTTED_LEN: usize = SLOT_STRIDE + SLOT_LEN;

/// A slot that reads back whole: its line and generation.
struct Slot<'a> {
    line: &'a str,
    generation: u64,
}

/// `<line> <generation> <crc32c of "<line> <generation>", 8 hex digits>`, padded.
fn slot_bytes(line: &str, generation: u64) -> Option<[u8; SLOT_LEN]> {
    let body = format!("{line} {generation}");
    let text = format!("{body} {:08x}", crc32c::crc32c(body.as_bytes()));
    if text.len() >= SLOT_LEN {
        return None;
    }
    let mut slot = [b' '; SLOT_LEN];
    slot[..text.len()].copy_from_slice(text.as_bytes());
    slot[SLOT_LEN - 1] = b'\n';
    Some(slot)
}

fn read_slot(text: &str) -> Option<Slot<'_>> {
    let text = text.trim_end();
    let (body, crc) = text.rsplit_once(' ')?;
    if crc.len() != 8 || u32::from_str_radix(crc, 16).ok()? != crc32c::crc32c(body.as_bytes()) {
        return None;
    }
    let (line, generation) = body.rsplit_once(' ')?;
    Some(Slot {
        line,
        generation: generation.parse().ok()?,
    })
}

/// The slot with the highest generation among those that read back whole, and its index.
fn newest_slot(text: &str) -> Option<(usize, Slot<'_>)> {
    let slots = [&text[..SLOT_LEN], &text[SLOT_STRIDE..]];
    slots
        .into_iter()
        .enumerate()
        .filter_map(|(i, t)| read_slot(t).map(|slot| (i, slot)))
        .max_by_key(|(_, slot)| slot.generation)
}

/// When a cursor file was saved, and whether by this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Saved {
    /// Wall-clock ms since the epoch, as the saving process's clock read then.
    pub(super) ms: u64,
    /// Saved by this process: it has been running since, so this replica was not away,
    /// whatever the wall clock did meanwhile.
    pub(super) here: bool,
}

/// This process's mark in the cursor files it saves (random per process). "Saved by this
/// process" was once judged by comparing the saved time with the process's start time, both
/// from the wall clock: a clock stepped back while a file was re-saved made this process's own
/// fresh start position look older than the process, and older than the tombstone retention
/// once the clock came back; the replica then took itself for one that was away and answered
/// 503 `ReplicaUnchecked` for good (the nemesis with clock jumps and moves, seed 11).
pub(super) fn process_text() -> &'static String {
    static MARK: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MARK.get_or_init(|| {
        use std::hash::BuildHasher;
        // RandomState is keyed from the OS's randomness, once per process.
        let mark = std::collections::hash_map::RandomState::new()
            .hash_one((std::process::id(), std::time::SystemTime::now()));
        format!("{mark:016x}")
    })
}

/// A position before every change of the peer's feed: this replica has applied nothing of
/// it, so it has never shown the peer a position that let it drop a tombstone.
pub(super) fn at_start(cursor: Cursor) -> bool {
    cursor.sequence == 0
}

pub(super) fn incarnation_text(incarnation: u64) -> String {
    format!("{incarnation:016x}")
}

/// Saves a cursor durably: a crash must never move it past changes that are not applied here.
/// (Moving it back is harmless: applying a change twice is a no-op.) A slot holds the peer's
/// cursor, the local replica's incarnation, when it was saved and by which process:
/// `<cursor> <local incarnation> <ms since the epoch> <process mark>` (`process_text`).
pub(super) fn save_cursor(
    path: &Path,
    cursor: Cursor,
    local_incarnation: u64,
) -> std::io::Result<()> {
    let line = format!(
        "{cursor} {} {} {}",
        incarnation_text(local_incarnation),
        now_ms(),
        process_text()
    );
    match save_in_place(path, &line) {
        Ok(true) => return Ok(()),
        Ok(false) => {}
        Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => {}
        Err(err) => return Err(err),
    }
    save_as_new_file(path, &line)
}

/// Overwrites the older slot of a slotted file in place and syncs it; `false` when the file
/// is missing or not slotted (nothing written).
fn save_in_place(path: &Path, line: &str) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(err),
    };
    let Some(text) = read_text(&mut file).filter(|t| t.len() == SLOTTED_LEN) else {
        return Ok(false);
    };
    let (index, generation) = match newest_slot(&text) {
        Some((i, slot)) => (1 - i, slot.generation.saturating_add(1)),
        None => (0, 1),
    };
    let slot = slot_bytes(line, generation).ok_or_else(too_long)?;
    file.write_all_at(&slot, (index * SLOT_STRIDE) as u64)?;
    file.sync_data()?;
    Ok(true)
}

fn too_long() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, "cursor line too long")
}

/// Writes a new slotted file (the line in its first slot) through a temporary file and a
/// rename, both synced; into a spare (the single-line form) when the disk is full.
fn save_as_new_file(path: &Path, line: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut file_bytes = vec![b' '; SLOTTED_LEN];
    file_bytes[..SLOT_LEN].copy_from_slice(&slot_bytes(line, 1).ok_or_else(too_long)?);
    file_bytes[SLOT_STRIDE - 1] = b'\n';
    file_bytes[SLOTTED_LEN - 1] = b'\n';
    let written = std::fs::File::create(&tmp).and_then(|mut file| {
        file.write_all(&file_bytes)?;
        file.sync_data()
    });
    match written {
        Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => {
            let _ = std::fs::remove_file(&tmp);
            write_into_spare(&tmp, &format!("{line}\n"))?;
        }
        other => other?,
    }
    std::fs::rename(&tmp, path)?;
    // The rename must be durable too: a cursor that went back after a power loss would ask
    // the peer for a position before tombstones it may have dropped since (a 409: rebuild).
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Cursor files made ahead of need in the replication directory, each already holding
/// `SPARE_LEN` bytes on disk. A cursor saved while the disk is full goes into one of them,
/// overwritten in place (which needs no new space). Above all a new peer's start position
/// (`note_new_peer`): lost to a full disk and then a crash, it made this replica suspect
/// itself of being behind that peer for good, answering 503 `ReplicaUnchecked` until rebuilt
/// by hand (the nemesis, seed 1: a full disk during a replace-node, then a power loss).
const SPARES: usize = 32;
const SPARE_LEN: usize = 160;
const SPARE_EXTENSION: &str = "spare";

/// Tops the replication directory up to `SPARES` spare cursor files (at every start of
/// replication: process start and map change). A full disk leaves it short: best effort.
pub(super) fn make_spares(dir: &Path) {
    use std::io::Write;
    if larder_store::create_dir_all_durable(dir).is_err() {
        return;
    }
    let have = std::fs::read_dir(dir).map_or(0, |entries| {
        let spare =
            |e: &std::fs::DirEntry| e.path().extension().is_some_and(|x| x == SPARE_EXTENSION);
        entries.flatten().filter(spare).count()
    });
    // Names only need to differ from each other and from spares left by earlier starts.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    for n in have..SPARES {
        let path = dir.join(format!("{stamp}-{n}.{SPARE_EXTENSION}"));
        let made = std::fs::File::create(&path).and_then(|mut file| {
            file.write_all(&[b' '; SPARE_LEN])?;
            file.sync_data()
        });
        if made.is_err() {
            let _ = std::fs::remove_file(&path);
            break;
        }
    }
    let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
}

/// Writes `text` (padded with spaces, which `load_cursor` skips) into a spare cursor file
/// renamed to `tmp`, in place.
fn write_into_spare(tmp: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let full = || std::io::Error::from_raw_os_error(libc::ENOSPC);
    let dir = tmp.parent().ok_or_else(full)?;
    let spare = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == SPARE_EXTENSION))
        .ok_or_else(full)?;
    let line = text.trim_end();
    if line.len() >= SPARE_LEN {
        return Err(full());
    }
    std::fs::rename(&spare, tmp)?;
    let mut padded = line.as_bytes().to_vec();
    padded.resize(SPARE_LEN - 1, b' ');
    padded.push(b'\n');
    let mut file = std::fs::OpenOptions::new().write(true).open(tmp)?;
    file.write_all(&padded)?;
    file.sync_data()
}

/// One link's cursor file, shared by the link's rounds and its worker's keeper of start
/// positions (`replication::keep_starts_fresh`). Every write goes through the lock, so the
/// keeper never puts the start back over a position a round has just saved.
pub(super) struct CursorFile {
    path: PathBuf,
    state: Mutex<FileState>,
}

struct FileState {
    /// What the file holds, as this process last wrote or read it.
    cursor: Cursor,
    /// When this process last wrote it (monotonic, so a wall clock that jumps changes nothing);
    /// `None`: not since this process started or read it again.
    saved_at: Option<Instant>,
    /// A bulk bootstrap of the partition owns the file until the link reads it again.
    paused: bool,
}

impl CursorFile {
    /// `paused` when a bulk bootstrap of the partition owns the file now: the link reads it
    /// again once the copy is done (the copy may end before the link's first round).
    pub(super) fn new(path: PathBuf, cursor: Cursor, paused: bool) -> Arc<Self> {
        let state = FileState {
            cursor,
            saved_at: None,
            paused,
        };
        Arc::new(CursorFile {
            path,
            state: Mutex::new(state),
        })
    }

    /// Saves `cursor` durably (blocking: syncs the file and its directory).
    pub(super) fn save(&self, cursor: Cursor, local_incarnation: u64) -> std::io::Result<()> {
        let mut state = self.lock();
        save_cursor(&self.path, cursor, local_incarnation)?;
        state.cursor = cursor;
        state.saved_at = Some(Instant::now());
        Ok(())
    }

    /// [`CursorFile::save`] on a blocking thread: it syncs a file and its directory, which must
    /// not stall the async workers that serve reads and writes.
    pub(super) async fn save_off_thread(
        self: &Arc<Self>,
        cursor: Cursor,
        local_incarnation: u64,
    ) -> std::io::Result<()> {
        let file = self.clone();
        crate::node::blocking(move || file.save(cursor, local_incarnation)).await
    }

    /// Whether this process last wrote the file more than `every` ago, or not at all.
    pub(super) fn stale(&self, every: Duration) -> bool {
        self.lock().saved_at.is_none_or(|at| at.elapsed() > every)
    }

    /// Saves a position at the start again, with the time now, if the file holds one, is stale
    /// and no bootstrap owns it (blocking); whether it wrote.
    ///
    /// At the start means sequence 0, in any incarnation of the peer, as `check_link` reads it:
    /// [`Cursor::START`] (never pulled) or the peer's own `<incarnation>.0` (pulled while its
    /// feed was empty). Refreshing only the first left the second saved once, at the one pull
    /// that answered; a peer killed then, and a whole-cluster power loss a retention later, made
    /// this replica take itself for one that was away from that peer: 503 `ReplicaUnchecked`
    /// for good (the power-loss regression test, seed 5, on a loaded machine).
    pub(super) fn refresh_start(
        &self,
        every: Duration,
        local_incarnation: u64,
    ) -> std::io::Result<bool> {
        let mut state = self.lock();
        let stale = state.saved_at.is_none_or(|at| at.elapsed() > every);
        if !at_start(state.cursor) || state.paused || !stale {
            return Ok(false);
        }
        save_cursor(&self.path, state.cursor, local_incarnation)?;
        state.saved_at = Some(Instant::now());
        Ok(true)
    }

    /// Hands the file to a bulk bootstrap, which saves its source's cursor at its end.
    pub(super) fn pause(&self) {
        self.lock().paused = true;
    }

    pub(super) fn paused(&self) -> bool {
        self.lock().paused
    }

    /// Takes the file back from a bootstrap: reads what it saved (blocking).
    pub(super) fn resume(&self, local_incarnation: u64) -> Cursor {
        let mut state = self.lock();
        let (cursor, saved) = load_cursor(&self.path, local_incarnation);
        state.cursor = cursor;
        state.saved_at = saved.filter(|s| s.here).map(|_| Instant::now());
        state.paused = false;
        cursor
    }

    fn lock(&self) -> MutexGuard<'_, FileState> {
        // A poisoned lock only means a panic elsewhere; the state is still what was written.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_saved_on_a_full_disk_goes_into_a_spare_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        make_spares(dir.path());
        let spares = || {
            std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == SPARE_EXTENSION))
                .count()
        };
        assert_eq!(spares(), SPARES);
        let path = dir.path().join("p1-s2.cursor");
        let text = format!(
            "{} {} {} {}\n",
            Cursor::START,
            incarnation_text(7),
            now_ms(),
            process_text()
        );
        let tmp = path.with_extension("tmp");
        write_into_spare(&tmp, &text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        assert_eq!(spares(), SPARES - 1, "one spare used");
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            SPARE_LEN as u64,
            "in place"
        );
        let (loaded, saved) = load_cursor(&path, 7);
        assert_eq!(loaded, Cursor::START);
        assert!(
            saved.is_some_and(|s| s.here),
            "with its time, by this process"
        );
        make_spares(dir.path());
        assert_eq!(spares(), SPARES, "topped up at the next start");
    }

    fn position(sequence: u64) -> Cursor {
        Cursor {
            incarnation: 0xabc,
            sequence,
        }
    }

    #[test]
    fn saves_alternate_slots_in_place_and_the_newest_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p1-s2.cursor");
        save_cursor(&path, position(1), 7).unwrap();
        let inode = || std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
        let first = inode();
        for sequence in 2..=5 {
            save_cursor(&path, position(sequence), 7).unwrap();
            assert_eq!(load_cursor(&path, 7).0, position(sequence));
            assert_eq!(std::fs::metadata(&path).unwrap().len(), SLOTTED_LEN as u64);
        }
        assert_eq!(inode(), first, "overwritten in place, not replaced");
        let text = std::fs::read_to_string(&path).unwrap();
        let generations: Vec<u64> = [&text[..SLOT_LEN], &text[SLOT_STRIDE..]]
            .iter()
            .map(|t| read_slot(t).unwrap().generation)
            .collect();
        assert_eq!(
            generations,
            [5, 4],
            "five saves: slot 0 holds the 1st, 3rd and 5th"
        );
    }

    /// A crash in the middle of a save tears at most the slot being written: the other one
    /// holds the position saved before, the last one the peer was shown.
    #[test]
    fn a_torn_slot_falls_back_to_the_position_saved_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p1-s2.cursor");
        save_cursor(&path, position(10), 7).unwrap();
        save_cursor(&path, position(11), 7).unwrap(); // into slot 1
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[SLOT_STRIDE + 3] ^= 0x01; // one bit of the newest slot
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(load_cursor(&path, 7).0, position(10));
        // The next save goes over the torn slot, not over the good one.
        save_cursor(&path, position(12), 7).unwrap();
        assert_eq!(load_cursor(&path, 7).0, position(12));
        let text = std::fs::read_to_string(&path).unwrap();
        let kept = read_slot(&text[..SLOT_LEN]).expect("slot 0 untouched");
        assert!(
            kept.line.starts_with(&position(10).to_string()),
            "{}",
            kept.line
        );
        let new = read_slot(&text[SLOT_STRIDE..]).expect("slot 1 rewritten");
        assert!(
            new.line.starts_with(&position(12).to_string()),
            "{}",
            new.line
        );
        save_cursor(&path, position(13), 7).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            read_slot(&text[..SLOT_LEN]).is_some() && read_slot(&text[SLOT_STRIDE..]).is_some()
        );
        // Both torn: no position at all (pull from the start), as for a lost file.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[0] ^= 0x01;
        bytes[SLOT_STRIDE] ^= 0x01;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(load_cursor(&path, 7), (Cursor::START, None));
    }

    #[test]
    fn a_file_of_the_single_line_form_reads_and_is_rewritten_slotted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p1-s2.cursor");
        let line = format!(
            "{} {} 5 {}\n",
            position(3),
            incarnation_text(7),
            process_text()
        );
        std::fs::write(&path, line).unwrap();
        assert_eq!(load_cursor(&path, 7).0, position(3));
        save_cursor(&path, position(4), 7).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), SLOTTED_LEN as u64);
        assert_eq!(load_cursor(&path, 7).0, position(4));
        // Longer than any cursor file, or not text: none.
        std::fs::write(&path, vec![b' '; SLOTTED_LEN + 1]).unwrap();
        assert_eq!(load_cursor(&path, 7), (Cursor::START, None));
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert_eq!(load_cursor(&path, 7), (Cursor::START, None));
    }

    proptest::proptest! {
        /// Whatever the disk holds, reading it never panics; a slot reads back what was put in.
        #[test]
        fn slots_read_back_and_any_bytes_are_safe(
            sequence in 0u64..u64::MAX,
            generation in 0u64..u64::MAX,
            noise in proptest::collection::vec(proptest::num::u8::ANY, 0..SLOTTED_LEN + 2),
            at in 0usize..SLOT_LEN,
        ) {
            let line = format!("{} {} 5 {}", position(sequence), incarnation_text(7), process_text());
            let slot = slot_bytes(&line, generation).unwrap();
            let read = read_slot(std::str::from_utf8(&slot).unwrap()).unwrap();
            proptest::prop_assert_eq!((read.line, read.generation), (line.as_str(), generation));
            let mut flipped = slot;
            flipped[at] ^= 0x20;
            if let Ok(text) = std::str::from_utf8(&flipped) {
                // A changed byte fails the checksum, unless it only turned padding into padding.
                let same = read_slot(text).is_some_and(|r| r.line == line && r.generation == generation);
                proptest::prop_assert!(read_slot(text).is_none() || same);
            }
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("p1-s2.cursor");
            std::fs::write(&path, &noise).unwrap();
            let _ = load_cursor(&path, 7);
            let mut slotted = noise.clone();
            slotted.resize(SLOTTED_LEN, b' ');
            std::fs::write(&path, &slotted).unwrap();
            let _ = load_cursor(&path, 7);
        }
    }

    #[test]
    fn saved_cursors_belong_to_the_local_incarnation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p1-s2.cursor");
        assert_eq!(load_cursor(&path, 7), (Cursor::START, None), "none saved");
        let cursor = Cursor {
            incarnation: 0xabc,
            sequence: 42,
        };
        let before = now_ms();
        save_cursor(&path, cursor, 7).unwrap();
        let (loaded, saved) = load_cursor(&path, 7);
        assert_eq!(loaded, cursor);
        let saved = saved.unwrap();
        assert!(saved.ms >= before, "saved with its time");
        assert!(saved.here, "by this process");
        // The local replica was rebuilt: pull everything again.
        assert_eq!(load_cursor(&path, 8).0, Cursor::START);
        // A cursor of the old physical format (`<segment>.<offset>`) restarts too.
        std::fs::write(&path, "3.1048576").unwrap();
        assert_eq!(load_cursor(&path, 7).0, Cursor::START);
        std::fs::write(&path, "garbage 0000000000000007").unwrap();
        assert_eq!(load_cursor(&path, 7).0, Cursor::START);
        // Written by a build that saved no time: counts as saved now.
        std::fs::write(&path, "0000000000000abc.42 0000000000000007\n").unwrap();
        let (loaded, saved) = load_cursor(&path, 7);
        assert_eq!(loaded, cursor);
        assert!(saved.unwrap().ms >= before);
        assert!(!saved.unwrap().here);
        // Saved by another process, at a time its clock read: not this process's, whatever the
        // time says (a clock stepped back or forward does not make it this process's).
        std::fs::write(
            &path,
            "0000000000000abc.42 0000000000000007 5 00000000deadbeef\n",
        )
        .unwrap();
        assert_eq!(load_cursor(&path, 7).1, Some(Saved { ms: 5, here: false }));
        let mine = format!(
            "0000000000000abc.42 0000000000000007 5 {}\n",
            process_text()
        );
        std::fs::write(&path, mine).unwrap();
        assert_eq!(load_cursor(&path, 7).1, Some(Saved { ms: 5, here: true }));
    }

    #[test]
    fn the_keeper_refreshes_only_a_stale_start_that_no_one_else_owns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p1-s2.cursor");
        let file = CursorFile::new(path.clone(), Cursor::START, false);
        let every = Duration::from_millis(20);
        assert!(file.refresh_start(every, 7).unwrap(), "never written here");
        assert!(!file.refresh_start(every, 7).unwrap(), "just written");
        std::thread::sleep(Duration::from_millis(30));
        file.pause();
        assert!(
            !file.refresh_start(every, 7).unwrap(),
            "a bootstrap owns it"
        );
        let position = Cursor {
            incarnation: 0xabc,
            sequence: 9,
        };
        save_cursor(&path, position, 7).unwrap(); // the bootstrap's end
        assert_eq!(file.resume(7), position);
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            !file.refresh_start(every, 7).unwrap(),
            "never the start over a position"
        );
        assert_eq!(load_cursor(&path, 7).0, position);
        file.save(Cursor::START, 7).unwrap(); // a peer's new incarnation
        std::thread::sleep(Duration::from_millis(30));
        assert!(file.refresh_start(every, 7).unwrap());
        assert!(load_cursor(&path, 7).1.is_some_and(|s| s.here));
    }

    /// A pull that found the peer's feed empty leaves `<peer incarnation>.0`: still the start
    /// of that feed (`check_link` reads sequence 0 as the start), so it is kept fresh as it is,
    /// its incarnation with it.
    #[test]
    fn the_keeper_refreshes_the_start_of_a_peers_empty_feed_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p2-s1.cursor");
        let empty_feed = Cursor {
            incarnation: 0xabc,
            sequence: 0,
        };
        let file = CursorFile::new(path.clone(), Cursor::START, false);
        file.save(empty_feed, 7).unwrap();
        let every = Duration::from_millis(20);
        assert!(!file.refresh_start(every, 7).unwrap(), "just written");
        std::fs::write(
            &path,
            format!("{empty_feed} {} 5 other\n", incarnation_text(7)),
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert!(file.refresh_start(every, 7).unwrap(), "stale: saved again");
        let (cursor, saved) = load_cursor(&path, 7);
        assert_eq!(cursor, empty_feed, "the peer's incarnation kept");
        assert!(
            saved.is_some_and(|s| s.here && s.ms > 5),
            "with the time now"
        );
    }
}
