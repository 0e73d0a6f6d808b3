//! What compaction tells its operator and how it treats foreground work: a pass reports the
//! garbage it measured in the sealed segments it left alone, and a rewrite gives way while its
//! `Foreground` is busy (without stopping for good).

use bytes::Bytes;
use larder_store::*;

fn opts(foreground: Option<Foreground>) -> Options {
    Options {
        segment_size: 64 << 10,
        compaction_yields_to: foreground,
        ..Options::default()
    }
}

fn meta() -> BlobMeta {
    BlobMeta {
        props: Bytes::new(),
        time_ms: 1,
        expires_ms: None,
    }
}

fn compact(store: &Store, min_garbage_ratio: f64) -> CompactReport {
    store
        .compact(&CompactOptions {
            min_garbage_ratio,
            now_ms: 0,
            seal_active: true,
            max_bytes_per_sec: 0,
            tombstone_horizon: None,
            tombstone_retention_ms: 0,
        })
        .unwrap()
}

/// `count` blobs of `size` bytes named `<prefix><i>`; every other one deleted.
fn half_deleted(store: &Store, prefix: &str, count: usize, size: usize) {
    for i in 0..count {
        let key = format!("{prefix}{i}");
        let data = Bytes::from(vec![i as u8; size]);
        store.put_blob(key.as_bytes(), meta(), &[data]).unwrap();
    }
    for i in (0..count).step_by(2) {
        store
            .delete_blob(format!("{prefix}{i}").as_bytes(), 2)
            .unwrap();
    }
}

#[test]
fn a_pass_reports_the_garbage_it_left_in_sealed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts(None)).unwrap();
    half_deleted(&store, "k", 40, 10_000);
    // Nothing is that garbage-ridden: every segment is measured and left alone.
    let measured = compact(&store, 0.99);
    assert_eq!(measured.segments_compacted, 0, "{measured:?}");
    let ratio = measured.garbage_bytes as f64 / measured.sealed_bytes as f64;
    assert!(
        measured.sealed_bytes >= 400_000 && (0.4..0.6).contains(&ratio),
        "{measured:?}"
    );
    let compacted = compact(&store, 0.0);
    assert!(compacted.segments_compacted > 0, "{compacted:?}");
    assert_eq!(compacted.garbage_bytes, 0, "{compacted:?}");
    assert!(
        compacted.sealed_bytes >= 200_000 && compacted.sealed_bytes < 260_000,
        "the live half: {compacted:?}"
    );
    assert_eq!(
        compacted.bytes_reclaimed, measured.garbage_bytes,
        "{measured:?} {compacted:?}"
    );
}

#[test]
fn a_rewrite_yields_while_the_foreground_is_busy_and_still_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let foreground = Foreground::new(0);
    let store = Store::open(dir.path(), opts(Some(foreground.clone()))).unwrap();
    half_deleted(&store, "a", 400, 1000);
    let idle = compact(&store, 0.0);
    assert!(idle.segments_compacted > 0, "{idle:?}");
    assert_eq!(
        foreground.yielded(),
        std::time::Duration::ZERO,
        "nothing was busy"
    );

    half_deleted(&store, "b", 400, 1000);
    let busy = foreground.enter();
    assert!(foreground.is_busy());
    let report = compact(&store, 0.0);
    drop(busy);
    assert!(
        report.segments_compacted > 0,
        "finishes under load: {report:?}"
    );
    assert!(
        foreground.yielded() > std::time::Duration::ZERO,
        "a busy foreground was given way to"
    );
    assert_eq!(foreground.in_flight(), 0);
}
