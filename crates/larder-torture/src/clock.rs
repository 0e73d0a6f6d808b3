//! Clock skew and jumps. Every `larder` process of the run reads the wall clock through
//! libfaketime (`LD_PRELOAD`), offset by what its own file in `<run>/clocks/` says (re-read at
//! most once a second); monotonic time stays true, so timers and deadlines are unaffected, as on
//! a machine whose NTP steps the clock. A schedule drawn from the seed (apart from the faults',
//! which it overlaps) sets one process's offset at a time, then sets it back to zero: a jump
//! forward or back, held for seconds. Document versions, operation times, tombstone retention
//! and `max_clock_skew` all read that clock.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::content::Rng;
use crate::history::History;

/// Where Debian's libfaketime package puts its thread-safe library.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The per-process clock files of a run.
#[derive(Clone)]
pub struct Clocks {
    dir: PathBuf,
    library: PathBuf,
}

impl Clocks {
    pub fn new(run_dir: &Path, library: PathBuf) -> anyhow::Result<Clocks> {
        let dir = run_dir.join("clocks");
        std::fs::create_dir_all(&dir)?;
        Ok(Clocks { dir, library })
    }

    fn file(&self, process: &str) -> PathBuf {
        self.dir.join(process)
    }

    /// The environment that puts `process` on its own clock (starting true).
    pub fn env(&self, process: &str) -> anyhow::Result<Vec<(String, String)>> {
        let file = self.file(process);
        if !file.exists() {
            std::fs::write(&file, "+0\n")?;
        }
        Ok(vec![
            ("LD_PRELOAD".into(), self.library.display().to_string()),
            ("FAKETIME_TIMESTAMP_FILE".into(), file.display().to_string()),
            ("FAKETIME_CACHE_DURATION".into(), "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ])
    }

    /// Sets `process`'s clock `offset_s` seconds away from the true one.
    pub fn set(&self, process: &str, offset_s: i64) -> std::io::Result<()> {
        std::fs::write(self.file(process), format!("{offset_s:+}\n"))
    }
}

/// Removes what libfaketime left in /dev/shm for process `pid`, once it is reaped: a process on
/// a faked clock creates a semaphore and a segment there, and removes them only when it exits
/// by itself, which a killed one does not.
pub fn forget(pid: u32) {
    let _ = std::fs::remove_file(format!("/dev/shm/faketime_shm_{pid}"));
    let _ = std::fs::remove_file(format!("/dev/shm/sem.faketime_sem_{pid}"));
}

#[derive(Clone, Debug, Serialize)]
pub struct Skew {
    pub at_ms: u64,
    pub process: String,
    pub offset_s: i64,
    pub duration_ms: u64,
}

/// One jump at a time, 1–8 s each, about 3 s apart. Seven in ten stay within the storage
/// nodes' `max_clock_skew` (5 min: everything is accepted, only the order of versions is at
/// stake); the rest go past it (6–30 min), where nodes refuse versions and times from a clock
/// ahead, and a node behind refuses everyone else's.
pub fn schedule(seed: u64, duration: Duration, processes: &[String]) -> Vec<Skew> {
    let mut rng = Rng::derive(seed, 3);
    let mut skews = Vec::new();
    let end = duration.as_millis() as u64;
    let mut at = rng.range(1000, 3000);
    while at < end && !processes.is_empty() {
        let process = processes[rng.range(0, processes.len() as u64) as usize].clone();
        let magnitude = match rng.range(0, 10) {
            0..=6 => rng.range(1, 240),
            _ => rng.range(360, 1800),
        } as i64;
        let offset_s = if rng.chance(50) {
            magnitude
        } else {
            -magnitude
        };
        let duration_ms = rng.range(1000, 8000);
        skews.push(Skew {
            at_ms: at,
            process,
            offset_s,
            duration_ms,
        });
        at += duration_ms + rng.range(1500, 4500);
    }
    skews
}

/// Applies `skews` in order (blocking); returns how many were applied.
pub fn run(skews: &[Skew], clocks: &Clocks, history: &History) -> u64 {
    let start = Instant::now();
    let mut applied = 0;
    for skew in skews {
        if let Some(wait) = Duration::from_millis(skew.at_ms).checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let detail = serde_json::to_string(skew).unwrap_or_default();
        history.note("clock", "skew", &detail);
        if let Err(e) = clocks.set(&skew.process, skew.offset_s) {
            history.note("clock", "skew-failed", &format!("{detail}: {e}"));
            continue;
        }
        std::thread::sleep(Duration::from_millis(skew.duration_ms));
        if let Err(e) = clocks.set(&skew.process, 0) {
            history.note("clock", "reset-failed", &format!("{detail}: {e}"));
        }
        history.note("clock", "reset", &detail);
        applied += 1;
    }
    applied
}
