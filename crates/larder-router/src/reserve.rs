//! Journal entries reserved ahead of need, so that a body held in the upload journal goes out
//! without waiting on a journal sync.
//!
//! An S3 PutObject stores its body under a journal entry held for the name (`journal.rs`), and
//! the body's ID must be on the journal's disk before the body can be on a storage node's:
//! otherwise a power loss between the two would leave a stored body that no journal lists and
//! no name points to, leaked for good. Recorded at request time, that sync stood in series with
//! the body's round and the index record's round: three syncs per PUT. Here a background task
//! mints IDs on random writable partitions and records each under an entry of its own, marked
//! reserved, a batch per sync, before any request needs them; a PUT takes one and sends its
//! body as that ID at once. What it is held for travels in the body's own metadata (the S3
//! layer's `held.rs`), so the request writes nothing to the journal but its `done`.
//!
//! What a crash leaves: reserved entries, used or not, which the router leaves to their holder
//! as it does held ones; at most `TARGET` of them were never used (an ID never written each).
//! A clean shutdown releases the unused ones (`release_reserved`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use larder_cluster::{BlobId, BlobKind};
use parking_lot::Mutex;

use crate::journal::JournalEntry;
use crate::Router;

/// Reserved entries kept ready: enough for the concurrent PUTs of a busy frontend between two
/// refills, few enough that a crash leaves little to settle (every replica asked of each).
const TARGET: usize = 64;
/// A refill starts when fewer than this many are left, and tops up to `TARGET` in one sync.
const LOW: usize = TARGET / 2;
/// Reserved entries looked at per request before minting a fresh ID instead (those skipped
/// name a partition no longer writable or healthy).
const TRIES: usize = 4;

/// The ready entries and whether a refill is under way.
#[derive(Default)]
pub(crate) struct Reserved {
    ready: Mutex<Ready>,
    refilling: AtomicBool,
}

#[derive(Default)]
struct Ready {
    entries: VecDeque<JournalEntry>,
    /// Set by a clean shutdown: no refill starts, and one under way hands its entries back.
    closed: bool,
}

/// How long a clean shutdown waits for a refill under way, whose entries it then releases too.
const REFILL_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Router {
    /// A journal entry for an upload of one simple blob: a reserved one when one is ready (its
    /// blob goes out without waiting on the journal), else a fresh one; `None` without a
    /// journal. Starts a refill when few are left (needs a tokio runtime).
    pub fn begin_simple_journal_entry(
        self: &Arc<Self>,
    ) -> Result<Option<JournalEntry>, crate::RouterError> {
        if self.journal.is_none() {
            return Ok(None);
        }
        let (taken, left, closed) = self.take_reserved();
        if !closed && left < LOW && !self.reserved.refilling.swap(true, Ordering::AcqRel) {
            tokio::spawn(self.clone().refill_reserved());
        }
        match taken {
            Some(entry) => Ok(Some(entry)),
            None => self.begin_journal_entry(),
        }
    }

    /// The first ready entry whose partition takes writes now (those passed over are given
    /// up), how many are left, and whether the pool is closed.
    fn take_reserved(self: &Arc<Self>) -> (Option<JournalEntry>, usize, bool) {
        let mut ready = self.reserved.ready.lock();
        let closed = ready.closed;
        for _ in 0..TRIES {
            let Some(entry) = ready.entries.pop_front() else {
                break;
            };
            match entry.reserved() {
                Some(id) if self.may_write_to(&id) => {
                    return (Some(entry), ready.entries.len(), closed)
                }
                _ => {
                    // Never sent: its `done` forgets it (lost, the next start finds the ID
                    // nowhere and forgets it then).
                    tokio::spawn(async move { entry.remove().await });
                }
            }
        }
        (None, ready.entries.len(), closed)
    }

    /// A clean shutdown: forgets the entries still ready, in one synced write, and starts no
    /// refill from now on, so the next start has none of them to settle (every replica asked,
    /// and asked again while one is down). A refill under way is waited for (a while), so
    /// that its entries are released too.
    pub async fn release_reserved(&self) {
        self.reserved.ready.lock().closed = true;
        let waiting_since = std::time::Instant::now();
        while self.reserved.refilling.load(Ordering::Acquire)
            && waiting_since.elapsed() < REFILL_WAIT
        {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let ready: Vec<JournalEntry> = self.reserved.ready.lock().entries.drain(..).collect();
        let Some(journal) = self.journal.as_ref().filter(|_| !ready.is_empty()) else {
            return;
        };
        if let Err(err) = journal.release(&ready).await {
            tracing::warn!(%err, "cannot release the reserved upload journal entries; the next start settles them");
        }
    }

    async fn refill_reserved(self: Arc<Self>) {
        let wanted = {
            let ready = self.reserved.ready.lock();
            // Closed after this refill was asked for: the shutdown saw it under way (it was
            // marked before the spawn) or sees it now ended; either way it adds nothing.
            if ready.closed {
                0
            } else {
                TARGET.saturating_sub(ready.entries.len())
            }
        };
        if wanted == 0 {
            self.reserved.refilling.store(false, Ordering::Release);
            return;
        }
        let ids: Result<Vec<BlobId>, _> = (0..wanted)
            .map(|_| {
                let partition = self.pick_partition(None)?;
                Ok::<_, crate::RouterError>(BlobId::mint(
                    BlobKind::Simple,
                    self.datacenter_id,
                    partition,
                ))
            })
            .collect();
        let reserved = match (ids, &self.journal) {
            (Ok(ids), Some(journal)) => journal.reserve(&ids).await.map_err(|e| e.to_string()),
            (Err(err), _) => Err(err.to_string()),
            (_, None) => Ok(Vec::new()),
        };
        match reserved {
            // Added even when closed meanwhile: the shutdown waiting for this refill releases
            // them with the rest.
            Ok(entries) => self.reserved.ready.lock().entries.extend(entries),
            Err(err) => tracing::warn!(%err, "cannot reserve upload journal entries"),
        }
        self.reserved.refilling.store(false, Ordering::Release);
    }
}
