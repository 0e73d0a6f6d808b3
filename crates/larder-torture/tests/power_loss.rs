//! Regressions the nemesis suite found, each as the shortest run that showed it.
//! Need root and /dev/fuse (power losses go through larder-lossyfs) and the `larder` binary built
//! next to `larder-torture` (`cargo test --workspace` builds both).

use std::path::Path;
use std::process::Command;

fn can_cut_power() -> bool {
    let root = unsafe { libc::geteuid() } == 0;
    if !(root && Path::new("/dev/fuse").exists()) {
        eprintln!("skipped: power losses need root and /dev/fuse");
    }
    root && Path::new("/dev/fuse").exists()
}

/// A whole-cluster power loss lost every acknowledged write: storage nodes created their disk
/// and replica directories without syncing the parent directories, so the new directories
/// (and everything synced inside them) were not durable.
#[test]
fn a_whole_cluster_power_loss_keeps_every_acknowledged_write() {
    if !can_cut_power() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_larder-torture"))
        .args(["--seed", "5", "--seconds", "8", "--mean-gap-ms", "100000"])
        .args(["--final-cluster-power-loss", "--converge-seconds", "60"])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        // First, as CI shows only the start of a failure's output: why processes stopped
        // answering (the harness's notes, the errors in their logs), then the summary.
        eprintln!("{}", String::from_utf8_lossy(&output.stderr));
        eprintln!("{}", errors_in_logs(&dir.path().join("logs"), 30));
    }
    eprintln!("{}", first_lines(&stdout, 40));
    assert!(
        output.status.success(),
        "violations after a whole-cluster power loss"
    );
    assert!(stdout.contains(" 0 violations"));
}

/// Up to `max` lines of the run's process logs that report an error or a panic.
fn errors_in_logs(logs: &Path, max: usize) -> String {
    let mut found = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(logs)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let name = file
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        for line in text.lines() {
            if line.contains("ERROR") || line.contains("panicked") || line.starts_with("Error") {
                found.push(format!("{name}: {}", first_chars(line, 400)));
            }
        }
    }
    let more = found.len().saturating_sub(max);
    found.truncate(max);
    if more > 0 {
        found.push(format!("... and {more} more"));
    }
    found.join("\n")
}

fn first_lines(text: &str, max: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let shown: Vec<String> = lines
        .iter()
        .take(max)
        .map(|l| first_chars(l, 600))
        .collect();
    match lines.len() > max {
        true => format!("{}\n... {} more lines", shown.join("\n"), lines.len() - max),
        false => shown.join("\n"),
    }
}

fn first_chars(line: &str, max: usize) -> String {
    line.chars().take(max).collect()
}
