//! A compaction pass reads only the sealed segments that may have something to reclaim
//! (`ledger.rs`): a store that did not change is not read again; a delete brings back the
//! segment that holds the deleted blob, and only it; an expiry brings back its segment when it
//! passes; a reopened store reads everything once (the notes start at open).

use bytes::Bytes;
use larder_store::*;

const BLOB: usize = 2 << 10;

fn opts() -> Options {
    Options {
        segment_size: 16 << 10,
        ..Options::default()
    }
}

fn put(store: &Store, key: &str, expires_ms: Option<u64>) {
    let meta = BlobMeta {
        props: Bytes::from_static(b"p"),
        time_ms: 10,
        expires_ms,
    };
    let body = Bytes::from(vec![7u8; BLOB]);
    let got = store.put_blob(key.as_bytes(), meta, &[body]).unwrap();
    assert_eq!(got, PutOutcome::Stored, "{key}");
}

fn compact(store: &Store, now_ms: u64) -> CompactReport {
    store
        .compact(&CompactOptions {
            min_garbage_ratio: 0.2,
            now_ms,
            seal_active: true,
            max_bytes_per_sec: 0,
            tombstone_horizon: None,
            tombstone_retention_ms: 1_000,
        })
        .unwrap()
}

fn reopen(dir: &std::path::Path) -> Store {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match Store::open(dir, opts()) {
            Err(Error::Unavailable(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return other.unwrap(),
        }
    }
}

#[test]
fn a_pass_reads_only_segments_that_changed_or_came_due() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    for i in 0..40 {
        put(&store, &format!("k{i:02}"), None);
    }
    let first = compact(&store, 100);
    assert!(first.bytes_read > 30 * BLOB as u64, "{first:?}");
    assert_eq!(first.segments_compacted, 0, "{first:?}");
    let sealed = first.segments_skipped + first.bytes_read.div_ceil(16 << 10);

    let again = compact(&store, 100);
    assert_eq!(
        again.bytes_read, 0,
        "nothing changed, nothing read: {again:?}"
    );
    assert!(again.segments_skipped >= 3, "{again:?}");
    assert_eq!(again.sealed_bytes, first.sealed_bytes, "reported as before");

    // Deletes of the first blobs: their segment, and only it, is read and rewritten.
    for i in 0..4 {
        store
            .delete_blob(format!("k{i:02}").as_bytes(), 20)
            .unwrap();
    }
    let after_deletes = compact(&store, 100);
    assert_eq!(after_deletes.segments_compacted, 1, "{after_deletes:?}");
    assert!(
        after_deletes.bytes_read <= 2 * (16 << 10),
        "the deletes' segment and the newly sealed one holding the tombstones: {after_deletes:?}"
    );
    assert_eq!(compact(&store, 100).bytes_read, 0);

    // An expiring blob: its segment comes back when the expiry passes, not before.
    put(&store, "short-lived", Some(5_000));
    let sealed_it = compact(&store, 100);
    assert!(
        sealed_it.bytes_read > 0,
        "a newly sealed segment is read once"
    );
    assert_eq!(compact(&store, 4_999).bytes_read, 0);
    let expired = compact(&store, 5_000);
    assert!(expired.bytes_read > 0, "{expired:?}");
    assert!(matches!(
        store.get_blob(b"short-lived", 0).unwrap(),
        BlobLookup::NotFound | BlobLookup::Expired { .. }
    ));

    drop(store);
    let store = reopen(dir.path());
    let reopened = compact(&store, 5_000);
    assert!(
        reopened.segments_skipped == 0 && reopened.bytes_read > 0,
        "a reopened store reads every segment once: {reopened:?} ({sealed} sealed before)"
    );
    assert_eq!(compact(&store, 5_000).bytes_read, 0);
}
