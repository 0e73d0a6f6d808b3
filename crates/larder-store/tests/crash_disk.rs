//! Crash test of several stores on one disk (one journal, one commit thread): a child process
//! (this test binary, re-executed in child mode) runs concurrent writers over all the stores and
//! prints every acknowledged write; the parent SIGKILLs it at a random moment, reopens the disk
//! (replaying its journal) and the stores, and checks that every acknowledged write is there and
//! intact and that nothing stored carries wrong data. Several rounds on the same directories.

mod common;

use common::{blob_size, content};

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use larder_store::*;
use rand::Rng;

const CHILD_ENV: &str = "LARDER_DISK_CRASH_CHILD_DIR";
const ROUND_ENV: &str = "LARDER_DISK_CRASH_ROUND";
const STORES: usize = 4;
const WRITERS: usize = 8;

fn opts() -> Options {
    Options {
        segment_size: 1 << 20,
        checkpoint_every_records: 500,
        ..Options::default()
    }
}

fn disk_opts() -> DiskOptions {
    // Small journal files, so rotations (and their segment syncs) happen under the kill too.
    DiskOptions {
        journal_file_size: 512 << 10,
        ..DiskOptions::default()
    }
}

fn store_dir(root: &Path, s: usize) -> PathBuf {
    root.join(format!("p{s}"))
}

fn open(root: &Path) -> (Disk, Vec<Store>) {
    let disk = Disk::open(root, disk_opts()).unwrap();
    let stores = (0..STORES)
        .map(|s| Store::open_on(&disk, store_dir(root, s), opts()).unwrap())
        .collect();
    (disk, stores)
}

/// Child mode: only does anything when re-executed by `crash_of_many_stores_on_one_disk`.
#[test]
fn disk_crash_child_process() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let round: u64 = std::env::var(ROUND_ENV).unwrap().parse().unwrap();
    let (_disk, stores) = open(Path::new(&dir));
    let writers: Vec<_> = (0..WRITERS)
        .map(|t| {
            let stores = stores.clone();
            std::thread::spawn(move || child_writer(&stores, round, t))
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
}

fn ack(line: String) {
    let out = std::io::stdout();
    let mut out = out.lock();
    writeln!(out, "ACK {line} END").unwrap();
    out.flush().unwrap();
}

fn child_writer(stores: &[Store], round: u64, t: usize) {
    let mut rng = rand::rng();
    let mut mine: Vec<(usize, String)> = Vec::new();
    for i in 0u64.. {
        let s = rng.random_range(0..STORES);
        if rng.random_range(0..8) == 0 {
            if let Some((s, key)) = mine.pop() {
                stores[s].delete_blob(key.as_bytes(), i).unwrap();
                ack(format!("DEL {s} {key}"));
            }
            continue;
        }
        let size = if rng.random_range(0..6) == 0 {
            rng.random_range(65_000..200_000)
        } else {
            rng.random_range(0..3000)
        };
        let key = format!("b/{round}/{t}/{i}/{size}");
        let meta = BlobMeta {
            props: Bytes::from(key.clone()),
            time_ms: i,
            expires_ms: None,
        };
        let data = Bytes::from(content(key.as_bytes(), size));
        assert_eq!(
            stores[s].put_blob(key.as_bytes(), meta, &[data]).unwrap(),
            PutOutcome::Stored
        );
        ack(format!("PUT {s} {key}"));
        mine.push((s, key));
    }
}

#[derive(Default)]
struct Acked {
    puts: Vec<(usize, String)>,
    dels: Vec<(usize, String)>,
}

impl Acked {
    fn record(&mut self, line: &str) {
        let Some(body) = line
            .strip_prefix("ACK ")
            .and_then(|l| l.strip_suffix(" END"))
        else {
            return; // cut short by the kill: never a complete acknowledgement
        };
        let parts: Vec<&str> = body.split(' ').collect();
        let entry = (parts[1].parse().unwrap(), parts[2].to_string());
        match parts[0] {
            "PUT" => self.puts.push(entry),
            "DEL" => self.dels.push(entry),
            _ => panic!("bad ack line {line:?}"),
        }
    }
}

fn run_child(dir: &Path, round: u64, kill_after: Duration, acked: &mut Acked) {
    let round = round.to_string();
    let envs = [
        (CHILD_ENV, dir.as_os_str()),
        (ROUND_ENV, OsStr::new(&round)),
    ];
    let lines = common::run_and_kill("disk_crash_child_process", &envs, kill_after);
    lines.iter().for_each(|l| acked.record(l));
}

fn read_all(store: &Store, rec: &BlobRecord) -> Vec<u8> {
    let pieces: Result<Vec<Bytes>> = store.read_blob(rec, 0..u64::MAX).unwrap().collect();
    pieces.unwrap().concat()
}

fn verify(stores: &[Store], acked: &Acked) {
    for (s, store) in stores.iter().enumerate() {
        assert_eq!(
            store.stats().corrupt_records_found,
            0,
            "store {s}: a crash must not look like corruption"
        );
        // Every record in the feed, acknowledged or not, carries exactly the data its key implies.
        for c in store.changes(Cursor::START, usize::MAX).unwrap().changes {
            let key = std::str::from_utf8(&c.key).unwrap();
            if let BlobLookup::Found(rec) = store.get_blob(&c.key, 0).unwrap() {
                assert_eq!(read_all(store, &rec), content(&c.key, blob_size(key)));
            }
        }
    }
    for (s, key) in &acked.puts {
        match stores[*s].get_blob(key.as_bytes(), 0).unwrap() {
            BlobLookup::Found(rec) => assert_eq!(
                read_all(&stores[*s], &rec),
                content(key.as_bytes(), blob_size(key))
            ),
            BlobLookup::Deleted { .. } => {}
            other => panic!("acknowledged put {key} on store {s} lost: {other:?}"),
        }
    }
    for (s, key) in &acked.dels {
        assert!(
            matches!(
                stores[*s].get_blob(key.as_bytes(), 0).unwrap(),
                BlobLookup::Deleted { .. }
            ),
            "acked delete {key} on store {s} lost"
        );
    }
}

#[test]
fn crash_of_many_stores_on_one_disk() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut acked = Acked::default();
    let mut rng = rand::rng();
    for round in 1..=6u64 {
        let delay = Duration::from_millis(if round.is_multiple_of(3) {
            rng.random_range(5..60)
        } else {
            rng.random_range(200..900)
        });
        run_child(dir.path(), round, delay, &mut acked);
        let (disk, stores) = open(dir.path());
        verify(&stores, &acked);
        if round.is_multiple_of(2) {
            stores.iter().for_each(|s| s.close().unwrap());
        }
        drop(stores);
        drop(disk);
    }
    assert!(
        acked.puts.len() > 50,
        "too few writes acknowledged to mean anything: {}",
        acked.puts.len()
    );
}
