//! `tombstones.dropped`: the largest sequence number of a tombstone compaction ever dropped from
//! this replica. A peer that asks for the change feed from a position before it (in this
//! incarnation) cannot have seen that tombstone here any more; the storage node refuses it as a
//! replica that must be rebuilt (`FORMAT.md`, "Dropping tombstones").
//!
//! Written (temp file, synced, renamed, directory synced) before the rewrite that drops the
//! tombstones commits, so it is never behind what was dropped; a crash in between leaves it
//! ahead, which only makes the check stricter.

use std::io::{self, Write};
use std::path::Path;

use crate::segment::sync_dir;

pub(crate) const DROPPED_FILE: &str = "tombstones.dropped";
const TMP_NAME: &str = "tombstones.dropped.tmp";
const MAGIC: &[u8; 8] = b"LRDRDROP";

fn encode(seq: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(20);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&seq.to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn decode(bytes: &[u8]) -> Option<u64> {
    if bytes.len() != 20 || &bytes[..8] != MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(bytes[16..].try_into().ok()?);
    if crc32c::crc32c(&bytes[..16]) != crc {
        return None;
    }
    Some(u64::from_le_bytes(bytes[8..16].try_into().ok()?))
}

/// Durably records that tombstones up to `seq` are (about to be) dropped.
pub(crate) fn save(dir: &Path, seq: u64) -> io::Result<()> {
    let tmp = dir.join(TMP_NAME);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(&encode(seq))?;
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(DROPPED_FILE))?;
    sync_dir(dir)
}

/// The recorded sequence: 0 when no tombstone was ever dropped. A file that does not verify
/// (it is written atomically, so only the disk damaged it) counts as "everything up to
/// `last_seq` may have been dropped": stricter, never laxer.
pub(crate) fn load(dir: &Path, last_seq: u64) -> io::Result<u64> {
    // A save cut short by a crash: the rename never happened, so the file it would have
    // replaced still holds the truth.
    match std::fs::remove_file(dir.join(TMP_NAME)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    match std::fs::read(dir.join(DROPPED_FILE)) {
        Ok(bytes) => Ok(decode(&bytes).unwrap_or_else(|| {
            tracing::warn!(dir = %dir.display(), "tombstones.dropped is corrupt; assuming every tombstone was dropped");
            last_seq
        })),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trips_and_refuses_damage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(super::load(dir.path(), 9).unwrap(), 0);
        super::save(dir.path(), 42).unwrap();
        assert_eq!(super::load(dir.path(), 9).unwrap(), 42);
        let path = dir.path().join(super::DROPPED_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[9] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(super::load(dir.path(), 9).unwrap(), 9);
    }

    #[test]
    fn a_save_cut_short_leaves_nothing_behind_once_loaded() {
        let dir = tempfile::tempdir().unwrap();
        super::save(dir.path(), 7).unwrap();
        std::fs::write(dir.path().join(super::TMP_NAME), b"half").unwrap();
        assert_eq!(super::load(dir.path(), 9).unwrap(), 7);
        assert!(!dir.path().join(super::TMP_NAME).exists());
    }
}
