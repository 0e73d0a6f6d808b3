//! `larder put`, `larder get` and `larder delete` against a real cluster, as a user runs them.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{random_bytes, Cluster, LARDER};

fn larder(args: &[&str]) -> std::process::Output {
    Command::new(LARDER).args(args).output().unwrap()
}

#[test]
fn put_get_delete_files_and_standard_streams() {
    let cluster = Cluster::start(3, 8);
    let endpoint = format!("http://{}", cluster.frontend_addr);
    let dir = cluster.dir.path();
    // Larger than a chunk, so the CLI goes through the composite path.
    let data = random_bytes(9 * 1024 * 1024 + 3);
    let input = dir.join("input.bin");
    std::fs::write(&input, &data).unwrap();

    let put = larder(&["put", input.to_str().unwrap(), "--endpoint", &endpoint]);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let id = String::from_utf8(put.stdout).unwrap().trim().to_owned();
    assert_eq!(id.len(), 36, "prints the bare ID: {id:?}");

    let output = dir.join("output.bin");
    let get = larder(&[
        "get",
        &id,
        "-o",
        output.to_str().unwrap(),
        "--endpoint",
        &endpoint,
    ]);
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    assert_eq!(std::fs::read(&output).unwrap(), data);

    // Standard input (no length known up front) and standard output.
    let mut child = Command::new(LARDER)
        .args(["put", "-", "--endpoint", &endpoint])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&data[..5_000_000])
        .unwrap();
    let put = child.wait_with_output().unwrap();
    assert!(put.status.success());
    let piped_id = String::from_utf8(put.stdout).unwrap().trim().to_owned();
    let get = larder(&["get", &piped_id, "--endpoint", &endpoint]);
    assert!(get.status.success());
    assert_eq!(get.stdout, &data[..5_000_000]);

    let delete = larder(&["delete", &id, "--endpoint", &endpoint]);
    assert!(delete.status.success());
    let gone = larder(&[
        "get",
        &id,
        "-o",
        output.to_str().unwrap(),
        "--endpoint",
        &endpoint,
    ]);
    assert!(!gone.status.success());
    let message = String::from_utf8_lossy(&gone.stderr);
    assert!(
        message.contains("410") && message.contains("Deleted"),
        "{message}"
    );
    assert!(!output.exists(), "a failed download leaves no partial file");

    let unreachable = larder(&["get", &id, "--endpoint", "http://127.0.0.1:1"]);
    assert!(!unreachable.status.success());
}
