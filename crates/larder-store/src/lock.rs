//! One process, one store per directory: two writers appending to the same segments would
//! interleave records and break every promise the store makes.

use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::types::{Error, Result};

pub(crate) const LOCK_FILE: &str = "LOCK";

/// Takes an exclusive `flock` on `<dir>/LOCK`, held for as long as the returned file is open
/// (the kernel drops it when the process dies, so a crash never leaves a stale lock).
pub(crate) fn lock_dir(dir: &Path) -> Result<File> {
    lock_file(&dir.join(LOCK_FILE), dir)
}

/// Takes an exclusive `flock` on `path` (created if needed) on behalf of `dir`.
pub(crate) fn lock_file(path: &Path, dir: &Path) -> Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    // SAFETY: flock on a file descriptor we own; no memory is shared.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(Error::Unavailable(format!(
                "{} is already open in another store",
                dir.display()
            )));
        }
        return Err(Error::Io(err));
    }
    Ok(file)
}
