//! Bulk appends ([`crate::Store::begin_bulk`]): a batch of records, say a new replica's
//! bootstrap copying a peer's records, made durable by **one** commit round instead of one per
//! slice of them, and written once instead of twice.
//!
//! Each record gets exactly the decision its single write would get (validation, the free-space
//! reserve, "already exists", tombstones win, newest document version wins), taken under the log
//! mutex against the index and the pending writes (the batch's own earlier records included), a
//! sequence number of this log, and a head checksummed for its position. The records are written
//! straight to the active segment with one `pwritev` per slice (rotating segments as a single
//! write would), never copied into the log's batch or the disk journal; the segment is synced by
//! the next commit round, which then publishes them to the index and the change feed like any
//! record. So the store's state after a bulk batch is the state after the same records written
//! one by one (`tests/bulk.rs` checks it), and a crash before the round's sync loses only records
//! nobody was told about.
//!
//! The log mutex is released between slices of at most [`SLICE_BYTES`], so a foreground write
//! of the same log waits for at most one slice's `pwritev` (page cache), never for the batch.

use bytes::Bytes;

use crate::completion::{pair, Completion};
use crate::engine::{blob_state, check_key, check_size, doc_version, Engine};
use crate::format::{block_crcs, encode_head, RecordInfo, MAX_PROPS_LEN};
use crate::index::Index;
use crate::segment::io_error;
use crate::types::*;

/// Record bytes written under one hold of the log mutex (a larger record is a slice alone).
pub(crate) const SLICE_BYTES: u64 = 1 << 20;

/// One record of a bulk batch: the arguments of the single write it stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BulkRecord {
    PutBlob {
        key: Bytes,
        meta: BlobMeta,
        data: Bytes,
    },
    DeleteBlob {
        key: Bytes,
        time_ms: u64,
    },
    PutDoc {
        key: Bytes,
        version: u64,
        time_ms: u64,
        json: Bytes,
    },
    RemoveDoc {
        key: Bytes,
        version: u64,
        time_ms: u64,
    },
}

/// What a bulk record's single write would have answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BulkOutcome {
    Put(PutOutcome),
    Delete(DeleteOutcome),
    Doc(DocOutcome),
}

/// A record validated and checksummed outside the lock, waiting for its decision.
struct Prepared {
    info: RecordInfo,
    crcs: Vec<u32>,
    data: Option<Bytes>,
}

/// Records of one slice: where it starts and the buffers of its one `pwritev`.
struct Slice {
    start: u64,
    heads: Vec<Vec<u8>>,
    data: Vec<Option<Bytes>>,
    bytes: u64,
}

impl Slice {
    fn new(start: u64) -> Slice {
        Slice {
            start,
            heads: Vec::new(),
            data: Vec::new(),
            bytes: 0,
        }
    }

    fn bufs(&self) -> Vec<&[u8]> {
        let mut bufs = Vec::with_capacity(self.heads.len() * 2);
        for (head, data) in self.heads.iter().zip(&self.data) {
            bufs.push(&head[..]);
            if let Some(d) = data {
                bufs.push(&d[..]);
            }
        }
        bufs
    }
}

/// The answer a record's single write would give without writing, if any.
fn early(st: &crate::commit::LogState, index: &Index, info: &RecordInfo) -> Option<BulkOutcome> {
    let key = &info.key[..];
    match info.op {
        Op::PutBlob => blob_state(st, index, key).map(|state| {
            BulkOutcome::Put(match state {
                crate::commit::PendingBlob::Live => PutOutcome::AlreadyExists,
                crate::commit::PendingBlob::Deleted => PutOutcome::Deleted,
            })
        }),
        Op::DeleteBlob => (blob_state(st, index, key) == Some(crate::commit::PendingBlob::Deleted))
            .then_some(BulkOutcome::Delete(DeleteOutcome::AlreadyDeleted)),
        Op::PutDoc | Op::RemoveDoc => {
            let current = doc_version(st, index, key)?;
            (info.version <= current).then_some(BulkOutcome::Doc(DocOutcome::Stale { current }))
        }
    }
}

/// What a record's single write answers once it is durable.
fn stored(op: Op) -> BulkOutcome {
    match op {
        Op::PutBlob => BulkOutcome::Put(PutOutcome::Stored),
        Op::DeleteBlob => BulkOutcome::Delete(DeleteOutcome::Deleted),
        Op::PutDoc | Op::RemoveDoc => BulkOutcome::Doc(DocOutcome::Applied),
    }
}

/// The outcome of [`Engine::bulk`]: every record's answer, and the completion of the last
/// record written (`None`: nothing to wait for).
pub(crate) type Bulk = (Vec<Result<BulkOutcome>>, Option<Completion>);

impl Engine {
    /// Validates a record as its single write does (`put_blob`, `delete_blob`, `write_doc`),
    /// admits it against the free-space reserve and checksums its data.
    fn prepare(&self, record: BulkRecord) -> Result<Prepared> {
        let (op, key, props, time_ms, expires_ms, version, data) = match record {
            BulkRecord::PutBlob { key, meta, data } => {
                check_size(meta.props.len() as u64, MAX_PROPS_LEN as u64)?;
                let data = Some(data);
                let (p, t, e) = (meta.props, meta.time_ms, meta.expires_ms);
                (Op::PutBlob, key, p, t, e, 0, data)
            }
            BulkRecord::DeleteBlob { key, time_ms } => {
                (Op::DeleteBlob, key, Bytes::new(), time_ms, None, 0, None)
            }
            BulkRecord::PutDoc {
                key,
                version,
                time_ms,
                json,
            } => {
                let data = (!json.is_empty()).then_some(json);
                (Op::PutDoc, key, Bytes::new(), time_ms, None, version, data)
            }
            BulkRecord::RemoveDoc {
                key,
                version,
                time_ms,
            } => (
                Op::RemoveDoc,
                key,
                Bytes::new(),
                time_ms,
                None,
                version,
                None,
            ),
        };
        check_key(&key)?;
        // The index keeps the key and the properties for as long as the record lives: copies
        // of their own. A caller's key is often a view into a larger buffer (an export frame
        // of 4 MiB, a body chunk of many records) that it would otherwise pin for good: a
        // bootstrapped replica's memory grew by every byte it copied.
        let (key, props) = (Bytes::copy_from_slice(&key), Bytes::copy_from_slice(&props));
        let size = data.as_ref().map_or(0, |d| d.len() as u64);
        check_size(size, self.opts.max_record_size)?;
        let info = RecordInfo {
            op,
            key,
            props,
            time_ms,
            expires_ms,
            version,
            size,
            seq: 0,
        };
        if matches!(op, Op::PutBlob | Op::PutDoc) {
            self.space.admit(info.head_len() + size)?;
        }
        let crcs = block_crcs(data.as_slice());
        Ok(Prepared { info, crcs, data })
    }

    /// Appends `records` in order, each with its single write's decision, in slices written
    /// with one `pwritev` each; the segment is synced by the next commit round. Blocking I/O.
    /// An error (a failed write or rotation, a failed store or disk) fails the whole batch;
    /// records of slices written before it may still become durable (applying them again is
    /// a no-op), as a single write that fails may have landed.
    pub(crate) fn bulk(&self, records: Vec<BulkRecord>) -> Result<Bulk> {
        let mut outcomes = Vec::with_capacity(records.len());
        let mut prepared = records.into_iter().map(|r| self.prepare(r)).peekable();
        let mut last_end = None;
        let mut failure = None;
        while prepared.peek().is_some() && failure.is_none() {
            match self.bulk_slice(&mut prepared, &mut outcomes) {
                Ok(Some(end)) => last_end = Some(end),
                Ok(None) => {}
                Err(e) => failure = Some(e),
            }
        }
        // Whatever was written needs a round to become durable and published, failure or not.
        let completion = last_end.and_then(|end| self.wait_for_round(end));
        match failure {
            Some(e) => Err(e),
            None => Ok((outcomes, completion)),
        }
    }

    /// One slice under one hold of the log mutex. Returns the end of its last record written.
    fn bulk_slice(
        &self,
        prepared: &mut std::iter::Peekable<impl Iterator<Item = Result<Prepared>>>,
        outcomes: &mut Vec<Result<BulkOutcome>>,
    ) -> Result<Option<LogPos>> {
        let mut st = self.log.lock();
        self.writable(&st)?;
        // Small records batched before these go first, at the positions they were given.
        self.write_batch(&mut st)?;
        let mut slice = Slice::new(st.active_len);
        let mut last_end = None;
        while let Some(next) = prepared.peek() {
            let len = match next {
                Ok(p) => p.info.head_len() + p.info.size,
                Err(_) => 0,
            };
            if slice.bytes > 0 && slice.bytes + len > SLICE_BYTES {
                break;
            }
            let p = match prepared.next().expect("peeked") {
                Ok(p) => p,
                Err(e) => {
                    outcomes.push(Err(e));
                    continue;
                }
            };
            if let Some(answer) = early(&st, &self.index.read(), &p.info) {
                outcomes.push(Ok(answer));
                continue;
            }
            if st.active_len + len > self.opts.segment_size {
                // The slice so far belongs in the segment being sealed.
                self.write_slice(&mut st, &slice)?;
                self.maybe_rotate(&mut st, len)?;
                slice = Slice::new(st.active_len);
            }
            let mut info = p.info;
            info.seq = st.next_seq;
            let start = st.active_len;
            let head = encode_head(&info, &p.crcs, st.active.id, start);
            st.active_len += len;
            outcomes.push(Ok(stored(info.op)));
            let end = self.queue_written(&mut st, info, start);
            slice.heads.push(head);
            slice.data.push(p.data);
            slice.bytes += len;
            last_end = Some(end);
        }
        self.write_slice(&mut st, &slice)?;
        if self.opts.durability == Durability::RelaxedNoSyncForBenchmarks {
            let written = st.written;
            self.publish(&mut st, written);
        }
        Ok(last_end)
    }

    /// Writes a slice at its place in the active segment and queues the segment's sync for the
    /// next round. On failure the file is cut back to the slice's start and its records are
    /// taken out of the log, as a failed batch write does.
    fn write_slice(&self, st: &mut crate::commit::LogState, slice: &Slice) -> Result<()> {
        if slice.heads.is_empty() {
            return Ok(());
        }
        let file = st.active.file.clone();
        let Err(e) = self.write_at(&file, slice.start, &slice.bufs()) else {
            if self.opts.durability == Durability::Durable {
                st.needs_sync(&file);
            }
            return Ok(());
        };
        if let Err(te) = self.truncate(&file, slice.start) {
            tracing::error!(error = %te, "cannot truncate after a failed write; refusing writes");
            st.failed = Some(format!("truncate after failed write failed: {te}"));
        }
        let from = LogPos {
            segment: st.active.id,
            offset: slice.start,
        };
        self.cut_back(st, from, &e);
        Err(io_error(e))
    }

    /// Waits for the round that covers `end` (`None` in relaxed mode: already published).
    fn wait_for_round(&self, end: LogPos) -> Option<Completion> {
        if self.opts.durability != Durability::Durable {
            return None;
        }
        let (completer, completion) = pair();
        let mut st = self.log.lock();
        if st.durable >= end {
            return None; // a round started by another writer already covered it
        }
        st.waiting.push((end, completer));
        let queue = !std::mem::replace(&mut st.dirty, true);
        drop(st);
        if queue {
            let me = self.me.upgrade().expect("a writer holds the store");
            self.disk.shared().mark_dirty(me);
        }
        Some(completion)
    }
}
