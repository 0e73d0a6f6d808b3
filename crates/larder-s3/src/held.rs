//! Object bodies stored but not yet named, held in the frontend's upload journal until their
//! name's link is settled, so that no crash or lost answer leaks them:
//!
//! - PutObject and CopyObject store the body under a journal entry held for the name
//!   (`object:<bucket>/<key>`), UploadPart under one held for the part
//!   (`part:<bucket>/<upload>/<number>`), its IDs synced before anything is sent
//!   (`larder-router`'s `journal.rs`). A body of one blob takes a *reserved* entry when one
//!   is ready (`larder-router`'s `reserve.rs`), whose ID was synced before the request came:
//!   then nothing is written at request time, and the body carries its held name in its
//!   metadata (`HELD_META`), which settles a crash's leftover (`settle_reserved`: the blob
//!   asked of every replica, then the name as below).
//! - The name linked: the entry goes. The link refused: the body is tombstoned, then the
//!   entry goes.
//! - CompleteMultipartUpload holds an entry for the completion
//!   (`complete:<bucket>/<upload>/<token>/<key>`, `complete-sent:` once its link may have been
//!   sent), written before the token goes into the upload's record; its only ID is the
//!   object's parts record (a composite of version 2), recorded before that is written.
//!   Settling it keeps the parts the object links and gives the upload back or gives its parts
//!   up, as `multipart::settle_completion` says, and tombstones the parts record alone unless
//!   the name points at it.
//! - The link's outcome unknown (sent to the primary, no answer), or the process died with the
//!   entry still there (found at the next start): settle it. First a fence, a write of the
//!   name's index record at its primary, after which no earlier write of that record based on
//!   an older state can apply (read-modify-writes there are conditional on the state they
//!   read). Then the name is read. If it points at the body, the entry goes; if not, the
//!   body is tombstoned and the entry goes. Until storage answers, it tries again.

use std::sync::Arc;
use std::time::Duration;

use larder_cluster::BlobId;
use larder_router::{Everywhere, JournalEntry, Leftover, Router};

use crate::blobs;
use crate::error::S3Error;
use crate::multipart;
use crate::objects;
use crate::records::{upload_doc, Upload};
use crate::service::Larder;
use crate::store::Change;

/// Crash tests' hook: with `LARDER_S3_CRASH` set to `at` (`before-link`, `after-link` of a
/// PutObject, `before-add-part` of an UploadPart, `after-complete-mark`,
/// `after-complete-parts-record`, `before-complete-link`, `after-complete-link`,
/// `after-complete-finish` of a CompleteMultipartUpload, `after-base-stored`, `after-base-write`
/// of a fold of an index leaf, `leaf_base.rs`), the process exits on the spot there, running
/// no destructor (as a crash would leave things); with `LARDER_S3_CRASH_SKIP=n`, only the
/// (n+1)th time it gets there. Read once; unset, one load.
pub fn crash_point(at: &str) {
    static AT: std::sync::OnceLock<Option<(String, u64)>> = std::sync::OnceLock::new();
    static PASSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let armed = AT.get_or_init(|| {
        let at = std::env::var("LARDER_S3_CRASH").ok()?;
        let skip = std::env::var("LARDER_S3_CRASH_SKIP").ok();
        Some((at, skip.and_then(|n| n.parse().ok()).unwrap_or(0)))
    });
    let Some((armed_at, skip)) = armed else {
        return;
    };
    if armed_at == at && PASSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= *skip {
        eprintln!("LARDER_S3_CRASH={at}: exiting in the middle of a request");
        std::process::exit(101);
    }
}

/// What a body's journal entry is held for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeldFor {
    /// The object `key` of `bucket` (PutObject, CopyObject).
    Object { bucket: String, key: String },
    /// Part `number` of multipart upload `upload` of `key` into `bucket` (UploadPart). `key`
    /// is `None` in entries written before it was recorded.
    Part {
        bucket: String,
        upload: String,
        number: u32,
        key: Option<String>,
    },
    /// The completion of multipart upload `upload` of `key` into `bucket` that wrote `token`
    /// into the upload's record (CompleteMultipartUpload; the upload's record names the parts,
    /// `multipart::settle_completion`; the entry lists only the object's parts record).
    Completion {
        bucket: String,
        upload: String,
        key: String,
        token: String,
        /// Its link may have been sent (written before it is; a refusal writes `false` again).
        sent: bool,
    },
    /// The base blob of index record `doc` (`leaf_base.rs`): a fold's new base until the
    /// record's write naming it is settled, or the base of a record being removed.
    Base { doc: String },
}

impl HeldFor {
    /// The name written into the journal entry.
    pub fn name(&self) -> String {
        match self {
            HeldFor::Object { bucket, key } => format!("object:{bucket}/{key}"),
            HeldFor::Part {
                bucket,
                upload,
                number,
                key: Some(key),
            } => format!("part:{bucket}/{upload}/{number}/{key}"),
            HeldFor::Part {
                bucket,
                upload,
                number,
                key: None,
            } => format!("part:{bucket}/{upload}/{number}"),
            HeldFor::Completion {
                bucket,
                upload,
                key,
                token,
                sent,
            } => {
                let kind = if *sent { "complete-sent" } else { "complete" };
                format!("{kind}:{bucket}/{upload}/{token}/{key}")
            }
            HeldFor::Base { doc } => format!("base:{doc}"),
        }
    }

    fn parse(name: &str) -> Option<HeldFor> {
        let completion = [("complete:", false), ("complete-sent:", true)]
            .into_iter()
            .find_map(|(kind, sent)| Some((name.strip_prefix(kind)?, sent)));
        if let Some((rest, sent)) = completion {
            let mut parts = rest.splitn(4, '/');
            let (bucket, upload) = (parts.next()?.to_owned(), parts.next()?.to_owned());
            let (token, key) = (parts.next()?.to_owned(), parts.next()?.to_owned());
            return Some(HeldFor::Completion {
                bucket,
                upload,
                key,
                token,
                sent,
            });
        }
        if let Some(doc) = name.strip_prefix("base:") {
            return Some(HeldFor::Base {
                doc: doc.to_owned(),
            });
        }
        if let Some(rest) = name.strip_prefix("object:") {
            let (bucket, key) = rest.split_once('/')?;
            let (bucket, key) = (bucket.to_owned(), key.to_owned());
            return Some(HeldFor::Object { bucket, key });
        }
        let mut parts = name.strip_prefix("part:")?.splitn(4, '/');
        let (bucket, upload) = (parts.next()?.to_owned(), parts.next()?.to_owned());
        let number = parts.next()?.parse().ok()?;
        Some(HeldFor::Part {
            bucket,
            upload,
            number,
            key: parts.next().map(str::to_owned),
        })
    }
}

/// A journal entry a body was stored under, while its name's link is unsettled.
pub struct Held {
    entry: Option<JournalEntry>,
}

impl Held {
    pub fn new(entry: Option<JournalEntry>) -> Held {
        Held { entry }
    }

    /// The entry, to be settled by its holder's own rule (`leaf_base.rs`).
    pub fn into_entry(self) -> Option<JournalEntry> {
        self.entry
    }

    /// The name points at the body: forget the entry (in the background; a crash before it
    /// goes only makes the next start find the name linked).
    pub fn linked(self) {
        if let Some(entry) = self.entry {
            tokio::spawn(async move { forget(&entry).await });
        }
    }

    /// Nothing points at the body `id` (`None`: its write failed): tombstone what the entry
    /// lists (without a journal, `id` and a composite's chunks), then forget the entry.
    pub fn unlinked(self, router: &Arc<Router>, id: Option<BlobId>) {
        let router = router.clone();
        let entry = self.entry;
        tokio::spawn(async move {
            let Some(entry) = entry else {
                if let Some(id) = id {
                    let _ = blobs::delete(&router, &id.to_string()).await;
                }
                return;
            };
            let failed = router
                .delete_chunks(entry.ids(), "S3 body never named")
                .await;
            if failed == 0 {
                forget(&entry).await;
            }
        });
    }

    /// The link's outcome is unknown: settle it in the background. Without a journal the
    /// body is kept (a name pointing at a tombstoned blob would answer 503 for good; a kept
    /// one only takes space).
    pub fn unknown(self, s3: &Larder, name: HeldFor) {
        let Some(entry) = self.entry else {
            tracing::warn!(
                ?name,
                "a name's link failed with no answer; its body is kept"
            );
            return;
        };
        let s3 = s3.clone();
        tokio::spawn(async move {
            settle(&s3, &name, &entry.ids()).await;
            forget(&entry).await;
        });
    }
}

async fn forget(entry: &JournalEntry) {
    if let Err(err) = entry.remove().await {
        tracing::warn!(%err, "cannot remove an S3 body's journal entry; the next start settles it");
    }
}

/// The user-metadata name under which a body stored under a reserved journal entry carries
/// what it is held for (hex of `HeldFor::name`: any key is text, not every key is a header).
pub const HELD_META: &str = "larder-held";

/// The metadata entry a body held for `name` under a reserved entry carries.
pub fn held_meta(name: &str) -> (String, String) {
    (HELD_META.to_owned(), blobs::hex(name.as_bytes()))
}

fn from_held_meta(props: &larder_proto::BlobProperties) -> Option<HeldFor> {
    let (_, hex) = props.user_meta.iter().find(|(n, _)| n == HELD_META)?;
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    HeldFor::parse(&String::from_utf8(bytes?).ok()?)
}

/// Settles the entries a previous run of this frontend left held or reserved (found at
/// start-up), each in a task of its own: one that cannot be settled yet holds up no other.
pub fn settle_leftovers(s3: Larder, leftovers: Vec<Leftover>) {
    for leftover in leftovers {
        let s3 = s3.clone();
        tokio::spawn(async move {
            if leftover.held_for.is_none() && leftover.reserved {
                settle_reserved(&s3, &leftover.ids).await;
                if let Err(err) = leftover.remove().await {
                    tracing::warn!(%err, "cannot remove a settled journal entry");
                }
                return;
            }
            let Some(name) = leftover.held_for.as_deref().and_then(HeldFor::parse) else {
                let entry = leftover.name();
                tracing::warn!(%entry, "a held journal entry of an unknown kind stays");
                return;
            };
            let blobs = leftover.ids.len();
            tracing::info!(
                ?name,
                blobs,
                "settling an S3 body a crash left, named or not"
            );
            settle(&s3, &name, &leftover.ids).await;
            if let Err(err) = leftover.remove().await {
                tracing::warn!(%err, "cannot remove a settled journal entry");
            }
        });
    }
}

/// A reserved entry's blobs, each asked of every replica of its partition: stored on any, its
/// metadata says what it was held for, and it is settled as a held entry's body (tombstoned,
/// on every replica, unless the name points at it); on none, or tombstoned, there is nothing
/// to settle. Nothing is tombstoned without that name check: a read that counts a quorum of
/// "not found" answers would rest on the quorum and map of today, not of the write's day.
/// Until every replica answers.
async fn settle_reserved(s3: &Larder, ids: &[BlobId]) {
    for id in ids {
        let mut pause = Duration::from_millis(500);
        loop {
            match s3.router().find_everywhere(id).await {
                Ok(Everywhere::Found(properties)) => match from_held_meta(&properties) {
                    Some(name) => {
                        tracing::info!(?name, "settling an S3 body a crash left, named or not");
                        settle(s3, &name, &[*id]).await;
                    }
                    // Not a body this layer stored: nothing is known of it, nothing is done.
                    None => tracing::warn!(%id, "a reserved blob carries no held name; kept"),
                },
                // Never sent (most reserved entries a crash leaves), or settled already.
                Ok(Everywhere::Nowhere | Everywhere::Gone) => {}
                Err(err) => {
                    tracing::warn!(%err, %id, "cannot settle a reserved S3 body yet");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(30));
                    continue;
                }
            }
            break;
        }
    }
}

/// Until storage answers: fences the record that would name the body, reads it, and
/// tombstones `ids` unless it names one of them.
async fn settle(s3: &Larder, name: &HeldFor, ids: &[BlobId]) {
    let mut pause = Duration::from_millis(500);
    loop {
        let named = match name {
            // A PutObject or CopyObject body is never a part: the entry's own pieces decide.
            HeldFor::Object { bucket, key } => object_named(s3, (bucket, key), ids, false).await,
            HeldFor::Part {
                bucket,
                upload,
                number,
                key,
            } => part_named(s3, (bucket, upload, key.as_deref()), *number, ids).await,
            HeldFor::Base { doc } => {
                let records_router = s3.records.records_router();
                crate::leaf_base::settle(records_router, s3.router(), doc, ids).await;
                return;
            }
            // Settled by the upload's record, whose parts it keeps or drops itself. The entry
            // lists the parts record(s) the completion wrote: those the name does not point at
            // are tombstoned, alone (their parts are not theirs to drop).
            HeldFor::Completion {
                bucket,
                upload,
                key,
                token,
                sent,
            } => {
                let completion = multipart::Completion {
                    bucket,
                    id: upload,
                    key,
                    token,
                };
                match multipart::settle_completion(s3, &completion, *sent).await {
                    // What the name's body is made of is not known for sure (the completion
                    // finished before this settlement, or the name's parts record is missing):
                    // nothing is tombstoned that might be it.
                    Ok(None) => return,
                    Ok(Some(body)) => {
                        let stray: Vec<BlobId> = ids
                            .iter()
                            .filter(|id| !body.contains(&id.to_string()))
                            .copied()
                            .collect();
                        let router = s3.router();
                        if router
                            .delete_chunks(stray, "S3 parts record never named")
                            .await
                            == 0
                        {
                            return;
                        }
                        // Tried again after a pause: settling again changes nothing settled.
                        Err(S3Error::Unavailable(
                            "tombstoning a parts record no name points at".into(),
                        ))
                    }
                    Err(err) => Err(err),
                }
            }
        };
        match named {
            Ok(true) => return,
            Ok(false) => {
                let failed = s3
                    .router()
                    .delete_chunks(ids.to_vec(), "S3 body never named")
                    .await;
                if failed == 0 {
                    return;
                }
            }
            Err(err) => tracing::warn!(%err, ?name, "cannot settle an S3 body's name yet"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(30));
    }
}

fn holds(pieces: impl IntoIterator<Item = String>, ids: &[BlobId]) -> bool {
    let ids: Vec<String> = ids.iter().map(BlobId::to_string).collect();
    pieces.into_iter().any(|blob| ids.contains(&blob))
}

/// Whether `key` points at one of `ids`, after a fence; with `through_parts`, also through the
/// parts record its entry names (a missing one keeps `ids`: they may be its parts).
async fn object_named(
    s3: &Larder,
    (bucket, key): (&str, &str),
    ids: &[BlobId],
    through_parts: bool,
) -> Result<bool, S3Error> {
    match objects::touch(s3, bucket, key).await {
        Err(S3Error::NoSuchBucket) => return Ok(false),
        other => other?,
    }
    let entry = match s3.current(bucket, key).await {
        Err(S3Error::NoSuchBucket) => return Ok(false),
        other => other?,
    };
    let Some(entry) = entry else {
        return Ok(false);
    };
    if !through_parts {
        return Ok(holds(entry.body.into_iter().map(|p| p.blob), ids));
    }
    // Through the parts record too: a part's blobs are held under the part's name.
    match blobs::body_blobs(s3.router(), &entry.body).await? {
        Some(blobs) => Ok(holds(blobs, ids)),
        None => Ok(true),
    }
}

/// Whether the upload lists one of `ids` as part `number`, after a fence (a write of the
/// upload's record as it is). An upload that is gone was completed or aborted, and no
/// Complete links a part after its upload's record goes (`multipart::complete` removes it only
/// once its link is settled): the part is kept only if the object's name points at it (after
/// a fence of the name). An entry of an older build names no key: its part is kept (a leak,
/// logged), as a Complete of that build could still be linking it.
async fn part_named(
    s3: &Larder,
    (bucket, upload, key): (&str, &str, Option<&str>),
    number: u32,
    ids: &[BlobId],
) -> Result<bool, S3Error> {
    let doc = upload_doc(bucket, upload);
    let found = s3
        .records
        .update(&doc, |record: Option<Upload>| match record {
            Some(record) => Ok((Change::Put(record.clone()), Some(record))),
            None => Ok((Change::Keep, None)),
        })
        .await?;
    let Some(record) = found else {
        let Some(key) = key else {
            tracing::warn!(
                bucket,
                upload,
                number,
                "a part whose upload is gone is kept"
            );
            return Ok(true);
        };
        return object_named(s3, (bucket, key), ids, true).await;
    };
    let part = record.parts.get(&number).map(|p| p.blob.clone());
    Ok(holds(part, ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_with_slashes_in_the_key() {
        let object = HeldFor::Object {
            bucket: "b".into(),
            key: "dir/sub/file".into(),
        };
        assert_eq!(HeldFor::parse(&object.name()), Some(object));
        let part = HeldFor::Part {
            bucket: "b".into(),
            upload: "U1".into(),
            number: 7,
            key: Some("dir/file".into()),
        };
        assert_eq!(HeldFor::parse(&part.name()), Some(part));
        let older = HeldFor::Part {
            bucket: "b".into(),
            upload: "U1".into(),
            number: 7,
            key: None,
        };
        assert_eq!(HeldFor::parse("part:b/U1/7"), Some(older));
        for sent in [false, true] {
            let completion = HeldFor::Completion {
                bucket: "b".into(),
                upload: "U1".into(),
                key: "dir/file".into(),
                token: "t0".into(),
                sent,
            };
            assert_eq!(HeldFor::parse(&completion.name()), Some(completion));
        }
        let base = HeldFor::Base {
            doc: "larder-s3:leaf:b:L1".into(),
        };
        assert_eq!(HeldFor::parse(&base.name()), Some(base));
        assert_eq!(HeldFor::parse("complete:b/U1/t0"), None);
        assert_eq!(HeldFor::parse("part:b/x"), None);
        assert_eq!(HeldFor::parse("other:b/x"), None);
    }

    fn props_with(meta: Vec<(String, String)>) -> larder_proto::BlobProperties {
        larder_proto::BlobProperties {
            user_meta: meta,
            ..Default::default()
        }
    }

    proptest::proptest! {
        /// Any key (line breaks, non-ASCII) goes through a body's metadata and its compact
        /// header form and comes back as what the body was held for.
        #[test]
        fn a_held_name_survives_the_blob_metadata(bucket in "[a-z0-9.-]{3,20}", key in "\\PC{1,60}") {
            let held = HeldFor::Object { bucket, key };
            let props = props_with(vec![held_meta(&held.name())]);
            let header = props.to_compact().expect("hex is a header value");
            let back = larder_proto::BlobProperties::from_compact(&header).unwrap();
            proptest::prop_assert_eq!(from_held_meta(&back), Some(held));
        }

        /// Metadata a store hands back is read without panicking, whatever it holds.
        #[test]
        fn any_held_metadata_is_read_without_panic(value in "\\PC{0,40}", other in "[a-f0-9]{0,40}") {
            let _ = from_held_meta(&props_with(vec![(HELD_META.into(), value)]));
            let _ = from_held_meta(&props_with(vec![(HELD_META.into(), other)]));
        }
    }

    #[test]
    fn a_body_without_the_held_name_says_nothing() {
        assert_eq!(from_held_meta(&props_with(Vec::new())), None);
        let odd = vec![(HELD_META.to_owned(), "6f6".to_owned())];
        assert_eq!(from_held_meta(&props_with(odd)), None);
    }
}
