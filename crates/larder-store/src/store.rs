//! The `Store` facade: the crate's public handle over one open store (an [`Engine`]), and the
//! verified reader of a blob's data.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::engine::Engine;
use crate::reader::BlobReaderState;
use crate::types::*;

/// A replica's log store. Cheap to clone; all clones share one store.
#[derive(Clone)]
pub struct Store {
    pub(crate) engine: Arc<Engine>,
}

/// Streams a byte range of a blob in verified pieces of at most [`Options::read_chunk_size`].
/// Every piece is checked against its stored checksum before it is returned; a failing check
/// yields [`Error::Corrupt`] and ends the stream.
pub struct BlobReader {
    state: BlobReaderState,
}

impl Iterator for BlobReader {
    type Item = Result<Bytes>;
    fn next(&mut self) -> Option<Self::Item> {
        self.state.next()
    }
}

impl Store {
    /// Opens (creating if needed) the replica directory `dir`: loads the newest index checkpoint,
    /// replays the log after it, cuts off a torn tail, reports corrupt records.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store> {
        Ok(Store {
            engine: crate::recovery::open(dir.as_ref(), options)?,
        })
    }

    /// Appends a blob whose data is the concatenation of `data` (chunks as they arrived; not
    /// copied into one buffer). Returns once durable.
    pub fn put_blob(&self, key: &[u8], meta: BlobMeta, data: &[Bytes]) -> Result<PutOutcome> {
        self.engine.put_blob(key, meta, data)
    }

    /// Appends a tombstone, also for a key never seen (a late put must not resurrect it).
    pub fn delete_blob(&self, key: &[u8], time_ms: u64) -> Result<DeleteOutcome> {
        self.engine.delete_blob(key, time_ms)
    }

    /// Looks a blob up; `now_ms` decides TTL expiry.
    pub fn get_blob(&self, key: &[u8], now_ms: u64) -> Result<BlobLookup> {
        self.engine.get_blob(key, now_ms)
    }

    /// Streams `range` (clamped to the blob's size) of `blob`'s data.
    pub fn read_blob(&self, blob: &BlobRecord, range: Range<u64>) -> Result<BlobReader> {
        let state = BlobReaderState::open(
            &blob.location,
            &blob.key,
            blob.meta.props.len(),
            blob.size,
            range,
            self.engine.opts.read_chunk_size,
        )?;
        Ok(BlobReader { state })
    }

    /// Applies a document put if `version` is newer than what the store holds.
    pub fn put_doc(
        &self,
        key: &[u8],
        version: u64,
        time_ms: u64,
        json: Bytes,
    ) -> Result<DocOutcome> {
        self.engine
            .write_doc(Op::PutDoc, key, version, time_ms, json)
    }

    /// Applies a versioned document remove (a tombstone) if `version` is newer.
    pub fn remove_doc(&self, key: &[u8], version: u64, time_ms: u64) -> Result<DocOutcome> {
        self.engine
            .write_doc(Op::RemoveDoc, key, version, time_ms, Bytes::new())
    }

    pub fn get_doc(&self, key: &[u8]) -> Result<DocLookup> {
        self.engine.get_doc(key)
    }

    /// Durable records after `after`, at most `limit` of them, in log order.
    pub fn changes(&self, after: Cursor, limit: usize) -> Result<ChangeBatch> {
        self.engine.changes(after, limit)
    }

    /// Calls `f` for every live document key (for visiting); stops when it returns false.
    pub fn for_each_doc(&self, f: &mut dyn FnMut(&[u8], u64) -> bool) {
        self.engine.for_each_doc(f)
    }

    pub fn stats(&self) -> Stats {
        self.engine.stats()
    }

    /// Syncs, writes an index checkpoint and refuses further writes. Reads keep working.
    pub fn close(&self) -> Result<()> {
        self.engine.close()
    }
}
