//! Reading and changing the S3 layer's records through the router's documents: reads from a
//! quorum (strong read-after-write), changes as read-modify-writes applied at the partition
//! primary (DESIGN 6.1), so two changes based on one read never both apply.

use std::sync::Arc;

use larder_router::{Checked, DocRouter, DocState, Router, Written};
use tokio::time::Instant;

use crate::error::S3Error;
use crate::keep::Keep;
use crate::record_cache::{Cacheable, RecordCache};
use crate::records::Record;

/// How many times a change is read and applied again after losing to a concurrent one.
const ATTEMPTS: usize = 64;

/// What a change does to a record.
pub enum Change<R> {
    /// Write this state.
    Put(R),
    /// Write a tombstone.
    Remove,
    /// Leave it as it is.
    Keep,
}

/// The records, through the router of the home datacenter (one decision point per record
/// across datacenters, `S3Config::records_router`); object bodies through the local router.
pub struct Records {
    docs: DocRouter,
    router: Arc<Router>,
    /// Records read or written here, by version (`record_cache.rs`); none unless
    /// `with_index_cache`.
    cache: RecordCache,
}

impl Records {
    /// Records through `records_router`; blobs through `router` (this frontend's datacenter).
    pub fn new(router: Arc<Router>, records_router: Arc<Router>) -> Records {
        Records {
            docs: DocRouter::new(records_router),
            router,
            cache: RecordCache::new(0),
        }
    }

    /// Reads of index records by how the cache answered (for `/metrics`).
    pub fn index_cache_reads(
        &self,
    ) -> prometheus_client::metrics::family::Family<
        crate::metrics::ReadLabels,
        prometheus_client::metrics::counter::Counter,
    > {
        self.cache.reads()
    }

    /// Keeps the records read and written here in a cache of `bytes` (`record_cache.rs`).
    pub fn with_index_cache(mut self, bytes: usize) -> Records {
        self.cache = RecordCache::new(bytes);
        self
    }

    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.router.config().operation_timeout
    }

    /// The newest state of record `id` a quorum holds (`None`: absent or removed).
    pub async fn read<R: Record>(&self, id: &str) -> Result<Option<R>, S3Error> {
        let state = self.docs.get(id, self.deadline()).await?;
        decode(state).map(|(_, record)| record)
    }

    /// `read`, keeping only what `keep` says of an index record's entries (`keep.rs`): for
    /// reading, never for writing back.
    /// A copy kept by version answers when no replica of the quorum holds a newer one; with
    /// `Keep::All` it is shared, not cloned (a listing page reads a leaf of up to 1,000 names).
    pub async fn read_keeping<R: Cacheable>(
        &self,
        id: &str,
        keep: &Keep,
    ) -> Result<Option<Kept<R>>, S3Error> {
        match self
            .read_through::<R>(id, Quorum::Read, self.deadline())
            .await?
        {
            Fresh::Kept(_, record) if *keep == Keep::All => Ok(Some(Kept::Shared(record))),
            Fresh::Kept(_, record) => Ok(Some(Kept::Owned(record.keeping(keep)))),
            Fresh::Read(state) => crate::keep::decode_keeping(keep, || decode(state))
                .map(|(_, record)| record.map(Kept::Owned)),
        }
    }

    /// Reads record `id` (as the primary holds it), applies `change` and writes the result at
    /// the primary; if another change came between, does it all again. Returns what `change`
    /// returned with the last state it saw.
    pub async fn update<R, T>(
        &self,
        id: &str,
        change: impl FnMut(Option<R>) -> Result<(Change<R>, T), S3Error>,
    ) -> Result<T, S3Error>
    where
        R: Record,
    {
        self.update_noting(id, change, &mut false).await
    }

    /// `update`, setting `uncertain` when it fails on a write whose outcome is unknown (sent
    /// to the primary, no answer that says whether it applied): the change may yet be there.
    /// Any other failure is certain: nothing was written.
    pub async fn update_noting<R, T>(
        &self,
        id: &str,
        mut change: impl FnMut(Option<R>) -> Result<(Change<R>, T), S3Error>,
        uncertain: &mut bool,
    ) -> Result<T, S3Error>
    where
        R: Record,
    {
        let deadline = self.deadline();
        for _ in 0..ATTEMPTS {
            let (seen, current) = self.read_for_update::<R>(id, deadline).await?;
            let (what, answer) = change(current)?;
            let (json, record) = match what {
                Change::Keep => return Ok(answer),
                Change::Put(record) => {
                    let record = record.normalized();
                    (Some(record.encode()), Some(record))
                }
                Change::Remove => (None, None),
            };
            let version = self.docs.next_version(seen)?;
            let written = self
                .docs
                .write_serialised(id, seen, version, json.clone(), deadline)
                .await;
            *uncertain = written.is_err();
            if written.is_err() {
                self.cache.forget(id);
            }
            match written? {
                Written::Applied => {
                    // The next read of the record, by this frontend's next change or a GET,
                    // is then a 304 and a clone, unless another frontend wrote meanwhile.
                    match (json, record) {
                        (Some(json), Some(record)) => {
                            self.cache.keep_written(id, version, json, record)
                        }
                        _ => self.cache.forget(id),
                    }
                    return Ok(answer);
                }
                Written::Superseded(_) => continue,
            }
        }
        Err(S3Error::Unavailable(format!(
            "{id}: every one of {ATTEMPTS} attempts lost to a concurrent change; try again"
        )))
    }
}

/// Which quorum read a record goes through.
#[derive(Clone, Copy)]
enum Quorum {
    /// Any read quorum (`DocRouter::get`).
    Read,
    /// A read quorum with the partition's primary in it: the read of a read-modify-write.
    WithPrimary,
}

/// A record as `Records::read_keeping` read it: the record cache's decoded copy, shared, or
/// a copy of its own. For reading only, either way.
#[derive(Debug)]
pub enum Kept<R> {
    Shared(Arc<R>),
    Owned(R),
}

impl<R> std::ops::Deref for Kept<R> {
    type Target = R;

    fn deref(&self) -> &R {
        match self {
            Kept::Shared(record) => record,
            Kept::Owned(record) => record,
        }
    }
}

impl<R: Clone> Kept<R> {
    /// The record as a value of its own (a clone if it is shared).
    pub fn into_owned(self) -> R {
        match self {
            Kept::Shared(record) => Arc::unwrap_or_clone(record),
            Kept::Owned(record) => record,
        }
    }
}

/// A record read through the copy this frontend kept (`record_cache.rs`).
enum Fresh<R> {
    /// No answer of the quorum is newer than the kept copy of this version.
    Kept(u64, Arc<R>),
    /// The state read whole (its JSON now kept, or its copy forgotten).
    Read(DocState),
}

impl Records {
    /// The read of a read-modify-write, through the kept copy. The change gets its own clone.
    async fn read_for_update<R: Record>(
        &self,
        id: &str,
        deadline: Instant,
    ) -> Result<(u64, Option<R>), S3Error> {
        match self
            .read_through::<R>(id, Quorum::WithPrimary, deadline)
            .await?
        {
            Fresh::Kept(version, record) => Ok((version, Some(R::clone(&record)))),
            Fresh::Read(state) => decode(state),
        }
    }

    /// Record `id` from `quorum`, naming the version kept here when there is one: the kept
    /// copy answers when no replica holds a newer one; otherwise the state read whole, whose
    /// JSON is kept by version. Counted by outcome.
    async fn read_through<R: Record>(
        &self,
        id: &str,
        quorum: Quorum,
        deadline: Instant,
    ) -> Result<Fresh<R>, S3Error> {
        if let Some(known) = self.cache.known(id) {
            let checked = match quorum {
                Quorum::Read => self.docs.get_checking(id, known, deadline).await?,
                Quorum::WithPrimary => {
                    self.docs
                        .get_for_update_checking(id, known, deadline)
                        .await?
                }
            };
            match checked {
                Checked::Unchanged => {
                    if let Some(record) = self.cache.record::<R>(id, known) {
                        self.cache.count("unchanged");
                        return Ok(Fresh::Kept(known, record?));
                    }
                    // Evicted or replaced meanwhile: read it whole below.
                }
                Checked::Changed(state) => {
                    self.cache.count("changed");
                    return Ok(Fresh::Read(self.remember(id, state)));
                }
            }
        }
        self.cache.count("unkept");
        let state = match quorum {
            Quorum::Read => self.docs.get(id, deadline).await?,
            Quorum::WithPrimary => self.docs.get_for_update(id, deadline).await?,
        };
        Ok(Fresh::Read(self.remember(id, state)))
    }

    /// Keeps the JSON of a state read whole by its version (or forgets a removed record).
    fn remember(&self, id: &str, state: DocState) -> DocState {
        match &state {
            DocState::Found { version, json } => self.cache.keep(id, *version, json.clone()),
            DocState::Removed { .. } | DocState::NotFound => self.cache.forget(id),
        }
        state
    }
}

fn decode<R: Record>(state: DocState) -> Result<(u64, Option<R>), S3Error> {
    let version = state.version();
    match state {
        DocState::Found { json, .. } => Ok((version, Some(R::decode(&json)?))),
        DocState::Removed { .. } | DocState::NotFound => Ok((version, None)),
    }
}
