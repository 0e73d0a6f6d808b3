//! What can go wrong while serving one internal request. Each variant is mapped to a status and a
//! stable code in exactly one place, `reply::error_response`.

use larder_proto::{PropertiesError, RangeError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no internal API at {0}")]
    NoSuchPath(String),
    #[error("node {node} hosts no replica of partition {partition}")]
    NotHosted { node: String, partition: u32 },
    #[error("use {0}")]
    MethodNotAllowed(&'static str),
    #[error("{0}")]
    BadQuery(&'static str),
    #[error("{0}")]
    BadKey(&'static str),
    #[error("bad selection: {0}")]
    BadSelection(String),
    #[error("{0}")]
    BadHeader(String),
    #[error(transparent)]
    BadProperties(#[from] PropertiesError),
    /// A time or version past what this node's clock allows (see `validate.rs`).
    #[error("{header} {value} is too far in the future (limit {limit})")]
    FromTheFuture {
        header: &'static str,
        value: u64,
        limit: u64,
        /// How far past the limit, in milliseconds of this node's clock.
        ahead_ms: u64,
    },
    #[error("body does not match x-larder-body-crc32c")]
    ChecksumMismatch,
    /// A batch of PUTs (`put_batch.rs`) this node cannot read.
    #[error("bad batch: {0}")]
    BadBatch(#[from] larder_proto::BatchError),
    #[error("body exceeds {max} bytes")]
    BodyTooLarge { max: u64 },
    #[error("no body bytes arrived for {0:?}")]
    BodyTimeout(std::time::Duration),
    #[error("reading the body: {0}")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The node's budget for buffered request bodies is spent: try again soon (or elsewhere).
    #[error("this node is buffering {limit} bytes of request bodies already; retry later")]
    BodyBudgetSpent { limit: u64 },
    #[error(transparent)]
    BadRange(RangeError),
    #[error("{0}")]
    NotFound(&'static str),
    /// The node's read budget stayed spent for `read_budget_wait`: try later or elsewhere.
    #[error("this node's read budget stayed spent ([limits] read_budget); retry later")]
    ReadBudgetSpent,
    /// A bounded resource (visit scan slots) stayed taken too long: try later or elsewhere.
    #[error("{0}")]
    Busy(&'static str),
    /// A serialised document write reached a node that is not the partition's primary at the
    /// frontend's map (`documents::serialised`).
    #[error("{0}")]
    NotPrimary(String),
    /// A serialised document write read an older version than the primary holds: a concurrent
    /// read-modify-write came first. Nothing was written.
    #[error("the primary holds version {current}, newer than the one the write was based on")]
    NewerVersion { current: u64 },
    #[error("stored properties: {0}")]
    CorruptProperties(String),
    /// A peer replica asked for this replica's feed from a position before a tombstone this
    /// replica dropped: it cannot have seen that delete, so it must be rebuilt, never rejoined.
    #[error("replica of partition {partition} asked from sequence {after}, before tombstones dropped up to {dropped}: rebuild that replica")]
    BehindDroppedTombstones {
        partition: u32,
        after: u64,
        dropped: u64,
    },
    /// A peer replica asked for our feed before our own pull of it was answered since this
    /// node started (`horizon.rs`): retried.
    #[error("partition {partition}: not serving peers before this replica has pulled from them")]
    NotCheckedYet { partition: u32 },
    /// This replica is behind tombstones a peer dropped: it serves no peer until rebuilt.
    #[error("partition {partition}: this replica is behind tombstones a peer dropped and must be rebuilt")]
    MustBeRebuilt { partition: u32 },
    /// This replica is being replaced by a fresh copy from its peers (`rebuild.rs`): it serves
    /// no data request until that copy has caught up.
    #[error("partition {partition}: this replica is being rebuilt from its peers")]
    Rebuilding { partition: u32 },
    /// A read found the blob, but this replica has not yet heard from every local peer since
    /// it started whether it is behind tombstones they dropped (`Horizons::checked_for_reads`).
    #[error("partition {partition}: this replica has not yet checked itself against its peers")]
    Unchecked { partition: u32 },
    /// This replica is still bootstrapping (`DESIGN.md` 6.1): no source for others' replication
    /// or bootstrap yet.
    #[error("partition {partition}: this replica is bootstrapping and is no source yet")]
    Bootstrapping { partition: u32 },
    /// A map pushed through the test path was refused whole; the old one stays.
    #[error("map refused: {0}")]
    MapRefused(String),
    #[error(transparent)]
    Store(#[from] larder_store::Error),
    /// The request's map revision is older than this node's, at which this node holds no
    /// replica of the partition: the sender must fetch the newer map.
    #[error("node {node} holds no replica of partition {partition} at map revision {revision}, newer than the request's {asked}")]
    Misdirected {
        node: String,
        partition: u32,
        revision: u64,
        asked: u64,
    },
    /// An offered cluster map was refused; the current one stays.
    #[error(transparent)]
    Map(#[from] larder_cluster::MapError),
}

pub type Result<T> = std::result::Result<T, Error>;
