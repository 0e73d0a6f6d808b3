//! Log store benchmark: durable puts/s at several record sizes and writer counts, next to `dd`
//! with `conv=fdatasync` on the same disk; 32 stores on one disk with 256 writers spread over
//! them (as a storage node hosts its partitions), with the disk's fdatasyncs per second; and
//! recovery time of a replica holding 1M small records (with a checkpoint and with a full
//! replay). Prints markdown. `LARDER_BENCH_ONLY_DISK=1` runs only the 32-store row.
//!
//! Usage: `store_bench DIR [SECONDS_PER_CELL]` (DIR must be on the disk under test, not tmpfs).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use larder_store::{BlobMeta, Disk, DiskOptions, Durability, Options, PutOutcome, Store};

const SIZES: [(usize, &str); 3] = [(1 << 10, "1 KiB"), (64 << 10, "64 KiB"), (4 << 20, "4 MiB")];
const WRITERS: [usize; 3] = [1, 16, 256];
const RECOVERY_RECORDS: u64 = 1_000_000;

/// Records in the recovery replica: 1 million unless `LARDER_BENCH_RECOVERY_RECORDS` says
/// otherwise (the smoke run uses a few thousand).
fn recovery_records() -> u64 {
    std::env::var("LARDER_BENCH_RECOVERY_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(RECOVERY_RECORDS)
}

/// 4 MiB blocks dd writes: 256 (1 GiB) unless `LARDER_BENCH_DD_COUNT` says otherwise.
fn dd_count() -> String {
    std::env::var("LARDER_BENCH_DD_COUNT").unwrap_or_else(|_| "256".into())
}

/// Writer counts per record size: 1, 16 and 256 unless `LARDER_BENCH_WRITERS=256,...` says
/// otherwise (for experiments).
fn writer_counts() -> Vec<usize> {
    std::env::var("LARDER_BENCH_WRITERS")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.parse().ok()).collect())
        .unwrap_or_else(|| WRITERS.to_vec())
}

struct Cell {
    size: usize,
    writers: usize,
    puts_per_s: f64,
    mb_per_s: f64,
    records_per_sync: f64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let root = PathBuf::from(
        args.get(1)
            .expect("usage: store_bench DIR [SECONDS] [REPS]"),
    );
    let secs: f64 = args.get(2).map_or(3.0, |s| s.parse().expect("seconds"));
    let reps: usize = args.get(3).map_or(3, |s| s.parse().expect("repetitions"));
    std::fs::create_dir_all(&root).unwrap();
    if std::env::var("LARDER_BENCH_ONLY_DISK").is_ok_and(|v| v == "1") {
        let shared = disk_row(&root, secs, reps);
        report_disk(&shared);
        return;
    }
    // This VM's disk and memory are noisy (first touch of fresh guest memory is slow, other
    // builds share the 2 cores), so dd and every cell run `reps` times and the median counts.
    let dd: Vec<f64> = (0..reps).map(|_| dd_mb_per_s(&root)).collect();
    // For experiments: LARDER_BENCH_SIZES=4194304 runs only those sizes; empty skips the puts.
    let sizes = std::env::var("LARDER_BENCH_SIZES").ok();
    let only: Option<Vec<usize>> = sizes
        .as_deref()
        .map(|v| v.split(',').filter_map(|s| s.parse().ok()).collect());
    let mut cells = Vec::new();
    for (size, _) in SIZES
        .into_iter()
        .filter(|(s, _)| only.as_ref().is_none_or(|o| o.contains(s)))
    {
        for writers in writer_counts() {
            let mut runs: Vec<Cell> = (0..reps)
                .map(|r| {
                    put_cell(
                        &root.join(format!("puts-{size}-{writers}-{r}")),
                        size,
                        writers,
                        Duration::from_secs_f64(secs),
                    )
                })
                .collect();
            runs.sort_by(|a, b| a.puts_per_s.total_cmp(&b.puts_per_s));
            let all: Vec<String> = runs
                .iter()
                .map(|c| format!("{:.0}", c.puts_per_s))
                .collect();
            eprintln!("{size} B x {writers}: puts/s {}", all.join(" "));
            cells.push(runs.swap_remove(reps / 2));
        }
    }
    let shared = disk_row(&root, secs, reps);
    if only.as_ref().is_some_and(|o| !o.is_empty()) {
        report_disk(&shared);
        return;
    }
    let (with_ckpt, replay) = recovery(&root.join("recovery"));
    if only.is_some() {
        eprintln!("open (wall, cpu) with checkpoint {with_ckpt:?}, full replay {replay:?}");
        return;
    }
    report(&cells, &dd, with_ckpt, replay);
    report_disk(&shared);
}

/// Stores on one disk and writers spread over them, as a storage node runs its partitions.
const DISK_STORES: usize = 32;
const DISK_WRITERS: usize = 256;
const DISK_RECORD: usize = 1 << 10;

struct DiskCell {
    puts_per_s: f64,
    fdatasyncs_per_s: f64,
}

/// The 32-store row, `reps` times; the median by puts/s.
fn disk_row(root: &Path, secs: f64, reps: usize) -> DiskCell {
    let mut runs: Vec<DiskCell> = (0..reps)
        .map(|r| {
            disk_cell(
                &root.join(format!("disk-{r}")),
                Duration::from_secs_f64(secs),
            )
        })
        .collect();
    runs.sort_by(|a, b| a.puts_per_s.total_cmp(&b.puts_per_s));
    let all: Vec<String> = runs
        .iter()
        .map(|c| {
            format!(
                "{:.0} puts/s {:.0} fdatasyncs/s",
                c.puts_per_s, c.fdatasyncs_per_s
            )
        })
        .collect();
    eprintln!(
        "{DISK_STORES} stores x {DISK_WRITERS} writers: {}",
        all.join(", ")
    );
    runs.swap_remove(reps / 2)
}

/// Opens the stores of the row: every one on one disk, sharing its journal and commit rounds.
fn open_disk_stores(root: &Path) -> (Disk, Vec<Store>) {
    let disk = Disk::open(root, DiskOptions::default()).unwrap();
    let stores = (0..DISK_STORES)
        .map(|i| Store::open_on(&disk, root.join(format!("p{i}")), store_options()).unwrap())
        .collect();
    (disk, stores)
}

fn disk_cell(root: &Path, run: Duration) -> DiskCell {
    let (disk, stores) = open_disk_stores(root);
    let data = [Bytes::from(vec![7u8; DISK_RECORD])];
    let syncs_before = disk.stats().fdatasyncs();
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + run;
    let threads: Vec<_> = (0..DISK_WRITERS)
        .map(|t| {
            let (store, data, done) = (stores[t % DISK_STORES].clone(), data.clone(), done.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let key = format!("w{t}-{i}");
                    let meta = BlobMeta {
                        props: Bytes::new(),
                        time_ms: i,
                        expires_ms: None,
                    };
                    let put = store.put_blob(key.as_bytes(), meta, &data).unwrap();
                    assert_eq!(put, PutOutcome::Stored);
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let elapsed = start.elapsed().as_secs_f64();
    let syncs = disk.stats().fdatasyncs() - syncs_before;
    drop(stores);
    drop(disk);
    std::fs::remove_dir_all(root).unwrap();
    DiskCell {
        puts_per_s: done.load(Ordering::Relaxed) as f64 / elapsed,
        fdatasyncs_per_s: syncs as f64 / elapsed,
    }
}

fn report_disk(c: &DiskCell) {
    println!();
    println!(
        "| {DISK_STORES} stores on one disk, {DISK_WRITERS} writers spread over them, 1 KiB | durable puts/s | fdatasyncs/s (disk) | puts per fdatasync |"
    );
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| this build | {:.0} | {:.0} | {:.1} |",
        c.puts_per_s,
        c.fdatasyncs_per_s,
        c.puts_per_s / c.fdatasyncs_per_s.max(f64::MIN_POSITIVE)
    );
}

fn store_options() -> Options {
    Options {
        durability: Durability::Durable,
        ..Options::default()
    }
}

/// Runs `writers` threads putting `size`-byte blobs for about `run`; every put is durable.
fn put_cell(dir: &Path, size: usize, writers: usize, run: Duration) -> Cell {
    let store = Store::open(dir, store_options()).unwrap();
    // One buffer shared by all writers, handed over as 64 KiB chunks like a streamed upload.
    let data = Bytes::from(
        (0..size)
            .map(|i| (i * 131 % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    let chunks: Arc<Vec<Bytes>> = Arc::new(
        (0..size)
            .step_by(64 << 10)
            .map(|s| data.slice(s..(s + (64 << 10)).min(size)))
            .collect(),
    );
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + run;
    let threads: Vec<_> = (0..writers)
        .map(|t| {
            let (store, chunks, done) = (store.clone(), chunks.clone(), done.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let key = format!("w{t}-{i}");
                    let meta = BlobMeta {
                        props: Bytes::new(),
                        time_ms: i,
                        expires_ms: None,
                    };
                    assert_eq!(
                        store.put_blob(key.as_bytes(), meta, &chunks).unwrap(),
                        PutOutcome::Stored
                    );
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let elapsed = start.elapsed().as_secs_f64();
    let stats = store.stats();
    drop(store);
    std::fs::remove_dir_all(dir).unwrap();
    let puts = done.load(Ordering::Relaxed) as f64;
    Cell {
        size,
        writers,
        puts_per_s: puts / elapsed,
        mb_per_s: puts * size as f64 / elapsed / 1e6,
        records_per_sync: stats.records_appended as f64 / stats.syncs.max(1) as f64,
    }
}

/// `dd if=/dev/zero of=F bs=4M count=256 conv=fdatasync`, in MB/s (10^6 bytes).
fn dd_mb_per_s(root: &Path) -> f64 {
    let file = root.join("dd.bin");
    let out = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", file.display()))
        .args(["bs=4M", &format!("count={}", dd_count()), "conv=fdatasync"])
        .output()
        .expect("run dd");
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&out.stderr);
    // "1073741824 bytes (1.1 GB, 1.0 GiB) copied, 2.03 s, 529 MB/s": recompute from bytes and seconds.
    let line = text
        .lines()
        .find(|l| l.contains("copied"))
        .unwrap_or_else(|| panic!("dd said: {text}"));
    let bytes: f64 = line.split_whitespace().next().unwrap().parse().unwrap();
    let secs: f64 = line
        .split(", ")
        .find(|p| p.ends_with(" s"))
        .unwrap()
        .trim_end_matches(" s")
        .parse()
        .unwrap();
    eprintln!("dd: {line}");
    bytes / secs / 1e6
}

/// Fills a replica with 1M ~100-byte records, then times `open` with its checkpoint and with a
/// full replay (checkpoint removed).
fn recovery(dir: &Path) -> ((f64, f64), (f64, f64)) {
    let opts = Options {
        durability: Durability::RelaxedNoSyncForBenchmarks,
        checkpoint_every_records: u64::MAX,
        ..Options::default()
    };
    let store = Store::open(dir, opts).unwrap();
    let data = [Bytes::from(vec![7u8; 100])];
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let (store, data) = (store.clone(), data.clone());
            std::thread::spawn(move || {
                for i in (t..recovery_records()).step_by(2) {
                    let meta = BlobMeta {
                        props: Bytes::new(),
                        time_ms: i,
                        expires_ms: None,
                    };
                    store
                        .put_blob(format!("key-{i:08}").as_bytes(), meta, &data)
                        .unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    store.close().unwrap();
    drop(store);
    let timed_open = || {
        let (start, cpu) = (Instant::now(), cpu_seconds());
        let store = Store::open(dir, store_options()).unwrap();
        let took = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu);
        assert_eq!(store.stats().live_keys, recovery_records());
        took
    };
    // Median of three opens each (no writes happen, so no new checkpoint appears in between).
    let median = |runs: &mut Vec<(f64, f64)>| {
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        runs[runs.len() / 2]
    };
    let with_ckpt = median(&mut (0..3).map(|_| timed_open()).collect());
    std::fs::remove_file(dir.join("index.ckpt")).unwrap();
    let replay = median(&mut (0..3).map(|_| timed_open()).collect());
    let _ = std::fs::remove_dir_all(dir);
    (with_ckpt, replay)
}

fn report(
    cells: &[Cell],
    dd_runs: &[f64],
    (with_ckpt, ckpt_cpu): (f64, f64),
    (replay, replay_cpu): (f64, f64),
) {
    let mut sorted = dd_runs.to_vec();
    sorted.sort_by(f64::total_cmp);
    let dd = sorted[sorted.len() / 2];
    let dd_all: Vec<String> = dd_runs.iter().map(|d| format!("{d:.0}")).collect();
    let name = |size| SIZES.iter().find(|(s, _)| *s == size).unwrap().1;
    println!("| record | writers | durable puts/s | MB/s | records per fdatasync |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for c in cells {
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.1} |",
            name(c.size),
            c.writers,
            c.puts_per_s,
            c.mb_per_s,
            c.records_per_sync
        );
    }
    let cell = |size, writers| {
        cells
            .iter()
            .find(|c| c.size == size && c.writers == writers)
            .unwrap()
    };
    let best_large = cells
        .iter()
        .filter(|c| c.size == 4 << 20)
        .map(|c| c.mb_per_s)
        .fold(0.0, f64::max);
    let scale = cell(1 << 10, 256).puts_per_s / cell(1 << 10, 1).puts_per_s;
    println!();
    println!("| measure | value | target | met |");
    println!("| --- | ---: | --- | --- |");
    println!(
        "| dd bs=4M count=256 conv=fdatasync (median of {}: {} MB/s) | {dd:.1} MB/s | | |",
        dd_runs.len(),
        dd_all.join(", ")
    );
    println!(
        "| 4 MiB records, best writer count, vs dd | {best_large:.1} MB/s = {:.0}% | >= 80% | {} |",
        100.0 * best_large / dd,
        yes(best_large >= 0.8 * dd)
    );
    println!(
        "| 1 KiB puts/s, 256 writers vs 1 writer | {scale:.1}x | >= 20x | {} |",
        yes(scale >= 20.0)
    );
    println!(
        "| open, 1M records, with checkpoint (CPU {ckpt_cpu:.2} s) | {with_ckpt:.2} s | < 2 s | {} |",
        yes(with_ckpt < 2.0)
    );
    println!(
        "| open, 1M records, full replay, no checkpoint (CPU {replay_cpu:.2} s) | {replay:.2} s | < 2 s | {} |",
        yes(replay < 2.0)
    );
}

/// User + system CPU time of this process so far (all threads): recovery's cost independent of
/// how busy the shared machine is.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn yes(met: bool) -> &'static str {
    if met {
        "yes"
    } else {
        "**no**"
    }
}
