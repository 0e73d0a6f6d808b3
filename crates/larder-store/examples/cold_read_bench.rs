//! Reads of large records the page cache does not hold: past it (`O_DIRECT`, the default
//! `Options::direct_cold_reads_from`) against through it, the settings taking turns on one
//! store. The store is filled once with 4 MiB records, each dropped from the page cache once
//! synced; before each cell every segment is dropped again, then READERS threads read every
//! record whole. Prints a markdown table: MB/s, the process's CPU per GiB read (user and
//! system), and what the page cache holds of the segments after the cell.
//!
//! Usage: `cold_read_bench DIR [RECORDS] [ROUNDS] [READERS]` (DIR on the disk under test).

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use larder_store::{BlobLookup, BlobMeta, Disk, DiskOptions, Options, Store};

const RECORD: usize = 4 << 20;

/// The storage node's allocator: it keeps freed buffers for the next reads, as the node does
/// (the system allocator maps and unmaps each 4 MiB buffer, and faulting its pages in then
/// costs more than either read).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let root = PathBuf::from(
        args.get(1)
            .expect("usage: cold_read_bench DIR [RECORDS] [ROUNDS] [READERS]"),
    );
    let records: usize = args.get(2).map_or(256, |s| s.parse().expect("records"));
    let rounds: usize = args.get(3).map_or(3, |s| s.parse().expect("rounds"));
    let readers: usize = args.get(4).map_or(4, |s| s.parse().expect("readers"));
    std::fs::create_dir_all(&root).unwrap();
    let disk_opts = DiskOptions {
        uncache_after_recent: 0,
        ..DiskOptions::default()
    };
    let disk = Disk::open(&root, disk_opts).unwrap();
    let dir = root.join("store");
    fill(&disk, &dir, records);
    println!(
        "| round | reads | MB/s | user CPU s per GiB | system CPU s per GiB | cached after (MiB) |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: |");
    let settings = [
        ("past the page cache (default)", Some(1 << 20)),
        ("through the page cache", None),
    ];
    for round in 1..=rounds {
        let mut order: Vec<_> = settings.iter().collect();
        order.rotate_left(round % settings.len());
        for (name, from) in order {
            let opts = Options {
                direct_cold_reads_from: *from,
                read_chunk_size: RECORD,
                ..Options::default()
            };
            let store = Store::open_on(&disk, &dir, opts).unwrap();
            drop_cache(&dir);
            let (secs, user, system) = read_all(&store, records, readers);
            store.close().unwrap();
            let gib = (records * RECORD) as f64 / f64::from(1u32 << 30);
            println!(
                "| {round} | {name} | {:.0} | {:.3} | {:.3} | {} |",
                (records * RECORD) as f64 / secs / 1e6,
                user / gib,
                system / gib,
                cached_mib(&dir)
            );
        }
    }
    drop(disk);
    std::fs::remove_dir_all(&root).unwrap();
}

fn fill(disk: &Disk, dir: &Path, records: usize) {
    let store = Store::open_on(disk, dir, Options::default()).unwrap();
    let data = Bytes::from(
        (0..RECORD)
            .map(|i| (i * 131 % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    for i in 0..records {
        let meta = BlobMeta {
            props: Bytes::new(),
            time_ms: i as u64,
            expires_ms: None,
        };
        store
            .put_blob(
                format!("r{i}").as_bytes(),
                meta,
                std::slice::from_ref(&data),
            )
            .unwrap();
    }
    store.close().unwrap();
}

/// Reads every record whole with `readers` threads: seconds, user and system CPU seconds.
fn read_all(store: &Store, records: usize, readers: usize) -> (f64, f64, f64) {
    let next = AtomicUsize::new(0);
    let (user0, system0) = cpu();
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..readers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= records {
                    break;
                }
                let BlobLookup::Found(record) =
                    store.get_blob(format!("r{i}").as_bytes(), 0).unwrap()
                else {
                    panic!("record {i} is stored");
                };
                let mut read = 0;
                for piece in store.read_blob(&record, 0..u64::MAX).unwrap() {
                    read += piece.unwrap().len();
                }
                assert_eq!(read, RECORD);
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    let (user1, system1) = cpu();
    (secs, user1 - user0, system1 - system0)
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect()
}

fn drop_cache(dir: &Path) {
    for path in segments(dir) {
        let file = std::fs::File::open(path).unwrap();
        // SAFETY: advice on an open descriptor.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

/// MiB of the segments in the page cache (`mincore` over a read-only mapping of each).
fn cached_mib(dir: &Path) -> u64 {
    let mut pages = 0u64;
    for path in segments(dir) {
        let file = std::fs::File::open(path).unwrap();
        let len = file.metadata().unwrap().len() as usize;
        if len == 0 {
            continue;
        }
        let mut resident = vec![0u8; len.div_ceil(4096)];
        // SAFETY: a read-only shared mapping of an open file, unmapped before returning;
        // `resident` has one byte per page, as `mincore` needs.
        unsafe {
            let at = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            );
            assert_ne!(at, libc::MAP_FAILED);
            assert_eq!(libc::mincore(at, len, resident.as_mut_ptr()), 0);
            libc::munmap(at, len);
        }
        pages += resident.iter().filter(|&&b| b & 1 == 1).count() as u64;
    }
    (pages * 4096) >> 20
}

/// User and system CPU seconds of this process so far (all threads).
fn cpu() -> (f64, f64) {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (tv(ru.ru_utime), tv(ru.ru_stime))
}
