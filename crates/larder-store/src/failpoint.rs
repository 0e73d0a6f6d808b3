//! Test-only fault injection in the write path (full disk, failing truncate, failing fdatasync), so the undo logic
//! that no real disk failure would reliably trigger in a test can be exercised.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

#[derive(Default)]
pub(crate) struct FailPoints {
    /// The next record write stores only this many bytes, then fails with ENOSPC.
    write_fails_after: Mutex<Option<usize>>,
    truncate_fails: AtomicBool,
    /// Creating the next journal file fails with ENOSPC (a full disk at rotation).
    journal_create_fails: AtomicBool,
    /// Retiring a journal file rotated out when full waits this long first, then fails (as if
    /// syncing its segments had) when the flag says so.
    retire_delay: Mutex<Option<(std::time::Duration, bool)>>,
    /// Every fdatasync waits this long, then fails with EIO (so writers pile up behind it).
    sync_fails_after: Mutex<Option<std::time::Duration>>,
    /// The next fdatasync (only it) waits this long, then fails with EIO.
    next_sync_fails_after: Mutex<Option<std::time::Duration>>,
    /// Every fdatasync waits this long first, then does its job.
    sync_delay: Mutex<Option<std::time::Duration>>,
    /// Compaction stops with an error at this step (1: rewrite synced, 2: renamed into place,
    /// 3: old generation deleted), as if the process died there.
    compaction_stop: Mutex<Option<u8>>,
}

impl FailPoints {
    pub fn fail_next_write_after(&self, bytes: usize) {
        *self.write_fails_after.lock() = Some(bytes);
    }

    pub fn set_truncate_fails(&self, fails: bool) {
        self.truncate_fails.store(fails, Ordering::SeqCst);
    }

    /// Writes a prefix of `bufs` and returns ENOSPC when armed, like a disk filling mid-record.
    pub fn partial_write(&self, file: &File, offset: u64, bufs: &[&[u8]]) -> Option<io::Error> {
        let mut left = self.write_fails_after.lock().take()?;
        let mut prefix = Vec::new();
        for b in bufs {
            let n = left.min(b.len());
            prefix.push(&b[..n]);
            left -= n;
        }
        if let Err(e) = crate::segment::write_all_vectored_at(file, offset, &prefix) {
            return Some(e);
        }
        Some(io::Error::from_raw_os_error(libc::ENOSPC))
    }

    pub fn fail_syncs_after(&self, delay: std::time::Duration) {
        *self.sync_fails_after.lock() = Some(delay);
    }

    pub fn fail_next_sync_after(&self, delay: std::time::Duration) {
        *self.next_sync_fails_after.lock() = Some(delay);
    }

    pub fn slow_syncs(&self, delay: Option<std::time::Duration>) {
        *self.sync_delay.lock() = delay;
    }

    /// EIO after the armed delay, like a disk that fails a flush.
    pub fn sync(&self) -> Option<io::Error> {
        if let Some(delay) = *self.sync_delay.lock() {
            std::thread::sleep(delay);
        }
        let next = self.next_sync_fails_after.lock().take();
        if let Some(delay) = next {
            std::thread::sleep(delay);
            return Some(io::Error::from_raw_os_error(libc::EIO));
        }
        let delay = (*self.sync_fails_after.lock())?;
        std::thread::sleep(delay);
        Some(io::Error::from_raw_os_error(libc::EIO))
    }

    pub fn stop_compaction_at(&self, point: Option<u8>) {
        *self.compaction_stop.lock() = point;
    }

    pub fn compaction_point(&self, point: u8) -> crate::types::Result<()> {
        if *self.compaction_stop.lock() == Some(point) {
            return Err(crate::types::Error::Unavailable(format!(
                "compaction stopped at fail point {point}"
            )));
        }
        Ok(())
    }

    pub fn set_journal_create_fails(&self, fails: bool) {
        self.journal_create_fails.store(fails, Ordering::SeqCst);
    }

    pub fn journal_create_fails(&self) -> bool {
        self.journal_create_fails.load(Ordering::SeqCst)
    }

    pub fn delay_retirements(&self, delay: Option<std::time::Duration>, then_fail: bool) {
        *self.retire_delay.lock() = delay.map(|d| (d, then_fail));
    }

    /// Whether a retirement fails (after waiting as told).
    pub fn retirement_fails(&self) -> bool {
        let Some((delay, then_fail)) = *self.retire_delay.lock() else {
            return false;
        };
        std::thread::sleep(delay);
        then_fail
    }

    pub fn truncate_fails(&self) -> bool {
        self.truncate_fails.load(Ordering::SeqCst)
    }
}
