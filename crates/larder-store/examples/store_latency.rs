//! Latency of durable 1 KiB puts at a fixed offered load: 32 stores on one disk (as a storage
//! node hosts its partitions), puts issued on a schedule (open loop) by 64 writer threads, each
//! put's latency counted from when it was due, so a stall shows up in every put it delays. Runs
//! each sync-thread count given, alternating, and prints a markdown table.
//!
//! Usage: `store_latency DIR PUTS_PER_S SECONDS REPS SYNC_THREADS...`
//! (DIR must be on the disk under test, not tmpfs), e.g. `store_latency target/lat 2000 5 3 1 2`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use larder_store::{BlobMeta, Disk, DiskOptions, Durability, Options, PutOutcome, Store};

const STORES: usize = 32;
const WRITERS: usize = 64;

struct Run {
    latencies_us: Vec<u64>,
    puts_per_s: f64,
    journal_syncs: u64,
    cpu_us_per_put: f64,
}

/// This process's user + system CPU time so far, in microseconds.
fn cpu_time_us() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("reading /proc/self/stat");
    // Fields after the command name (which may hold spaces, but ends with the last ')').
    let fields: Vec<&str> = stat[stat.rfind(')').expect("stat format") + 2..]
        .split(' ')
        .collect();
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    ticks * 1e6 / 100.0 // USER_HZ is 100 on Linux
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: store_latency DIR PUTS_PER_S SECONDS REPS SYNC_THREADS...";
    let [dir, rate, secs, reps, ..] = &args[1..] else {
        panic!("{usage}");
    };
    let rate: f64 = rate.parse().expect("PUTS_PER_S");
    let secs: f64 = secs.parse().expect("SECONDS");
    let reps: usize = reps.parse().expect("REPS");
    let threads: Vec<usize> = args[5..]
        .iter()
        .map(|t| t.parse().expect("SYNC_THREADS"))
        .collect();
    println!("| sync threads | offered puts/s | achieved | p50 ms | p90 ms | p99 ms | p99.9 ms | journal syncs/s | CPU µs/put |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for rep in 0..reps {
        for &sync_threads in &threads {
            let root = Path::new(dir).join(format!("run-{rep}-{sync_threads}"));
            let run = run(&root, sync_threads, rate, secs);
            std::fs::remove_dir_all(&root).expect("removing the run's data");
            let mut l = run.latencies_us;
            l.sort_unstable();
            let q = |p: f64| l[((l.len() as f64 * p) as usize).min(l.len() - 1)] as f64 / 1000.0;
            println!(
                "| {sync_threads} | {rate:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.1} |",
                run.puts_per_s,
                q(0.5),
                q(0.9),
                q(0.99),
                q(0.999),
                run.journal_syncs as f64 / secs,
                run.cpu_us_per_put
            );
        }
    }
}

fn run(root: &Path, sync_threads: usize, rate: f64, secs: f64) -> Run {
    let opts = DiskOptions {
        sync_threads,
        ..DiskOptions::default()
    };
    let disk = Disk::open(root, opts).expect("opening the disk");
    let store_opts = Options {
        durability: Durability::Durable,
        ..Options::default()
    };
    let stores: Arc<Vec<Store>> = Arc::new(
        (0..STORES)
            .map(|i| Store::open_on(&disk, root.join(format!("p{i}")), store_opts.clone()))
            .collect::<Result<_, _>>()
            .expect("opening the stores"),
    );
    let before = disk.stats().journal_syncs;
    let cpu_before = cpu_time_us();
    let interval = Duration::from_secs_f64(WRITERS as f64 / rate);
    let total = (rate * secs) as usize / WRITERS;
    let start = Instant::now() + Duration::from_millis(50);
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let stores = stores.clone();
            std::thread::spawn(move || {
                let data = [Bytes::from(vec![w as u8; 1024])];
                let offset = interval.mul_f64(w as f64 / WRITERS as f64);
                let mut latencies = Vec::with_capacity(total);
                for k in 0..total {
                    let due = start + offset + interval * k as u32;
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let key = format!("w{w}-{k}");
                    let meta = BlobMeta {
                        props: Bytes::new(),
                        time_ms: 1,
                        expires_ms: None,
                    };
                    let store = &stores[(w + k) % STORES];
                    let put = store.put_blob(key.as_bytes(), meta, &data).expect("put");
                    assert_eq!(put, PutOutcome::Stored);
                    latencies.push(due.elapsed().as_micros() as u64);
                }
                latencies
            })
        })
        .collect();
    let latencies_us: Vec<u64> = writers
        .into_iter()
        .flat_map(|w| w.join().expect("writer thread"))
        .collect();
    let elapsed = start.elapsed().as_secs_f64();
    let cpu_us_per_put = (cpu_time_us() - cpu_before) / latencies_us.len() as f64;
    Run {
        cpu_us_per_put,
        puts_per_s: latencies_us.len() as f64 / elapsed,
        latencies_us,
        journal_syncs: disk.stats().journal_syncs - before,
    }
}
