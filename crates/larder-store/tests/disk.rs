//! Many stores on one disk: one journal sync per commit round covers the writes of all of them,
//! and the journal brings back what a power loss takes from the segments' page cache.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use larder_store::*;

const STORES: usize = 8;

fn opts() -> Options {
    Options {
        checkpoint_every_records: u64::MAX,
        ..Options::default()
    }
}

fn meta(key: &str) -> BlobMeta {
    BlobMeta {
        props: Bytes::copy_from_slice(key.as_bytes()),
        time_ms: 1,
        expires_ms: None,
    }
}

/// Deterministic content for a key, so any stored byte can be checked.
fn content(key: &str, len: usize) -> Bytes {
    let seed = key
        .bytes()
        .fold(7u8, |h, b| h.wrapping_mul(31).wrapping_add(b));
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect::<Vec<u8>>()
        .into()
}

fn store_dir(root: &Path, i: usize) -> PathBuf {
    root.join(format!("p{i}"))
}

fn open_all(disk: &Disk, root: &Path) -> Vec<Store> {
    (0..STORES)
        .map(|i| Store::open_on(disk, store_dir(root, i), opts()).unwrap())
        .collect()
}

/// A disk whose rounds are at least `ms` apart (writes begun together share the next round),
/// with its stores.
fn open_with_rounds_apart(root: &Path, ms: u64) -> (Disk, Vec<Store>) {
    let opts = DiskOptions {
        min_round_interval: std::time::Duration::from_millis(ms),
        ..DiskOptions::default()
    };
    let disk = Disk::open(root, opts).unwrap();
    let stores = open_all(&disk, root);
    (disk, stores)
}

fn read(store: &Store, key: &str) -> Option<Bytes> {
    let BlobLookup::Found(rec) = store.get_blob(key.as_bytes(), 0).unwrap() else {
        return None;
    };
    let pieces: Result<Vec<Bytes>> = store.read_blob(&rec, 0..u64::MAX).unwrap().collect();
    Some(pieces.unwrap().concat().into())
}

/// `writers` threads, each putting `per_writer` small blobs spread over every store. Returns the
/// keys written to each store.
fn write_spread(stores: &[Store], writers: usize, per_writer: usize) -> Vec<Vec<String>> {
    let threads: Vec<_> = (0..writers)
        .map(|t| {
            let stores = stores.to_vec();
            std::thread::spawn(move || {
                let mut written = vec![Vec::new(); stores.len()];
                for i in 0..per_writer {
                    let s = (t + i) % stores.len();
                    let key = format!("k-{t}-{i}");
                    let put = stores[s].put_blob(key.as_bytes(), meta(&key), &[content(&key, 700)]);
                    assert_eq!(put.unwrap(), PutOutcome::Stored);
                    written[s].push(key);
                }
                written
            })
        })
        .collect();
    let mut all = vec![Vec::new(); stores.len()];
    for t in threads {
        for (s, keys) in t.join().unwrap().into_iter().enumerate() {
            all[s].extend(keys);
        }
    }
    all
}

#[test]
fn stores_on_one_disk_share_one_journal_sync_per_round() {
    let root = tempfile::tempdir().unwrap();
    let disk = Disk::open(root.path(), DiskOptions::default()).unwrap();
    let stores = open_all(&disk, root.path());
    let (writers, per_writer) = (64, 30);
    let written = write_spread(&stores, writers, per_writer);
    let writes = (writers * per_writer) as u64;
    let stats = disk.stats();
    // One journal sync per round, whatever the number of logs the round wrote: far fewer syncs
    // than writes, and than (writes spread over 8 logs) / 8 would give with a sync per log.
    assert!(stats.journal_syncs * 4 < writes, "{stats:?}");
    assert_eq!(
        stats.segment_syncs, 0,
        "small records never sync a segment: {stats:?}"
    );
    assert_eq!(stats.fdatasyncs(), stats.journal_syncs);
    let log_rounds: u64 = stores.iter().map(|s| s.stats().syncs).sum();
    assert!(
        log_rounds > stats.journal_syncs,
        "rounds covered several logs at once: {log_rounds} log rounds, {stats:?}"
    );
    for (store, keys) in stores.iter().zip(&written) {
        assert_eq!(
            store.stats().disk,
            disk.stats(),
            "every store reports its disk"
        );
        for key in keys {
            assert_eq!(read(store, key).unwrap(), content(key, 700));
        }
    }
}

/// What the segment files of `root` hold on stable storage after a power loss: the journal
/// (synced by every round) and each segment up to `synced_len`; the rest of a segment was only
/// in the page cache. Half the stores lose their tail entirely, half keep the size with zeros.
fn power_loss_copy(root: &Path, to: &Path, synced_len: &[u64]) {
    for entry in std::fs::read_dir(root).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if name.starts_with("journal-") {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
    for (i, &synced) in synced_len.iter().enumerate() {
        let (from, dest) = (store_dir(root, i), store_dir(to, i));
        std::fs::create_dir_all(&dest).unwrap();
        let seg = "seg-00000001.log";
        let mut bytes = std::fs::read(from.join(seg)).unwrap();
        assert!(
            bytes.len() as u64 > synced,
            "store {i} wrote past its synced length"
        );
        if i % 2 == 0 {
            bytes.truncate(synced as usize);
        } else {
            bytes[synced as usize..].fill(0);
        }
        std::fs::write(dest.join(seg), bytes).unwrap();
    }
}

fn segment_len(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("seg-00000001.log"))
        .unwrap()
        .len()
}

#[test]
fn after_a_power_loss_the_journal_brings_back_every_acknowledged_write() {
    let root = tempfile::tempdir().unwrap();
    let (disk, stores) = open_with_rounds_apart(root.path(), 50);
    let synced: Vec<u64> = (0..STORES)
        .map(|i| segment_len(&store_dir(root.path(), i)))
        .collect();
    // A record too large to batch is written to its segment by its writer; a round carrying
    // few such bytes over several logs journals them too rather than sync each segment: they
    // are only in the journal and the page cache, as everything after them.
    stores[0]
        .put_blob(b"first", meta("first"), &[content("first", 10)])
        .unwrap();
    let large: Vec<String> = (0..STORES).map(|i| format!("large-{i}")).collect();
    let commits: Vec<_> = (stores.iter().zip(&large))
        .map(|(store, key)| {
            store.begin_put_blob(key.as_bytes(), meta(key), &[content(key, 100_000)])
        })
        .collect();
    for commit in commits {
        assert_eq!(commit.wait().unwrap(), PutOutcome::Stored);
    }
    let stats = disk.stats();
    assert_eq!(stats.segment_syncs, 0, "large records journaled: {stats:?}");
    let written = write_spread(&stores, 16, 40);
    let deleted = "k-3-5";
    let s = (3 + 5) % STORES;
    assert_eq!(
        stores[s].delete_blob(deleted.as_bytes(), 9).unwrap(),
        DeleteOutcome::Deleted
    );
    // Alone in its segment and its round, a large record is synced there, not journaled.
    let before = disk.stats();
    let alone = "alone";
    stores[1]
        .put_blob(alone.as_bytes(), meta(alone), &[content(alone, 100_000)])
        .unwrap();
    let after = disk.stats();
    assert_eq!(after.segment_syncs, before.segment_syncs + 1, "{after:?}");
    let synced_1 = segment_len(&store_dir(root.path(), 1));
    let synced: Vec<u64> = (synced.iter().enumerate())
        .map(|(i, &len)| if i == 1 { synced_1 } else { len })
        .collect();
    stores[1]
        .put_blob(
            b"after-alone",
            meta("after-alone"),
            &[content("after-alone", 700)],
        )
        .unwrap();
    // Power goes out now: the stores are still open, nothing was closed or synced further.
    let after = tempfile::tempdir().unwrap();
    power_loss_copy(root.path(), after.path(), &synced);
    let disk = Disk::open(after.path(), DiskOptions::default()).unwrap();
    let stores = open_all(&disk, after.path());
    for (i, store) in stores.iter().enumerate() {
        assert_eq!(store.stats().corrupt_records_found, 0, "store {i}");
        assert_eq!(read(store, &large[i]).unwrap(), content(&large[i], 100_000));
        if i == 1 {
            assert_eq!(read(store, alone).unwrap(), content(alone, 100_000));
            assert_eq!(
                read(store, "after-alone").unwrap(),
                content("after-alone", 700)
            );
        }
        for key in &written[i] {
            if key == deleted {
                assert!(matches!(
                    store.get_blob(key.as_bytes(), 0).unwrap(),
                    BlobLookup::Deleted { time_ms: 9 }
                ));
                continue;
            }
            assert_eq!(
                read(store, key),
                Some(content(key, 700)),
                "store {i} lost {key}"
            );
        }
    }
    // The journal was replayed, synced into the segments and emptied: the stores go on.
    assert_eq!(
        stores[0]
            .put_blob(b"after", meta("after"), &[content("after", 10)])
            .unwrap(),
        PutOutcome::Stored
    );
}

#[test]
fn a_torn_journal_tail_is_cut_and_what_came_before_it_is_kept() {
    let root = tempfile::tempdir().unwrap();
    let disk = Disk::open(root.path(), DiskOptions::default()).unwrap();
    let stores = open_all(&disk, root.path());
    let synced: Vec<u64> = (0..STORES)
        .map(|i| segment_len(&store_dir(root.path(), i)))
        .collect();
    let written = write_spread(&stores, 8, 20);
    let after = tempfile::tempdir().unwrap();
    power_loss_copy(root.path(), after.path(), &synced);
    // The process died while appending a round's frames: half a frame (a copy of the first one's
    // start) and some garbage follow the last complete frame.
    let journal = std::fs::read_dir(after.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_str().unwrap().ends_with(".jnl"))
        .unwrap();
    let mut bytes = std::fs::read(&journal).unwrap();
    let torn = bytes[16..16 + 600].to_vec();
    bytes.extend_from_slice(&torn);
    bytes.extend_from_slice(&[0xAB; 77]);
    std::fs::write(&journal, bytes).unwrap();
    let disk = Disk::open(after.path(), DiskOptions::default()).unwrap();
    assert_eq!(
        std::fs::metadata(&journal).unwrap().len(),
        16,
        "the replayed journal file is emptied to its header and appended to again"
    );
    let stores = open_all(&disk, after.path());
    for (i, store) in stores.iter().enumerate() {
        assert_eq!(store.stats().corrupt_records_found, 0, "store {i}");
        for key in &written[i] {
            assert_eq!(
                read(store, key),
                Some(content(key, 700)),
                "store {i} lost {key}"
            );
        }
    }
}

#[test]
fn a_store_outside_its_disk_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let disk = Disk::open(root.path(), DiskOptions::default()).unwrap();
    assert!(Store::open_on(&disk, elsewhere.path(), opts()).is_err());
    assert!(Store::open_on(&disk, root.path().join("p1/../../x"), opts()).is_err());
}

#[test]
fn journal_files_rotate_and_the_old_ones_go() {
    let root = tempfile::tempdir().unwrap();
    let disk = Disk::open(
        root.path(),
        DiskOptions {
            journal_file_size: 64 << 10,
            ..DiskOptions::default()
        },
    )
    .unwrap();
    let stores = open_all(&disk, root.path());
    let written = write_spread(&stores, 8, 60);
    let journal_count = || {
        std::fs::read_dir(root.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_str()
                    .unwrap()
                    .ends_with(".jnl")
            })
            .count()
    };
    // The file rotated out last is retired (its segments synced, then deleted) by a thread of
    // its own, while rounds go on in the next one.
    let rotated = std::time::Instant::now();
    while journal_count() > 1 {
        assert!(
            rotated.elapsed() < std::time::Duration::from_secs(20),
            "a rotated journal file is never deleted"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let stats = disk.stats();
    assert!(
        stats.segment_syncs > 0,
        "segments synced before a rotation: {stats:?}"
    );
    drop(stores);
    drop(disk);
    assert_eq!(
        journal_count(),
        1,
        "a clean close empties the journal, and keeps it"
    );
    let disk = Disk::open(root.path(), DiskOptions::default()).unwrap();
    let stores = open_all(&disk, root.path());
    for (store, keys) in stores.iter().zip(&written) {
        for key in keys {
            assert_eq!(read(store, key), Some(content(key, 700)));
        }
    }
}

#[test]
fn an_async_caller_awaits_its_commit_without_a_parked_thread() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path(), opts()).unwrap();
    assert!(is_batched(10, 10, 1000));
    assert!(!is_batched(10, 10, 70_000));
    // A minimal executor: polls on this thread, sleeps until the waker fires.
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut commits: Vec<Option<Commit<PutOutcome>>> = (0..50)
        .map(|i| {
            let key = format!("a{i}");
            Some(store.begin_put_blob(key.as_bytes(), meta(&key), &[content(&key, 100)]))
        })
        .collect();
    while commits.iter().any(Option::is_some) {
        for slot in &mut commits {
            let Some(c) = slot else { continue };
            if let std::task::Poll::Ready(r) =
                std::future::Future::poll(std::pin::Pin::new(c), &mut cx)
            {
                assert_eq!(r.unwrap(), PutOutcome::Stored);
                *slot = None;
            }
        }
        if commits.iter().any(Option::is_some) {
            std::thread::park_timeout(std::time::Duration::from_millis(100));
        }
    }
    for i in 0..50 {
        let key = format!("a{i}");
        assert_eq!(read(&store, &key), Some(content(&key, 100)));
    }
    assert_eq!(
        store.begin_put_blob(b"a1", meta("a1"), &[]).wait().unwrap(),
        PutOutcome::AlreadyExists
    );
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), dest).unwrap();
        }
    }
}

/// The disk journal still holds frames of a segment that compaction rewrote: replaying them
/// after a crash must not write the old bytes into the rewrite (frames name generation 0's file,
/// which is gone), and every survivor and tombstone is intact.
#[test]
fn journal_frames_of_a_compacted_segment_are_not_replayed_into_it() {
    let root = tempfile::tempdir().unwrap();
    let disk = Disk::open(root.path(), DiskOptions::default()).unwrap();
    let dir = store_dir(root.path(), 0);
    let store = Store::open_on(&disk, &dir, opts()).unwrap();
    let mut kept = Vec::new();
    for i in 0..60 {
        let key = format!("k{i}");
        let body = content(&key, 200 + i * 37);
        store
            .put_blob(key.as_bytes(), meta(&key), std::slice::from_ref(&body))
            .unwrap();
        if i % 3 == 0 {
            store.delete_blob(key.as_bytes(), 5).unwrap();
        } else {
            kept.push((key, body));
        }
    }
    let compact = CompactOptions {
        min_garbage_ratio: 0.0,
        now_ms: 0,
        seal_active: true,
        max_bytes_per_sec: 0,
        tombstone_horizon: None,
        tombstone_retention_ms: 0,
    };
    let report = store.compact(&compact).unwrap();
    assert!(report.segments_compacted > 0, "{report:?}");
    store
        .put_blob(b"after", meta("after"), &[content("after", 10)])
        .unwrap();
    // A crash now: the journal (never rotated) has frames for the compacted segment's records.
    let crashed = tempfile::tempdir().unwrap();
    copy_tree(root.path(), crashed.path());
    assert!(std::fs::read_dir(crashed.path()).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".jnl")));
    let disk2 = Disk::open(crashed.path(), DiskOptions::default()).unwrap();
    let store2 = Store::open_on(&disk2, store_dir(crashed.path(), 0), opts()).unwrap();
    assert_eq!(store2.stats().corrupt_records_found, 0);
    kept.push(("after".into(), content("after", 10)));
    for (key, body) in &kept {
        let BlobLookup::Found(rec) = store2.get_blob(key.as_bytes(), 0).unwrap() else {
            panic!("{key} lost")
        };
        let got: Vec<Bytes> = store2
            .read_blob(&rec, 0..u64::MAX)
            .unwrap()
            .map(|p| p.unwrap())
            .collect();
        assert_eq!(got.concat(), body[..], "{key}");
    }
    for i in (0..60).step_by(3) {
        let key = format!("k{i}");
        assert!(
            matches!(
                store2.get_blob(key.as_bytes(), 0).unwrap(),
                BlobLookup::Deleted { .. }
            ),
            "{key} came back"
        );
    }
}

/// Deleted files this process still holds open whose name contains `part` (Linux: the
/// `/proc/self/fd` links of unlinked files end in " (deleted)").
fn held_deleted(part: &str) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|target| target.contains(part) && target.ends_with(" (deleted)"))
        .count()
}

#[test]
fn rotated_journal_files_larger_than_a_release_step_are_released_and_closed() {
    // Journal files past one release step (4 MiB) are cut down and closed by a thread of their
    // own after the rotation (`release.rs`); what they held stays readable, before and after
    // a reopen.
    let root = tempfile::tempdir().unwrap();
    let disk = Disk::open(
        root.path(),
        DiskOptions {
            journal_file_size: 5 << 20,
            ..DiskOptions::default()
        },
    )
    .unwrap();
    let stores = open_all(&disk, root.path());
    let mut written = Vec::new();
    for i in 0..400 {
        let key = format!("big-{i}");
        let store = &stores[i % stores.len()];
        let put = store.put_blob(key.as_bytes(), meta(&key), &[content(&key, 32 << 10)]);
        assert_eq!(put.unwrap(), PutOutcome::Stored);
        written.push((i % stores.len(), key));
    }
    let released = std::time::Instant::now();
    while held_deleted(root.path().to_str().unwrap()) > 0 {
        assert!(
            released.elapsed() < std::time::Duration::from_secs(20),
            "a rotated journal file was never closed"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for (s, key) in &written {
        assert_eq!(read(&stores[*s], key), Some(content(key, 32 << 10)));
    }
    drop(stores);
    drop(disk);
    let disk = Disk::open(root.path(), DiskOptions::default()).unwrap();
    let stores = open_all(&disk, root.path());
    for (s, key) in &written {
        assert_eq!(read(&stores[*s], key), Some(content(key, 32 << 10)));
    }
}

/// A replica rebuilt in place (the storage node's "rebuilt, never rejoined"): its store is
/// closed, the journal rotated, its directory deleted and a new store created at the same
/// path. A crash then must not replay the old store's journal frames into the new store's
/// segments (same path, same segment ids): after `Disk::rotate_journal` no frame names them.
#[test]
fn a_store_recreated_at_the_same_path_after_a_rotation_is_not_overwritten_by_replay() {
    let root = tempfile::tempdir().unwrap();
    let disk = Disk::open(root.path(), DiskOptions::default()).unwrap();
    let dir = store_dir(root.path(), 0);
    let old = Store::open_on(&disk, &dir, opts()).unwrap();
    for i in 0..200 {
        let key = format!("old-{i}");
        old.put_blob(key.as_bytes(), meta(&key), &[content(&key, 500)])
            .unwrap();
    }
    old.close().unwrap();
    drop(old);
    disk.rotate_journal().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let new = Store::open_on(&disk, &dir, opts()).unwrap();
    // Records too large to batch (as a bulk bootstrap's): written to the segment, never to
    // the journal, so no later frame would repair what an old one overwrote.
    let keys: Vec<String> = (0..4).map(|i| format!("new-{i}")).collect();
    for key in &keys {
        new.put_blob(key.as_bytes(), meta(key), &[content(key, 100_000)])
            .unwrap();
    }
    // The process dies now: the journal and the segments are as they are (page cache kept).
    let after = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(root.path()).unwrap().flatten() {
        let name = entry.file_name().into_string().unwrap();
        if name.starts_with("journal-") {
            std::fs::copy(entry.path(), after.path().join(&name)).unwrap();
        }
    }
    let copied = store_dir(after.path(), 0);
    std::fs::create_dir_all(&copied).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        if entry.file_type().unwrap().is_file() && entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), copied.join(entry.file_name())).unwrap();
        }
    }
    drop(new);
    let disk = Disk::open(after.path(), DiskOptions::default()).unwrap();
    let store = Store::open_on(&disk, &copied, opts()).unwrap();
    assert_eq!(store.stats().corrupt_records_found, 0);
    for key in &keys {
        assert_eq!(read(&store, key), Some(content(key, 100_000)), "{key}");
    }
    assert!(read(&store, "old-0").is_none());
}

/// A store deleted and created again at the same path on a running disk (a storage node given a
/// partition back after it retired its replica): once the journal was rotated, a crash's replay
/// writes none of the old store's frames into the new store's segments.
#[test]
fn a_store_created_again_after_a_journal_rotation_gets_no_old_frames() {
    let root = tempfile::tempdir().unwrap();
    let disk = Disk::open(root.path(), DiskOptions::default()).unwrap();
    let dir = store_dir(root.path(), 0);
    let old = Store::open_on(&disk, &dir, opts()).unwrap();
    for i in 0..20 {
        let key = format!("old{i}");
        let body = content(&key, 3000);
        old.put_blob(key.as_bytes(), meta(&key), &[body]).unwrap();
    }
    old.close().unwrap();
    drop(old);
    std::fs::remove_dir_all(&dir).unwrap();
    disk.rotate_journal().unwrap();
    let new = Store::open_on(&disk, &dir, opts()).unwrap();
    let mut kept = Vec::new();
    for i in 0..20 {
        let key = format!("new{i}");
        let body = content(&key, 2000 + i * 10);
        new.put_blob(key.as_bytes(), meta(&key), std::slice::from_ref(&body))
            .unwrap();
        kept.push((key, body));
    }
    // A crash now: the journal is replayed into the new store's segments.
    let crashed = tempfile::tempdir().unwrap();
    copy_tree(root.path(), crashed.path());
    let disk2 = Disk::open(crashed.path(), DiskOptions::default()).unwrap();
    let store2 = Store::open_on(&disk2, store_dir(crashed.path(), 0), opts()).unwrap();
    assert_eq!(store2.stats().corrupt_records_found, 0);
    for (key, body) in &kept {
        assert_eq!(read(&store2, key).as_deref(), Some(&body[..]), "{key}");
    }
    assert_eq!(read(&store2, "old0"), None);
}

#[test]
fn large_records_past_a_rounds_budget_sync_their_segments_instead_of_the_journal() {
    let root = tempfile::tempdir().unwrap();
    let (disk, stores) = open_with_rounds_apart(root.path(), 300);
    stores[0]
        .put_blob(b"first", meta("first"), &[content("first", 10)])
        .unwrap();
    let journal_len = || {
        let file = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_str().unwrap().ends_with(".jnl"))
            .unwrap();
        std::fs::metadata(file).unwrap().len()
    };
    let (before, journaled_before) = (disk.stats(), journal_len());
    // 16 x 100 KB in one round: past the 1 MiB a round journals, so none is journaled and each
    // store's segment is synced once. One record of 1.5 MiB is never journaled.
    let keys: Vec<(usize, String, usize)> = (0..16)
        .map(|i| (i % STORES, format!("large-{i}"), 100_000))
        .chain(std::iter::once((3, "huge".to_string(), 1_500_000)))
        .collect();
    let commits: Vec<_> = keys
        .iter()
        .map(|(s, key, len)| {
            stores[*s].begin_put_blob(key.as_bytes(), meta(key), &[content(key, *len)])
        })
        .collect();
    for commit in commits {
        assert_eq!(commit.wait().unwrap(), PutOutcome::Stored);
    }
    let after = disk.stats();
    assert!(
        after.segment_syncs - before.segment_syncs >= STORES as u64,
        "{before:?} {after:?}"
    );
    assert!(
        journal_len() - journaled_before < 100_000,
        "large records were journaled: {} bytes",
        journal_len() - journaled_before
    );
    for (s, key, len) in &keys {
        assert_eq!(read(&stores[*s], key), Some(content(key, *len)), "{key}");
    }
}

/// A round journals a large record and a batch written after it in the same log: the journal
/// must hold them in log order, since replay stops a log at the first frame past its segment's
/// end (a batch frame ahead of the large one made replay skip it, and all after it).
#[test]
fn a_small_record_after_a_journaled_large_one_in_its_round_survives_a_power_loss() {
    let root = tempfile::tempdir().unwrap();
    let (disk, stores) = open_with_rounds_apart(root.path(), 300);
    let dir = store_dir(root.path(), 0);
    let synced = segment_len(&dir);
    let store = &stores[0];
    store
        .put_blob(b"first", meta("first"), &[content("first", 10)])
        .unwrap();
    let large = store.begin_put_blob(b"large", meta("large"), &[content("large", 100_000)]);
    let small = store.begin_put_blob(b"small", meta("small"), &[content("small", 700)]);
    assert_eq!(large.wait().unwrap(), PutOutcome::Stored);
    assert_eq!(small.wait().unwrap(), PutOutcome::Stored);
    store
        .put_blob(b"later", meta("later"), &[content("later", 700)])
        .unwrap();
    assert_eq!(
        disk.stats().segment_syncs,
        0,
        "the large record was journaled"
    );
    // Power goes out: store 0's segment keeps only its header; the journal is all there is.
    let after = tempfile::tempdir().unwrap();
    power_loss_copy(root.path(), after.path(), &[synced]);
    let disk = Disk::open(after.path(), DiskOptions::default()).unwrap();
    let store = Store::open_on(&disk, store_dir(after.path(), 0), opts()).unwrap();
    for (key, len) in [
        ("first", 10),
        ("large", 100_000),
        ("small", 700),
        ("later", 700),
    ] {
        assert_eq!(read(&store, key), Some(content(key, len)), "{key} lost");
    }
}
