//! The internal API between frontends and storage nodes (plain HTTP/2: method, path and headers
//! carry the operation, statuses are real). This crate is the only owner of that wire format; see
//! `INTERNAL_API.md` beside it.

mod batch;
mod changes;
mod compact;
mod documents;
mod export;
mod get_batch;
mod paths;
mod properties;
mod range;
mod visit;

pub use batch::{
    decode_answers, decode_put_batch, encode_answers, encode_put_batch, BatchError, ItemAnswer,
    PutItem, MAX_BODY as BATCH_MAX_BODY, MAX_ITEMS as BATCH_MAX_ITEMS,
    MAX_ITEM_DATA as BATCH_MAX_ITEM_DATA, MAX_PROPS as BATCH_MAX_PROPS,
};
pub use changes::{ChangeEntry, ChangePage};
pub use documents::{decode_key, doc_path, encode_key, header as doc_header, percent_decode};
pub use export::{
    encode_stream_head, ExportDecoder, ExportError, ExportFrame, FrameKind,
    MAX_KEY as EXPORT_MAX_KEY, MAX_PROPS as EXPORT_MAX_PROPS,
    STREAM_HEAD_LEN as EXPORT_STREAM_HEAD_LEN,
};
pub use get_batch::{
    decode_get_answers, decode_get_batch, encode_get_answers, encode_get_batch,
    max_answer as get_batch_max_answer, GetAnswer as GetItemAnswer, GetBatch, GetItem,
    MAX_ANSWERED as GET_BATCH_MAX_ANSWERED, MAX_BODY as GET_BATCH_MAX_BODY,
    MAX_INLINE as GET_BATCH_MAX_INLINE, MAX_ITEMS as GET_BATCH_MAX_ITEMS,
    MAX_KEY as GET_BATCH_MAX_KEY,
};
pub use paths::{
    blob_path, changes_path, export_path, parse_path, replica_path, InternalPath, COMPACTION_PATH,
    GET_BATCH_PATH, HEALTH_PATH, MAP_PATH, METRICS_PATH, PUT_BATCH_PATH,
};
pub use properties::{BlobProperties, PropertiesError, MAX_USER_META_BYTES};
pub use range::{content_range, ByteRange, RangeError};
pub use visit::{
    ItemState, VisitError, VisitItem, VisitPage, VisitQuery, MAX_LIMIT as VISIT_MAX_LIMIT,
};

/// The `larder-map-revision` of a request or answer, when present and a number.
pub fn map_revision(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header_name::MAP_REVISION)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Header names of the internal API (lower case, as HTTP/2 sends them).
pub mod header {
    /// Operation time of a put or delete, ms since the Unix epoch.
    pub const TIME_MS: &str = "x-larder-time-ms";
    /// Expiry time of a blob, ms since the Unix epoch.
    pub const EXPIRES_MS: &str = "x-larder-expires-ms";
    /// Every blob property in one value (the compact form, `compact.rs`): sent on internal PUTs
    /// and in storage nodes' GET/HEAD answers instead of one header per property.
    pub const PROPS: &str = "x-larder-props";
    /// Prefix of user metadata headers (`x-larder-meta-<name>`), also in the public API.
    pub const META_PREFIX: &str = "x-larder-meta-";
    /// CRC32C of the request body (decimal); the storage node refuses a body that does not match.
    pub const BODY_CRC32C: &str = "x-larder-body-crc32c";
    /// Why a 410 is a 410: `deleted` or `expired`.
    pub const GONE_REASON: &str = "x-larder-gone";
    /// Size of the whole blob (also on 206 and 416 answers).
    pub const BLOB_SIZE: &str = "x-larder-blob-size";
    /// The cluster map revision the sender runs (decimal): on every frontend request and every
    /// storage node answer (the fence of `INTERNAL_API.md`, "Map revisions").
    pub const MAP_REVISION: &str = "larder-map-revision";
    /// On a storage node's 200/206 to a blob GET/HEAD: the replica has not reached every local
    /// peer's feed head recently (`caught-up window`), so it may lack a recent tombstone; the
    /// frontend confirms such an answer with another replica.
    pub const CATCHING_UP: &str = "x-larder-catching-up";
    /// On a `503` to a blob read: the node's read budget stayed spent (`[limits] read_budget`):
    /// frontends park their stalled downloads sooner, whose bytes are what holds it.
    pub const READ_BUDGET_SPENT: &str = "x-larder-read-budget-spent";
    /// Outcome of an internal put: `stored` or `exists`.
    pub const PUT_OUTCOME: &str = "x-larder-put";
    /// On an export answer: the source replica's bytes on disk, an estimate of what is left to
    /// copy (for progress and time left).
    pub const EXPORT_ESTIMATE: &str = "x-larder-export-bytes";
    /// On a change feed page: `1` when the node took the puller's `saved=` cursor as its
    /// position for the tombstone horizon. A puller whose peer does not say so (an earlier
    /// release, which reads `after` as that position) saves its cursor before every pull.
    pub const SAVED_TAKEN: &str = "x-larder-saved-taken";
}

/// The names of `header` used on every read, as `HeaderName`s: a `&str` name is parsed again
/// on each lookup, and one outside HTTP's standard names copied on each insert.
pub mod header_name {
    use super::header as h;
    use http::HeaderName;

    pub const PROPS: HeaderName = HeaderName::from_static(h::PROPS);
    pub const BLOB_SIZE: HeaderName = HeaderName::from_static(h::BLOB_SIZE);
    pub const CATCHING_UP: HeaderName = HeaderName::from_static(h::CATCHING_UP);
    pub const MAP_REVISION: HeaderName = HeaderName::from_static(h::MAP_REVISION);
    pub const GONE_REASON: HeaderName = HeaderName::from_static(h::GONE_REASON);
    pub const TIME_MS: HeaderName = HeaderName::from_static(h::TIME_MS);
}

/// Query flag on internal GET/HEAD: also return expired records (for replication).
pub const INCLUDE_EXPIRED_QUERY: &str = "include=expired";
