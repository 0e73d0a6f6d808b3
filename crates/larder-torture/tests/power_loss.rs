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
    eprintln!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "violations after a whole-cluster power loss"
    );
    assert!(stdout.contains(" 0 violations"));
}
