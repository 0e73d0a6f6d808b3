//! Dropping tombstones (`FORMAT.md`, "Dropping tombstones"): only past the caller's horizon and
//! the retention, only once no older put of the key is left in the log, and never so that a
//! reopen (checkpoint or full replay) or the change feed brings deleted data back.

use bytes::Bytes;
use larder_store::*;

const RETENTION: u64 = 1_000;

fn opts() -> Options {
    Options {
        segment_size: 16 << 10,
        checkpoint_every_records: 5,
        ..Options::default()
    }
}

fn meta() -> BlobMeta {
    BlobMeta {
        props: Bytes::from_static(b"p"),
        time_ms: 10,
        expires_ms: None,
    }
}

fn put(store: &Store, key: &str, len: usize) {
    let body = Bytes::from(vec![key.len() as u8; len]);
    let got = store.put_blob(key.as_bytes(), meta(), &[body]).unwrap();
    assert_eq!(got, PutOutcome::Stored, "{key}");
}

fn compact(store: &Store, ratio: f64, horizon: Option<u64>, now_ms: u64) -> CompactReport {
    let opts = CompactOptions {
        min_garbage_ratio: ratio,
        now_ms,
        seal_active: true,
        max_bytes_per_sec: 0,
        tombstone_horizon: horizon,
        tombstone_retention_ms: RETENTION,
    };
    store.compact(&opts).unwrap()
}

/// Every change of the feed from the beginning that names `key`.
fn feed_of(store: &Store, key: &str) -> Vec<Change> {
    let all = store.changes(Cursor::START, usize::MAX).unwrap().changes;
    all.into_iter()
        .filter(|c| &c.key[..] == key.as_bytes())
        .collect()
}

fn seq_of(store: &Store, op: Op, key: &str) -> u64 {
    let found = feed_of(store, key).into_iter().find(|c| c.op == op);
    found.expect("in the feed").cursor.sequence
}

/// Reopens once the dropped store's threads have let go of the directory's lock.
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

fn is_deleted(store: &Store, key: &str) -> bool {
    matches!(
        store.get_blob(key.as_bytes(), 0).unwrap(),
        BlobLookup::Deleted { .. }
    )
}

fn is_absent(store: &Store, key: &str) -> bool {
    matches!(
        store.get_blob(key.as_bytes(), 0).unwrap(),
        BlobLookup::NotFound
    )
}

#[test]
fn a_tombstone_goes_only_past_the_horizon_and_the_retention_and_stays_gone() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    put(&store, "gone", 2000);
    put(&store, "kept", 2000);
    store.delete_blob(b"gone", 10).unwrap();
    let tomb = seq_of(&store, Op::DeleteBlob, "gone");
    let late = 10 + RETENTION;
    // Too young, not past the horizon, or no horizon (a peer's position unknown): kept.
    for (horizon, now) in [(Some(tomb), late - 1), (Some(tomb - 1), late), (None, late)] {
        let report = compact(&store, 0.0, horizon, now);
        assert_eq!(report.tombstones_dropped, 0, "{horizon:?} {now}");
        assert!(is_deleted(&store, "gone"));
    }
    assert_eq!(store.dropped_through(), 0);
    let report = compact(&store, 0.0, Some(tomb), late);
    assert_eq!(report.tombstones_dropped, 1, "{report:?}");
    // Gone from the index and from the log (the feed reads the log).
    assert!(is_absent(&store, "gone"));
    assert!(feed_of(&store, "gone").is_empty());
    assert_eq!(store.dropped_through(), tomb);
    // A crash (full replay: compaction removed the checkpoint) and a clean reopen (checkpoint).
    drop(store);
    let store = reopen(dir.path());
    assert!(is_absent(&store, "gone"), "after a crash");
    assert!(feed_of(&store, "gone").is_empty());
    assert_eq!(store.dropped_through(), tomb);
    store.close().unwrap();
    drop(store);
    let store = reopen(dir.path());
    assert!(is_absent(&store, "gone"), "from the checkpoint");
    assert_eq!(store.stats().live_keys, 1);
    // Sequences are never handed out twice, even though the newest records were dropped and a
    // full replay (no checkpoint: a crash during a later compaction) cannot see them.
    drop(store);
    std::fs::remove_file(dir.path().join("index.ckpt")).unwrap();
    let store = reopen(dir.path());
    put(&store, "after", 10);
    assert!(seq_of(&store, Op::PutBlob, "after") > tomb);
}

/// seg 1: put x, a live blob. seg 2: a live blob, x's tombstone, y's put and y's tombstone.
/// With a ratio only seg 2 passes, x's put stays in seg 1, so x's tombstone must stay too (a
/// replay without it would serve x again); y's put and tombstone go in the same rewrite.
#[test]
fn an_older_put_left_in_the_log_keeps_its_tombstone_until_it_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    put(&store, "x", 1000);
    put(&store, "live1", 12_000);
    put(&store, "live2", 4000);
    store.delete_blob(b"x", 10).unwrap();
    put(&store, "y", 10_000);
    store.delete_blob(b"y", 10).unwrap();
    assert!(store.stats().segments >= 2);
    let horizon = store.stats().durable_cursor.sequence;
    let report = compact(&store, 0.5, Some(horizon), 10 + RETENTION);
    assert_eq!(report.tombstones_dropped, 1, "only y's: {report:?}");
    assert!(is_absent(&store, "y"));
    assert!(is_deleted(&store, "x"));
    drop(store);
    let store = reopen(dir.path());
    assert!(is_deleted(&store, "x"), "x came back after a replay");
    assert!(is_absent(&store, "y"));
    // Any garbage at all: seg 1 goes first (x's put), then x's tombstone can go.
    let report = compact(&store, 0.0, Some(horizon), 10 + RETENTION);
    assert_eq!(report.tombstones_dropped, 1, "{report:?}");
    assert!(is_absent(&store, "x"));
    drop(store);
    let store = reopen(dir.path());
    assert!(is_absent(&store, "x") && is_absent(&store, "y"));
    assert_eq!(store.stats().live_keys, 2);
    assert!(feed_of(&store, "x").is_empty());
}

/// A replica rebuilt from scratch pulls the feed from the beginning: a deleted blob's put must
/// not be in it (before or after compaction), only its tombstone, until that is dropped.
#[test]
fn the_change_feed_from_the_beginning_hands_back_no_deleted_blob() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    put(&store, "a", 100);
    put(&store, "b", 100);
    store.delete_blob(b"a", 10).unwrap();
    let ops: Vec<Op> = feed_of(&store, "a").iter().map(|c| c.op).collect();
    assert_eq!(ops, [Op::DeleteBlob]);
    assert_eq!(feed_of(&store, "b").len(), 1);
    // Documents: only the newest version of a key, put or remove.
    store
        .put_doc(b"d", 1, 10, Bytes::from_static(b"{}"))
        .unwrap();
    store.remove_doc(b"d", 2, 10).unwrap();
    store
        .put_doc(b"d", 3, 10, Bytes::from_static(b"{}"))
        .unwrap();
    let versions: Vec<(Op, u64)> = feed_of(&store, "d")
        .iter()
        .map(|c| (c.op, c.version))
        .collect();
    assert_eq!(versions, [(Op::PutDoc, 3)]);
}

#[test]
fn a_document_remove_goes_only_with_every_older_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    for version in 1..=3 {
        let json = Bytes::from(vec![b' '; 3000]);
        store.put_doc(b"doc", version, 10, json).unwrap();
    }
    store.remove_doc(b"doc", 4, 10).unwrap();
    let horizon = store.stats().durable_cursor.sequence;
    // Not past the retention: the older versions go, the remove stays.
    let report = compact(&store, 0.0, Some(horizon), 10);
    assert_eq!(report.tombstones_dropped, 0);
    drop(store);
    let store = reopen(dir.path());
    assert!(matches!(
        store.get_doc(b"doc").unwrap(),
        DocLookup::Removed { version: 4, .. }
    ));
    let report = compact(&store, 0.0, Some(horizon), 10 + RETENTION);
    assert_eq!(report.tombstones_dropped, 1, "{report:?}");
    assert_eq!(store.get_doc(b"doc").unwrap(), DocLookup::NotFound);
    drop(store);
    let store = reopen(dir.path());
    assert_eq!(store.get_doc(b"doc").unwrap(), DocLookup::NotFound);
    assert!(feed_of(&store, "doc").is_empty());
}

/// The index stays bounded by live data: a segment whose droppable tombstones outnumber its
/// live records is rewritten even when their bytes are far below the garbage ratio.
#[test]
fn many_small_tombstones_next_to_live_data_are_dropped_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    put(&store, "big", 12_000);
    for i in 0..20 {
        // Deletes of IDs never written here (any client that may delete can make them).
        store
            .delete_blob(format!("never{i}").as_bytes(), 10)
            .unwrap();
    }
    assert_eq!(store.stats().segments, 1);
    let horizon = store.stats().durable_cursor.sequence;
    let report = compact(&store, 0.5, Some(horizon), 10 + RETENTION);
    assert_eq!(report.tombstones_dropped, 20, "{report:?}");
    assert!(is_absent(&store, "never7"));
    assert!(matches!(
        store.get_blob(b"big", 0).unwrap(),
        BlobLookup::Found(_)
    ));
}
