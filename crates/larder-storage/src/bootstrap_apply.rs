//! The receiving end of a bulk bootstrap (`bootstrap.rs` fetches the export): one thread per
//! copy, off the async workers, that decodes the export's frames (each verified before it is
//! used), checks each record as replication does, and appends them with the store's bulk path
//! (`Store::begin_bulk`): a batch is written once and made durable by one commit round, not one
//! round per slice of records and a journal copy of each. The next batch is decoded and written
//! while the previous one's sync is in flight (at most [`IN_FLIGHT`] batches); the bootstrap
//! cursor moves only once every record before it is durable, and is saved (a file, synced) at
//! most every [`SAVE_EVERY`], so small records do not cost two extra syncs per batch. A crash
//! resumes from the saved cursor: re-applying a record is a no-op (blobs are immutable,
//! tombstones win, documents keep their newest version).
//!
//! Throttled (`rate_mb_per_s` > 0), the thread yields to foreground traffic: batches shrink to
//! [`STEP`] of the rate (so each sync carries little and the rate limiter spaces them evenly
//! instead of in bursts of a whole batch), it waits while the node is busy with foreground
//! requests, and it runs at a low CPU priority (`nice` 10) in the idle I/O class.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use larder_cluster::PartitionId;
use larder_proto::{ExportDecoder, ExportFrame, FrameKind};
use larder_store::{BlobMeta, BulkOutcome, BulkRecord, Commit, Store};
use tokio::sync::mpsc;

use crate::bootstrap::{CopyError, Saved};
use crate::error::Error;
use crate::StorageNode;

/// Batches written and not yet known durable: one syncing while the next is written.
const IN_FLIGHT: usize = 2;
/// The bootstrap cursor is saved at most this often (and at the end).
const SAVE_EVERY: Duration = Duration::from_millis(250);
/// Throttled, a batch carries at most this share of a second's rate.
const STEP: u64 = 50;
/// ... and never less than this.
const MIN_STEP_BYTES: u64 = 64 << 10;
/// Nice value of a throttled applier thread.
const THROTTLED_NICE: libc::c_int = 10;

/// What the applier thread needs.
pub(crate) struct Applier {
    pub node: Arc<StorageNode>,
    pub partition: PartitionId,
    pub store: Store,
    pub path: PathBuf,
    pub saved: Saved,
    /// Bytes durable here since the cursor was last saved.
    pub unsaved_bytes: u64,
}

/// How a copy ended, once its applier thread is done.
pub(crate) type Done = tokio::sync::oneshot::Receiver<Result<Saved, CopyError>>;

/// Starts the applier thread of one copy; feed it the export body's bytes through the returned
/// sender (bounded: a slow disk holds the stream back). The receiver answers once with how the
/// copy ended (`Ok` with the saved state once the end frame's position is durable and saved).
pub(crate) fn start(
    applier: Applier,
    queued: usize,
) -> std::io::Result<(mpsc::Sender<Bytes>, Done)> {
    let (tx, rx) = mpsc::channel(queued.max(1));
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let name = format!("larder-bulk-{}", applier.partition);
    std::thread::Builder::new().name(name).spawn(move || {
        let _ = done_tx.send(applier.run(rx));
    })?;
    Ok((tx, done_rx))
}

/// A batch written, waiting for its round.
struct Written {
    commit: Commit<Vec<larder_store::Result<BulkOutcome>>>,
    /// The source position every record up to which is then durable here.
    sequence: u64,
    bytes: u64,
    records: u64,
}

/// Records decoded and not yet written.
#[derive(Default)]
struct Pending {
    records: Vec<BulkRecord>,
    /// Frames read (refused ones included: they count for the position).
    frames: u64,
    bytes: u64,
    last: Option<u64>,
}

impl Applier {
    fn run(mut self, mut rx: mpsc::Receiver<Bytes>) -> Result<Saved, CopyError> {
        let config = &self.node.moves.config;
        let throttled = config.rate_mb_per_s > 0;
        let _priority = throttled.then(LowPriority::enter);
        let mut decoder = ExportDecoder::new(self.node.intake.max_body);
        let mut pending = Pending::default();
        let mut written: VecDeque<Written> = VecDeque::new();
        let mut last_save = Instant::now();
        while let Some(chunk) = rx.blocking_recv() {
            decoder.push(&chunk);
            drop(chunk);
            while let Some(frame) = decoder.next_frame()? {
                let incarnation = decoder.incarnation().expect("frames follow the head");
                self.saved.cursor.incarnation = incarnation;
                if frame.kind == FrameKind::End {
                    pending.last = Some(frame.sequence);
                    self.write(&mut pending, &mut written)?;
                    while let Some(batch) = written.pop_front() {
                        self.durable(batch)?;
                    }
                    self.save()?;
                    return Ok(self.saved);
                }
                pending.frames += 1;
                pending.bytes = pending.bytes.saturating_add(frame.wire_len());
                pending.last = Some(frame.sequence);
                if let Some(record) = self.record(frame) {
                    pending.records.push(record);
                }
                if self.full(&pending) {
                    self.write(&mut pending, &mut written)?;
                    while written.len() >= IN_FLIGHT {
                        let batch = written.pop_front().expect("not empty");
                        self.durable(batch)?;
                    }
                    if last_save.elapsed() >= SAVE_EVERY {
                        self.save()?;
                        last_save = Instant::now();
                    }
                }
            }
        }
        // The stream ended (or the fetching task went away) before the end frame: keep what is
        // durable, resume from there.
        while let Some(batch) = written.pop_front() {
            self.durable(batch)?;
        }
        self.save()?;
        Err(CopyError::Truncated)
    }

    fn full(&self, pending: &Pending) -> bool {
        let config = &self.node.moves.config;
        let mut bytes = config.batch_bytes.as_u64().max(1);
        if config.rate_mb_per_s > 0 {
            let step = config.rate_mb_per_s.saturating_mul(1_000_000) / STEP;
            bytes = bytes.min(step.max(MIN_STEP_BYTES));
        }
        pending.frames >= config.batch_records.max(1) as u64 || pending.bytes >= bytes
    }

    /// Throttles, then writes the pending records as one bulk batch (the rounds make it durable).
    fn write(
        &self,
        pending: &mut Pending,
        written: &mut VecDeque<Written>,
    ) -> Result<(), CopyError> {
        let Some(sequence) = pending.last else {
            return Ok(());
        };
        let batch = std::mem::take(pending);
        crate::bootstrap::throttle_blocking(&self.node, batch.bytes);
        let commit = self.store.begin_bulk(batch.records);
        written.push_back(Written {
            commit,
            sequence,
            bytes: batch.bytes,
            records: batch.frames,
        });
        Ok(())
    }

    /// Waits until a written batch is durable; only then does the cursor move past it.
    fn durable(&mut self, batch: Written) -> Result<(), CopyError> {
        let outcomes = batch
            .commit
            .wait()
            .map_err(|e| CopyError::Local(e.into()))?;
        for outcome in outcomes {
            match outcome {
                Ok(_) => {}
                Err(
                    err @ (larder_store::Error::BadKey(_) | larder_store::Error::TooLarge { .. }),
                ) => self.refused(None, err.into()),
                Err(err) => return Err(CopyError::Local(err.into())),
            }
        }
        self.saved.cursor.sequence = batch.sequence;
        self.saved.bytes = self.saved.bytes.saturating_add(batch.bytes);
        self.saved.records = self.saved.records.saturating_add(batch.records);
        let node = &self.node;
        node.metrics.bootstrap_bytes.inc_by(batch.bytes);
        node.metrics.bootstrap_records.inc_by(batch.records);
        self.unsaved_bytes = self.unsaved_bytes.saturating_add(batch.bytes);
        Ok(())
    }

    /// Saves the cursor; the progress `GET .../replica` shows is what a restart resumes from.
    fn save(&mut self) -> Result<(), CopyError> {
        crate::bootstrap::save(&self.path, &self.saved, self.store.incarnation())?;
        let bytes = std::mem::take(&mut self.unsaved_bytes);
        self.node
            .moves
            .note_durable(self.partition, &self.saved, bytes);
        Ok(())
    }

    /// A record this node refuses (a time from the far future, bad properties) is logged,
    /// counted and passed over, as replication does.
    fn refused(&self, key: Option<&[u8]>, err: Error) {
        let key = key.map(String::from_utf8_lossy).unwrap_or_default();
        tracing::warn!(partition = self.partition, %key, %err, "bootstrap: skipping a record this node refuses");
        self.node
            .metrics
            .replication_refused
            .get_or_create(&crate::metrics::PeerLabels {
                partition: self.partition.to_string(),
                peer: "bootstrap".into(),
            })
            .inc();
    }

    /// The bulk record of a verified frame, after the checks replication applies.
    fn record(&self, frame: ExportFrame) -> Option<BulkRecord> {
        match self.check(&frame) {
            Ok(record) => Some(record),
            Err(err) => {
                self.refused(Some(&frame.key), err);
                None
            }
        }
    }

    fn check(&self, frame: &ExportFrame) -> Result<BulkRecord, Error> {
        let clock = &self.node.clock;
        if std::str::from_utf8(&frame.key).is_err() {
            return Err(Error::BadKey("not UTF-8"));
        }
        let time_ms = clock.check_time(larder_proto::header::TIME_MS, frame.time_ms)?;
        let key = frame.key.clone();
        Ok(match frame.kind {
            FrameKind::PutBlob => {
                crate::props::to_header(&frame.props)?;
                let meta = BlobMeta {
                    props: frame.props.clone(),
                    time_ms,
                    expires_ms: clock.check_expiry(frame.expires_ms)?,
                };
                BulkRecord::PutBlob {
                    key,
                    meta,
                    data: frame.data.clone(),
                }
            }
            FrameKind::DeleteBlob => BulkRecord::DeleteBlob { key, time_ms },
            FrameKind::PutDoc => BulkRecord::PutDoc {
                key,
                version: clock.check_version(frame.version)?,
                time_ms,
                json: frame.data.clone(),
            },
            // (The end frame never gets here: `run` takes it first.)
            FrameKind::RemoveDoc | FrameKind::End => BulkRecord::RemoveDoc {
                key,
                version: clock.check_version(frame.version)?,
                time_ms,
            },
        })
    }
}

/// The calling thread at a low CPU priority and in the idle I/O class until dropped: a
/// throttled copy takes what foreground work leaves.
struct LowPriority {
    nice: Option<libc::c_int>,
    _io: crate::background::IdleIo,
}

impl LowPriority {
    fn enter() -> LowPriority {
        // SAFETY: plain syscalls on the calling thread (its tid), no memory passed.
        let nice = unsafe {
            let tid = libc::gettid() as libc::id_t;
            *libc::__errno_location() = 0;
            let old = libc::getpriority(libc::PRIO_PROCESS, tid);
            let ok = *libc::__errno_location() == 0
                && libc::setpriority(libc::PRIO_PROCESS, tid, THROTTLED_NICE) == 0;
            ok.then_some(old)
        };
        LowPriority {
            nice,
            _io: crate::background::IdleIo::enter(),
        }
    }
}

impl Drop for LowPriority {
    fn drop(&mut self) {
        if let Some(old) = self.nice {
            // SAFETY: as above. (Raising the priority back may be refused without privileges;
            // the thread ends right after, so that costs nothing.)
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, old);
            }
        }
    }
}
