//! The free-space reserve: puts are refused with [`Error::OutOfSpace`] while the replica's
//! filesystem has less than `Options::min_free_space` available. A disk that fills to its last
//! byte fails writes mid-record and leaves no room for what frees space (tombstones, checkpoints,
//! compaction); with a reserve, a full node refuses new data cleanly and still takes deletes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::segment::io_error;
use crate::types::{Error, Result};

/// `statvfs` at most this often; in between, accepted puts are subtracted from the last figure.
const RECHECK: Duration = Duration::from_millis(100);

pub(crate) struct SpaceGuard {
    dir: PathBuf,
    reserve: u64,
    /// When the filesystem was last asked, and what is free by our count since.
    last: Mutex<Option<(Instant, u64)>>,
}

impl SpaceGuard {
    pub fn new(dir: &Path, reserve: u64) -> Self {
        SpaceGuard {
            dir: dir.to_path_buf(),
            reserve,
            last: Mutex::new(None),
        }
    }

    /// Whether `incoming` more bytes may be written without eating into the reserve.
    pub fn admit(&self, incoming: u64) -> Result<()> {
        if self.reserve == 0 {
            return Ok(());
        }
        let mut last = self.last.lock();
        let (at, free) = match *last {
            Some((at, free)) if at.elapsed() < RECHECK => (at, free),
            _ => (Instant::now(), available(&self.dir).map_err(io_error)?),
        };
        if free < self.reserve.saturating_add(incoming) {
            *last = Some((at, free));
            return Err(Error::OutOfSpace);
        }
        *last = Some((at, free - incoming));
        Ok(())
    }
}

/// Bytes available on the filesystem holding `dir`, if it can be asked.
pub(crate) fn free_bytes(dir: &Path) -> Option<u64> {
    available(dir).ok()
}

/// Bytes available to unprivileged writers on the filesystem holding `dir`.
fn available(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: `path` is a valid C string and `stat` is written by the call before it is read.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stat.f_bavail as u64 * stat.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_would_eat_into_the_reserve() {
        let dir = tempfile::tempdir().unwrap();
        let free = available(dir.path()).unwrap();
        assert!(free > 0);
        assert!(SpaceGuard::new(dir.path(), 0).admit(u64::MAX).is_ok());
        let guard = SpaceGuard::new(dir.path(), free / 2);
        assert!(guard.admit(1000).is_ok());
        assert!(matches!(guard.admit(free), Err(Error::OutOfSpace)));
        let full = SpaceGuard::new(dir.path(), free.saturating_mul(2));
        assert!(matches!(full.admit(1), Err(Error::OutOfSpace)));
    }

    #[test]
    fn counts_admitted_bytes_between_checks() {
        let dir = tempfile::tempdir().unwrap();
        let free = available(dir.path()).unwrap();
        let guard = SpaceGuard::new(dir.path(), free / 2);
        // Within one recheck interval, admitted bytes are subtracted from the last figure.
        guard.admit(free / 4).unwrap();
        assert!(matches!(guard.admit(free / 3), Err(Error::OutOfSpace)));
    }
}
