//! Unit tests that need crate internals: fault injection in the write path (a full disk).

use bytes::Bytes;

use crate::*;

fn meta() -> BlobMeta {
    BlobMeta {
        props: Bytes::from_static(b"p"),
        time_ms: 1,
        expires_ms: None,
    }
}

fn data(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8) ^ seed)
        .collect::<Vec<u8>>()
        .into()
}

fn read(store: &Store, key: &[u8]) -> Option<Vec<u8>> {
    let BlobLookup::Found(rec) = store.get_blob(key, 0).unwrap() else {
        return None;
    };
    let pieces: Result<Vec<Bytes>> = store.read_blob(&rec, 0..u64::MAX).unwrap().collect();
    Some(pieces.unwrap().concat())
}

fn segment_len(dir: &std::path::Path) -> u64 {
    std::fs::metadata(dir.join("seg-00000001.log"))
        .unwrap()
        .len()
}

#[test]
fn enospc_mid_record_leaves_no_partial_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    store.put_blob(b"before", meta(), &[data(1000, 1)]).unwrap();
    let len = segment_len(dir.path());
    for cut in [1, 51, 60, 70_000] {
        store.engine.fail.fail_next_write_after(cut);
        let res = store.put_blob(b"failed", meta(), &[data(50_000, 2), data(50_000, 3)]);
        assert!(
            matches!(res, Err(Error::OutOfSpace)),
            "cut at {cut}: {:?}",
            res.map(|_| ())
        );
        assert_eq!(
            segment_len(dir.path()),
            len,
            "partial record truncated away"
        );
        assert!(matches!(
            store.get_blob(b"failed", 0).unwrap(),
            BlobLookup::NotFound
        ));
    }
    // The store keeps working, and the retried put lands where the failed one was.
    assert_eq!(
        store.put_blob(b"failed", meta(), &[data(100, 4)]).unwrap(),
        PutOutcome::Stored
    );
    store.put_blob(b"after", meta(), &[data(100, 5)]).unwrap();
    drop(store);
    let store = Store::open(dir.path(), Options::default()).unwrap();
    assert_eq!(store.stats().corrupt_records_found, 0);
    assert_eq!(read(&store, b"before").unwrap(), data(1000, 1));
    assert_eq!(read(&store, b"failed").unwrap(), data(100, 4));
    assert_eq!(read(&store, b"after").unwrap(), data(100, 5));
}

#[test]
fn failed_truncate_makes_store_refuse_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    store.put_blob(b"kept", meta(), &[data(1000, 1)]).unwrap();
    store.engine.fail.fail_next_write_after(80);
    store.engine.fail.set_truncate_fails(true);
    assert!(matches!(
        store.put_blob(b"torn", meta(), &[data(5000, 2)]),
        Err(Error::OutOfSpace)
    ));
    assert!(matches!(
        store.put_blob(b"next", meta(), &[data(10, 3)]),
        Err(Error::Unavailable(_))
    ));
    assert!(matches!(
        store.delete_blob(b"kept", 5),
        Err(Error::Unavailable(_))
    ));
    assert_eq!(
        read(&store, b"kept").unwrap(),
        data(1000, 1),
        "reads keep working"
    );
    drop(store);
    // The half record is a torn tail to recovery: cut off, not reported, never served.
    let store = Store::open(dir.path(), Options::default()).unwrap();
    assert_eq!(store.stats().corrupt_records_found, 0);
    assert!(matches!(
        store.get_blob(b"torn", 0).unwrap(),
        BlobLookup::NotFound
    ));
    assert_eq!(read(&store, b"kept").unwrap(), data(1000, 1));
    assert_eq!(
        store.put_blob(b"next", meta(), &[data(10, 3)]).unwrap(),
        PutOutcome::Stored
    );
    assert_eq!(store.changes(Cursor::START, 10).unwrap().changes.len(), 2);
}

#[test]
fn enospc_on_segment_rotation_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        segment_size: 4096,
        ..Options::default()
    };
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    store.put_blob(b"a", meta(), &[data(3000, 1)]).unwrap();
    // Occupy the next segment's name so creating it fails, like a full directory would.
    std::fs::create_dir(dir.path().join("seg-00000002.log")).unwrap();
    assert!(store.put_blob(b"b", meta(), &[data(3000, 2)]).is_err());
    std::fs::remove_dir(dir.path().join("seg-00000002.log")).unwrap();
    assert_eq!(
        store.put_blob(b"b", meta(), &[data(3000, 2)]).unwrap(),
        PutOutcome::Stored
    );
    assert_eq!(store.stats().segments, 2);
    drop(store);
    let store = Store::open(dir.path(), opts).unwrap();
    assert_eq!(read(&store, b"b").unwrap(), data(3000, 2));
}

#[test]
fn a_failed_fdatasync_fails_every_writer_waiting_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    store.put_blob(b"kept", meta(), &[data(100, 1)]).unwrap();
    // A slow, failing sync: writers arriving meanwhile park behind it and must all hear of it.
    store
        .engine
        .fail
        .fail_syncs_after(std::time::Duration::from_millis(200));
    let writers: Vec<_> = (0..64u8)
        .map(|i| {
            let store = store.clone();
            std::thread::spawn(move || store.put_blob(&[b'k', i], meta(), &[data(100, i)]))
        })
        .collect();
    for (i, writer) in writers.into_iter().enumerate() {
        let res = writer.join().unwrap();
        assert!(
            matches!(res, Err(Error::Io(_) | Error::Unavailable(_))),
            "writer {i} was acknowledged after a failed sync: {:?}",
            res.map(|_| ())
        );
        assert!(matches!(
            store.get_blob(&[b'k', i as u8], 0).unwrap(),
            BlobLookup::NotFound
        ));
    }
    assert!(matches!(
        store.put_blob(b"after", meta(), &[data(10, 3)]),
        Err(Error::Unavailable(_))
    ));
    assert_eq!(read(&store, b"kept").unwrap(), data(100, 1));
}

#[test]
fn many_writers_are_each_woken_once_their_record_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let writers: Vec<_> = (0..256u32)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..20u32 {
                    let key = format!("w{t}-{i}");
                    let put = store.put_blob(key.as_bytes(), meta(), &[data(64, t as u8)]);
                    assert_eq!(put.unwrap(), PutOutcome::Stored);
                    // Acknowledged means published: readable at once.
                    assert_eq!(read(&store, key.as_bytes()).unwrap(), data(64, t as u8));
                }
            })
        })
        .collect();
    writers.into_iter().for_each(|w| w.join().unwrap());
    let stats = store.stats();
    assert_eq!(stats.records_appended, 256 * 20);
    assert!(stats.syncs < stats.records_appended / 4, "{stats:?}");
}

#[test]
fn a_failed_batch_write_loses_only_the_batched_records_and_the_log_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    store.put_blob(b"kept", meta(), &[data(100, 1)]).unwrap();
    let len = segment_len(dir.path());
    // A slow sync leads; small records arriving meanwhile are batched for the next round, whose
    // batch write then runs out of space half-way.
    store
        .engine
        .fail
        .slow_syncs(Some(std::time::Duration::from_millis(1000)));
    let leader = {
        let store = store.clone();
        std::thread::spawn(move || store.put_blob(b"leader", meta(), &[data(100, 2)]))
    };
    // The commit round has written the leader's batch and is in its slow sync.
    while store.stats().records_appended < 2 || segment_len(dir.path()) == len {
        std::thread::yield_now();
    }
    // No round starts while the test holds the disk's queue: the records pile up in one batch.
    let held = store.engine.disk.shared().queue.lock();
    let batched: Vec<_> = (0..32u8)
        .map(|i| {
            let store = store.clone();
            std::thread::spawn(move || store.put_blob(&[b'b', i], meta(), &[data(200, i)]))
        })
        .collect();
    while store.stats().records_appended < 34 {
        std::thread::yield_now();
    }
    store.engine.fail.fail_next_write_after(1000);
    drop(held);
    assert_eq!(leader.join().unwrap().unwrap(), PutOutcome::Stored);
    for (i, writer) in batched.into_iter().enumerate() {
        let res = writer.join().unwrap();
        assert!(
            matches!(res, Err(Error::OutOfSpace)),
            "batched writer {i}: {:?}",
            res.map(|_| ())
        );
    }
    store.engine.fail.slow_syncs(None);
    let leader_len = segment_len(dir.path());
    assert!(leader_len > len, "the leader's record was written");
    for i in 0..32u8 {
        assert!(matches!(
            store.get_blob(&[b'b', i], 0).unwrap(),
            BlobLookup::NotFound
        ));
    }
    // The log goes on where the lost batch began, and a retry of a lost key lands.
    assert_eq!(
        store.put_blob(&[b'b', 7], meta(), &[data(200, 7)]).unwrap(),
        PutOutcome::Stored
    );
    assert_eq!(read(&store, &[b'b', 7]).unwrap(), data(200, 7));
    drop(store);
    let store = Store::open(dir.path(), Options::default()).unwrap();
    assert_eq!(store.stats().corrupt_records_found, 0);
    assert_eq!(store.changes(Cursor::START, 100).unwrap().changes.len(), 3);
    assert_eq!(read(&store, b"leader").unwrap(), data(100, 2));
    assert_eq!(read(&store, &[b'b', 7]).unwrap(), data(200, 7));
}

#[test]
fn a_failed_journal_sync_fails_the_rounds_writers_and_every_store_on_the_disk_refuses_writes() {
    let root = tempfile::tempdir().unwrap();
    let disk = Disk::open(root.path(), DiskOptions::default()).unwrap();
    let a = Store::open_on(&disk, root.path().join("a"), Options::default()).unwrap();
    let b = Store::open_on(&disk, root.path().join("b"), Options::default()).unwrap();
    // Not written to in the failed round: it must refuse writes all the same.
    let c = Store::open_on(&disk, root.path().join("c"), Options::default()).unwrap();
    a.put_blob(b"kept", meta(), &[data(100, 1)]).unwrap();
    // The round's sync fails (slowly, so writers of both stores pile into it and the next one).
    disk.shared()
        .fail
        .fail_syncs_after(std::time::Duration::from_millis(200));
    let writers: Vec<_> = (0..32u8)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            std::thread::spawn(move || store.put_blob(&[b'k', i], meta(), &[data(100, i)]))
        })
        .collect();
    for (i, writer) in writers.into_iter().enumerate() {
        let res = writer.join().unwrap();
        assert!(
            matches!(res, Err(Error::Unavailable(_))),
            "writer {i} was acknowledged after a failed journal sync: {:?}",
            res.map(|_| ())
        );
    }
    for store in [&a, &b, &c] {
        assert!(matches!(
            store.put_blob(b"after", meta(), &[data(10, 3)]),
            Err(Error::Unavailable(_))
        ));
        assert!(matches!(
            store.delete_blob(b"kept", 5),
            Err(Error::Unavailable(_))
        ));
    }
    assert_eq!(
        read(&a, b"kept").unwrap(),
        data(100, 1),
        "reads keep working"
    );
    let why = disk
        .refusing_writes()
        .expect("the disk says it refuses writes");
    assert!(why.contains("fdatasync failed"), "{why}");
}

#[test]
fn a_round_synced_after_a_failed_one_is_not_acknowledged_either() {
    let root = tempfile::tempdir().unwrap();
    let disk = Disk::open(root.path(), DiskOptions::default()).unwrap();
    let a = Store::open_on(&disk, root.path().join("a"), Options::default()).unwrap();
    let b = Store::open_on(&disk, root.path().join("b"), Options::default()).unwrap();
    // The first round's sync fails late; the next round's sync, on the other sync thread,
    // succeeds before it. Its records sit after the failed round's in the journal and could not
    // be recovered without them: it must fail too.
    disk.shared()
        .fail
        .fail_next_sync_after(std::time::Duration::from_millis(400));
    let first = std::thread::spawn(move || a.put_blob(b"first", meta(), &[data(100, 1)]));
    std::thread::sleep(std::time::Duration::from_millis(100));
    let second = b.put_blob(b"second", meta(), &[data(100, 2)]);
    assert!(
        matches!(second, Err(Error::Unavailable(_))),
        "a round after a failed one was acknowledged: {:?}",
        second.map(|_| ())
    );
    assert!(matches!(first.join().unwrap(), Err(Error::Unavailable(_))));
    assert!(matches!(
        b.get_blob(b"second", 0).unwrap(),
        BlobLookup::NotFound
    ));
}

/// Reopens `dir` once the dropped store's commit thread has let go of its lock.
fn reopen(dir: &std::path::Path) -> Store {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match Store::open(dir, small()) {
            Err(Error::Unavailable(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return other.unwrap(),
        }
    }
}

fn compact_all(store: &Store) -> CompactReport {
    let opts = CompactOptions {
        min_garbage_ratio: 0.0,
        now_ms: 0,
        seal_active: true,
        max_bytes_per_sec: 0,
        tombstone_horizon: None,
        tombstone_retention_ms: 0,
    };
    store.compact(&opts).unwrap()
}

/// Writes 40 blobs over several small segments and deletes every other one; returns the
/// survivors' keys and data.
fn fill_and_delete(store: &Store) -> Vec<(Vec<u8>, Bytes)> {
    let mut kept = Vec::new();
    for i in 0..40u8 {
        let key = format!("b{i}").into_bytes();
        let body = data(3000 + i as usize * 100, i);
        store
            .put_blob(&key, meta(), std::slice::from_ref(&body))
            .unwrap();
        if i % 2 == 0 {
            store.delete_blob(&key, 2).unwrap();
        } else {
            kept.push((key, body));
        }
    }
    kept
}

fn check_survivors(store: &Store, kept: &[(Vec<u8>, Bytes)]) {
    for (key, body) in kept {
        assert_eq!(read(store, key).as_deref(), Some(&body[..]), "{key:?}");
    }
    for i in (0..40u8).step_by(2) {
        let key = format!("b{i}").into_bytes();
        assert!(
            matches!(store.get_blob(&key, 0).unwrap(), BlobLookup::Deleted { .. }),
            "deleted {i} came back"
        );
    }
    assert_eq!(store.stats().corrupt_records_found, 0);
}

fn small() -> Options {
    Options {
        segment_size: 16 << 10,
        checkpoint_every_records: 5,
        ..Options::default()
    }
}

/// A crash (the store dropped without closing) at each step of a segment's rewrite leaves a
/// store that opens with every survivor intact, every deleted blob still deleted and the same
/// change feed; the next pass finishes the job.
#[test]
fn compaction_crash_at_each_step_is_recovered() {
    for point in 1..=3u8 {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), small()).unwrap();
        let kept = fill_and_delete(&store);
        let feed_before: Vec<Change> = store.changes(Cursor::START, usize::MAX).unwrap().changes;
        store.engine.fail.stop_compaction_at(Some(point));
        let opts = CompactOptions {
            min_garbage_ratio: 0.0,
            now_ms: 0,
            seal_active: true,
            max_bytes_per_sec: 0,
            tombstone_horizon: None,
            tombstone_retention_ms: 0,
        };
        assert!(store.compact(&opts).is_err(), "point {point}");
        drop(store);
        let store = reopen(dir.path());
        check_survivors(&store, &kept);
        let feed: Vec<Change> = store.changes(Cursor::START, usize::MAX).unwrap().changes;
        // The crashed rewrite either did not happen or is complete: every survivor and every
        // tombstone is in the feed, in order, with its sequence number.
        let live =
            |c: &&Change| c.op == Op::DeleteBlob || kept.iter().any(|(k, _)| k[..] == c.key[..]);
        let want: Vec<&Change> = feed_before.iter().filter(live).collect();
        let got: Vec<&Change> = feed.iter().filter(live).collect();
        assert_eq!(got, want, "point {point}");
        let leftovers: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        let report = compact_all(&store);
        assert!(
            report.bytes_reclaimed > 0 || point >= 2,
            "point {point}: {report:?}"
        );
        check_survivors(&store, &kept);
        let feed: Vec<Change> = store.changes(Cursor::START, usize::MAX).unwrap().changes;
        assert_eq!(feed.iter().collect::<Vec<_>>(), want, "point {point}");
        drop(store);
        let store = reopen(dir.path());
        check_survivors(&store, &kept);
    }
}

/// Compaction gives the space back, keeps cursors valid, and a reader holding a location in a
/// rewritten segment still reads its bytes.
#[test]
fn compaction_reclaims_space_and_spares_readers_and_cursors() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small()).unwrap();
    let kept = fill_and_delete(&store);
    let (key, body) = &kept[0];
    let BlobLookup::Found(held) = store.get_blob(key, 0).unwrap() else {
        panic!("survivor not found")
    };
    let feed = store.changes(Cursor::START, usize::MAX).unwrap().changes;
    // A cursor just before a deleted blob's put (the feed no longer shows that put, but the
    // record is in the log until compacted; it was written right before its tombstone): after
    // compaction it resumes at the next surviving record.
    let deleted_put = feed
        .iter()
        .position(|c| c.op == Op::DeleteBlob && &c.key[..] == b"b10")
        .unwrap();
    let cursor = Cursor {
        sequence: feed[deleted_put].cursor.sequence - 2,
        ..feed[deleted_put].cursor
    };
    let before = store.stats().bytes_on_disk;
    let report = compact_all(&store);
    assert!(report.segments_compacted > 0);
    let after = store.stats().bytes_on_disk;
    // (Sealing the active segment started a new one: one more header.)
    let header = 32;
    assert_eq!(
        before + header - after,
        report.bytes_reclaimed,
        "{report:?}"
    );
    let deleted_bytes: u64 = (0..40u64).step_by(2).map(|i| 3000 + i * 100).sum();
    assert!(report.bytes_reclaimed >= deleted_bytes, "{report:?}");
    let pieces: Result<Vec<Bytes>> = store.read_blob(&held, 0..u64::MAX).unwrap().collect();
    assert_eq!(
        pieces.unwrap().concat(),
        body[..],
        "the held location still reads"
    );
    check_survivors(&store, &kept);
    let page = store.changes(cursor, 1).unwrap().changes;
    let next_surviving = feed[deleted_put..]
        .iter()
        .find(|c| c.op != Op::PutBlob || kept.iter().any(|(k, _)| k[..] == c.key[..]))
        .unwrap();
    assert_eq!(&page[0], next_surviving);
    // Nothing is left to reclaim.
    assert_eq!(compact_all(&store).segments_compacted, 0);
}

/// A segment big enough to be given back in steps (`release.rs`) is cut down only once the
/// last reader holding a location in it is done: until then that reader reads it whole.
#[test]
fn a_replaced_segment_is_cut_down_only_after_its_last_reader() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        segment_size: 32 << 20,
        ..Options::default()
    };
    let store = std::sync::Arc::new(Store::open(dir.path(), opts).unwrap());
    let body = |i: u8| Bytes::from(vec![i; 1 << 20]);
    for i in 0..12u8 {
        let key = format!("b{i}").into_bytes();
        store.put_blob(&key, meta(), &[body(i)]).unwrap();
        if i % 3 != 0 {
            store.delete_blob(&key, 20).unwrap();
        }
    }
    let BlobLookup::Found(held) = store.get_blob(b"b0", 0).unwrap() else {
        panic!("survivor not found")
    };
    let old_len = held.location.file.metadata().unwrap().len();
    assert!(old_len > 8 << 20, "{old_len}");
    let watch = held.location.file.try_clone().unwrap();
    let pass = {
        let store = store.clone();
        std::thread::spawn(move || compact_all(&store))
    };
    // The rewrite is done long before this; the pass now waits for `held`.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(
        watch.metadata().unwrap().len(),
        old_len,
        "cut under a reader"
    );
    let pieces: Result<Vec<Bytes>> = store.read_blob(&held, 0..u64::MAX).unwrap().collect();
    assert_eq!(pieces.unwrap().concat(), body(0)[..]);
    drop(held);
    let report = pass.join().unwrap();
    assert!(report.segments_compacted > 0, "{report:?}");
    assert!(
        watch.metadata().unwrap().len() < old_len,
        "the replaced segment was given back once its reader was done"
    );
    for i in (0..12u8).step_by(3) {
        assert_eq!(
            read(&store, format!("b{i}").as_bytes()).unwrap(),
            body(i)[..]
        );
    }
}

/// A record whose data fails its checksum is dropped and reported, never copied forward with a
/// fresh head that would make it look valid.
#[test]
fn compaction_drops_a_corrupt_record_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small()).unwrap();
    let kept = fill_and_delete(&store);
    let (key, _) = &kept[0];
    let BlobLookup::Found(rec) = store.get_blob(key, 0).unwrap() else {
        panic!("survivor not found")
    };
    let path = dir
        .path()
        .join(crate::segment::segment_name(rec.location.segment));
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let head = crate::format::head_len(key.len(), rec.meta.props.len(), rec.size);
    use std::os::unix::fs::FileExt;
    file.write_all_at(b"\xff\xfe", rec.location.offset + head + 10)
        .unwrap();
    let report = compact_all(&store);
    assert_eq!(report.corrupt_records_dropped, 1, "{report:?}");
    assert!(matches!(
        store.get_blob(key, 0).unwrap(),
        BlobLookup::NotFound
    ));
    check_survivors(&store, &kept[1..]);
    drop(store);
    let store = reopen(dir.path());
    assert!(matches!(
        store.get_blob(key, 0).unwrap(),
        BlobLookup::NotFound
    ));
    check_survivors(&store, &kept[1..]);
}

/// Writers and deleters keep going while compaction passes run (two at once, too): every
/// acknowledged write reads back, every delete holds, before and after a reopen.
#[test]
fn compaction_runs_alongside_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small()).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let compactors: Vec<_> = (0..2)
        .map(|_| {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut passes = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    compact_all(&store);
                    passes += 1;
                }
                passes
            })
        })
        .collect();
    let mut kept = Vec::new();
    for i in 0..300u32 {
        let key = format!("w{i}").into_bytes();
        let body = data(500 + (i as usize % 7) * 900, i as u8);
        store
            .put_blob(&key, meta(), std::slice::from_ref(&body))
            .unwrap();
        if i % 3 == 0 {
            store.delete_blob(&key, 2).unwrap();
        } else {
            kept.push((key, body));
        }
        if i % 50 == 0 {
            for (key, body) in &kept {
                assert_eq!(read(&store, key).as_deref(), Some(&body[..]));
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in compactors {
        assert!(c.join().unwrap() > 0);
    }
    let verify = |store: &Store| {
        for (key, body) in &kept {
            assert_eq!(read(store, key).as_deref(), Some(&body[..]), "{key:?}");
        }
        for i in (0..300u32).step_by(3) {
            let key = format!("w{i}").into_bytes();
            assert!(matches!(
                store.get_blob(&key, 0).unwrap(),
                BlobLookup::Deleted { .. }
            ));
        }
        assert_eq!(store.stats().corrupt_records_found, 0);
        let puts = store
            .changes(Cursor::START, usize::MAX)
            .unwrap()
            .changes
            .iter()
            .filter(|c| c.op == Op::PutBlob)
            .count();
        assert!(puts >= kept.len());
    };
    verify(&store);
    drop(store);
    let store = reopen(dir.path());
    verify(&store);
}

/// A log of `records` small blobs in one segment, appended in bulk batches.
fn long_log(records: u32) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    for first in (0..records).step_by(10_000) {
        let batch = (first..records.min(first + 10_000))
            .map(|i| BulkRecord::PutBlob {
                key: format!("k{i:07}").into_bytes().into(),
                meta: meta(),
                data: Bytes::from_static(b"sixteen bytes!!!"),
            })
            .collect();
        store.bulk(batch).unwrap();
    }
    (dir, store)
}

fn feed_bytes_read(store: &Store) -> u64 {
    (store.engine.counters.feed_read).load(std::sync::atomic::Ordering::Relaxed)
}

/// Pages of 256 (as an export reads) through the whole feed with `next_page`; `between` runs
/// after each page. Returns how many changes were seen.
fn page_through(mut next_page: impl FnMut() -> ChangeBatch, mut between: impl FnMut(u64)) -> u64 {
    let (mut pages, mut seen) = (0u64, 0u64);
    loop {
        let batch = next_page();
        seen += batch.changes.len() as u64;
        pages += 1;
        if batch.changes.len() < 256 {
            return seen;
        }
        between(pages);
    }
}

/// A reader paging through the whole feed with the `next` it got (a replica catching up) reads
/// each byte of the log a bounded number of times: each page starts at its hint and reads about
/// what it needs, not a whole scanner window past it (1 MiB a page: 45 times this log).
#[test]
fn paging_through_the_feed_reads_the_log_about_once() {
    const RECORDS: u32 = 200_000;
    let (_dir, store) = long_log(RECORDS);
    let log = store.stats().bytes_on_disk;
    let mut cursor = Cursor::START;
    let seen = page_through(
        || {
            let batch = store.changes(cursor, 256).unwrap();
            cursor = batch.next;
            batch
        },
        |_| {},
    );
    assert_eq!(seen, u64::from(RECORDS));
    let read = feed_bytes_read(&store);
    assert!(read <= 2 * log, "{read} bytes read for a log of {log}");
}

/// Pulls of `readers` readers, each at its own place after `first` (replicas pulling as writes
/// land): each pull leaves a new hint. Returns the bytes they read.
fn pull_near_the_tail(store: &Store, first: u64, readers: u64) -> u64 {
    let before = feed_bytes_read(store);
    for i in 0..readers {
        let at = Cursor {
            incarnation: store.incarnation(),
            sequence: first + i,
        };
        store.changes(at, 1).unwrap();
    }
    feed_bytes_read(store) - before
}

/// An export (`Store::feed`) keeps its exact place between pages while other readers fill the
/// shared hints: before, once 256 hints were ahead of it, its own hint was forgotten as soon
/// as it was made and every page scanned from the segment's start, a quadratic pass.
#[test]
fn an_export_reads_the_log_about_once_whatever_other_readers_do() {
    const RECORDS: u32 = 200_000;
    let (_dir, store) = long_log(RECORDS);
    let log = store.stats().bytes_on_disk;
    let mut reader = store.feed(Cursor::START);
    let mut others_read = 0;
    let seen = page_through(
        || reader.next_page(256).unwrap(),
        |page| {
            if page % 50 == 0 {
                let first = u64::from(RECORDS) - 10_000 + page * 6;
                others_read += pull_near_the_tail(&store, first, 300);
            }
        },
    );
    assert_eq!(seen, u64::from(RECORDS));
    let read = feed_bytes_read(&store) - others_read;
    assert!(read <= 2 * log, "{read} bytes read for a log of {log}");
}

/// A replica far behind, pulling with the `next` it got, keeps its hint while others pull at
/// the tail (fewer than the hints kept between two of its pulls): the least recently used hint
/// is forgotten first, not the smallest sequence (the reader behind).
#[test]
fn a_reader_behind_keeps_its_hint_while_others_pull_at_the_tail() {
    const RECORDS: u32 = 200_000;
    let (_dir, store) = long_log(RECORDS);
    let log = store.stats().bytes_on_disk;
    let mut cursor = Cursor::START;
    let mut others_read = 0;
    let seen = page_through(
        || {
            let batch = store.changes(cursor, 256).unwrap();
            cursor = batch.next;
            batch
        },
        |page| {
            if page % 10 == 0 {
                let first = u64::from(RECORDS) - 10_000 + page * 10;
                others_read += pull_near_the_tail(&store, first, 100);
            }
        },
    );
    assert_eq!(seen, u64::from(RECORDS));
    let read = feed_bytes_read(&store) - others_read;
    assert!(read <= 2 * log, "{read} bytes read for a log of {log}");
}

/// A feed reader whose place is in a segment compaction then rewrote (shorter: what was before
/// its place moved down) goes on with exactly the changes after its cursor: a place is used
/// only in the segment generation it was found in.
#[test]
fn a_feed_reader_resumes_right_after_compaction_rewrote_its_segment() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small()).unwrap();
    for i in 0..40u32 {
        let key = format!("c{i:02}").into_bytes();
        store
            .put_blob(&key, meta(), &[data(1000, i as u8)])
            .unwrap();
    }
    let mut reader = store.feed(Cursor::START);
    assert_eq!(reader.next_page(20).unwrap().changes.len(), 20);
    for i in (0..20u32).step_by(2) {
        store.delete_blob(format!("c{i:02}").as_bytes(), 2).unwrap();
    }
    assert!(compact_all(&store).segments_compacted > 0);
    let want = store.changes(reader.cursor(), usize::MAX).unwrap();
    let got = reader.next_page(usize::MAX).unwrap();
    assert_eq!(got.changes, want.changes);
    assert_eq!(got.next, want.next);
    assert!(got.changes.iter().any(|c| c.key[..] == b"c20"[..]));
}

/// The journal files of the disk at `root`, with their lengths.
fn journal_files(root: &std::path::Path) -> Vec<(String, u64)> {
    let mut files: Vec<(String, u64)> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".jnl"))
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, e.metadata().unwrap().len())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn a_failed_journal_append_is_synced_through_the_segments_and_the_disk_keeps_writing() {
    let root = tempfile::tempdir().unwrap();
    let disk = Disk::open(root.path(), DiskOptions::default()).unwrap();
    let a = Store::open_on(&disk, root.path().join("a"), Options::default()).unwrap();
    a.put_blob(b"before", meta(), &[data(100, 1)]).unwrap();
    let journal_before = journal_files(root.path());
    let stats_before = disk.stats();
    // The disk fills mid-append: 10 bytes of the frame land, then ENOSPC.
    disk.shared().fail.fail_next_write_after(10);
    a.put_blob(b"during", meta(), &[data(100, 2)])
        .expect("a full journal must not fail a write whose segment bytes are in place");
    let stats = disk.stats();
    assert_eq!(stats.unjournaled_rounds, 1, "{stats:?}");
    assert!(
        stats.segment_syncs > stats_before.segment_syncs,
        "the round was acknowledged without syncing its segment: {stats:?}"
    );
    assert_eq!(
        journal_files(root.path()),
        journal_before,
        "the failed append's bytes were left in the journal"
    );
    // Not stuck: the next round goes through the journal again.
    a.put_blob(b"after", meta(), &[data(100, 3)]).unwrap();
    a.delete_blob(b"before", 5).unwrap();
    assert_eq!(disk.stats().unjournaled_rounds, 1);
    assert_eq!(disk.refusing_writes(), None);
    assert!(journal_files(root.path())[0].1 > journal_before[0].1);
    drop(a);
    drop(disk);
    let disk = Disk::open(root.path(), DiskOptions::default()).unwrap();
    let a = Store::open_on(&disk, root.path().join("a"), Options::default()).unwrap();
    assert_eq!(read(&a, b"during").unwrap(), data(100, 2));
    assert_eq!(read(&a, b"after").unwrap(), data(100, 3));
    assert_eq!(read(&a, b"before"), None);
    assert_eq!(a.stats().corrupt_records_found, 0);
}

#[test]
fn a_journal_that_cannot_rotate_for_want_of_space_is_emptied_in_place() {
    let root = tempfile::tempdir().unwrap();
    let opts = DiskOptions {
        journal_file_size: 4096,
        ..DiskOptions::default()
    };
    let disk = Disk::open(root.path(), opts.clone()).unwrap();
    let a = Store::open_on(&disk, root.path().join("a"), Options::default()).unwrap();
    disk.shared().fail.set_journal_create_fails(true);
    for i in 0..40u8 {
        a.put_blob(&[b'k', i], meta(), &[data(1000, i)]).unwrap();
    }
    let files = journal_files(root.path());
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].1 < 4096 + 2048, "never emptied: {files:?}");
    assert_eq!(disk.stats().unjournaled_rounds, 0);
    // Space is back: rotation starts new files again.
    disk.shared().fail.set_journal_create_fails(false);
    for i in 40..60u8 {
        a.put_blob(&[b'k', i], meta(), &[data(1000, i)]).unwrap();
    }
    assert_ne!(journal_files(root.path())[0].0, files[0].0);
    drop(a);
    drop(disk);
    let disk = Disk::open(root.path(), opts).unwrap();
    let a = Store::open_on(&disk, root.path().join("a"), Options::default()).unwrap();
    for i in 0..60u8 {
        assert_eq!(read(&a, &[b'k', i]).unwrap(), data(1000, i), "record {i}");
    }
}

/// Journal files of 4 KiB, and a store on the disk whose retirements of full journal files take
/// 300 ms and then fail or not; the store is written until its journal rotates. Returns the
/// keys written.
fn rotate_with_slow_retirement(root: &std::path::Path, then_fail: bool) -> (Disk, Store, Vec<u8>) {
    let opts = DiskOptions {
        journal_file_size: 4096,
        ..DiskOptions::default()
    };
    let disk = Disk::open(root, opts).unwrap();
    let a = Store::open_on(&disk, root.join("a"), Options::default()).unwrap();
    let delay = std::time::Duration::from_millis(300);
    disk.shared().fail.delay_retirements(Some(delay), then_fail);
    let mut written = Vec::new();
    for i in 0..40u8 {
        a.put_blob(&[b'k', i], meta(), &[data(1000, i)]).unwrap();
        written.push(i);
        if journal_files(root).len() > 1 {
            break; // rotated when full: the old file is being retired
        }
    }
    assert!(journal_files(root).len() > 1, "never rotated");
    (disk, a, written)
}

#[test]
fn a_failed_retirement_of_a_full_journal_file_keeps_it_and_fails_the_disk_and_rotations() {
    let root = tempfile::tempdir().unwrap();
    // Retirements fail, 300 ms after they start: the disk still writes meanwhile.
    let (disk, a, acknowledged) = rotate_with_slow_retirement(root.path(), true);
    // A rotation asked for now waits for that retirement, and must not report success.
    assert!(
        disk.rotate_journal().is_err(),
        "a rotation reported success"
    );
    assert!(disk.refusing_writes().is_some(), "the disk kept writing");
    assert!(a.put_blob(b"after", meta(), &[data(10, 1)]).is_err());
    assert!(
        journal_files(root.path()).len() > 1,
        "the unretired file is gone"
    );
    drop(a);
    drop(disk);
    // Everything acknowledged comes back: the kept file is replayed with the newer one.
    let disk = Disk::open(root.path(), DiskOptions::default()).unwrap();
    let a = Store::open_on(&disk, root.path().join("a"), Options::default()).unwrap();
    for i in acknowledged {
        assert_eq!(read(&a, &[b'k', i]).unwrap(), data(1000, i), "record {i}");
    }
}

/// A replica rebuilt in place needs `Disk::rotate_journal` to leave no journal file with the
/// old store's frames: one rotated out when full and still being retired included.
#[test]
fn an_explicit_rotation_waits_for_the_retirement_of_the_file_before() {
    let root = tempfile::tempdir().unwrap();
    let (disk, _a, _) = rotate_with_slow_retirement(root.path(), false);
    disk.rotate_journal().unwrap();
    let files = journal_files(root.path());
    assert_eq!(files.len(), 1, "a file was left behind: {files:?}");
    assert!(disk.refusing_writes().is_none());
}

/// Group commit under load (`DiskOptions::min_round_interval`): a round waits out the interval
/// after the one before it, and the writes that come meanwhile share it.
#[test]
fn a_round_waits_out_the_interval_and_gathers_the_writes_that_come_meanwhile() {
    let root = tempfile::tempdir().unwrap();
    let interval = std::time::Duration::from_millis(400);
    let opts = DiskOptions {
        min_round_interval: interval,
        ..DiskOptions::default()
    };
    let disk = Disk::open(root.path(), opts).unwrap();
    let a = Store::open_on(&disk, root.path().join("a"), Options::default()).unwrap();
    let b = Store::open_on(&disk, root.path().join("b"), Options::default()).unwrap();
    let started = std::time::Instant::now();
    a.put_blob(b"first", meta(), &[data(10, 1)]).unwrap();
    let rounds = disk.stats().rounds;
    let to_a = a.begin_put_blob(b"second", meta(), &[data(10, 2)]);
    let to_b = b.begin_put_blob(b"third", meta(), &[data(10, 3)]);
    to_a.wait().unwrap();
    to_b.wait().unwrap();
    assert!(started.elapsed() >= interval, "the next round did not wait");
    assert_eq!(
        disk.stats().rounds,
        rounds + 1,
        "both writes share one round"
    );
}

/// Pages of `path` in the page cache, from `mincore` over a mapping of the whole file.
fn cached_pages(path: &std::path::Path) -> usize {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    let page = 4096;
    let mut resident = vec![0u8; len.div_ceil(page)];
    // SAFETY: a read-only shared mapping of a file that stays open, unmapped before returning;
    // `resident` has one byte per page of it, as `mincore` needs.
    unsafe {
        let at = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        assert_ne!(at, libc::MAP_FAILED);
        assert_eq!(libc::mincore(at, len, resident.as_mut_ptr()), 0);
        libc::munmap(at, len);
    }
    resident.iter().filter(|&&b| b & 1 == 1).count()
}

/// Three records of 2 MiB after a small one, on a disk with `window` bytes of large records
/// kept cached: the pages of the segment in the page cache once at most `most` (waiting up to
/// 10 s: they are dropped just after the writers hear back), or at once without a bound.
/// Every record reads back whole.
fn cached_after_large_puts(uncache: Option<u64>, window: u64, most: Option<usize>) -> usize {
    let root = tempfile::tempdir().unwrap();
    let disk_opts = DiskOptions {
        uncache_after_recent: window,
        ..DiskOptions::default()
    };
    let disk = Disk::open(root.path(), disk_opts).unwrap();
    let opts = Options {
        uncache_synced_from: uncache,
        ..Options::default()
    };
    let dir = root.path().join("s");
    let store = Store::open_on(&disk, &dir, opts).unwrap();
    store.put_blob(b"small", meta(), &[data(100, 1)]).unwrap();
    for (i, key) in [b"a", b"b", b"c"].iter().enumerate() {
        let record = data(2 << 20, 7 + i as u8);
        store
            .put_blob(*key, meta(), std::slice::from_ref(&record))
            .unwrap();
    }
    let segment = dir.join("seg-00000001.log");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut cached = cached_pages(&segment);
    while most.is_some_and(|most| cached > most) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
        cached = cached_pages(&segment);
    }
    for (i, key) in [b"a", b"b", b"c"].iter().enumerate() {
        assert_eq!(read(&store, *key).unwrap(), data(2 << 20, 7 + i as u8));
    }
    assert_eq!(read(&store, b"small").unwrap(), data(100, 1));
    cached
}

#[test]
fn large_records_leave_the_page_cache_once_synced_past_a_window_of_recent_ones() {
    // 512 pages per record; the few around each that it shares with its neighbours may stay.
    let dropped_at_once = cached_after_large_puts(Some(1 << 20), 0, Some(4));
    assert!(dropped_at_once <= 4, "{dropped_at_once}");
    // A window of 3 MiB keeps the last record only.
    let last_kept = cached_after_large_puts(Some(1 << 20), 3 << 20, Some(512 + 4));
    assert!((510..=512 + 4).contains(&last_kept), "{last_kept}");
    let all_kept = cached_after_large_puts(None, 0, None);
    assert!(all_kept >= 3 * 510, "{all_kept}");
}

fn drop_from_page_cache(path: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: advice on an open descriptor.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
}

/// Whether this file system opens files with `O_DIRECT` (tmpfs before Linux 6.6 does not).
fn takes_o_direct(path: &std::path::Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .is_ok()
}

/// A large record the page cache no longer holds is read past it (`cold.rs`), and checked
/// block by block like any read: it reads back whole and in ranges, nothing of it comes back
/// into the page cache, and a byte changed on the disk fails its checksum.
#[test]
fn large_records_out_of_the_page_cache_are_read_past_it_and_still_checked() {
    let root = tempfile::tempdir().unwrap();
    let opts = Options {
        read_chunk_size: 1 << 20,
        ..Options::default()
    };
    let store = Store::open(root.path(), opts).unwrap();
    let record = data((3 << 20) + 777, 9);
    store
        .put_blob(b"big", meta(), std::slice::from_ref(&record))
        .unwrap();
    let segment = root.path().join("seg-00000001.log");
    drop_from_page_cache(&segment);
    assert_eq!(read(&store, b"big").unwrap(), record);
    let BlobLookup::Found(rec) = store.get_blob(b"big", 0).unwrap() else {
        panic!("stored");
    };
    let range = (1 << 20) + 5..(3 << 20) + 700;
    let pieces: Result<Vec<Bytes>> = store.read_blob(&rec, range.clone()).unwrap().collect();
    let want = &record[range.start as usize..range.end as usize];
    assert_eq!(pieces.unwrap().concat(), want);
    let stats = store.stats();
    if takes_o_direct(&segment) {
        assert!(
            stats.large_read_bytes_direct >= 2 * record.len() as u64 - (1 << 20),
            "{stats:?}"
        );
        // The record's head is read through the cache (a page or two); its data is not.
        let cached = cached_pages(&segment);
        assert!(cached <= 4, "{cached} pages cached");
    } else {
        eprintln!("no O_DIRECT on this file system: every read went through the page cache");
    }
    // Read while cached: from the page cache.
    let before = stats.large_read_bytes_cached;
    let _ = std::fs::read(&segment).unwrap();
    assert_eq!(read(&store, b"big").unwrap(), record);
    assert!(store.stats().large_read_bytes_cached >= before + record.len() as u64);

    // One byte changed in the middle of the data, on the disk only.
    let bytes = std::fs::read(&segment).unwrap();
    let start = bytes
        .windows(64)
        .position(|w| w == &record[..64])
        .expect("the record's data is in its segment");
    let at = start + (2 << 20) + 3;
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&segment)
            .unwrap();
        file.write_all_at(&[bytes[at] ^ 0xff], at as u64).unwrap();
        file.sync_data().unwrap();
    }
    drop_from_page_cache(&segment);
    let pieces: Vec<Result<Bytes>> = store.read_blob(&rec, 0..u64::MAX).unwrap().collect();
    assert!(
        pieces
            .iter()
            .any(|p| matches!(p, Err(Error::Corrupt { .. }))),
        "a changed byte read past the page cache must fail its checksum"
    );
}
