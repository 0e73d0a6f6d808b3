//! Reading and changing the S3 layer's records through the router's documents: reads from a
//! quorum (strong read-after-write), changes as read-modify-writes applied at the partition
//! primary (DESIGN 6.1), so two changes based on one read never both apply.

use std::sync::Arc;

use larder_router::{Checked, DocRouter, DocState, Router, Written};
use tokio::time::Instant;

use crate::error::S3Error;
use crate::held::Held;
use crate::keep::Keep;
use crate::leaf_base::{self, BasePolicy};
use crate::record_cache::{Cacheable, RecordCache};
use crate::records::{BasePlan, Record};

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
    records_router: Arc<Router>,
    /// Records read or written here, by version (`record_cache.rs`); none unless
    /// `with_index_cache`. Leaves' base blobs too, by blob ID (`leaf_base.rs`).
    cache: RecordCache,
    /// How leaves are written: as deltas from a base blob, or whole (`leaf_base.rs`).
    bases: BasePolicy,
    /// Bases stored (`larder_frontend_s3_index_leaf_folds_total`).
    folds: prometheus_client::metrics::counter::Counter,
}

impl Records {
    /// Records through `records_router`; blobs through `router` (this frontend's datacenter).
    pub fn new(router: Arc<Router>, records_router: Arc<Router>) -> Records {
        Records {
            docs: DocRouter::new(records_router.clone()),
            router,
            records_router,
            cache: RecordCache::new(0),
            bases: BasePolicy::WHOLE,
            folds: Default::default(),
        }
    }

    /// The count of leaf bases stored (for `/metrics`).
    pub fn leaf_folds(&self) -> prometheus_client::metrics::counter::Counter {
        self.folds.clone()
    }

    /// Writes leaves as deltas from base blobs, as `policy` says (`leaf_base.rs`).
    pub fn with_leaf_bases(mut self, policy: BasePolicy) -> Records {
        self.bases = policy;
        self
    }

    /// The router the records go through (the home datacenter's).
    pub fn records_router(&self) -> &Arc<Router> {
        &self.records_router
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
        let (_, record) = decode(state)?;
        self.resolved(id, record, &Keep::All).await
    }

    /// `read`, without reading the record's base (`leaf_base.rs`): an index record's names
    /// are then only those changed since its base was made. For its other fields (garbage,
    /// links, marks) only, never for its names, never written back.
    pub async fn read_unresolved<R: Record>(&self, id: &str) -> Result<Option<R>, S3Error> {
        let state = self.docs.get(id, self.deadline()).await?;
        decode(state).map(|(_, record)| record)
    }

    /// `record` (decoded from `id`) made whole with its base, as `keep` keeps it.
    async fn resolved<R: Record>(
        &self,
        id: &str,
        record: Option<R>,
        keep: &Keep,
    ) -> Result<Option<R>, S3Error> {
        let Some(mut record) = record else {
            return Ok(None);
        };
        leaf_base::resolve(&self.router, &self.cache, id, &mut record, keep).await?;
        Ok(Some(record))
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
            Fresh::Read(state) => {
                let (_, record) = crate::keep::decode_keeping(keep, || decode(state))?;
                let record = self.resolved(id, record, keep).await?;
                Ok(record.map(Kept::Owned))
            }
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
            let had_base = current.as_ref().and_then(R::base_blob).map(str::to_owned);
            let (what, answer) = change(current)?;
            let version = self.docs.next_version(seen)?;
            let (json, record, base) = match what {
                Change::Keep => return Ok(answer),
                Change::Put(record) => {
                    let mut record = record.normalized();
                    let base = self.plan_base(id, &mut record).await?;
                    if let Some(blob) = &had_base {
                        record.remember_base(blob, self.base_garbage_after());
                    }
                    (Some(record.encode()), Some(record), base)
                }
                Change::Remove => {
                    let base = match had_base {
                        Some(blob) => Some(self.hold_removed_base(id, &blob).await?),
                        None => None,
                    };
                    (None, None, base)
                }
            };
            let written = self
                .docs
                .write_serialised(id, seen, version, json.clone(), deadline)
                .await;
            *uncertain = written.is_err();
            if written.is_err() {
                self.cache.forget(id);
            }
            if let Some(base) = base {
                if let (BaseWrite::Folded(_), Ok(Written::Applied)) = (&base, &written) {
                    crate::held::crash_point("after-base-write");
                }
                self.settle_base(id, base, &written);
            }
            match written? {
                Written::Applied => {
                    // The next read of the record, by this frontend's next change or a GET,
                    // is then a 304 and a clone, unless another frontend wrote meanwhile.
                    match (json, record) {
                        (Some(json), Some(record)) => {
                            let extra = record.base_bytes();
                            self.cache.keep_written(id, version, (json, extra), record)
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

/// A base blob held in the journal while the write of its record is under way.
enum BaseWrite {
    /// A fold's new base, which the record names once the write applies.
    Folded(leaf_base::Folded),
    /// The base of a record being removed, tombstoned once the removal applies.
    Removed(larder_cluster::BlobId, Held),
}

impl Records {
    /// Folds `record` into a new base blob, or gives its base up, as its size says
    /// (`leaf_base.rs`); a new base is stored (and held) before the record is written.
    async fn plan_base<R: Record>(
        &self,
        id: &str,
        record: &mut R,
    ) -> Result<Option<BaseWrite>, S3Error> {
        let after_ms = self.base_garbage_after();
        match record.base_plan((self.bases.delta_bytes, self.bases.max_blob)) {
            BasePlan::AsIs => Ok(None),
            BasePlan::Inline => {
                record.rebase(None, after_ms);
                Ok(None)
            }
            BasePlan::Fold => {
                let Some(base) = record.base_of(id) else {
                    return Ok(None);
                };
                let stored =
                    leaf_base::store_base(&self.router, (id, base), self.bases.max_blob).await?;
                crate::held::crash_point("after-base-stored");
                match stored {
                    Some((folded, base)) => {
                        self.folds.inc();
                        record.rebase(Some(base), after_ms);
                        Ok(Some(BaseWrite::Folded(folded)))
                    }
                    None => {
                        record.rebase(None, after_ms);
                        Ok(None)
                    }
                }
            }
        }
    }

    /// When a base replaced now may be tombstoned.
    fn base_garbage_after(&self) -> u64 {
        crate::service::now_ms().saturating_add(self.bases.grace.as_millis() as u64)
    }

    /// Holds the base `blob` of record `id`, which is being removed.
    async fn hold_removed_base(&self, id: &str, blob: &str) -> Result<BaseWrite, S3Error> {
        let blob = crate::blobs::parse_id(blob)?;
        let entry = leaf_base::hold(&self.router, id, Some(&blob)).await?;
        Ok(BaseWrite::Removed(blob, Held::new(entry)))
    }

    /// Settles a held base by how the write of its record went.
    fn settle_base(
        &self,
        id: &str,
        base: BaseWrite,
        written: &Result<Written, larder_router::DocError>,
    ) {
        match (base, written) {
            (BaseWrite::Folded(folded), Ok(Written::Applied)) => folded.named(&self.cache),
            (BaseWrite::Folded(folded), Ok(Written::Superseded(_))) => {
                folded.held.unlinked(&self.router, Some(folded.blob))
            }
            (BaseWrite::Removed(blob, held), Ok(Written::Applied)) => {
                held.unlinked(&self.router, Some(blob))
            }
            (BaseWrite::Removed(_, held), Ok(Written::Superseded(_))) => held.linked(),
            (BaseWrite::Folded(folded), Err(_)) => {
                leaf_base::settle_later(&self.records_router, &self.router, id, folded.held)
            }
            (BaseWrite::Removed(_, held), Err(_)) => {
                leaf_base::settle_later(&self.records_router, &self.router, id, held)
            }
        }
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
            Fresh::Read(state) => {
                let (version, record) = decode(state)?;
                Ok((version, self.resolved(id, record, &Keep::All).await?))
            }
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
                        let record = self.kept_whole(id, known, record?).await?;
                        return Ok(Fresh::Kept(known, record));
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

    /// A kept record made whole with its base (once per version: the whole copy is kept).
    async fn kept_whole<R: Record>(
        &self,
        id: &str,
        version: u64,
        record: Arc<R>,
    ) -> Result<Arc<R>, S3Error> {
        if !record.unresolved() {
            return Ok(record);
        }
        let mut whole = R::clone(&record);
        leaf_base::resolve(&self.router, &self.cache, id, &mut whole, &Keep::All).await?;
        let whole = Arc::new(whole);
        let extra = whole.base_bytes();
        self.cache.set_decoded(id, version, (whole.clone(), extra));
        Ok(whole)
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
