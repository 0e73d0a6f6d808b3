//! What the crash tests share: this test binary run again as a child process that writes and
//! prints what it acknowledged, killed for real (SIGKILL) after a while.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs the test `child_test` of this binary with `envs` set, kills it with SIGKILL after
/// `kill_after`, and returns every line it printed before it died.
pub fn run_and_kill(
    child_test: &str,
    envs: &[(&str, &OsStr)],
    kill_after: Duration,
) -> Vec<String> {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", child_test, "--nocapture", "--test-threads=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (key, value) in envs {
        command.env(key, value);
    }
    let mut child = command.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    std::thread::sleep(kill_after);
    // SAFETY: plain syscall on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    reader.join().unwrap()
}

/// The bytes a key implies (a hash of the key seeds a splitmix64 stream): what a child wrote
/// can be checked without the parent ever seeing it.
pub fn content(key: &[u8], len: usize) -> Vec<u8> {
    let mut x = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    (0..len)
        .map(|_| {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let z = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            (z ^ (z >> 27)) as u8
        })
        .collect()
}

/// A key's blob size: its last path component.
pub fn blob_size(key: &str) -> usize {
    key.rsplit('/').next().unwrap().parse().unwrap()
}
