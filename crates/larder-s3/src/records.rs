//! The S3 layer's records, stored as documents in Larder's own replicated, versioned storage
//! (the router's `DocRouter`: newest version wins; read-modify-writes at the partition primary).
//! Each is a JSON object whose `"v"` names its format; an unknown version is an error, never
//! guessed at. The document keys start with `larder-s3:`, which no `/document/v1` ID can
//! (those start with `id:`), so the public document API can neither address nor visit them.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::checksums::ObjectChecksum;
use crate::error::S3Error;
use crate::keep::Keep;
use crate::upload_checksum::UploadChecksum;

/// The one format version every record below is written in.
pub const FORMAT: u32 = 1;

/// Largest record read back (a bucket index at its entry bound is well under this).
pub const MAX_RECORD_BYTES: usize = 8 << 20;

/// Entries one list record holds (a bucket's uploads in progress): past this a new one is
/// refused rather than growing a record every write rewrites.
pub const MAX_INDEX_ENTRIES: usize = 10_000;

/// The format of a bucket's root once it has split into leaves, and of every leaf
/// (`index_tree.rs`): code that knows only `FORMAT` refuses them rather than misreading them.
pub const FORMAT_SPLIT: u32 = 2;

/// The format of a leaf whose names are mostly in a base blob (`leaf_base.rs`): its `objects`
/// are then only the names changed since the base was made, and `removed` the names gone
/// since. Code that knows only `FORMAT_SPLIT` refuses it rather than misreading it.
pub const FORMAT_BASED: u32 = 3;

/// The format of an empty leaf merged, or being merged, into the leaf on its left
/// (`index_tree/merge.rs`): it holds no names and takes none. Code that knows only the formats
/// before it refuses it rather than linking a name into a range its left neighbour may cover.
pub const FORMAT_MERGING: u32 = 4;

/// The format of a leaf merged, or being merged, into the leaf on its left while it held
/// names (`Merging::names`), which the left leaf takes over. Code that knows only the formats
/// before it refuses it: it would finish the merge without moving the names, and lose them.
pub const FORMAT_MERGING_NAMES: u32 = 5;

/// The document holding the access keys.
pub const KEYS_DOC: &str = "larder-s3:keys";
/// The document listing the buckets (for ListBuckets; each bucket's own index decides).
pub const CATALOG_DOC: &str = "larder-s3:buckets";

/// The document of bucket `name`'s index.
pub fn bucket_doc(name: &str) -> String {
    format!("larder-s3:bucket:{name}")
}

/// The document listing the leaves merged away in bucket `bucket` made at `created_ms` (one
/// per incarnation of a name, so that a bucket made again never meets its predecessor's).
pub fn merged_leaves_doc(bucket: &str, created_ms: u64) -> String {
    format!("larder-s3:merged:{bucket}:{created_ms}")
}

/// The document of leaf `id` of bucket `bucket`'s index.
pub fn leaf_doc(bucket: &str, id: &str) -> String {
    format!("larder-s3:leaf:{bucket}:{id}")
}

/// An index record's names, each with its entry shared, in a persistent B-tree: a
/// read-modify-write clones the record it changes (a leaf of up to `index_leaf_entries`
/// names) from the kept copy, changes a few names and replaces the kept copy with it. With a
/// `BTreeMap`, cloning every node and key and dropping the replaced copy were 15 % of the
/// frontend's CPU per 1 KiB PutObject (perf, `warp put`); here a clone is one reference
/// count and a change copies only the path to the names it touches.
pub type Objects = imbl::OrdMap<String, Arc<ObjectEntry>>;

/// Writes an index record's names with each entry's JSON as it made it once (`EntryJson`): a
/// batch of links rewrites a leaf of up to 1,000 names, and escaping and formatting every
/// entry again each time was most of the frontend's CPU per PutObject that was not I/O.
fn serialize_objects<S: Serializer>(objects: &Objects, serializer: S) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(Some(objects.len()))?;
    for (key, entry) in objects {
        map.serialize_entry(key, entry.json())?;
    }
    map.end()
}

/// A bucket's root record: the decision point for creating and deleting the bucket. While the
/// bucket is small it is also its only leaf and holds its objects in name order (format 1);
/// past `index_leaf_entries` it splits, and from then on it lists its leaves by the first key
/// each covers (format 2; `index_tree.rs`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketIndex {
    pub v: u32,
    pub created_ms: u64,
    /// The objects, while the root is the bucket's only leaf (empty once split).
    #[serde(
        deserialize_with = "crate::keep::objects",
        serialize_with = "serialize_objects"
    )]
    pub objects: Objects,
    /// Blobs no name points at any more, tombstoned once their grace period is over (a read
    /// that resolved the name just before may still be fetching them). Written in the same
    /// document write that unlinks them, so a crash cannot leak one.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::keep::garbage"
    )]
    pub garbage: Vec<Garbage>,
    /// Anonymous requests may read this bucket (GET, HEAD, listings): PutBucketAcl with the
    /// canned ACL `public-read` (`private` turns it off).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub public_read: bool,
    /// The bucket's tags (PutBucketTagging; `tagging.rs`). Builds before bucket tags refuse a
    /// root that has them (this record denies unknown fields).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: crate::tagging::Tags,
    /// Once split: the first key each leaf covers → the leaf's ID. A routing hint only: a
    /// leaf's first key never changes and leaves never merge, so starting from any leaf that
    /// begins at or before a key and following `right` links finds the key's leaf.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub leaves: BTreeMap<String, String>,
    /// A split of this root into two leaves under way (links and unlinks wait for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub splitting: Option<Split>,
    /// A DeleteBucket of the split bucket under way: its ticket (and when it began), carried
    /// by the seals it puts on the leaves. Whoever removes or clears it decides whether the
    /// delete happens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleting: Option<Seal>,
    /// The blob holding the root's names as of its last fold, as a leaf's (`Leaf::base`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<LeafBase>,
    /// Names of the base removed since it was made, as stored (as a leaf's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
}

impl BucketIndex {
    /// Whether the root has split into leaves (and holds no objects itself).
    pub fn is_split(&self) -> bool {
        !self.leaves.is_empty()
    }

    /// The format this root is written in: 2 once anything of a split is in it, else 3 with
    /// a base, else 1 (what code before splits and bases reads).
    fn format(&self) -> u32 {
        let split = self.is_split() || self.splitting.is_some() || self.deleting.is_some();
        match (split, self.base.is_some()) {
            (true, _) => FORMAT_SPLIT,
            (false, true) => FORMAT_BASED,
            (false, false) => FORMAT,
        }
    }
}

/// A split under way: keys from `at` on move to the new leaf `right` (and, for a root, keys
/// before `at` to the new leaf `left`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Split {
    pub at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left: Option<String>,
    pub right: String,
}

/// One leaf of a split bucket's index: the names in `[low, high)` (no `high`: to the end),
/// and the leaf holding the keys after it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Leaf {
    pub v: u32,
    /// The `created_ms` of the bucket this leaf belongs to: a leaf left from a deleted bucket
    /// of the same name is never taken for one of the bucket made again.
    pub bucket_created_ms: u64,
    pub low: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub right: Option<String>,
    #[serde(
        deserialize_with = "crate::keep::objects",
        serialize_with = "serialize_objects"
    )]
    pub objects: Objects,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::keep::garbage"
    )]
    pub garbage: Vec<Garbage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub splitting: Option<Split>,
    /// Set by a DeleteBucket on an empty leaf: no name is linked here while it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<Seal>,
    /// Set on a leaf that is being merged into the leaf on its left (empty, or holding few
    /// names: `index_tree/merge.rs`): never lifted, and no name is linked here again (format
    /// 4, or 5 with names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merging: Option<Merging>,
    /// The blob holding the leaf's names as of its last fold (`leaf_base.rs`), once the leaf
    /// grew past `[s3] index_delta_bytes`: a write then sends only what changed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<LeafBase>,
    /// Names of the base removed since it was made, as stored (format 3). Empty in memory
    /// once the base is read (`Record::resolve_base`): `objects` is then every name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
}

/// A leaf's base: an immutable blob of its names as they were at a fold.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeafBase {
    pub blob: String,
    /// The base's names once read (`None`: the leaf as decoded, its `objects` the delta).
    #[serde(skip)]
    pub objects: Option<Objects>,
    /// The length of the base's JSON, once read (what the record cache counts for it).
    #[serde(skip)]
    pub bytes: usize,
}

/// Two leaves are the same when they name the same base blob (whose bytes never change).
impl PartialEq for LeafBase {
    fn eq(&self, other: &LeafBase) -> bool {
        self.blob == other.blob
    }
}

impl Eq for LeafBase {}

/// The bytes of a leaf's base blob: the leaf's names as they were, and the leaf they belong
/// to (a base named by another leaf is corruption, never read as its names).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeafBaseBlob {
    pub v: u32,
    pub leaf: String,
    #[serde(
        deserialize_with = "crate::keep::objects",
        serialize_with = "serialize_objects"
    )]
    pub objects: Objects,
    /// The length of the JSON it was decoded from (0: not decoded).
    #[serde(skip)]
    pub bytes: usize,
}

/// Two bases are the same when they hold the same names for the same leaf, however long the
/// JSON they were read from.
impl PartialEq for LeafBaseBlob {
    fn eq(&self, other: &LeafBaseBlob) -> bool {
        (self.v, &self.leaf, &self.objects) == (other.v, &other.leaf, &other.objects)
    }
}

impl Eq for LeafBaseBlob {}

/// What the next write of a record does with its base (`leaf_base.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BasePlan {
    /// Write it as it is: the delta from its base, or every name when it has none.
    AsIs,
    /// Write every name into the record again and give up the base (the record is small, or
    /// bases are off).
    Inline,
    /// Write its names as a new base blob first, then the record as an empty delta.
    Fold,
}

/// About how many bytes the changes from `base` to `now` take in a record's JSON (`delta`'s
/// names and entries, and its removed names), without building them.
fn delta_bytes(base: &Objects, now: &Objects) -> usize {
    base.diff(now)
        .map(|item| match item {
            imbl::ordmap::DiffItem::Add(name, entry)
            | imbl::ordmap::DiffItem::Update {
                new: (name, entry), ..
            } => name.len() + entry.approx_bytes() + 4,
            imbl::ordmap::DiffItem::Remove(name, _) => name.len() + 3,
        })
        .sum()
}

/// The changes from `base` to `now`: names added or changed, and names removed.
pub fn delta(base: &Objects, now: &Objects) -> (Objects, Vec<String>) {
    let mut changed = Objects::new();
    let mut removed = Vec::new();
    for item in base.diff(now) {
        match item {
            imbl::ordmap::DiffItem::Add(key, entry)
            | imbl::ordmap::DiffItem::Update {
                new: (key, entry), ..
            } => {
                changed.insert(key.clone(), entry.clone());
            }
            imbl::ordmap::DiffItem::Remove(key, _) => removed.push(key.clone()),
        }
    }
    (changed, removed)
}

/// A DeleteBucket's ticket, on the root and on each empty leaf it sealed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seal {
    pub ticket: String,
    /// When it was set, by the deleting frontend's clock (only for telling a seal whose
    /// deleter died from one under way; the root's `deleting` decides).
    pub at_ms: u64,
}

/// A leaf's merge into its left neighbour (`index_tree/merge.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Merging {
    /// The leaf that ended at this one when the merge began: a walk that starts at this leaf
    /// goes there instead (any leaf left of a key leads to it by `right` links).
    pub into: String,
    /// Whether the leaf held names when it was sealed (format 5): the leaf that takes its
    /// range takes them too. An empty leaf's merge leaves it out (format 4, as before).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub names: bool,
}

/// The leaves of one bucket merged away (`index_tree/stubs.rs`): each stub is removed once
/// `[s3] merged_leaf_grace` is over, or with its bucket. A record of its own, not a field of
/// the leaves or the root, so that builds before it read every leaf and root as they did (and
/// leave the stubs, as they always did).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergedLeaves {
    pub v: u32,
    /// In the order their merges began.
    pub leaves: Vec<MergedLeaf>,
}

/// One leaf listed in `MergedLeaves`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergedLeaf {
    pub id: String,
    /// When its merge began (ms since the epoch).
    pub at_ms: u64,
    /// Set once its merge's last step is done: only then is its record a stub to remove.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub finished: bool,
}

/// What a name points at.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectEntry {
    /// The bytes, in order: one blob for a single PUT, one per part for a multipart upload
    /// (parts differ in size, so they are listed here rather than in one composite manifest).
    pub body: Vec<Piece>,
    pub size: u64,
    /// The ETag's value as S3 clients expect it, without the quotes (MD5 hex for a single PUT).
    pub etag: String,
    pub modified_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// `x-amz-meta-*` user metadata (names lower-case, without the prefix).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// The additional checksum of a single PUT that asked for one (`checksums.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<ObjectChecksum>,
    /// `Cache-Control` and the other standard headers it answers reads with.
    #[serde(default, skip_serializing_if = "ObjectHeaders::is_empty")]
    pub headers: ObjectHeaders,
    /// Its own canned ACL's say on anonymous reads; `None`: as its bucket's (`acl.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_read: Option<bool>,
    /// Its tags (`tagging.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// The entry's JSON once an index record holding it was written (never part of it).
    #[serde(skip)]
    pub json: EntryJson,
}

/// An entry's JSON, made the first time a record holding the entry is written and reused by
/// every later write of a record that shares the entry (`Objects` holds entries in `Arc`s,
/// so a shared entry is never changed). A clone starts empty, because a clone is how an entry
/// is changed; every check of an entry ignores it.
#[derive(Default)]
pub struct EntryJson(OnceLock<Box<RawValue>>);

impl Clone for EntryJson {
    fn clone(&self) -> EntryJson {
        EntryJson::default()
    }
}

impl PartialEq for EntryJson {
    fn eq(&self, _: &EntryJson) -> bool {
        true
    }
}

impl Eq for EntryJson {}

impl std::fmt::Debug for EntryJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EntryJson")
    }
}

/// The standard headers an object keeps from its upload (`object_headers.rs`), as given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectHeaders {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    /// An HTTP date.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
}

impl ObjectHeaders {
    pub fn is_empty(&self) -> bool {
        *self == ObjectHeaders::default()
    }
}

impl ObjectEntry {
    /// The entry's JSON as its index record holds it, made once (`EntryJson`).
    pub fn json(&self) -> &RawValue {
        let json = self.json.0.get_or_init(|| {
            serde_json::value::to_raw_value(self).expect("entries are strings and numbers")
        });
        // An entry changed after its JSON was made would be written as it was: tests check.
        #[cfg(debug_assertions)]
        assert_eq!(
            json.get(),
            serde_json::value::to_raw_value(self).unwrap().get(),
            "an entry changed after its JSON was made"
        );
        json
    }

    /// The entry without its kept JSON, to be changed.
    pub fn without_json(mut self) -> ObjectEntry {
        self.json = EntryJson::default();
        self
    }

    /// About how many bytes the entry takes in its record's JSON, what an index record's
    /// split by size counts (`index_tree::split_point`): exactly that once it was written. A
    /// multipart object lists every part, so this grows with its parts: 10,000 parts are most
    /// of a megabyte.
    pub fn approx_bytes(&self) -> usize {
        if let Some(json) = self.json.0.get() {
            return json.get().len();
        }
        let text = |s: &Option<String>| s.as_ref().map_or(0, |s| s.len() + 24);
        let pieces: usize = self.body.iter().map(|p| p.blob.len() + 32).sum();
        let meta: usize = self.meta.iter().map(|(k, v)| k.len() + v.len() + 6).sum();
        let h = &self.headers;
        let headers: usize = [
            &h.cache_control,
            &h.content_disposition,
            &h.content_encoding,
            &h.content_language,
            &h.expires,
        ]
        .into_iter()
        .map(text)
        .sum();
        let checksum = self.checksum.as_ref().map_or(0, |c| c.value.len() + 48);
        let tags: usize = self.tags.iter().map(|(k, v)| k.len() + v.len() + 6).sum();
        let described = text(&self.content_type) + meta + headers + checksum + tags;
        96 + pieces + self.etag.len() + described
    }
}

/// A Larder blob (simple or composite) holding `size` bytes of an object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Piece {
    pub blob: String,
    pub size: u64,
}

/// A multipart upload in progress: `larder-s3:upload:<bucket>:<upload id>`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upload {
    pub v: u32,
    pub key: String,
    pub created_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "ObjectHeaders::is_empty")]
    pub headers: ObjectHeaders,
    /// The object's canned ACL's say on anonymous reads (`acl.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_read: Option<bool>,
    /// The object's tags (`tagging.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// The additional checksum its parts carry, and how they make the object's
    /// (`upload_checksum.rs`); `None`: none asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<UploadChecksum>,
    /// Part number → the part's blob, size and MD5 (hex).
    pub parts: BTreeMap<u32, UploadedPart>,
    /// A CompleteMultipartUpload under way (`multipart.rs`, `complete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completing: Option<Completing>,
}

/// Written into an upload's record before its object is linked, and there until the link is
/// settled: the record (and so the parts) stays the upload's until the object is known to be
/// linked, and no Abort, UploadPart or second Complete changes it meanwhile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Completing {
    /// Names the completing frontend's journal entry, which settles the completion if that
    /// frontend dies first (`held.rs`).
    pub token: String,
    /// The part numbers the object is made of, in order.
    pub parts: Vec<u32>,
    /// When the token was written (ms since the epoch): a token much older than any request
    /// lives was left by a frontend that died (`multipart::STALE_COMPLETION`).
    pub since_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UploadedPart {
    pub blob: String,
    pub size: u64,
    pub md5: String,
    pub modified_ms: u64,
    /// Its checksum of the upload's algorithm (base64), when the upload has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
}

/// The document of multipart upload `id` into `bucket`.
pub fn upload_doc(bucket: &str, id: &str) -> String {
    format!("larder-s3:upload:{bucket}:{id}")
}

/// The document listing bucket `bucket`'s multipart uploads in progress (for
/// ListMultipartUploads): `larder-s3:uploads:<bucket>`.
pub fn uploads_doc(bucket: &str) -> String {
    format!("larder-s3:uploads:{bucket}")
}

/// A bucket's uploads in progress, by object name, then upload ID (→ creation time, ms).
/// Written after an upload's own record and before it is removed, so every listed upload
/// whose record is gone was completed or aborted by a request that failed half-way.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UploadList {
    pub v: u32,
    pub uploads: BTreeMap<String, BTreeMap<String, u64>>,
}

impl UploadList {
    pub fn len(&self) -> usize {
        self.uploads.values().map(BTreeMap::len).sum()
    }
}

/// A blob to tombstone after `after_ms`. An index record holds up to `max_held_garbage` of
/// these through their grace period, and every read-modify-write of the record copies them
/// and writes them all: so an entry is shared by the record's copies, immutable, with its
/// JSON made once, instead of being allocated, escaped and formatted again for each (under
/// overwrites of a few names, cloning and serialising 4,096 of them was a seventh of the
/// frontend's CPU per PutObject).
#[derive(Clone, Debug)]
pub struct Garbage(Arc<Held>);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Held {
    blob: String,
    after_ms: u64,
    #[serde(skip)]
    json: OnceLock<Box<RawValue>>,
}

impl Garbage {
    pub fn new(blob: impl Into<String>, after_ms: u64) -> Garbage {
        Garbage(Arc::new(Held {
            blob: blob.into(),
            after_ms,
            json: OnceLock::new(),
        }))
    }

    pub fn blob(&self) -> &str {
        &self.0.blob
    }

    /// When the blob may be tombstoned (ms since the epoch).
    pub fn after_ms(&self) -> u64 {
        self.0.after_ms
    }

    /// Makes the blob due at `now_ms` if it was due later; whether it was. The entry is
    /// replaced, not changed: the record's other copies share the old one.
    pub fn hurry_to(&mut self, now_ms: u64) -> bool {
        if self.0.after_ms <= now_ms {
            return false;
        }
        *self = Garbage::new(self.0.blob.clone(), now_ms);
        true
    }

    /// The entry's JSON as its record holds it, made once.
    fn json(&self) -> &RawValue {
        self.0.json.get_or_init(|| {
            let fields = GarbageFields {
                blob: &self.0.blob,
                after_ms: self.0.after_ms,
            };
            serde_json::value::to_raw_value(&fields).expect("a string and a number")
        })
    }
}

impl PartialEq for Garbage {
    fn eq(&self, other: &Garbage) -> bool {
        self.blob() == other.blob() && self.after_ms() == other.after_ms()
    }
}

impl Eq for Garbage {}

impl Serialize for Garbage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.json().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Garbage {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Held::deserialize(deserializer).map(|held| Garbage(Arc::new(held)))
    }
}

/// What a `Garbage` entry is written as.
#[derive(Serialize)]
struct GarbageFields<'a> {
    blob: &'a str,
    after_ms: u64,
}

/// The buckets, for ListBuckets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    pub v: u32,
    /// Name → creation time (ms since the epoch).
    pub buckets: BTreeMap<String, u64>,
}

/// The access keys.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRing {
    pub v: u32,
    pub keys: BTreeMap<String, AccessKey>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessKey {
    pub secret: String,
    pub created_ms: u64,
    /// Bucket name (or `*`: every bucket) → what the key may do there.
    pub buckets: BTreeMap<String, Permission>,
}

/// What a key may do in a bucket; each includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// Get, head and list objects.
    Read,
    /// Also put and delete objects.
    Write,
    /// Also create and delete the bucket.
    Owner,
}

impl std::str::FromStr for Permission {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "read" => Ok(Permission::Read),
            "write" => Ok(Permission::Write),
            "owner" => Ok(Permission::Owner),
            other => Err(format!("unknown permission {other:?} (read, write, owner)")),
        }
    }
}

impl AccessKey {
    /// What this key may do in `bucket`.
    pub fn permission(&self, bucket: &str) -> Option<Permission> {
        let named = self.buckets.get(bucket).copied();
        let any = self.buckets.get("*").copied();
        named.max(any)
    }
}

/// A record with a format version.
/// Clone, Send, Sync and 'static: a frontend keeps the records it wrote and read by version
/// (`record_cache.rs`) and gives each change its own clone.
pub trait Record:
    Serialize + for<'de> Deserialize<'de> + Default + Clone + Send + Sync + 'static
{
    fn version(&self) -> u32;

    /// Whether this code reads format `v` of the record.
    fn knows(v: u32) -> bool {
        v == FORMAT
    }

    /// Decodes a stored record, refusing formats this code does not know.
    fn decode(bytes: &[u8]) -> Result<Self, S3Error> {
        decode_known(bytes)
    }

    fn encode(&self) -> bytes::Bytes {
        serde_json::to_vec(self)
            .expect("records are maps of strings and numbers")
            .into()
    }

    /// The record as `encode` writes it and `decode` would read it back (a frontend keeps
    /// what it wrote in this form, `record_cache.rs`).
    fn normalized(self) -> Self {
        self
    }

    /// The blob holding most of the record's names, when it has one (`leaf_base.rs`).
    fn base_blob(&self) -> Option<&str> {
        None
    }

    /// Bytes of JSON of the base whose names the record holds merged (0: none).
    fn base_bytes(&self) -> usize {
        0
    }

    /// About how many bytes its names take at most, when that is known without adding up
    /// every entry: its base's JSON and the entries changed since (`index_tree::split_of`).
    fn names_bytes_at_most(&self) -> Option<usize> {
        None
    }

    /// Whether the record is as decoded and its base still to be read (`resolve_base`).
    fn unresolved(&self) -> bool {
        false
    }

    /// Makes the record decoded from `doc` whole with its base's names (as `keep` keeps them).
    fn resolve_base(
        &mut self,
        _doc: &str,
        _base: &LeafBaseBlob,
        _keep: &Keep,
    ) -> Result<(), S3Error> {
        Ok(())
    }

    /// What its next write does with its base, with deltas of at most `bounds.0` bytes (0:
    /// none) and bases of at most `bounds.1`.
    fn base_plan(&self, _bounds: (usize, usize)) -> BasePlan {
        BasePlan::AsIs
    }

    /// Puts base `blob`, which the record had when read, on its garbage list unless it still
    /// names it (as base or garbage): a change that made a record anew leaks no base.
    fn remember_base(&mut self, _blob: &str, _after_ms: u64) {}

    /// Its names, for a new base blob made at `doc`.
    fn base_of(&self, _doc: &str) -> Option<LeafBaseBlob> {
        None
    }

    /// Takes `base` (the blob `base_of` made, now stored; `None`: no base) in place of its
    /// base, whose blob goes on its garbage list, to be tombstoned after `after_ms`.
    fn rebase(&mut self, _base: Option<LeafBase>, _after_ms: u64) {}
}

/// A stored record in a format this code knows.
fn decode_known<R: Record>(bytes: &[u8]) -> Result<R, S3Error> {
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(S3Error::Corrupt(format!("{} bytes", bytes.len())));
    }
    let record: R = serde_json::from_slice(bytes).map_err(|e| S3Error::Corrupt(e.to_string()))?;
    match record.version() {
        v if R::knows(v) => Ok(record),
        other => Err(S3Error::Corrupt(format!("unknown format version {other}"))),
    }
}

/// The names of an index record that holds them (a leaf, or the root of a small bucket) and
/// what of them a base blob holds (`leaf_base.rs`).
struct Names<'a> {
    objects: &'a mut Objects,
    base: &'a mut Option<LeafBase>,
    removed: &'a mut Vec<String>,
    garbage: &'a mut Vec<Garbage>,
}

impl Names<'_> {
    fn resolve(self, doc: &str, base: &LeafBaseBlob, keep: &Keep) -> Result<(), S3Error> {
        let Some(mine) = self.base.as_mut().filter(|b| b.objects.is_none()) else {
            return Ok(());
        };
        if base.leaf != doc {
            return Err(S3Error::Corrupt(format!(
                "{doc} names base blob {} of {}",
                mine.blob, base.leaf
            )));
        }
        let kept = crate::keep::kept_entries(&base.objects, keep);
        let mut names = kept.clone();
        for name in std::mem::take(self.removed) {
            names.remove(&name);
        }
        for (name, entry) in std::mem::take(self.objects) {
            if let Keep::One(wanted) = keep {
                if *wanted != name {
                    continue;
                }
            }
            names.insert(name, entry);
        }
        *self.objects = names;
        // Read only, and partly, when one name is kept: never written back (`keep.rs`).
        mine.objects = Some(kept);
        mine.bytes = base.bytes;
        Ok(())
    }

    fn remember(self, blob: &str, after_ms: u64) {
        let named = self.base.as_ref().is_some_and(|b| b.blob == blob);
        if !named && !self.garbage.iter().any(|g| g.blob() == blob) {
            self.garbage.push(Garbage::new(blob, after_ms));
        }
    }

    fn rebase(self, base: Option<LeafBase>, after_ms: u64) {
        if let Some(old) = std::mem::replace(self.base, base) {
            self.garbage.push(Garbage::new(old.blob, after_ms));
        }
    }
}

/// What the next write of a record holding `objects` does with its base `base`, with deltas
/// of at most `delta_bytes` and bases of at most `max_base` bytes.
fn plan_base(
    objects: &Objects,
    base: &Option<LeafBase>,
    (delta_bytes, max_base): (usize, usize),
) -> BasePlan {
    if base.as_ref().is_some_and(|b| b.objects.is_none()) {
        return BasePlan::AsIs;
    }
    let has_base = base.is_some();
    if delta_bytes == 0 || objects.is_empty() {
        return if has_base {
            BasePlan::Inline
        } else {
            BasePlan::AsIs
        };
    }
    if let Some(LeafBase {
        objects: Some(base),
        ..
    }) = base
    {
        if self::delta_bytes(base, objects) <= delta_bytes {
            return BasePlan::AsIs;
        }
    }
    let all = names_bytes(objects);
    let fits = all >= FOLD_FACTOR.saturating_mul(delta_bytes) && all <= max_base;
    match (fits, has_base) {
        (true, _) => BasePlan::Fold,
        (false, true) => BasePlan::Inline,
        (false, false) => BasePlan::AsIs,
    }
}

/// About how many bytes `objects` take in a record's JSON: names and entries.
pub fn names_bytes(objects: &Objects) -> usize {
    objects
        .iter()
        .map(|(name, entry)| name.len() + entry.approx_bytes() + 4)
        .sum()
}

/// The `Record` methods of a record that holds names, with `objects`, `base`, `removed` and
/// `garbage` fields and a `format()` (`what` names it in errors): written in the format its
/// fields call for, with a base read as the delta from it (as decoded, a delta not yet
/// resolved, as it was read); read back only in the format its fields call for, and with no
/// names removed from no base.
macro_rules! based_record_hooks {
    ($what:literal) => {
        fn decode(bytes: &[u8]) -> Result<Self, S3Error> {
            let record: Self = decode_known(bytes)?;
            let fields_agree = record.base.is_some() || record.removed.is_empty();
            match record.v == record.format() && fields_agree {
                true => Ok(record),
                false => Err(S3Error::Corrupt(format!(
                    "{} of format {} with the wrong fields",
                    $what, record.v
                ))),
            }
        }

        fn normalized(self) -> Self {
            Self {
                v: self.format(),
                ..self
            }
        }

        fn encode(&self) -> bytes::Bytes {
            self.stored_json()
                .expect("records are maps of strings and numbers")
                .into()
        }

        fn base_blob(&self) -> Option<&str> {
            self.base.as_ref().map(|base| base.blob.as_str())
        }

        fn unresolved(&self) -> bool {
            self.base
                .as_ref()
                .is_some_and(|base| base.objects.is_none())
        }

        fn base_bytes(&self) -> usize {
            self.base.as_ref().map_or(0, |base| base.bytes)
        }

        fn names_bytes_at_most(&self) -> Option<usize> {
            let base = self.base.as_ref().filter(|base| base.bytes > 0)?;
            let changed = delta_bytes(base.objects.as_ref()?, &self.objects);
            Some(base.bytes.saturating_add(changed))
        }

        fn resolve_base(
            &mut self,
            doc: &str,
            base: &LeafBaseBlob,
            keep: &Keep,
        ) -> Result<(), S3Error> {
            self.names().resolve(doc, base, keep)
        }

        fn base_plan(&self, bounds: (usize, usize)) -> BasePlan {
            plan_base(&self.objects, &self.base, bounds)
        }

        fn remember_base(&mut self, blob: &str, after_ms: u64) {
            self.names().remember(blob, after_ms);
        }

        fn base_of(&self, doc: &str) -> Option<LeafBaseBlob> {
            Some(LeafBaseBlob {
                v: FORMAT,
                leaf: doc.to_owned(),
                objects: self.objects.clone(),
                bytes: 0,
            })
        }

        fn rebase(&mut self, base: Option<LeafBase>, after_ms: u64) {
            self.names().rebase(base, after_ms);
            self.v = self.format();
        }
    };
}

/// The fields `Names` works on, of a record that holds names.
macro_rules! names_of {
    ($t:ty) => {
        impl $t {
            fn names(&mut self) -> Names<'_> {
                Names {
                    objects: &mut self.objects,
                    base: &mut self.base,
                    removed: &mut self.removed,
                    garbage: &mut self.garbage,
                }
            }

            /// The record as stored: with a base read, the delta from it.
            fn stored_json(&self) -> serde_json::Result<Vec<u8>> {
                match &self.base {
                    Some(LeafBase {
                        objects: Some(base),
                        ..
                    }) => {
                        let (objects, removed) = delta(base, &self.objects);
                        serde_json::to_vec(&Self {
                            v: self.format(),
                            objects,
                            removed,
                            ..self.clone()
                        })
                    }
                    _ if self.v == self.format() => serde_json::to_vec(self),
                    _ => serde_json::to_vec(&Self {
                        v: self.format(),
                        ..self.clone()
                    }),
                }
            }
        }
    };
}
names_of!(Leaf);
names_of!(BucketIndex);

macro_rules! record {
    ($($t:ty),*) => {$(
        impl Record for $t {
            fn version(&self) -> u32 {
                self.v
            }
        }
    )*};
}
record!(Catalog, KeyRing, Upload, UploadList, MergedLeaves);

impl Record for BucketIndex {
    fn version(&self) -> u32 {
        self.v
    }

    fn knows(v: u32) -> bool {
        v == FORMAT || v == FORMAT_SPLIT || v == FORMAT_BASED
    }

    // Written as format 1 while it is the bucket's only leaf (what code before the split
    // reads), as format 2 once anything of the split is in it, as format 3 with a base (the
    // delta from it, as a leaf's). Format 1 with the fields of a split or a base is no record
    // this code wrote: refused.
    based_record_hooks!("bucket index");
}

impl Record for Leaf {
    fn version(&self) -> u32 {
        self.v
    }

    fn knows(v: u32) -> bool {
        v == FORMAT_SPLIT || v == FORMAT_BASED || v == FORMAT_MERGING || v == FORMAT_MERGING_NAMES
    }

    // Format 2 without a base, 3 with one, 4 being merged, 5 being merged with its names (any
    // other pairing: refused).
    based_record_hooks!("index leaf");
}

/// A leaf keeps a base only once its names take this many times `[s3] index_delta_bytes`:
/// smaller, writing it whole costs little more than a delta, and a base blob is one more
/// write and one more read.
pub const FOLD_FACTOR: usize = 4;

impl Leaf {
    /// The format this leaf is written in.
    fn format(&self) -> u32 {
        match (&self.merging, &self.base) {
            (Some(merging), _) if merging.names => FORMAT_MERGING_NAMES,
            (Some(_), _) => FORMAT_MERGING,
            (None, Some(_)) => FORMAT_BASED,
            (None, None) => FORMAT_SPLIT,
        }
    }
}

impl Record for LeafBaseBlob {
    fn version(&self) -> u32 {
        self.v
    }

    fn decode(bytes: &[u8]) -> Result<Self, S3Error> {
        let base: LeafBaseBlob = decode_known(bytes)?;
        Ok(LeafBaseBlob {
            bytes: bytes.len(),
            ..base
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // Stored bytes are read back by every frontend: any bytes decode or fail, never panic.
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = BucketIndex::decode(&bytes);
            let _ = KeyRing::decode(&bytes);
        }

        #[test]
        fn an_index_round_trips(
            names in proptest::collection::btree_set("[a-z/]{1,12}", 0..8),
            public_read in proptest::option::of(any::<bool>()),
            // Any string, quotes, escapes and control characters included: entries' JSON is
            // made once and copied, so what is copied must be what the fields make.
            garbage in proptest::collection::vec((any::<String>(), any::<u64>()), 0..6),
            tags in proptest::collection::btree_map(any::<String>(), any::<String>(), 0..3),
        ) {
            let mut index = BucketIndex { v: FORMAT, tags: tags.clone(), ..Default::default() };
            index.garbage = garbage.into_iter().map(|(blob, after)| Garbage::new(blob, after)).collect();
            for name in names {
                index.objects.insert(name, Arc::new(ObjectEntry {
                    body: vec![Piece { blob: "b".into(), size: 1 }], size: 1, etag: "\"e\"".into(), modified_ms: 2,
                    content_type: None, meta: BTreeMap::new(), checksum: None,
                    headers: Default::default(), public_read, tags: tags.clone(),
                    json: Default::default(),
                }));
            }
            let first = index.encode();
            prop_assert_eq!(BucketIndex::decode(&first).unwrap(), index.clone());
            // Written again from the entries' kept JSON: the same bytes.
            prop_assert_eq!(index.encode(), first);
        }
    }

    /// Entries are written from their kept JSON in exactly the form the fields make (what
    /// records written before it was kept hold), and a changed clone is written as changed.
    #[test]
    fn kept_entry_json_is_the_entrys_own_form() {
        let entry = Arc::new(ObjectEntry {
            body: vec![Piece {
                blob: "b\"1".into(),
                size: 3,
            }],
            size: 3,
            etag: "e".into(),
            modified_ms: 7,
            ..Default::default()
        });
        let mut leaf = Leaf {
            v: FORMAT_SPLIT,
            low: "a".into(),
            ..Default::default()
        };
        leaf.objects.insert("k\u{e9}".into(), entry.clone());
        let expected = r#"{"v":2,"bucket_created_ms":0,"low":"a","objects":{"ké":{"body":[{"blob":"b\"1","size":3}],"size":3,"etag":"e","modified_ms":7}}}"#;
        assert_eq!(std::str::from_utf8(&leaf.encode()).unwrap(), expected);
        assert_eq!(entry.approx_bytes(), entry.json().get().len());
        let mut changed = Arc::unwrap_or_clone(entry.clone());
        changed.size = 4;
        assert!(changed.json.0.get().is_none(), "a clone keeps no JSON");
        leaf.objects.insert("k\u{e9}".into(), Arc::new(changed));
        assert!(std::str::from_utf8(&leaf.encode())
            .unwrap()
            .contains(r#""size":4,"#));
        // Moved out of the last record holding it, an entry keeps its JSON until told not to.
        let moved = Arc::into_inner(entry).expect("the last holder");
        assert!(moved.json.0.get().is_some());
        assert!(moved.without_json().json.0.get().is_none());
    }

    /// Garbage entries are written from their shared JSON in the form the fields make (what
    /// records written before it was shared hold); a copy hurried is written as hurried, and
    /// the entry it was copied from as it was.
    #[test]
    fn garbage_json_is_the_entrys_own_form_and_a_hurried_copy_its_own() {
        let held = Garbage::new("b\"1", 900);
        let mut leaf = Leaf {
            v: FORMAT_SPLIT,
            low: "a".into(),
            garbage: vec![held.clone(), Garbage::new("b2", 950)],
            ..Default::default()
        };
        let expected = r#"{"v":2,"bucket_created_ms":0,"low":"a","objects":{},"garbage":[{"blob":"b\"1","after_ms":900},{"blob":"b2","after_ms":950}]}"#;
        let first = leaf.encode();
        assert_eq!(std::str::from_utf8(&first).unwrap(), expected);
        assert_eq!(Leaf::decode(&first).unwrap(), leaf);
        // The copy in the leaf is the original, JSON and all...
        let copy = leaf.clone();
        assert!(Arc::ptr_eq(&held.0, &leaf.garbage[0].0));
        assert!(Arc::ptr_eq(&held.0, &copy.garbage[0].0));
        assert!(held.0.json.get().is_some());
        // ...and one made due sooner is written with its new time; the original is not.
        assert!(leaf.garbage[0].hurry_to(100));
        assert!(!leaf.garbage[0].hurry_to(500), "already due by then");
        assert!(std::str::from_utf8(&leaf.encode())
            .unwrap()
            .contains(r#"{"blob":"b\"1","after_ms":100}"#));
        assert_eq!(held.json().get(), r#"{"blob":"b\"1","after_ms":900}"#);
        assert_eq!(copy.garbage[0], held);
    }

    #[test]
    fn an_unknown_version_is_refused() {
        assert!(Catalog::decode(br#"{"v":2,"buckets":{}}"#).is_err());
        assert!(Catalog::decode(br#"{"v":1,"buckets":{}}"#).is_ok());
    }

    #[test]
    fn a_wildcard_grant_applies_to_every_bucket() {
        let mut key = AccessKey {
            secret: String::new(),
            created_ms: 0,
            buckets: BTreeMap::new(),
        };
        key.buckets.insert("*".into(), Permission::Read);
        key.buckets.insert("b".into(), Permission::Owner);
        assert_eq!(key.permission("a"), Some(Permission::Read));
        assert_eq!(key.permission("b"), Some(Permission::Owner));
    }
}
