//! Object bodies stored but not yet named, held in the frontend's upload journal until their
//! name's link is settled, so that no crash or lost answer leaks them:
//!
//! - PutObject and CopyObject store the body under a journal entry held for the name
//!   (`object:<bucket>/<key>`), its IDs synced before anything is sent (`larder-router`'s
//!   `journal.rs`).
//! - The name linked: the entry goes. The link refused: the body is tombstoned, then the
//!   entry goes.
//! - The link's outcome unknown (sent to the primary, no answer), or the process died with the
//!   entry still there (found at the next start): settle it. First a fence, a write of the
//!   name's index record at its primary, after which no earlier write of that record based on
//!   an older state can apply (read-modify-writes there are conditional on the state they
//!   read). Then the name is read. If it points at the body, the entry goes; if not, the
//!   body is tombstoned and the entry goes. Until storage answers, it tries again.

use std::sync::Arc;
use std::time::Duration;

use larder_cluster::BlobId;
use larder_router::{JournalEntry, Leftover, Router};

use crate::blobs;
use crate::error::S3Error;
use crate::objects;
use crate::service::Larder;

/// Crash tests' hook: with `LARDER_S3_CRASH` set to `at` (`before-link`, `after-link`), the
/// process exits on the spot there, in the middle of a PutObject, running no destructor (as a
/// crash would leave things). Read once; unset, this costs one load.
pub fn crash_point(at: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if AT
        .get_or_init(|| std::env::var("LARDER_S3_CRASH").ok())
        .as_deref()
        == Some(at)
    {
        eprintln!("LARDER_S3_CRASH={at}: exiting in the middle of a PutObject");
        std::process::exit(101);
    }
}

/// What an entry is held for.
const OBJECT: &str = "object:";

/// The journal name of an object's body.
pub fn object_name(bucket: &str, key: &str) -> String {
    format!("{OBJECT}{bucket}/{key}")
}

fn parse_object_name(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix(OBJECT)?.split_once('/')
}

/// A journal entry a body was stored under, while its name's link is unsettled.
pub struct Held {
    entry: Option<JournalEntry>,
}

impl Held {
    pub fn new(entry: Option<JournalEntry>) -> Held {
        Held { entry }
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
    pub fn unknown(self, s3: &Larder, bucket: &str, key: &str) {
        let Some(entry) = self.entry else {
            tracing::warn!(
                bucket,
                key,
                "a name's link failed with no answer; its body is kept"
            );
            return;
        };
        let (s3, bucket, key) = (s3.clone(), bucket.to_owned(), key.to_owned());
        let ids = entry.ids();
        let entry = Some(entry);
        tokio::spawn(async move {
            settle(&s3, &bucket, &key, &ids).await;
            if let Some(entry) = entry {
                forget(&entry).await;
            }
        });
    }
}

async fn forget(entry: &JournalEntry) {
    if let Err(err) = entry.remove().await {
        tracing::warn!(%err, "cannot remove an S3 body's journal entry; the next start settles it");
    }
}

/// Settles the entries a previous run of this frontend left held (found at start-up).
pub async fn settle_leftovers(s3: Larder, leftovers: Vec<Leftover>) {
    for leftover in leftovers {
        let Some((bucket, key)) = leftover.held_for.as_deref().and_then(parse_object_name) else {
            tracing::warn!(file = %leftover.path.display(), "a held journal entry of an unknown kind stays");
            continue;
        };
        tracing::info!(
            bucket,
            key,
            blobs = leftover.ids.len(),
            "settling an S3 body a crash left unnamed or not"
        );
        settle(&s3, bucket, key, &leftover.ids).await;
        if let Err(err) = leftover.remove() {
            tracing::warn!(%err, "cannot remove a settled journal entry");
        }
    }
}

/// Until storage answers: fences the name's index record, reads the name, and tombstones `ids`
/// unless the name points at one of them.
async fn settle(s3: &Larder, bucket: &str, key: &str, ids: &[BlobId]) {
    let mut pause = Duration::from_millis(500);
    loop {
        match named(s3, bucket, key, ids).await {
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
            Err(err) => tracing::warn!(%err, bucket, key, "cannot settle an S3 body's name yet"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(30));
    }
}

/// Whether `key` points at one of `ids`, after a fence.
async fn named(s3: &Larder, bucket: &str, key: &str, ids: &[BlobId]) -> Result<bool, S3Error> {
    match objects::touch(s3, bucket, key).await {
        Err(S3Error::NoSuchBucket) => return Ok(false),
        other => other?,
    }
    let entry = match s3.current(bucket, key).await {
        Err(S3Error::NoSuchBucket) => return Ok(false),
        other => other?,
    };
    let ids: Vec<String> = ids.iter().map(BlobId::to_string).collect();
    Ok(entry.is_some_and(|e| e.body.iter().any(|piece| ids.contains(&piece.blob))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_name_round_trips_with_slashes_in_the_key() {
        let name = object_name("b", "dir/sub/file");
        assert_eq!(parse_object_name(&name), Some(("b", "dir/sub/file")));
        assert_eq!(parse_object_name("part:b/x"), None);
    }
}
