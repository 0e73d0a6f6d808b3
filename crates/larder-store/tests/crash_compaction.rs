//! Crash test of compaction: a child process (this test binary, re-executed) runs writers that
//! put and delete blobs on two stores of one disk while a thread compacts them over and over
//! (rate-limited, so a pass takes a while); the parent SIGKILLs it at a random moment, most of
//! the time in the middle of a pass (scanning, copying, or swapping a generation in), reopens
//! the disk and the stores and checks that every acknowledged put that was not deleted is there
//! with its bytes, every acknowledged delete holds, nothing deleted came back, nothing is
//! corrupt, and no compaction leftover remains. Several rounds on the same directories, so later
//! rounds compact what earlier ones recovered.

mod common;

use common::{blob_size, content};

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use larder_store::*;
use rand::Rng;

const CHILD_ENV: &str = "LARDER_COMPACTION_CRASH_CHILD_DIR";
const ROUND_ENV: &str = "LARDER_COMPACTION_CRASH_ROUND";
const STORES: usize = 2;
const WRITERS: usize = 4;

fn opts() -> Options {
    Options {
        segment_size: 256 << 10,
        checkpoint_every_records: 300,
        ..Options::default()
    }
}

fn store_dir(root: &Path, s: usize) -> PathBuf {
    root.join(format!("p{s}"))
}

fn open(root: &Path) -> (Disk, Vec<Store>) {
    let disk = Disk::open(
        root,
        DiskOptions {
            journal_file_size: 1 << 20,
            ..DiskOptions::default()
        },
    )
    .unwrap();
    let stores = (0..STORES)
        .map(|s| Store::open_on(&disk, store_dir(root, s), opts()).unwrap())
        .collect();
    (disk, stores)
}

fn say(line: String) {
    let out = std::io::stdout();
    let mut out = out.lock();
    // Marked: the test harness may print its own words before the first line.
    writeln!(out, "@@ {line} END").unwrap();
    out.flush().unwrap();
}

/// Child mode: only does anything when re-executed by `sigkill_mid_compaction_loses_nothing`.
#[test]
fn compaction_crash_child_process() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let round: u64 = std::env::var(ROUND_ENV).unwrap().parse().unwrap();
    let (_disk, stores) = open(Path::new(&dir));
    let compactor = {
        let stores = stores.clone();
        std::thread::spawn(move || compact_forever(&stores))
    };
    let writers: Vec<_> = (0..WRITERS)
        .map(|t| {
            let stores = stores.clone();
            std::thread::spawn(move || child_writer(&stores, round, t))
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    compactor.join().unwrap();
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Passes back to back, each announced and its end reported, at 8 MB/s so that copying takes
/// most of a pass; every other pass seals the active segment first (an operator's pass).
fn compact_forever(stores: &[Store]) {
    for pass in 0u64.. {
        for (s, store) in stores.iter().enumerate() {
            say(format!("PASS {pass} {s}"));
            let report = store
                .compact(&CompactOptions {
                    min_garbage_ratio: 0.2,
                    now_ms: now_ms(),
                    seal_active: pass % 2 == 0,
                    max_bytes_per_sec: 8_000_000,
                    // Every tombstone the put count allows goes too, so kills land in passes
                    // that drop them: a deleted key must stay deleted after each one.
                    tombstone_horizon: Some(u64::MAX),
                    tombstone_retention_ms: 0,
                })
                .unwrap();
            assert_eq!(report.corrupt_records_dropped, 0);
            say(format!(
                "DONE {pass} {s} {} {}",
                report.segments_compacted, report.tombstones_dropped
            ));
        }
    }
}

fn child_writer(stores: &[Store], round: u64, t: usize) {
    let mut rng = rand::rng();
    let mut mine: Vec<(usize, String)> = Vec::new();
    for i in 0u64.. {
        // Deletes are frequent, so that most segments are mostly garbage.
        if rng.random_range(0..3) == 0 && !mine.is_empty() {
            let (s, key) = mine.swap_remove(rng.random_range(0..mine.len()));
            // Announced first: a delete the kill cuts short may still be durable.
            say(format!("DEL {s} {key}"));
            stores[s].delete_blob(key.as_bytes(), i).unwrap();
            say(format!("ACK DEL {s} {key}"));
            continue;
        }
        let s = rng.random_range(0..STORES);
        let size = if rng.random_range(0..8) == 0 {
            rng.random_range(65_000..150_000)
        } else {
            rng.random_range(0..4000)
        };
        // Some blobs are expired already: compaction drops them (then they are not found).
        let expiring = rng.random_range(0..10) == 0;
        let tag = if expiring { "x" } else { "b" };
        let key = format!("{tag}/{round}/{t}/{i}/{size}");
        let meta = BlobMeta {
            props: Bytes::from(key.clone()),
            time_ms: i,
            expires_ms: expiring.then_some(1),
        };
        let data = Bytes::from(content(key.as_bytes(), size));
        assert_eq!(
            stores[s].put_blob(key.as_bytes(), meta, &[data]).unwrap(),
            PutOutcome::Stored
        );
        say(format!("ACK PUT {s} {key}"));
        if !expiring {
            mine.push((s, key));
        }
    }
}

/// What the child acknowledged, and whether it died in the middle of a compaction pass.
#[derive(Default)]
struct Seen {
    puts: Vec<(usize, String)>,
    dels: Vec<(usize, String)>,
    /// Deletes begun, acknowledged or not.
    deleting: std::collections::HashSet<(usize, String)>,
    killed_mid_pass: bool,
    segments_compacted: u64,
    tombstones_dropped: u64,
}

impl Seen {
    fn record(&mut self, line: &str) {
        let Some(body) = line
            .split_once("@@ ")
            .and_then(|(_, l)| l.strip_suffix(" END"))
        else {
            return; // cut short by the kill: never a complete line
        };
        let parts: Vec<&str> = body.split(' ').collect();
        match parts[..] {
            ["ACK", "PUT", s, key] => self.puts.push((s.parse().unwrap(), key.to_owned())),
            ["ACK", "DEL", s, key] => self.dels.push((s.parse().unwrap(), key.to_owned())),
            ["DEL", s, key] => {
                self.deleting.insert((s.parse().unwrap(), key.to_owned()));
            }
            ["PASS", ..] => self.killed_mid_pass = true,
            ["DONE", _, _, compacted, tombstones] => {
                self.killed_mid_pass = false;
                self.segments_compacted += compacted.parse::<u64>().unwrap();
                self.tombstones_dropped += tombstones.parse::<u64>().unwrap();
            }
            _ => panic!("bad line {line:?}"),
        }
    }
}

fn read_all(store: &Store, rec: &BlobRecord) -> Vec<u8> {
    let pieces: Result<Vec<Bytes>> = store.read_blob(rec, 0..u64::MAX).unwrap().collect();
    pieces.unwrap().concat()
}

fn verify(root: &Path, stores: &[Store], seen: &Seen) {
    for (s, store) in stores.iter().enumerate() {
        assert_eq!(store.stats().corrupt_records_found, 0, "store {s}");
        let names: Vec<String> = std::fs::read_dir(store_dir(root, s))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.iter().any(|n| n.ends_with(".tmp")),
            "a rewrite's leftover survived reopening: {names:?}"
        );
        let mut ids: Vec<&str> = names
            .iter()
            .filter(|n| n.starts_with("seg-"))
            .map(|n| &n[4..12])
            .collect();
        let all = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), all, "two generations of one segment: {names:?}");
        // Whatever the feed still has carries exactly the bytes its key implies.
        for c in store.changes(Cursor::START, usize::MAX).unwrap().changes {
            if let BlobLookup::Found(rec) = store.get_blob(&c.key, 0).unwrap() {
                let key = std::str::from_utf8(&c.key).unwrap();
                assert_eq!(read_all(store, &rec), content(&c.key, blob_size(key)));
            }
        }
    }
    let deleted: std::collections::HashSet<&(usize, String)> = seen.dels.iter().collect();
    for entry in &seen.puts {
        let (s, key) = entry;
        let found = stores[*s].get_blob(key.as_bytes(), 0).unwrap();
        match found {
            BlobLookup::Found(rec) => {
                assert!(!deleted.contains(entry), "deleted {key} came back");
                assert_eq!(
                    read_all(&stores[*s], &rec),
                    content(key.as_bytes(), blob_size(key))
                );
            }
            // Deleted by us (acknowledged, or cut short by the kill after it was durable); once
            // its tombstone is dropped, not found at all.
            BlobLookup::Deleted { .. } => {}
            BlobLookup::NotFound if seen.deleting.contains(entry) => {}
            // Expired blobs are dropped by compaction; no other put may go missing.
            BlobLookup::NotFound if key.starts_with("x/") => {}
            other => panic!("acknowledged put {key} on store {s} lost: {other:?}"),
        }
    }
    for (s, key) in &seen.dels {
        let found = stores[*s].get_blob(key.as_bytes(), 0).unwrap();
        assert!(
            matches!(found, BlobLookup::Deleted { .. } | BlobLookup::NotFound),
            "acknowledged delete {key} on store {s} lost: {found:?}"
        );
    }
}

#[test]
fn sigkill_mid_compaction_loses_nothing() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut seen = Seen::default();
    let mut rng = rand::rng();
    let rounds = 10u64;
    let mut mid_pass = 0;
    for round in 1..=rounds {
        let kill_after = Duration::from_millis(rng.random_range(150..900));
        let round_text = round.to_string();
        let envs = [
            (CHILD_ENV, dir.path().as_os_str()),
            (ROUND_ENV, OsStr::new(&round_text)),
        ];
        let lines = common::run_and_kill("compaction_crash_child_process", &envs, kill_after);
        seen.killed_mid_pass = false;
        lines.iter().for_each(|l| seen.record(l));
        mid_pass += seen.killed_mid_pass as u32;
        let (disk, stores) = open(dir.path());
        verify(dir.path(), &stores, &seen);
        drop(stores);
        drop(disk);
    }
    assert!(
        seen.puts.len() > 200 && seen.dels.len() > 50,
        "too few writes acknowledged to mean anything: {} puts, {} deletes",
        seen.puts.len(),
        seen.dels.len()
    );
    eprintln!(
        "{} puts, {} deletes, {} segments compacted, {mid_pass} of {rounds} kills mid-pass",
        seen.puts.len(),
        seen.dels.len(),
        seen.segments_compacted
    );
    assert!(
        seen.tombstones_dropped > 0,
        "no pass dropped a tombstone: the kills never met the drop rule"
    );
    assert!(
        seen.segments_compacted >= 20,
        "too little compacted to mean anything: {}",
        seen.segments_compacted
    );
    assert!(
        mid_pass * 2 >= rounds as u32,
        "only {mid_pass} of {rounds} kills landed in a compaction pass"
    );
}
