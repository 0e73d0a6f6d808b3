//! Corruption tests: flipped bytes and truncated files anywhere in a replica. Opening must work
//! (or fail with a clear error for a newer format), and every read must return exactly the
//! written bytes or NotFound / Corrupt: never wrong data.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use larder_store::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn opts() -> Options {
    Options {
        segment_size: 256 << 10,
        read_chunk_size: 50_000,
        checkpoint_every_records: 1_000_000,
        ..Options::default()
    }
}

fn content(key: &str, len: usize) -> Vec<u8> {
    let mut x = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

struct Fixture {
    dir: tempfile::TempDir,
    blobs: Vec<(String, usize)>,
    /// Put then deleted, or deleted without a put.
    deleted: Vec<(String, Option<usize>)>,
    docs: Vec<(String, Vec<u64>)>,
}

fn doc_json(key: &str, version: u64) -> Bytes {
    Bytes::from(content(
        &format!("{key}@{version}"),
        100 + version as usize * 7,
    ))
}

fn build(close: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let mut fx = Fixture {
        dir,
        blobs: Vec::new(),
        deleted: Vec::new(),
        docs: Vec::new(),
    };
    for i in 0..60 {
        let key = format!("blob-{i}");
        let len = if i % 3 == 0 {
            rng.random_range(70_000..200_000)
        } else {
            rng.random_range(0..3000)
        };
        let data = Bytes::from(content(&key, len));
        let meta = BlobMeta {
            props: Bytes::from(key.clone()),
            time_ms: i,
            expires_ms: None,
        };
        store.put_blob(key.as_bytes(), meta, &[data]).unwrap();
        if i % 10 == 0 {
            store
                .put_doc(
                    format!("doc-{i}").as_bytes(),
                    1,
                    i,
                    doc_json(&format!("doc-{i}"), 1),
                )
                .unwrap();
        }
        if i % 7 == 3 {
            store.delete_blob(key.as_bytes(), i).unwrap();
            fx.deleted.push((key, Some(len)));
        } else {
            fx.blobs.push((key, len));
        }
    }
    for i in 0..5 {
        let key = format!("never-{i}");
        store.delete_blob(key.as_bytes(), i).unwrap();
        fx.deleted.push((key, None));
    }
    for i in (0..60).step_by(10) {
        let key = format!("doc-{i}");
        let mut versions = vec![1];
        for v in 2..4 {
            if v == 3 && i % 20 == 0 {
                store.remove_doc(key.as_bytes(), v, 0).unwrap();
            } else {
                store
                    .put_doc(key.as_bytes(), v, 0, doc_json(&key, v))
                    .unwrap();
            }
            versions.push(v);
        }
        fx.docs.push((key, versions));
    }
    if close {
        store.close().unwrap();
    }
    fx
}

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("seg-"))
        .collect();
    v.sort();
    v
}

fn flip_byte(path: &Path, rng: &mut StdRng) {
    let mut bytes = std::fs::read(path).unwrap();
    if bytes.is_empty() {
        return;
    }
    let at = rng.random_range(0..bytes.len());
    bytes[at] ^= rng.random_range(1..=255u8);
    std::fs::write(path, bytes).unwrap();
}

fn expect_corrupt(e: Error, what: &str) {
    assert!(
        matches!(e, Error::Corrupt { .. }),
        "{what}: expected Corrupt, got {e}"
    );
}

/// Reads `range` of a blob: every yielded byte must match; an error must be Corrupt.
fn check_range(store: &Store, rec: &BlobRecord, want: &[u8], start: u64, end: u64) {
    let reader = match store.read_blob(rec, start..end) {
        Ok(r) => r,
        Err(e) => return expect_corrupt(e, "read_blob"),
    };
    let mut pos = (start as usize).min(want.len());
    for piece in reader {
        match piece {
            Ok(p) => {
                assert_eq!(&p[..], &want[pos..pos + p.len()], "wrong bytes at {pos}");
                pos += p.len();
            }
            Err(e) => return expect_corrupt(e, "piece"),
        }
    }
    assert_eq!(
        pos,
        (end as usize).min(want.len()),
        "stream ended early without an error"
    );
}

fn check_blob(store: &Store, key: &str, len: Option<usize>, deleted: bool, rng: &mut StdRng) {
    match store.get_blob(key.as_bytes(), 0).unwrap() {
        BlobLookup::Found(rec) => {
            // A put whose tombstone was destroyed may reappear, but only with its own bytes.
            let len = len.unwrap_or_else(|| panic!("{key} was never put"));
            assert_eq!(rec.size as usize, len, "{key} size");
            assert_eq!(rec.meta.props, Bytes::from(key.to_string()), "{key} props");
            let want = content(key, len);
            check_range(store, &rec, &want, 0, u64::MAX);
            let s = rng.random_range(0..=len as u64);
            check_range(store, &rec, &want, s, s + rng.random_range(0..100_000));
        }
        BlobLookup::NotFound => {}
        BlobLookup::Deleted { .. } => assert!(deleted, "{key} was never deleted"),
        BlobLookup::Expired(_) => panic!("{key} has no TTL"),
    }
}

fn check_doc(store: &Store, key: &str, versions: &[u64]) {
    match store.get_doc(key.as_bytes()) {
        Ok(DocLookup::Found { version, json, .. }) => {
            assert!(
                versions.contains(&version),
                "{key}: unknown version {version}"
            );
            assert_eq!(json, doc_json(key, version), "{key} v{version} json");
        }
        Ok(DocLookup::Removed { version, .. }) => assert!(versions.contains(&version)),
        Ok(DocLookup::NotFound) => {}
        Err(e) => expect_corrupt(e, key),
    }
}

fn check_all(dir: &Path, fx: &Fixture, rng: &mut StdRng) -> Stats {
    let store = Store::open(dir, opts()).unwrap();
    for (key, len) in &fx.blobs {
        check_blob(&store, key, Some(*len), false, rng);
    }
    for (key, len) in &fx.deleted {
        check_blob(&store, key, *len, true, rng);
    }
    for (key, versions) in &fx.docs {
        check_doc(&store, key, versions);
    }
    // The feed only shows records that were really written.
    for c in store.changes(Cursor::START, usize::MAX).unwrap().changes {
        let key = std::str::from_utf8(&c.key).unwrap();
        assert!(
            key.starts_with("blob-") || key.starts_with("never-") || key.starts_with("doc-"),
            "{key}"
        );
    }
    // The store still accepts writes after whatever recovery did.
    store
        .put_blob(
            b"after-recovery",
            BlobMeta {
                props: Bytes::new(),
                time_ms: 0,
                expires_ms: None,
            },
            &[Bytes::from_static(b"ok")],
        )
        .unwrap();
    store.stats()
}

fn trial(fx: &Fixture, seed: u64, damage: impl Fn(&Path, &mut StdRng)) -> Stats {
    let mut rng = StdRng::seed_from_u64(seed);
    let work = tempfile::tempdir().unwrap();
    copy_dir(fx.dir.path(), work.path());
    damage(work.path(), &mut rng);
    check_all(work.path(), fx, &mut rng)
}

#[test]
fn random_byte_flips_never_return_wrong_data() {
    for close in [true, false] {
        let fx = build(close);
        for seed in 0..25 {
            trial(&fx, seed, |dir, rng| {
                let segs = segments(dir);
                for _ in 0..rng.random_range(1..6) {
                    flip_byte(&segs[rng.random_range(0..segs.len())], rng);
                }
            });
        }
    }
}

#[test]
fn truncation_anywhere_never_returns_wrong_data() {
    let fx = build(true);
    for seed in 0..25 {
        trial(&fx, seed, |dir, rng| {
            let segs = segments(dir);
            let seg = &segs[rng.random_range(0..segs.len())];
            let len = std::fs::metadata(seg).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(seg)
                .unwrap()
                .set_len(rng.random_range(0..len))
                .unwrap();
        });
    }
}

#[test]
fn corrupt_checkpoint_is_ignored_and_log_replayed() {
    let fx = build(true);
    let clean = trial(&fx, 0, |_, _| {});
    for seed in 0..10 {
        let stats = trial(&fx, seed, |dir, rng| {
            let ckpt = dir.join("index.ckpt");
            if seed % 2 == 0 {
                flip_byte(&ckpt, rng);
            } else {
                let len = std::fs::metadata(&ckpt).unwrap().len();
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&ckpt)
                    .unwrap()
                    .set_len(rng.random_range(0..len))
                    .unwrap();
            }
        });
        // The log is intact, so full replay yields exactly the same store.
        assert_eq!(stats.live_keys, clean.live_keys);
        assert_eq!(stats.corrupt_records_found, 0);
    }
}

#[test]
fn checkpoint_of_newer_version_is_refused() {
    let fx = build(true);
    let ckpt = fx.dir.path().join("index.ckpt");
    let mut bytes = std::fs::read(&ckpt).unwrap();
    bytes[8] = 3;
    let n = bytes.len() - 4;
    let crc = crc32c(&bytes[..n]);
    bytes[n..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&ckpt, bytes).unwrap();
    assert!(matches!(
        Store::open(fx.dir.path(), opts()),
        Err(Error::UnsupportedVersion { found: 3, .. })
    ));
}

#[test]
fn segment_of_newer_version_is_refused_but_a_flipped_version_is_corruption() {
    let fx = build(true);
    let seg = segments(fx.dir.path())[1].clone();
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[6] = 3;
    std::fs::write(&seg, &bytes).unwrap();
    // Without a matching CRC the version byte is just a flipped bit.
    let store = Store::open(fx.dir.path(), opts()).unwrap();
    assert_eq!(store.stats().corrupt_records_found, 1);
    drop(store);
    let crc = crc32c(&bytes[..28]);
    bytes[28..32].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&seg, &bytes).unwrap();
    match Store::open(fx.dir.path(), opts()) {
        Err(
            e @ Error::UnsupportedVersion {
                found: 3,
                supported: 2,
                ..
            },
        ) => assert!(e.to_string().contains("seg-00000002.log")),
        other => panic!("expected UnsupportedVersion, got {:?}", other.map(|_| ())),
    }
}

fn segment_with(dir: &Path, key: &str) -> PathBuf {
    let holds = |s: &PathBuf| {
        std::fs::read(s)
            .unwrap()
            .windows(key.len())
            .any(|w| w == key.as_bytes())
    };
    segments(dir).into_iter().find(holds).unwrap()
}

/// Offset of the record holding `key` (first occurrence of the key bytes after a record magic).
fn find_record(bytes: &[u8], key: &str) -> usize {
    let pat = key.as_bytes();
    (0..bytes.len() - pat.len())
        .find(|&i| &bytes[i..i + pat.len()] == pat && i >= 60 && &bytes[i - 60..i - 56] == b"LRec")
        .unwrap()
        - 60
}

#[test]
fn bad_data_block_in_the_middle_is_reported_and_only_that_block_fails() {
    let fx = build(false);
    let (key, len) = fx
        .blobs
        .iter()
        .find(|(_, len)| *len > 140_000)
        .cloned()
        .unwrap();
    let want = content(&key, len);
    let seg = segment_with(fx.dir.path(), &key);
    let mut bytes = std::fs::read(&seg).unwrap();
    let rec = find_record(&bytes, &key);
    let head = 60 + key.len() + key.len() + 4 * len.div_ceil(65536);
    bytes[rec + head + 65536 + 10] ^= 0xff; // second data block
    std::fs::write(&seg, bytes).unwrap();
    let store = Store::open(fx.dir.path(), opts()).unwrap();
    assert_eq!(store.stats().corrupt_records_found, 1);
    let BlobLookup::Found(r) = store.get_blob(key.as_bytes(), 0).unwrap() else {
        panic!()
    };
    let first: Vec<Bytes> = store
        .read_blob(&r, 0..65536)
        .unwrap()
        .map(|p| p.unwrap())
        .collect();
    assert_eq!(first.concat(), &want[..65536]);
    let third: Vec<Bytes> = store
        .read_blob(&r, 131_072..len as u64)
        .unwrap()
        .map(|p| p.unwrap())
        .collect();
    assert_eq!(third.concat(), &want[131_072..]);
    let mut bad = store.read_blob(&r, 60_000..70_000).unwrap();
    expect_corrupt(bad.next().unwrap().unwrap_err(), "bad block");
    assert!(bad.next().is_none(), "the stream ends after an error");
    for (k, l) in fx.blobs.iter().filter(|(k, _)| *k != key) {
        check_blob(&store, k, Some(*l), false, &mut StdRng::seed_from_u64(1));
        assert!(
            matches!(
                store.get_blob(k.as_bytes(), 0).unwrap(),
                BlobLookup::Found(_)
            ),
            "{k} lost"
        );
    }
}

#[test]
fn bad_header_in_the_middle_skips_only_that_record() {
    let fx = build(false);
    let key = "blob-11";
    let seg = segment_with(fx.dir.path(), key);
    let mut bytes = std::fs::read(&seg).unwrap();
    let rec = find_record(&bytes, key);
    bytes[rec + 20] ^= 0x40; // inside the data length
    std::fs::write(&seg, bytes).unwrap();
    let store = Store::open(fx.dir.path(), opts()).unwrap();
    assert_eq!(store.stats().corrupt_records_found, 1);
    assert!(matches!(
        store.get_blob(key.as_bytes(), 0).unwrap(),
        BlobLookup::NotFound
    ));
    for (k, l) in fx.blobs.iter().filter(|(k, _)| k != key) {
        assert!(
            matches!(
                store.get_blob(k.as_bytes(), 0).unwrap(),
                BlobLookup::Found(_)
            ),
            "{k} lost"
        );
        check_blob(&store, k, Some(*l), false, &mut StdRng::seed_from_u64(1));
    }
}

#[test]
fn torn_tail_is_truncated_silently() {
    let fx = build(false);
    let last = segments(fx.dir.path()).pop().unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    let bytes = std::fs::read(&last).unwrap();
    // A copy of the last record's first 100 bytes: a header whose data never arrived.
    let rec = (0..bytes.len() - 4)
        .rev()
        .find(|&i| &bytes[i..i + 4] == b"LRec")
        .unwrap();
    let mut torn = bytes.clone();
    torn.extend_from_slice(&bytes[rec..(rec + 100).min(bytes.len())]);
    torn.extend_from_slice(&[0u8; 3000]);
    std::fs::write(&last, torn).unwrap();
    let store = Store::open(fx.dir.path(), opts()).unwrap();
    assert_eq!(store.stats().corrupt_records_found, 0);
    assert_eq!(std::fs::metadata(&last).unwrap().len(), len);
    let mut rng = StdRng::seed_from_u64(3);
    for (k, l) in &fx.blobs {
        assert!(
            matches!(
                store.get_blob(k.as_bytes(), 0).unwrap(),
                BlobLookup::Found(_)
            ),
            "{k} lost"
        );
        check_blob(&store, k, Some(*l), false, &mut rng);
    }
}

fn crc32c(b: &[u8]) -> u32 {
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

/// A blob may carry a whole Larder segment (a backup, say). When the header of that blob's own
/// record is damaged, recovery scans past it for the next valid record: the records inside the
/// blob must not be taken for real ones, because each record's checksum covers its position.
#[test]
fn records_inside_a_blob_are_never_taken_for_real_ones() {
    let inner_dir = tempfile::tempdir().unwrap();
    let inner = Store::open(inner_dir.path(), opts()).unwrap();
    let meta = |time_ms| BlobMeta {
        props: Bytes::new(),
        time_ms,
        expires_ms: None,
    };
    for i in 0..5 {
        let data = Bytes::from(content(&format!("inner-{i}"), 300));
        inner
            .put_blob(format!("inner-{i}").as_bytes(), meta(1), &[data])
            .unwrap();
    }
    inner.close().unwrap();
    let segment = std::fs::read(&segments(inner_dir.path())[0]).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    store
        .put_blob(b"backup", meta(2), &[Bytes::from(segment)])
        .unwrap();
    store
        .put_blob(b"after", meta(3), &[Bytes::from_static(b"still here")])
        .unwrap();
    drop(store);
    std::fs::remove_file(dir.path().join("index.ckpt")).ok();
    // The backup is the segment's first record, right after the 32-byte file header: damage its
    // fixed header so that recovery must resync.
    let path = &segments(dir.path())[0];
    let mut bytes = std::fs::read(path).unwrap();
    bytes[32 + 20] ^= 0xff;
    std::fs::write(path, bytes).unwrap();

    let store = Store::open(dir.path(), opts()).unwrap();
    for i in 0..5 {
        let key = format!("inner-{i}");
        assert!(
            matches!(
                store.get_blob(key.as_bytes(), 0).unwrap(),
                BlobLookup::NotFound
            ),
            "{key} was resurrected from inside a blob"
        );
    }
    assert!(matches!(
        store.get_blob(b"backup", 0).unwrap(),
        BlobLookup::NotFound
    ));
    let BlobLookup::Found(after) = store.get_blob(b"after", 0).unwrap() else {
        panic!("the record after the damage is lost")
    };
    let read: Vec<u8> = store
        .read_blob(&after, 0..u64::MAX)
        .unwrap()
        .map(|c| c.unwrap())
        .flat_map(|c| c.to_vec())
        .collect();
    assert_eq!(read, b"still here");
    assert!(store.stats().corrupt_records_found >= 1);
}
