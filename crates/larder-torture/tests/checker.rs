//! The checker's own test: storage nodes that acknowledge without fdatasync (the relaxed
//! benchmark mode) lose acknowledged writes in a power loss, and the checker must say so.
//! Needs root and /dev/fuse (power losses go through larder-lossyfs) and the `larder` binary
//! built next to `larder-torture` (`cargo test --workspace` builds both).

use std::path::Path;
use std::process::Command;

#[test]
fn the_checker_catches_acknowledged_writes_lost_by_broken_durability() {
    let root = unsafe { libc::geteuid() } == 0;
    if !(root && Path::new("/dev/fuse").exists()) {
        eprintln!("skipped: power losses need root and /dev/fuse");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_larder-torture"))
        .args(["--seed", "3", "--seconds", "15", "--converge-seconds", "20"])
        .arg("--broken-durability")
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    // --broken-durability exits 0 only when the checker found violations.
    assert!(
        output.status.success(),
        "the checker missed the lost writes"
    );
    assert!(stdout.contains("VIOLATION acknowledged-blob-on-every-replica"));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
    assert!(report["violations"].as_array().unwrap().len() > 10);
}
