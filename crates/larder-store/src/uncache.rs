//! Large records leave the page cache once synced, oldest first, past a window of the most
//! recent ones (`Options::uncache_synced_from`, `DiskOptions::uncache_after_recent`).
//!
//! Why drop them at all: a large write fills fresh page-cache pages, and on a VM whose free
//! memory goes back to the host a fresh page costs far more than a reused one (a fault in the
//! host, as we read it; most of a storage node's CPU under 4 MiB PUTs,
//! `benchmarks/store/UNCACHE.md`). A dropped record's clean pages
//! are freed at once and the next writes take them back. Why keep a window: what was written
//! last is what is read next (a client reading its upload back, a peer catching up on
//! replication), and reading it from disk again would cost as much.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::segment::drop_cached;

/// The largest page-cache folio (a PMD, 2 MiB on x86-64). The kernel drops only the folios that
/// lie wholly inside the range it is advised of, and ext4 caches a file in folios of up to this
/// size, so the folio across the boundary between two records stays when either is dropped
/// alone (half of every 2 MiB record stayed, in the test). A record's range is widened back to
/// this alignment: the folio it shares with the record before (dropped already, being older)
/// goes with it, and the one it shares with the next goes when the next one does.
const FOLIO_MAX: u64 = 2 << 20;

/// Synced large records still in the page cache, newest last, up to a byte budget per disk.
pub(crate) struct RecentLarge {
    window: Mutex<Window>,
    keep: u64,
}

#[derive(Default)]
struct Window {
    /// File (not kept open: a segment compaction deletes frees its space), offset, length.
    records: VecDeque<(Weak<File>, u64, u64)>,
    bytes: u64,
}

impl RecentLarge {
    pub fn new(keep: u64) -> RecentLarge {
        RecentLarge {
            window: Mutex::new(Window::default()),
            keep,
        }
    }

    /// Takes records a round just synced, and drops from the page cache the oldest ones past
    /// the window (outside the lock: a `fadvise` frees its pages as it goes).
    pub fn synced(&self, records: Vec<(Arc<File>, u64, u64)>) {
        if records.is_empty() {
            return;
        }
        let mut past = Vec::new();
        {
            let mut window = self.window.lock();
            for (file, offset, len) in records {
                window
                    .records
                    .push_back((Arc::downgrade(&file), offset, len));
                window.bytes = window.bytes.saturating_add(len);
            }
            while window.bytes > self.keep {
                let Some(oldest) = window.records.pop_front() else {
                    break;
                };
                window.bytes = window.bytes.saturating_sub(oldest.2);
                past.push(oldest);
            }
        }
        for (file, offset, len) in past {
            // Pages of the records before in the widened range go too: older, or small ones
            // (read from disk again if asked for), never data.
            let start = offset - offset % FOLIO_MAX;
            // A file gone meanwhile took its pages with it. Advice only: if it fails, the pages
            // stay cached until the kernel reclaims them.
            if let Some(file) = file.upgrade() {
                let _ = drop_cached(&file, start, len.saturating_add(offset - start));
            }
        }
    }
}
