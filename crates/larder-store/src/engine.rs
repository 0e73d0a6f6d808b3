//! The engine behind a [`crate::Store`]: the state of one open store directory (its log, index,
//! segments and checkpoints), shared by every clone of the handle, and the decisions each
//! operation makes before it reaches the log (validation, "already exists", tombstones win, last
//! writer wins). `commit`, `checkpoint`, `recovery` and `feed` add the rest of its methods.
//!
//! ## Lock order
//!
//! Locks are taken in this order, never the reverse; none is held across a sync or a wake-up:
//!
//! 0. `compaction` (one pass at a time) is taken before everything else;
//! 1. `ckpt.lock` (one checkpoint at a time), then `index` for reading; compaction's swap holds
//!    it while it takes `index`, `segments`, `feed_hints` and `log`, one at a time;
//! 2. `log` (the append mutex), then `index` (read to decide, write to publish) or `segments`
//!    (write, to add a segment on rotation) — never both at once;
//! 3. `index` and `segments` are otherwise taken alone and briefly;
//! 4. `lock` (the directory lock), `feed_hints` and `space`'s own mutex are leaves;
//! 5. the disk's queue and failure mutexes (`disk::Shared`) are leaves too: a writer queues its
//!    log after releasing `log`, and the commit thread takes one log's `log` at a time, never
//!    while holding the queue.
//!
//! No `fdatasync` happens under `log`: the commit thread syncs the journal with no store lock
//! held, and completions are completed with no lock held, so readers and writers never wait on
//! the disk, only their own completion does.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Weak;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

use crate::checkpoint::CheckpointState;
use crate::commit::{Appended, LogState, PendingBlob};
use crate::format::{RecordInfo, MAX_PROPS_LEN};
use crate::index::{BlobState, DocState, Index};
use crate::segment::Segment;
use crate::types::*;

#[derive(Default)]
pub(crate) struct Counters {
    pub appended: AtomicU64,
    pub syncs: AtomicU64,
    pub corrupt: AtomicU64,
    /// Segment bytes the change feed read (`feed.rs`): each byte of the log O(1) times over a
    /// reader's pass, not once per page.
    pub feed_read: AtomicU64,
    /// Bytes of large record reads, from the page cache or past it (`cold.rs`); shared with
    /// the readers, which outlive a borrow of the store.
    pub large_reads: std::sync::Arc<crate::cold::LargeReads>,
}

/// One open store. See the module docs for its lock order.
pub(crate) struct Engine {
    pub dir: PathBuf,
    /// The directory's exclusive lock, held until `close` (after which this store never writes).
    pub lock: parking_lot::Mutex<Option<std::fs::File>>,
    pub opts: Options,
    pub log: Mutex<LogState>,
    /// The disk whose journal and commit thread make this store's writes durable.
    pub disk: crate::disk::Disk,
    /// This store's directory relative to the disk's root: how journal frames name it.
    pub rel_path: Vec<u8>,
    /// Whether `disk` is this store's own (`Store::open`): then closing the store closes it.
    pub private_disk: bool,
    pub index: RwLock<Index>,
    /// Every segment, ascending by id; the last one is the active segment.
    pub segments: RwLock<Vec<Segment>>,
    pub counters: Counters,
    pub space: crate::space::SpaceGuard,
    pub ckpt: CheckpointState,
    /// Made when the directory was created (in every segment header): the first half of every
    /// change feed cursor.
    pub incarnation: u64,
    pub feed_hints: Mutex<crate::feed::FeedHints>,
    /// Held by a compaction pass for its whole run: one pass at a time per store. What the
    /// passes learnt of each segment (`ledger.rs`).
    pub compaction: Mutex<crate::ledger::Ledger>,
    /// The largest sequence of a tombstone compaction dropped (`dropped.rs`).
    pub dropped_through: AtomicU64,
    /// Lets `&self` methods hand an owning reference to the background checkpoint thread.
    pub me: Weak<Engine>,
    #[cfg(test)]
    pub fail: crate::failpoint::FailPoints,
}

pub(crate) fn check_key(key: &[u8]) -> Result<()> {
    if key.is_empty() {
        return Err(Error::BadKey("empty key".into()));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::BadKey(format!(
            "{} bytes is longer than {MAX_KEY_LEN}",
            key.len()
        )));
    }
    Ok(())
}

pub(crate) fn check_size(size: u64, limit: u64) -> Result<()> {
    if size > limit {
        return Err(Error::TooLarge { size, limit });
    }
    Ok(())
}

/// A blob's state as writers must see it: pending (appended, not yet durable) first.
pub(crate) fn blob_state(st: &LogState, index: &Index, key: &[u8]) -> Option<PendingBlob> {
    if let Some((_, p)) = st.pending_blobs.get(key) {
        return Some(*p);
    }
    index.blobs.get(key).map(|b| match b {
        BlobState::Live(_) => PendingBlob::Live,
        BlobState::Deleted(_) => PendingBlob::Deleted,
    })
}

pub(crate) fn doc_version(st: &LogState, index: &Index, key: &[u8]) -> Option<u64> {
    match st.pending_docs.get(key) {
        Some((_, v)) => Some(*v),
        None => index.docs.get(key).map(DocState::version),
    }
}

impl Engine {
    pub(crate) fn put_blob(
        &self,
        key: &[u8],
        meta: BlobMeta,
        data: &[Bytes],
    ) -> Result<Appended<PutOutcome>> {
        check_key(key)?;
        check_size(meta.props.len() as u64, MAX_PROPS_LEN as u64)?;
        let size = data.iter().map(|d| d.len() as u64).sum();
        check_size(size, self.opts.max_record_size)?;
        let outcome = |state| match state {
            PendingBlob::Live => PutOutcome::AlreadyExists,
            PendingBlob::Deleted => PutOutcome::Deleted,
        };
        // A durable state answers now (a tombstone is dropped only long after every write of
        // its key could still be in flight): skip checksumming the data.
        if let Some(s) = self.index.read().blobs.get(key) {
            return Ok(Appended::Early(outcome(match s {
                BlobState::Live(_) => PendingBlob::Live,
                BlobState::Deleted(_) => PendingBlob::Deleted,
            })));
        }
        let info = RecordInfo {
            op: Op::PutBlob,
            key: Bytes::copy_from_slice(key),
            // The index keeps the properties for as long as the blob lives: a copy of their
            // own, never a view that would pin the caller's buffer (a request's body chunk).
            props: Bytes::copy_from_slice(&meta.props),
            time_ms: meta.time_ms,
            expires_ms: meta.expires_ms,
            version: 0,
            size,
            seq: 0,
        };
        self.space.admit(info.head_len() + size)?;
        self.append(info, data, |st, idx| blob_state(st, idx, key).map(outcome))
    }

    pub(crate) fn delete_blob(&self, key: &[u8], time_ms: u64) -> Result<Appended<DeleteOutcome>> {
        check_key(key)?;
        let info = RecordInfo {
            op: Op::DeleteBlob,
            key: Bytes::copy_from_slice(key),
            props: Bytes::new(),
            time_ms,
            expires_ms: None,
            version: 0,
            size: 0,
            seq: 0,
        };
        self.append(info, &[], |st, idx| {
            (blob_state(st, idx, key) == Some(PendingBlob::Deleted))
                .then_some(DeleteOutcome::AlreadyDeleted)
        })
    }

    pub(crate) fn get_blob(&self, key: &[u8], now_ms: u64) -> Result<BlobLookup> {
        check_key(key)?;
        let index = self.index.read();
        Ok(match index.blobs.get(key) {
            None => BlobLookup::NotFound,
            Some(BlobState::Deleted(tomb)) => BlobLookup::Deleted {
                time_ms: tomb.time_ms,
            },
            Some(BlobState::Live(b)) => {
                let rec = BlobRecord {
                    key: Bytes::copy_from_slice(key),
                    meta: b.meta.clone(),
                    size: b.size,
                    location: b.loc.clone(),
                };
                // Expiry is inclusive: at `expires_ms` the blob is already gone.
                match b.meta.expires_ms {
                    Some(exp) if now_ms >= exp => BlobLookup::Expired(rec),
                    _ => BlobLookup::Found(rec),
                }
            }
        })
    }

    /// Shared by document puts and removes: both are versioned records under last-writer-wins.
    pub(crate) fn write_doc(
        &self,
        op: Op,
        key: &[u8],
        version: u64,
        time_ms: u64,
        json: Bytes,
    ) -> Result<Appended<DocOutcome>> {
        check_key(key)?;
        check_size(json.len() as u64, self.opts.max_record_size)?;
        let info = RecordInfo {
            op,
            key: Bytes::copy_from_slice(key),
            props: Bytes::new(),
            time_ms,
            expires_ms: None,
            version,
            size: json.len() as u64,
            seq: 0,
        };
        if op == Op::PutDoc {
            self.space.admit(info.head_len() + info.size)?;
        }
        let data: &[Bytes] = if json.is_empty() {
            &[]
        } else {
            std::slice::from_ref(&json)
        };
        self.append(info, data, |st, idx| {
            let current = doc_version(st, idx, key)?;
            (version <= current).then_some(DocOutcome::Stale { current })
        })
    }

    pub(crate) fn get_doc(&self, key: &[u8]) -> Result<DocLookup> {
        check_key(key)?;
        let found = self.index.read().docs.get(key).cloned();
        Ok(match found {
            None => DocLookup::NotFound,
            Some(DocState::Removed { version, tomb }) => DocLookup::Removed {
                version,
                time_ms: tomb.time_ms,
            },
            Some(DocState::Live {
                version,
                time_ms,
                size,
                loc,
                ..
            }) => {
                let json = crate::reader::read_whole(&loc, key, size)?;
                DocLookup::Found {
                    version,
                    time_ms,
                    json,
                }
            }
        })
    }

    pub(crate) fn doc_version(&self, key: &[u8]) -> Result<Option<(u64, u64)>> {
        check_key(key)?;
        Ok(match self.index.read().docs.get(key) {
            None => None,
            Some(DocState::Removed { version, tomb }) => Some((*version, tomb.time_ms)),
            Some(DocState::Live {
                version, time_ms, ..
            }) => Some((*version, *time_ms)),
        })
    }

    pub(crate) fn for_each_doc(&self, f: &mut dyn FnMut(&[u8], u64) -> bool) {
        // Copy first so `f` may call back into the store without holding the index lock.
        let live: Vec<(Bytes, u64)> = self
            .index
            .read()
            .docs
            .iter()
            .filter_map(|(k, d)| match d {
                DocState::Live { version, .. } => Some((k.clone(), *version)),
                DocState::Removed { .. } => None,
            })
            .collect();
        for (key, version) in live {
            if !f(&key, version) {
                break;
            }
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        let (live_keys, last_seq) = {
            let index = self.index.read();
            (index.live_keys, index.last_seq)
        };
        let durable_cursor = Cursor {
            incarnation: self.incarnation,
            sequence: last_seq,
        };
        Stats {
            live_keys,
            records_appended: self.counters.appended.load(Ordering::Relaxed),
            syncs: self.counters.syncs.load(Ordering::Relaxed),
            corrupt_records_found: self.counters.corrupt.load(Ordering::Relaxed),
            bytes_on_disk: self.bytes_on_disk(),
            segments: self.segments.read().len() as u64,
            disk: self.disk.stats(),
            durable_cursor,
            incarnation: self.incarnation,
            large_read_bytes_cached: self.counters.large_reads.cached.load(Ordering::Relaxed),
            large_read_bytes_direct: self.counters.large_reads.direct.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn close(&self) -> Result<()> {
        self.close_log()?;
        self.write_checkpoint()?;
        if self.private_disk {
            self.disk.shut_down();
        }
        // Closed stores only read: another store may now open the directory and write.
        self.lock.lock().take();
        Ok(())
    }
}
