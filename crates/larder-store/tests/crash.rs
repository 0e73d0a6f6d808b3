//! Crash test: a child process (this test binary, re-executed in child mode) runs concurrent
//! writers and prints every acknowledged write; the parent SIGKILLs it at a random moment,
//! reopens the store and checks that every acknowledged write is there and intact, and that
//! nothing in the store carries wrong data. Several rounds on the same directory, so some kills
//! land during recovery or right after it.

mod common;

use common::{blob_size, content};

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Write;
use std::time::{Duration, Instant};

use bytes::Bytes;
use larder_store::*;
use rand::Rng;

const CHILD_ENV: &str = "LARDER_CRASH_CHILD_DIR";
const ROUND_ENV: &str = "LARDER_CRASH_ROUND";
const WRITERS: usize = 8;
const DOC_KEYS: u64 = 4;

fn opts() -> Options {
    Options {
        segment_size: 1 << 20,
        checkpoint_every_records: 300,
        ..Options::default()
    }
}

/// Which op a document version stands for, so the parent can check writes it never saw acked.
fn doc_is_remove(version: u64) -> bool {
    version.is_multiple_of(5)
}

/// Child mode: only does anything when re-executed by `crash_recovery_keeps_acknowledged_writes`.
#[test]
fn crash_child_process() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let round: u64 = std::env::var(ROUND_ENV).unwrap().parse().unwrap();
    let store = Store::open(&dir, opts()).unwrap();
    let writers: Vec<_> = (0..WRITERS)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || child_writer(&store, round, t as u64))
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

fn child_writer(store: &Store, round: u64, t: u64) {
    let mut rng = rand::rng();
    let mut mine = Vec::new();
    let mut version = round * 1_000_000;
    for i in 0.. {
        match rng.random_range(0..12) {
            10 | 11 => child_bulk(store, round, t, i, &mut rng, &mut mine),
            0..=4 => {
                let size = if rng.random_bool(0.5) {
                    rng.random_range(0..2000)
                } else {
                    rng.random_range(60_000..250_000)
                };
                let key = format!("b/{round}/{t}/{i}/{size}");
                let data = content(key.as_bytes(), size);
                let cut = rng.random_range(0..=size);
                let chunks = [
                    Bytes::copy_from_slice(&data[..cut]),
                    Bytes::copy_from_slice(&data[cut..]),
                ];
                let meta = BlobMeta {
                    props: Bytes::from(key.clone()),
                    time_ms: i,
                    expires_ms: None,
                };
                assert_eq!(
                    store.put_blob(key.as_bytes(), meta, &chunks).unwrap(),
                    PutOutcome::Stored
                );
                ack(format!("PUT {key}"));
                mine.push(key);
            }
            5 => {
                let key = match mine.pop() {
                    Some(k) if rng.random_bool(0.7) => k,
                    _ => format!("x/{round}/{t}/{i}"),
                };
                store.delete_blob(key.as_bytes(), i).unwrap();
                ack(format!("DEL {key}"));
            }
            _ => {
                version += 1;
                let key = format!("d/{t}/{}", rng.random_range(0..DOC_KEYS));
                let outcome = if doc_is_remove(version) {
                    store.remove_doc(key.as_bytes(), version, i).unwrap()
                } else {
                    let json = content(
                        format!("{key}@{version}").as_bytes(),
                        (version % 3000) as usize,
                    );
                    store
                        .put_doc(key.as_bytes(), version, i, Bytes::from(json))
                        .unwrap()
                };
                assert_eq!(outcome, DocOutcome::Applied);
                ack(format!("DOC {key} {version}"));
            }
        }
    }
}

/// A bulk batch (`Store::bulk`) of blob puts and deletes, each acknowledged once the batch's
/// commit resolved: the bulk path's records must survive a kill like single writes.
fn child_bulk(
    store: &Store,
    round: u64,
    t: u64,
    i: u64,
    rng: &mut impl Rng,
    mine: &mut Vec<String>,
) {
    let mut records = Vec::new();
    let mut acks = Vec::new();
    for j in 0..rng.random_range(1..40) {
        if j % 7 == 6 {
            if let Some(key) = mine.pop() {
                records.push(BulkRecord::DeleteBlob {
                    key: Bytes::from(key.clone()),
                    time_ms: i,
                });
                acks.push(format!("DEL {key}"));
                continue;
            }
        }
        let size = if rng.random_bool(0.8) {
            rng.random_range(0..2000)
        } else {
            rng.random_range(60_000..250_000)
        };
        let key = format!("b/{round}/{t}/{i}.{j}/{size}");
        records.push(BulkRecord::PutBlob {
            key: Bytes::from(key.clone()),
            meta: BlobMeta {
                props: Bytes::from(key.clone()),
                time_ms: i,
                expires_ms: None,
            },
            data: Bytes::from(content(key.as_bytes(), size)),
        });
        acks.push(format!("PUT {key}"));
        mine.push(key);
    }
    let outcomes = store.bulk(records).unwrap();
    assert!(outcomes.iter().all(|o| matches!(
        o,
        Ok(BulkOutcome::Put(PutOutcome::Stored) | BulkOutcome::Delete(DeleteOutcome::Deleted))
    )));
    acks.into_iter().for_each(ack);
}

/// Everything the parent has seen acknowledged, over all rounds.
#[derive(Default)]
struct Acked {
    puts: Vec<String>,
    dels: Vec<String>,
    docs: HashMap<String, u64>,
}

impl Acked {
    fn record(&mut self, line: &str) {
        // A line cut short by the kill has no END and was never a complete acknowledgement.
        let Some(body) = line
            .strip_prefix("ACK ")
            .and_then(|l| l.strip_suffix(" END"))
        else {
            return;
        };
        let parts: Vec<&str> = body.split(' ').collect();
        match parts[..] {
            ["PUT", key] => self.puts.push(key.to_string()),
            ["DEL", key] => self.dels.push(key.to_string()),
            ["DOC", key, v] => {
                let v: u64 = v.parse().unwrap();
                let e = self.docs.entry(key.to_string()).or_default();
                *e = (*e).max(v);
            }
            _ => panic!("bad ack line {line:?}"),
        }
    }
}

fn run_child(dir: &std::path::Path, round: u64, kill_after: Duration, acked: &mut Acked) -> usize {
    let round = round.to_string();
    let envs = [
        (CHILD_ENV, dir.as_os_str()),
        (ROUND_ENV, OsStr::new(&round)),
    ];
    let lines = common::run_and_kill("crash_child_process", &envs, kill_after);
    lines.iter().for_each(|l| acked.record(l));
    lines.len()
}

fn read_all(store: &Store, rec: &BlobRecord) -> Vec<u8> {
    let pieces: Result<Vec<Bytes>> = store.read_blob(rec, 0..u64::MAX).unwrap().collect();
    pieces.unwrap().concat()
}

fn verify(store: &Store, acked: &Acked) {
    assert_eq!(
        store.stats().corrupt_records_found,
        0,
        "a crash must not look like corruption"
    );
    for key in &acked.puts {
        match store.get_blob(key.as_bytes(), 0).unwrap() {
            BlobLookup::Found(rec) => assert_eq!(
                read_all(store, &rec),
                content(key.as_bytes(), blob_size(key))
            ),
            BlobLookup::Deleted { .. } => {} // a delete of it may have landed without its ack
            other => panic!("acknowledged put {key} lost: {other:?}"),
        }
    }
    for key in &acked.dels {
        assert!(
            matches!(
                store.get_blob(key.as_bytes(), 0).unwrap(),
                BlobLookup::Deleted { .. }
            ),
            "acked delete {key} lost"
        );
    }
    for (key, &version) in &acked.docs {
        let got = match store.get_doc(key.as_bytes()).unwrap() {
            DocLookup::Found { version, .. } | DocLookup::Removed { version, .. } => version,
            DocLookup::NotFound => 0,
        };
        assert!(
            got >= version,
            "doc {key}: acked version {version}, store has {got}"
        );
    }
    verify_everything_stored(store);
}

/// Every record in the feed, acknowledged or not, must carry exactly the data its key implies.
fn verify_everything_stored(store: &Store) {
    let changes = store.changes(Cursor::START, usize::MAX).unwrap().changes;
    for c in changes {
        let key = std::str::from_utf8(&c.key).unwrap();
        match c.op {
            Op::PutBlob => {
                assert_eq!(c.size as usize, blob_size(key));
                if let BlobLookup::Found(rec) = store.get_blob(&c.key, 0).unwrap() {
                    assert_eq!(rec.meta.props, Bytes::copy_from_slice(&c.key));
                    assert_eq!(
                        read_all(store, &rec),
                        content(&c.key, blob_size(key)),
                        "blob {key}"
                    );
                }
            }
            Op::DeleteBlob => assert!(matches!(
                store.get_blob(&c.key, 0).unwrap(),
                BlobLookup::Deleted { .. }
            )),
            Op::PutDoc | Op::RemoveDoc => {
                assert_eq!(c.op == Op::RemoveDoc, doc_is_remove(c.version))
            }
        }
    }
    store.for_each_doc(&mut |key, version| {
        let DocLookup::Found { json, .. } = store.get_doc(key).unwrap() else {
            panic!("live doc not found")
        };
        let key = std::str::from_utf8(key).unwrap();
        assert_eq!(
            json,
            content(
                format!("{key}@{version}").as_bytes(),
                (version % 3000) as usize
            )
        );
        true
    });
}

#[test]
fn crash_recovery_keeps_acknowledged_writes() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let mut acked = Acked::default();
    let mut rng = rand::rng();
    let mut total_lines = 0;
    for round in 1..=8u64 {
        // Short delays kill the child during open/recovery; long ones mid-stream.
        let delay = Duration::from_millis(if round.is_multiple_of(4) {
            rng.random_range(5..60)
        } else {
            rng.random_range(150..900)
        });
        total_lines += run_child(dir.path(), round, delay, &mut acked);
        let store = Store::open(dir.path(), opts()).unwrap();
        verify(&store, &acked);
        if round.is_multiple_of(2) {
            store.close().unwrap();
        }
    }
    assert!(
        acked.puts.len() > 50 && !acked.docs.is_empty(),
        "too few writes acknowledged to mean anything: {}",
        acked.puts.len()
    );
    eprintln!(
        "crash test: {total_lines} acks ({} puts, {} deletes, {} doc keys) in {:?}",
        acked.puts.len(),
        acked.dels.len(),
        acked.docs.len(),
        started.elapsed()
    );
}
