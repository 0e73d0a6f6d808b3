//! Bulk appends (`Store::bulk`) against the same records written one by one: random records
//! over a few keys (blob puts of every size class, deletes, document puts and removes, invalid
//! ones), cut into random batches, must give every record the same answer, and leave the same
//! state: the same index (blobs, their data and properties; documents), the same change feed
//! with the same sequence numbers, the same segment bytes, also after a crash (drop, no close)
//! and a reopen. Small segments make batches cross segment rotations.

use bytes::Bytes;
use larder_store::*;
use proptest::prelude::*;

const KEYS: u8 = 6;

#[derive(Clone, Debug)]
enum Rec {
    Put {
        key: u8,
        len: usize,
        expires: bool,
    },
    Delete {
        key: u8,
    },
    PutDoc {
        key: u8,
        version: u64,
        len: usize,
    },
    RemoveDoc {
        key: u8,
        version: u64,
    },
    /// An empty key: refused by validation, the batch goes on.
    Invalid,
}

fn rec() -> impl Strategy<Value = Rec> {
    let len = prop_oneof![0usize..200, 60_000usize..70_000, 130_000usize..140_000];
    prop_oneof![
        4 => (0..KEYS, len, any::<bool>()).prop_map(|(key, len, expires)| Rec::Put { key, len, expires }),
        2 => (0..KEYS).prop_map(|key| Rec::Delete { key }),
        2 => (0..KEYS, 1u64..8, 0usize..3000).prop_map(|(key, version, len)| Rec::PutDoc { key, version, len }),
        1 => (0..KEYS, 1u64..8).prop_map(|(key, version)| Rec::RemoveDoc { key, version }),
        1 => Just(Rec::Invalid),
    ]
}

fn key(k: u8, doc: bool) -> Bytes {
    Bytes::from(format!("{}{k}", if doc { "d" } else { "b" }))
}

fn content(seed: u64, len: usize) -> Bytes {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed) as u8)
        .collect::<Vec<u8>>()
        .into()
}

fn record(r: &Rec, i: u64) -> BulkRecord {
    match *r {
        Rec::Put {
            key: k,
            len,
            expires,
        } => BulkRecord::PutBlob {
            key: key(k, false),
            meta: BlobMeta {
                props: content(i, 5),
                time_ms: i,
                expires_ms: expires.then_some(1000 + i),
            },
            data: content(i, len),
        },
        Rec::Delete { key: k } => BulkRecord::DeleteBlob {
            key: key(k, false),
            time_ms: i,
        },
        Rec::PutDoc {
            key: k,
            version,
            len,
        } => BulkRecord::PutDoc {
            key: key(k, true),
            version,
            time_ms: i,
            json: content(version, len),
        },
        Rec::RemoveDoc { key: k, version } => BulkRecord::RemoveDoc {
            key: key(k, true),
            version,
            time_ms: i,
        },
        Rec::Invalid => BulkRecord::DeleteBlob {
            key: Bytes::new(),
            time_ms: i,
        },
    }
}

/// The single write a bulk record stands for, and its answer in the bulk's terms.
fn one_by_one(store: &Store, r: BulkRecord) -> Result<BulkOutcome> {
    match r {
        BulkRecord::PutBlob { key, meta, data } => {
            store.put_blob(&key, meta, &[data]).map(BulkOutcome::Put)
        }
        BulkRecord::DeleteBlob { key, time_ms } => {
            store.delete_blob(&key, time_ms).map(BulkOutcome::Delete)
        }
        BulkRecord::PutDoc {
            key,
            version,
            time_ms,
            json,
        } => store
            .put_doc(&key, version, time_ms, json)
            .map(BulkOutcome::Doc),
        BulkRecord::RemoveDoc {
            key,
            version,
            time_ms,
        } => store
            .remove_doc(&key, version, time_ms)
            .map(BulkOutcome::Doc),
    }
}

fn opts() -> Options {
    Options {
        segment_size: 200 << 10,
        max_record_size: 1 << 20,
        read_chunk_size: 7000,
        checkpoint_every_records: 0,
        durability: Durability::Durable,
        min_free_space: 0,
        compaction_yields_to: None,
        uncache_synced_from: Options::default().uncache_synced_from,
        direct_cold_reads_from: Options::default().direct_cold_reads_from,
    }
}

/// Everything a reader can observe of a store, in a comparable form.
fn state(store: &Store) -> Vec<String> {
    let mut out = Vec::new();
    for k in 0..KEYS {
        let blob = match store.get_blob(&key(k, false), 0).unwrap() {
            BlobLookup::Found(rec) | BlobLookup::Expired(rec) => {
                let data: Vec<Bytes> = store
                    .read_blob(&rec, 0..u64::MAX)
                    .unwrap()
                    .map(|p| p.unwrap())
                    .collect();
                let data = data.concat();
                format!(
                    "blob {k}: {:?} {} {} crc {}",
                    rec.meta,
                    rec.size,
                    data.len(),
                    crc32c(&data)
                )
            }
            other => format!("blob {k}: {other:?}"),
        };
        out.push(blob);
        let doc = match store.get_doc(&key(k, true)).unwrap() {
            DocLookup::Found {
                version,
                time_ms,
                json,
            } => format!("doc {k}: {version} {time_ms} crc {}", crc32c(&json)),
            other => format!("doc {k}: {other:?}"),
        };
        out.push(doc);
    }
    let changes = store.changes(Cursor::START, usize::MAX).unwrap();
    for c in changes.changes {
        out.push(format!(
            "change {} {:?} {:?} v{} {}B t{}",
            c.cursor.sequence, c.op, c.key, c.version, c.size, c.time_ms
        ));
    }
    out.push(format!("next {}", changes.next.sequence));
    let stats = store.stats();
    out.push(format!(
        "live {} appended {} bytes {} segments {}",
        stats.live_keys, stats.records_appended, stats.bytes_on_disk, stats.segments
    ));
    out
}

fn crc32c(bytes: &[u8]) -> u32 {
    // A cheap, order-sensitive digest is enough to compare contents.
    bytes
        .iter()
        .fold(0u32, |h, b| h.rotate_left(5) ^ u32::from(*b))
}

fn segment_bytes(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("seg-"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

/// Segment files with every header's incarnation and CRC masked (each store has its own
/// incarnation, which the record heads' CRCs do not cover, but the segment headers do).
fn masked(files: Vec<(String, Vec<u8>)>) -> Vec<(String, Vec<u8>)> {
    files
        .into_iter()
        .map(|(name, mut bytes)| {
            bytes[12..20].fill(0);
            bytes[28..32].fill(0);
            (name, bytes)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn a_bulk_batch_ends_where_the_same_records_one_by_one_end(
        recs in proptest::collection::vec(rec(), 1..80),
        cuts in proptest::collection::vec(1usize..30, 1..10),
    ) {
        let (one_dir, bulk_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let one = Store::open(one_dir.path(), opts()).unwrap();
        let bulk = Store::open(bulk_dir.path(), opts()).unwrap();
        let records: Vec<BulkRecord> =
            recs.iter().enumerate().map(|(i, r)| record(r, i as u64 + 1)).collect();
        let expected: Vec<String> = records
            .iter()
            .map(|r| format!("{:?}", one_by_one(&one, r.clone())))
            .collect();
        let mut got = Vec::new();
        let mut rest = records;
        let mut cut = cuts.iter().cycle();
        while !rest.is_empty() {
            let take = (*cut.next().unwrap()).min(rest.len());
            let batch: Vec<BulkRecord> = rest.drain(..take).collect();
            let answers = bulk.bulk(batch).unwrap();
            got.extend(answers.iter().map(|a| format!("{a:?}")));
        }
        prop_assert_eq!(&got, &expected);
        prop_assert_eq!(state(&bulk), state(&one));
        prop_assert_eq!(
            masked(segment_bytes(bulk_dir.path())),
            masked(segment_bytes(one_dir.path()))
        );
        // A crash (no close): recovery finds the same records either way.
        let (before_one, before_bulk) = (state(&one), state(&bulk));
        drop(one);
        drop(bulk);
        let one = Store::open(one_dir.path(), opts()).unwrap();
        let bulk = Store::open(bulk_dir.path(), opts()).unwrap();
        prop_assert_eq!(bulk.stats().corrupt_records_found, 0);
        let (after_one, after_bulk) = (state(&one), state(&bulk));
        prop_assert_eq!(&after_bulk, &after_one);
        // `records_appended` counts this process's appends: only the rest must survive.
        prop_assert_eq!(&before_bulk[..before_bulk.len() - 1], &after_bulk[..after_bulk.len() - 1]);
        prop_assert_eq!(&before_one[..before_one.len() - 1], &after_one[..after_one.len() - 1]);
    }
}

#[test]
fn a_bulk_batch_is_durable_in_one_commit_round() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        Options {
            segment_size: 64 << 20,
            ..opts()
        },
    )
    .unwrap();
    let records: Vec<BulkRecord> = (0..512)
        .map(|i| {
            record(
                &Rec::Put {
                    key: 0,
                    len: 1024,
                    expires: false,
                },
                i,
            )
        })
        .map(|r| match r {
            BulkRecord::PutBlob { meta, data, .. } => BulkRecord::PutBlob {
                key: Bytes::from(format!("k{}", meta.time_ms)),
                meta,
                data,
            },
            other => other,
        })
        .collect();
    let before = store.stats().disk;
    let answers = store.bulk(records).unwrap();
    assert!(answers
        .iter()
        .all(|a| matches!(a, Ok(BulkOutcome::Put(PutOutcome::Stored)))));
    let after = store.stats().disk;
    assert_eq!(after.rounds - before.rounds, 1, "{before:?} -> {after:?}");
    assert_eq!(after.journal_syncs - before.journal_syncs, 1);
    assert_eq!(after.segment_syncs - before.segment_syncs, 1);
    assert_eq!(store.stats().live_keys, 512);
}

/// Keys and properties often arrive as views into a larger buffer (an export frame, a body
/// chunk holding many records). The index keeps them for as long as the record lives, so it
/// must keep copies: a view would pin the whole buffer, and a replica's memory would grow by
/// every byte it was sent (a bootstrap of 256 MiB of 4 MiB blobs left 340 MiB resident).
#[test]
fn stored_records_do_not_pin_the_callers_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let buffer = |tag: &str| Bytes::from(format!("{tag}props{}", "x".repeat(64 << 10)));
    let meta = |frame: &Bytes| BlobMeta {
        props: frame.slice(7..12),
        time_ms: 1,
        expires_ms: None,
    };
    let bulk_frame = buffer("bulkone");
    let answers = store
        .bulk(vec![BulkRecord::PutBlob {
            key: bulk_frame.slice(0..7),
            meta: meta(&bulk_frame),
            data: bulk_frame.slice(12..),
        }])
        .unwrap();
    assert!(matches!(
        answers[..],
        [Ok(BulkOutcome::Put(PutOutcome::Stored))]
    ));
    let single_frame = buffer("single1");
    let outcome = store
        .put_blob(
            &single_frame[0..7],
            meta(&single_frame),
            &[single_frame.slice(12..)],
        )
        .unwrap();
    assert_eq!(outcome, PutOutcome::Stored);
    assert!(
        bulk_frame.is_unique(),
        "the bulk path kept a view of the frame"
    );
    assert!(
        single_frame.is_unique(),
        "a single put kept a view of its buffer"
    );
    // And what was stored is intact.
    match store.get_blob(b"bulkone", 2).unwrap() {
        BlobLookup::Found(blob) => assert_eq!(&blob.meta.props[..], b"props"),
        other => panic!("{other:?}"),
    }
}
