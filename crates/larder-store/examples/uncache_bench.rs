//! Durable 4 MiB puts with synced large records kept in the page cache, dropped at once, and
//! dropped past the default window of recent ones (`Options::uncache_synced_from`,
//! `DiskOptions::uncache_after_recent`): puts/s and the process's CPU per put (user and
//! system), the settings taking turns cell by cell on fresh stores. Prints a markdown table.
//!
//! Usage: `uncache_bench DIR [SECONDS_PER_CELL] [ROUNDS] [WRITERS]` (DIR on the disk under
//! test, not tmpfs). Each cell writes new data: a store's files are deleted after its cell.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use larder_store::{BlobMeta, Disk, DiskOptions, Options, PutOutcome, Store};

const RECORD: usize = 4 << 20;

struct Cell {
    puts_per_s: f64,
    user_ms_per_put: f64,
    system_ms_per_put: f64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let root = Path::new(
        args.get(1)
            .expect("usage: uncache_bench DIR [SECONDS] [ROUNDS]"),
    );
    let secs: f64 = args.get(2).map_or(5.0, |s| s.parse().expect("seconds"));
    let rounds: usize = args.get(3).map_or(3, |s| s.parse().expect("rounds"));
    let writers: usize = args.get(4).map_or(4, |s| s.parse().expect("writers"));
    std::fs::create_dir_all(root).unwrap();
    println!("| round | setting | puts/s | MB/s | user CPU ms per put | system CPU ms per put |");
    println!("| ---: | --- | ---: | ---: | ---: | ---: |");
    let window = DiskOptions::default().uncache_after_recent;
    let settings = [
        ("kept cached", None, 0),
        ("dropped once synced", Some(1 << 20), 0),
        ("dropped past the last GiB (default)", Some(1 << 20), window),
    ];
    for round in 1..=rounds {
        // Rotate which goes first: the machine drifts over a run.
        let mut order: Vec<_> = settings.iter().collect();
        order.rotate_left(round % settings.len());
        for (k, (name, from, window)) in order.into_iter().enumerate() {
            let dir = root.join(format!("uncache-{round}-{k}"));
            let c = cell(&dir, *from, *window, writers, Duration::from_secs_f64(secs));
            println!(
                "| {round} | {name} | {:.1} | {:.0} | {:.2} | {:.2} |",
                c.puts_per_s,
                c.puts_per_s * RECORD as f64 / 1e6,
                c.user_ms_per_put,
                c.system_ms_per_put
            );
        }
    }
}

/// `writers` threads putting 4 MiB blobs (as 64 KiB pieces, like a streamed upload) for `run`.
fn cell(
    dir: &Path,
    uncache_synced_from: Option<u64>,
    uncache_after_recent: u64,
    writers: usize,
    run: Duration,
) -> Cell {
    let disk_opts = DiskOptions {
        uncache_after_recent,
        ..DiskOptions::default()
    };
    let disk = Disk::open(dir, disk_opts).unwrap();
    let opts = Options {
        uncache_synced_from,
        ..Options::default()
    };
    let store = Store::open_on(&disk, dir.join("store"), opts).unwrap();
    let data = Bytes::from(
        (0..RECORD)
            .map(|i| (i * 131 % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    let pieces: Arc<Vec<Bytes>> = Arc::new(
        (0..RECORD)
            .step_by(64 << 10)
            .map(|s| data.slice(s..s + (64 << 10)))
            .collect(),
    );
    let done = Arc::new(AtomicU64::new(0));
    let (user0, system0) = cpu();
    let start = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|t| {
            let (store, pieces, done) = (store.clone(), pieces.clone(), done.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while start.elapsed() < run {
                    let meta = BlobMeta {
                        props: Bytes::new(),
                        time_ms: i,
                        expires_ms: None,
                    };
                    let key = format!("w{t}-{i}");
                    let put = store.put_blob(key.as_bytes(), meta, &pieces).unwrap();
                    assert_eq!(put, PutOutcome::Stored);
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let elapsed = start.elapsed().as_secs_f64();
    let (user1, system1) = cpu();
    drop(store);
    drop(disk);
    std::fs::remove_dir_all(dir).unwrap();
    let puts = done.load(Ordering::Relaxed).max(1) as f64;
    Cell {
        puts_per_s: puts / elapsed,
        user_ms_per_put: (user1 - user0) * 1e3 / puts,
        system_ms_per_put: (system1 - system0) * 1e3 / puts,
    }
}

/// User and system CPU seconds of this process so far (all threads).
fn cpu() -> (f64, f64) {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (tv(ru.ru_utime), tv(ru.ru_stime))
}
