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
