//! A counting global allocator, switched on at start for benchmarks only (off unless
//! `LARDER_ALLOC_COUNT_FILE` is set): it wraps the real allocator and counts allocations and
//! bytes, so a benchmark can
//! divide what a load allocated by the requests or connections it made (B6 in
//! `benchmarks/b6-connections`, and `benchmarks/cpu-per-request`).
//!
//! The counts leave the process through a file, not through any server's `/metrics`: every role
//! of this binary (a frontend, `larder dev`'s frontend, a storage node) then reports the same way
//! without this module reaching into a library crate. When `LARDER_ALLOC_COUNT_FILE` names a
//! path, a thread rewrites `<path>.<pid>` every `LARDER_ALLOC_COUNT_INTERVAL_MS` (default 100) with one
//! `name value` line per counter (fixed names, below); a benchmark reads it before and after a
//! load, waiting one interval. The counters are process-wide and cumulative since start.
//!
//! Counting costs one relaxed atomic add per counter per call, shared between threads: fine for
//! a benchmark's byte counts, not for its timings, so it is off unless asked for. Off, each call
//! costs one relaxed load of a flag written once at start (a cache line every core keeps shared)
//! and a branch predicted right every time. It used to be a cargo feature; that meant a second
//! build of the binary (3.5 minutes of every CI run) for one benchmark.

use std::alloc::{GlobalAlloc, Layout};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The real allocator `A`, counted.
pub struct Counting<A>(pub A);

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static ALLOCATED_BYTES: AtomicU64 = AtomicU64::new(0);
static FREES: AtomicU64 = AtomicU64::new(0);
static FREED_BYTES: AtomicU64 = AtomicU64::new(0);
static ZEROED_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static REALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Set once, by `start_reporting_from_env`, before any load a benchmark measures.
static COUNTING: AtomicBool = AtomicBool::new(false);

fn counting() -> bool {
    COUNTING.load(Ordering::Relaxed)
}

fn count_alloc(size: usize) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    ALLOCATED_BYTES.fetch_add(size as u64, Ordering::Relaxed);
}

fn count_free(size: usize) {
    FREES.fetch_add(1, Ordering::Relaxed);
    FREED_BYTES.fetch_add(size as u64, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to `A`, which upholds `GlobalAlloc`'s contract; the
// counters only observe sizes and never touch the memory.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counting() {
            count_alloc(layout.size());
        }
        // SAFETY: forwarded with the caller's own guarantees about `layout`.
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if counting() {
            count_alloc(layout.size());
            ZEROED_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as for `alloc`.
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if counting() {
            count_free(layout.size());
        }
        // SAFETY: `ptr` came from this allocator (hence from `A`) with `layout`.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Counted as a free of the old block and an allocation of the new one: growing a buffer
        // by doubling then shows up as the bytes it really asks the allocator for.
        if counting() {
            REALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            count_free(layout.size());
            count_alloc(new_size);
        }
        // SAFETY: forwarded with the caller's own guarantees about `ptr`, `layout`, `new_size`.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

/// The counters as `name value` lines (names fixed; `live_bytes` = allocated - freed).
pub fn render() -> String {
    let allocated = ALLOCATED_BYTES.load(Ordering::Relaxed);
    let freed = FREED_BYTES.load(Ordering::Relaxed);
    format!(
        "allocations {}\nallocated_bytes {allocated}\nfrees {}\nfreed_bytes {freed}\n\
         zeroed_allocations {}\nreallocations {}\nlive_bytes {}\n",
        ALLOCATIONS.load(Ordering::Relaxed),
        FREES.load(Ordering::Relaxed),
        ZEROED_ALLOCATIONS.load(Ordering::Relaxed),
        REALLOCATIONS.load(Ordering::Relaxed),
        allocated.saturating_sub(freed),
    )
}

/// Switches counting on and starts the thread that rewrites `LARDER_ALLOC_COUNT_FILE`, if that
/// variable is set. The counts start here: a benchmark reads them before and after a load.
pub fn start_reporting_from_env() {
    let Some(path) = std::env::var_os("LARDER_ALLOC_COUNT_FILE").map(PathBuf::from) else {
        return;
    };
    COUNTING.store(true, Ordering::Relaxed);
    let interval = std::env::var("LARDER_ALLOC_COUNT_INTERVAL_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::from_millis(100), Duration::from_millis);
    // `larder dev` passes its environment on to the storage nodes it starts, so every process
    // writes its own `<path>.<pid>` and the benchmark reads the file of the pid it measures.
    let mut file = path.into_os_string();
    file.push(format!(".{}", std::process::id()));
    let path = PathBuf::from(&file);
    file.push(".partial");
    let partial = PathBuf::from(file);
    let spawned = std::thread::Builder::new()
        .name("alloc-count".into())
        .spawn(move || loop {
            // Written aside and renamed, so a reader never sees half a file.
            if std::fs::write(&partial, render()).is_ok() {
                let _ = std::fs::rename(&partial, &path);
            }
            std::thread::sleep(interval);
        });
    if let Err(error) = spawned {
        eprintln!("larder: alloc-count reporter not started: {error}");
    }
}
