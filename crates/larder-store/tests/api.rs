//! The public API end to end: every operation, outcomes, persistence across reopen.

use std::sync::Arc;

use bytes::Bytes;
use larder_store::*;

fn meta(time_ms: u64, expires_ms: Option<u64>) -> BlobMeta {
    BlobMeta {
        props: Bytes::from_static(b"ct=text/plain"),
        time_ms,
        expires_ms,
    }
}

fn small_opts() -> Options {
    Options {
        segment_size: 64 << 10,
        read_chunk_size: 10_000,
        ..Options::default()
    }
}

fn content(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn read_all(store: &Store, key: &[u8], range: std::ops::Range<u64>) -> Vec<u8> {
    let BlobLookup::Found(rec) = store.get_blob(key, 0).unwrap() else {
        panic!("not found")
    };
    let mut out = Vec::new();
    for piece in store.read_blob(&rec, range).unwrap() {
        let piece = piece.unwrap();
        assert!(
            piece.len() <= 10_000,
            "pieces are bounded by read_chunk_size"
        );
        out.extend_from_slice(&piece);
    }
    out
}

#[test]
fn blob_put_get_read_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let data = content(300_000, 1);
    let chunks = [
        Bytes::copy_from_slice(&data[..5]),
        Bytes::copy_from_slice(&data[5..70_000]),
        Bytes::copy_from_slice(&data[70_000..]),
    ];
    assert_eq!(
        store.put_blob(b"a", meta(5, None), &chunks).unwrap(),
        PutOutcome::Stored
    );
    let BlobLookup::Found(rec) = store.get_blob(b"a", 0).unwrap() else {
        panic!()
    };
    assert_eq!((rec.size, rec.meta.clone()), (300_000, meta(5, None)));
    assert_eq!(read_all(&store, b"a", 0..u64::MAX), data);
    for (s, e) in [
        (0, 1),
        (65_535, 65_537),
        (131_072, 200_000),
        (299_999, 300_000),
        (10, 10),
        (400_000, 500_000),
    ] {
        let want = &data[(s as usize).min(data.len())..(e as usize).min(data.len())];
        assert_eq!(read_all(&store, b"a", s..e), want, "range {s}..{e}");
    }
    assert_eq!(
        store.put_blob(b"a", meta(6, None), &[]).unwrap(),
        PutOutcome::AlreadyExists
    );
    assert!(matches!(
        store.get_blob(b"missing", 0).unwrap(),
        BlobLookup::NotFound
    ));
    assert_eq!(
        store.put_blob(b"empty", meta(6, None), &[]).unwrap(),
        PutOutcome::Stored
    );
    assert_eq!(read_all(&store, b"empty", 0..10), b"");
}

#[test]
fn tombstones_win_in_either_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    store
        .put_blob(b"k", meta(1, None), &[Bytes::from_static(b"x")])
        .unwrap();
    assert_eq!(store.delete_blob(b"k", 9).unwrap(), DeleteOutcome::Deleted);
    assert_eq!(
        store.delete_blob(b"k", 10).unwrap(),
        DeleteOutcome::AlreadyDeleted
    );
    assert!(matches!(
        store.get_blob(b"k", 0).unwrap(),
        BlobLookup::Deleted { time_ms: 9 }
    ));
    assert_eq!(
        store.delete_blob(b"never", 3).unwrap(),
        DeleteOutcome::Deleted
    );
    let before = store.stats().records_appended;
    assert_eq!(
        store
            .put_blob(b"never", meta(4, None), &[Bytes::from_static(b"y")])
            .unwrap(),
        PutOutcome::Deleted
    );
    assert_eq!(
        store.stats().records_appended,
        before,
        "a refused put writes nothing"
    );
    drop(store);
    let store = Store::open(dir.path(), small_opts()).unwrap();
    assert!(matches!(
        store.get_blob(b"never", 0).unwrap(),
        BlobLookup::Deleted { time_ms: 3 }
    ));
    assert!(matches!(
        store.get_blob(b"k", 0).unwrap(),
        BlobLookup::Deleted { time_ms: 9 }
    ));
}

#[test]
fn ttl_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    store
        .put_blob(b"t", meta(1, Some(1000)), &[Bytes::from_static(b"x")])
        .unwrap();
    assert!(matches!(
        store.get_blob(b"t", 999).unwrap(),
        BlobLookup::Found(_)
    ));
    assert!(matches!(
        store.get_blob(b"t", 1000).unwrap(),
        BlobLookup::Expired(_)
    ));
    assert!(matches!(
        store.get_blob(b"t", 5000).unwrap(),
        BlobLookup::Expired(_)
    ));
}

#[test]
fn documents_last_writer_wins() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let j = |s: &'static str| Bytes::from_static(s.as_bytes());
    assert_eq!(
        store.put_doc(b"d", 2, 10, j("{\"v\":2}")).unwrap(),
        DocOutcome::Applied
    );
    assert_eq!(
        store.put_doc(b"d", 2, 11, j("{}")).unwrap(),
        DocOutcome::Stale { current: 2 }
    );
    assert_eq!(
        store.put_doc(b"d", 1, 11, j("{}")).unwrap(),
        DocOutcome::Stale { current: 2 }
    );
    assert_eq!(
        store.get_doc(b"d").unwrap(),
        DocLookup::Found {
            version: 2,
            time_ms: 10,
            json: j("{\"v\":2}")
        }
    );
    assert_eq!(
        store.remove_doc(b"d", 2, 12).unwrap(),
        DocOutcome::Stale { current: 2 }
    );
    assert_eq!(store.remove_doc(b"d", 3, 12).unwrap(), DocOutcome::Applied);
    assert_eq!(
        store.get_doc(b"d").unwrap(),
        DocLookup::Removed {
            version: 3,
            time_ms: 12
        }
    );
    assert_eq!(
        store.put_doc(b"d", 3, 13, j("{}")).unwrap(),
        DocOutcome::Stale { current: 3 }
    );
    assert_eq!(
        store.put_doc(b"d", 4, 13, j("{\"v\":4}")).unwrap(),
        DocOutcome::Applied
    );
    assert_eq!(
        store.remove_doc(b"gone", 7, 1).unwrap(),
        DocOutcome::Applied
    );
    assert_eq!(
        store.put_doc(b"gone", 6, 1, j("{}")).unwrap(),
        DocOutcome::Stale { current: 7 }
    );
    store.put_doc(b"e", 1, 1, j("{}")).unwrap();
    let mut seen = Vec::new();
    store.for_each_doc(&mut |k, v| {
        seen.push((k.to_vec(), v));
        true
    });
    seen.sort();
    assert_eq!(seen, vec![(b"d".to_vec(), 4), (b"e".to_vec(), 1)]);
    let mut calls = 0;
    store.for_each_doc(&mut |_, _| {
        calls += 1;
        false
    });
    assert_eq!(calls, 1);
    store.close().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    assert_eq!(
        store.get_doc(b"d").unwrap(),
        DocLookup::Found {
            version: 4,
            time_ms: 13,
            json: j("{\"v\":4}")
        }
    );
    assert_eq!(
        store.get_doc(b"gone").unwrap(),
        DocLookup::Removed {
            version: 7,
            time_ms: 1
        }
    );
    assert_eq!(store.get_doc(b"nope").unwrap(), DocLookup::NotFound);
    assert_eq!(store.stats().live_keys, 2);
}

#[test]
fn change_feed_pages_in_log_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let mut want = Vec::new();
    for i in 0..40u32 {
        let key = format!("k{i}");
        match i % 4 {
            0 | 1 => {
                store
                    .put_blob(
                        key.as_bytes(),
                        meta(i as u64, Some(99)),
                        &[Bytes::from(content(5000, i as u8))],
                    )
                    .unwrap();
                want.push((Op::PutBlob, key, 5000, 0));
            }
            2 => {
                store.delete_blob(key.as_bytes(), i as u64).unwrap();
                want.push((Op::DeleteBlob, key, 0, 0));
            }
            _ => {
                store
                    .put_doc(key.as_bytes(), 5, i as u64, Bytes::from_static(b"{}"))
                    .unwrap();
                want.push((Op::PutDoc, key, 2, 5));
            }
        }
    }
    assert!(store.stats().segments > 1, "small segments rotate");
    let mut got = Vec::new();
    let mut cursor = Cursor::START;
    loop {
        let batch = store.changes(cursor, 7).unwrap();
        assert!(batch.changes.len() <= 7);
        if batch.changes.is_empty() {
            assert_eq!(batch.next, cursor);
            break;
        }
        for c in &batch.changes {
            assert!(c.cursor > cursor);
            cursor = c.cursor;
            got.push((
                c.op,
                String::from_utf8(c.key.to_vec()).unwrap(),
                c.size,
                c.version,
            ));
        }
        assert_eq!(batch.next, cursor);
        let round_trip: Cursor = cursor.to_string().parse().unwrap();
        assert_eq!(round_trip, cursor);
    }
    assert_eq!(got, want);
    assert_eq!(store.stats().durable_cursor, cursor);
    assert_eq!(store.durable_cursor(), cursor);
    // At the head the idle page is the page `changes` answers; before it there is none.
    assert_eq!(
        store.idle_page(cursor),
        Some(store.changes(cursor, 7).unwrap())
    );
    let before = Cursor {
        sequence: cursor.sequence - 1,
        ..cursor
    };
    assert_eq!(store.idle_page(before), None);
    assert_eq!(store.idle_page(Cursor::START), None);
    drop(store);
    // Cursors stay valid across a reopen.
    let store = Store::open(dir.path(), small_opts()).unwrap();
    assert!(store.changes(cursor, 10).unwrap().changes.is_empty());
    store
        .put_doc(b"late", 1, 1, Bytes::from_static(b"{}"))
        .unwrap();
    assert_eq!(
        store.idle_page(cursor),
        None,
        "a change follows the cursor now"
    );
    let after = store.changes(cursor, 10).unwrap();
    assert_eq!(after.changes.len(), 1);
    assert_eq!(&after.changes[0].key[..], b"late");
    assert_eq!(store.changes(Cursor::START, 0).unwrap().changes.len(), 0);
}

#[test]
fn persistence_with_and_without_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        checkpoint_every_records: 25,
        ..small_opts()
    };
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    for i in 0..100u32 {
        let key = format!("key-{i}");
        store
            .put_blob(
                key.as_bytes(),
                meta(i as u64, None),
                &[Bytes::from(content(i as usize * 37, i as u8))],
            )
            .unwrap();
    }
    store.close().unwrap();
    assert!(dir.path().join("index.ckpt").exists());
    assert!(matches!(
        store.put_blob(b"after-close", meta(0, None), &[]),
        Err(Error::Unavailable(_))
    ));
    assert_eq!(
        read_all(&store, b"key-3", 0..1000),
        content(3 * 37, 3),
        "reads work after close"
    );
    for with_checkpoint in [true, false] {
        if !with_checkpoint {
            std::fs::remove_file(dir.path().join("index.ckpt")).unwrap();
        }
        let store = Store::open(dir.path(), opts.clone()).unwrap();
        for i in 0..100u32 {
            assert_eq!(
                read_all(&store, format!("key-{i}").as_bytes(), 0..u64::MAX),
                content(i as usize * 37, i as u8)
            );
        }
        assert_eq!(store.stats().live_keys, 100);
        assert_eq!(store.stats().corrupt_records_found, 0);
        drop(store);
    }
}

#[test]
fn rejects_bad_keys_and_large_records() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        Options {
            max_record_size: 1000,
            ..small_opts()
        },
    )
    .unwrap();
    assert!(matches!(
        store.put_blob(b"", meta(0, None), &[]),
        Err(Error::BadKey(_))
    ));
    assert!(matches!(
        store.get_blob(&[b'x'; MAX_KEY_LEN + 1], 0),
        Err(Error::BadKey(_))
    ));
    assert!(matches!(store.delete_blob(b"", 0), Err(Error::BadKey(_))));
    assert!(matches!(
        store.put_doc(b"", 1, 0, Bytes::new()),
        Err(Error::BadKey(_))
    ));
    assert_eq!(
        store
            .put_blob(&[b'x'; MAX_KEY_LEN], meta(0, None), &[])
            .unwrap(),
        PutOutcome::Stored
    );
    let big = [Bytes::from(vec![0u8; 600]), Bytes::from(vec![0u8; 401])];
    assert!(matches!(
        store.put_blob(b"big", meta(0, None), &big),
        Err(Error::TooLarge {
            size: 1001,
            limit: 1000
        })
    ));
    assert!(matches!(
        store.put_doc(b"big", 1, 0, Bytes::from(vec![0u8; 1001])),
        Err(Error::TooLarge { .. })
    ));
}

#[test]
fn concurrent_writers_share_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..20 {
                    let key = format!("t{t}-{i}");
                    let data = Arc::new(content(2000, t as u8));
                    store
                        .put_blob(key.as_bytes(), meta(0, None), &[Bytes::from(data.to_vec())])
                        .unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let stats = store.stats();
    assert_eq!(stats.records_appended, 320);
    assert!(
        stats.syncs < 320,
        "group commit: {} syncs for 320 records",
        stats.syncs
    );
    assert_eq!(stats.live_keys, 320);
    assert_eq!(read_all(&store, b"t5-7", 0..u64::MAX), content(2000, 5));
}

#[test]
fn relaxed_mode_and_unsupported_version() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        durability: Durability::RelaxedNoSyncForBenchmarks,
        ..small_opts()
    };
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    store
        .put_blob(b"r", meta(0, None), &[Bytes::from_static(b"relaxed")])
        .unwrap();
    assert_eq!(store.stats().syncs, 0);
    assert_eq!(read_all(&store, b"r", 0..100), b"relaxed");
    store.close().unwrap();
    // A well-formed header from a future version must be refused clearly.
    let path = dir.path().join("seg-00000001.log");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[6] = 9;
    let crc = crc32c_of(&bytes[..28]);
    bytes[28..32].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    match Store::open(dir.path(), opts) {
        Err(Error::UnsupportedVersion {
            found: 9,
            supported: 2,
            ..
        }) => {}
        other => panic!("expected UnsupportedVersion, got {:?}", other.map(|_| ())),
    }
}

/// Format version 1 (physical cursors, no sequence numbers) is refused with a clear error naming
/// the segment, never scanned as corruption or silently given new positions.
#[test]
fn version_1_directories_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    // A version 1 segment as that format wrote it: 16-byte header, CRC of 0..12 at 12.
    let mut v1 = Vec::new();
    v1.extend_from_slice(b"LARDER");
    v1.push(1);
    v1.push(b'S');
    v1.extend_from_slice(&1u32.to_le_bytes());
    let crc = crc32c_of(&v1[..12]);
    v1.extend_from_slice(&crc.to_le_bytes());
    v1.extend_from_slice(b"LRec\x01\x01");
    std::fs::write(dir.path().join("seg-00000001.log"), &v1).unwrap();
    match Store::open(dir.path(), small_opts()) {
        Err(
            e @ Error::UnsupportedVersion {
                found: 1,
                supported: 2,
                ..
            },
        ) => assert!(e.to_string().contains("seg-00000001.log"), "{e}"),
        other => panic!("expected UnsupportedVersion, got {:?}", other.map(|_| ())),
    }
    // Nothing was changed: the old data is still there for a build that reads it.
    assert_eq!(
        std::fs::read(dir.path().join("seg-00000001.log")).unwrap(),
        v1
    );
}

fn crc32c_of(b: &[u8]) -> u32 {
    // CRC32C (Castagnoli), bitwise; tests avoid depending on the crate's internals.
    let mut crc = !0u32;
    for &byte in b {
        crc ^= byte as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn a_directory_is_opened_by_one_store_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let first = Store::open(dir.path(), Options::default()).unwrap();
    match Store::open(dir.path(), Options::default()) {
        Err(larder_store::Error::Unavailable(message)) => {
            assert!(message.contains("already open"), "{message}")
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a second store opened the same directory"),
    }
    first.close().unwrap();
    drop(first);
    Store::open(dir.path(), Options::default()).expect("the lock goes with the store");
}

#[test]
fn dropped_store_with_frequent_checkpoints_releases_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        checkpoint_every_records: 7,
        segment_size: 48 << 10,
        ..Options::default()
    };
    for round in 0..20 {
        let started = std::time::Instant::now();
        let store = loop {
            match Store::open(dir.path(), opts.clone()) {
                Ok(s) => break s,
                Err(Error::Unavailable(_)) if started.elapsed().as_secs() < 5 => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                Err(err) => panic!(
                    "round {round}: reopening after drop: {err} after {:?}",
                    started.elapsed()
                ),
            }
        };
        for i in 0..30u32 {
            let meta = BlobMeta {
                props: Bytes::new(),
                time_ms: 1,
                expires_ms: None,
            };
            store
                .put_blob(
                    format!("k{round}-{i}").as_bytes(),
                    meta,
                    &[Bytes::from(vec![1u8; 3000])],
                )
                .unwrap();
        }
        drop(store);
    }
}

#[test]
fn below_the_free_space_reserve_puts_are_refused_and_deletes_still_land() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    store
        .put_blob(b"old", meta(1, None), &[Bytes::from_static(b"data")])
        .unwrap();
    store
        .put_doc(b"doc", 1, 1, Bytes::from_static(b"{}"))
        .unwrap();
    store.close().unwrap();
    drop(store);
    // More free space asked for than any test machine has: the disk counts as full.
    let full = Options {
        min_free_space: u64::MAX / 2,
        ..small_opts()
    };
    let store = Store::open(dir.path(), full).unwrap();
    assert!(matches!(
        store.put_blob(b"new", meta(2, None), &[Bytes::from_static(b"x")]),
        Err(Error::OutOfSpace)
    ));
    assert!(matches!(
        store.put_doc(b"doc", 2, 2, Bytes::from_static(b"{}")),
        Err(Error::OutOfSpace)
    ));
    assert_eq!(
        store.delete_blob(b"old", 3).unwrap(),
        DeleteOutcome::Deleted
    );
    assert_eq!(store.remove_doc(b"doc", 3, 3).unwrap(), DocOutcome::Applied);
    assert!(matches!(
        store.get_blob(b"new", 0).unwrap(),
        BlobLookup::NotFound
    ));
}

/// Cursors are logical (incarnation, sequence): every record of a page is found again from any
/// earlier cursor by a store that has never seen it (reopened, no hints), across segments, with
/// and without a checkpoint; a cursor of another incarnation (a rebuilt replica) starts over.
#[test]
fn cursors_are_logical_and_tied_to_the_incarnation() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    for i in 0..120u32 {
        let key = format!("k{i}");
        let data = Bytes::from(content(700 + i as usize * 13, i as u8));
        store
            .put_blob(key.as_bytes(), meta(1, None), &[data])
            .unwrap();
    }
    assert!(store.stats().segments > 2, "small segments rotate");
    let all = store.changes(Cursor::START, usize::MAX).unwrap();
    let incarnation = store.stats().incarnation;
    assert_ne!(incarnation, 0);
    let seqs: Vec<u64> = all.changes.iter().map(|c| c.cursor.sequence).collect();
    assert_eq!(
        seqs,
        (1..=120).collect::<Vec<u64>>(),
        "sequences count from 1"
    );
    assert!(all
        .changes
        .iter()
        .all(|c| c.cursor.incarnation == incarnation));
    assert_eq!(all.next, store.stats().durable_cursor);
    store.close().unwrap();
    drop(store);
    for (round, with_checkpoint) in [false, true].into_iter().enumerate() {
        if !with_checkpoint {
            std::fs::remove_file(dir.path().join("index.ckpt")).unwrap();
        }
        let store = Store::open(dir.path(), small_opts()).unwrap();
        assert_eq!(store.stats().incarnation, incarnation);
        for from in [0usize, 1, 37, 64, 119, 120] {
            let after = if from == 0 {
                Cursor::START
            } else {
                all.changes[from - 1].cursor
            };
            let page = store.changes(after, 5).unwrap();
            let end = (from + 5).min(all.changes.len());
            // (Later rounds appended records after the first 120.)
            assert_eq!(
                page.changes[..end - from],
                all.changes[from..end],
                "from {from}"
            );
        }
        // Another incarnation's cursor, however far, restarts from the first record.
        let stranger = Cursor {
            incarnation: incarnation ^ 1,
            sequence: 100,
        };
        let page = store.changes(stranger, 3).unwrap();
        assert_eq!(page.changes, all.changes[..3]);
        // A new record gets the next sequence, also after a reopen.
        store
            .delete_blob(format!("late{round}").as_bytes(), 2)
            .unwrap();
        let late = store.changes(all.next, 10).unwrap().changes;
        assert_eq!(late.len(), round + 1);
        assert_eq!(late[round].cursor.sequence, 121 + round as u64);
        store.close().unwrap();
    }
    // A new directory is a new incarnation.
    let other = tempfile::tempdir().unwrap();
    let fresh = Store::open(other.path(), small_opts()).unwrap();
    assert_ne!(fresh.stats().incarnation, incarnation);
}
