//! A storage node's start: its port answers only once it can serve (the nemesis suite filled
//! a node's disk while it still opened its stores, because it bound its port first), and a full
//! disk does not keep it from starting (it serves reads and deletes, and refuses writes with
//! 507 as it does at runtime).

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{spawn, wait_for_port, Cluster};

/// Kills the child when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_storage_node_accepts_connections_only_once_its_stores_are_open() {
    let mut cluster = Cluster::start(3, 1);
    cluster.stop_node(0);
    let id = cluster.map.nodes[0].id.clone();
    // Opening stalls on the map file the node accepted before (a FIFO nobody writes yet): it
    // stands for a long journal replay, deterministically.
    let accepted_map = cluster.dir.path().join(&id).join(larder_storage::MAP_FILE);
    let made = Command::new("mkfifo").arg(&accepted_map).status().unwrap();
    assert!(made.success());
    let config = cluster.path(&format!("{id}.toml"));
    let node = Killed(spawn(&["storage", "--config", &config]));
    let addr = cluster.node_addr(0);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        assert!(
            TcpStream::connect(addr).is_err(),
            "the port accepts connections while the node is still opening"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Let it finish opening: the port answers, and the node serves.
    let map = std::fs::read(cluster.dir.path().join("cluster.toml")).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&accepted_map)
        .unwrap()
        .write_all(&map)
        .unwrap();
    wait_for_port(addr);
    let (status, _) = cluster.internal_request(addr, "GET", larder_proto::HEALTH_PATH);
    assert_eq!(status, 200);
    drop(node);
}

/// Fills the file system at `dir` until a write fails with ENOSPC (a file `filler`).
fn fill(dir: &std::path::Path) {
    let mut file = std::fs::File::create(dir.join("filler")).unwrap();
    let block = vec![0u8; 64 * 1024];
    loop {
        if let Err(err) = file.write_all(&block) {
            assert_eq!(err.raw_os_error(), Some(28), "{err}");
            break;
        }
    }
    let _ = file.sync_all();
}

/// Runs `command` (a mount or umount), which needs root.
fn run(command: &[&str]) -> bool {
    Command::new(command[0])
        .args(&command[1..])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_storage_node_starts_on_a_full_disk_and_serves_reads_and_refuses_writes() {
    let euid = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&euid.stdout).trim() != "0" {
        eprintln!("skipped: a small file system to fill needs root (mount -t tmpfs)");
        return;
    }
    let mut cluster = Cluster::start(3, 1);
    let dir = cluster.dir.path().to_owned();
    let id = cluster.map.nodes[0].id.clone();
    let stored = common::curl(
        &dir,
        &[
            "--http2-prior-knowledge",
            "--data-binary",
            "kept on a full disk",
            &cluster.url("/v1/blobs"),
        ],
    );
    assert_eq!(stored.status, 201);
    let blob = stored.json()["id"].as_str().unwrap().to_owned();
    cluster.stop_node(0);
    // Node 0's data moves onto a small file system of its own, which is then filled.
    let data = dir.join(&id);
    let moved = dir.join("moved");
    std::fs::rename(&data, &moved).unwrap();
    std::fs::create_dir(&data).unwrap();
    assert!(run(&[
        "mount",
        "-t",
        "tmpfs",
        "-o",
        "size=64m",
        "tmpfs",
        data.to_str().unwrap()
    ]));
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            run(&["umount", "-l", self.0.to_str().unwrap()]);
        }
    }
    let _unmount = Unmount(data.clone());
    assert!(run(&[
        "cp",
        "-a",
        &format!("{}/.", moved.display()),
        data.to_str().unwrap()
    ]));
    fill(&data);
    let config = cluster.path(&format!("{id}.toml"));
    let mut node = Killed(spawn(&["storage", "--config", &config]));
    let addr = cluster.node_addr(0);
    let started = Instant::now();
    while TcpStream::connect(addr).is_err() {
        if let Ok(Some(status)) = node.0.try_wait() {
            panic!("the node did not start on a full disk: {status}");
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no port");
        std::thread::sleep(Duration::from_millis(50));
    }
    let parsed: larder_cluster::BlobId = blob.parse().unwrap();
    let path = larder_proto::blob_path(parsed.partition, &blob);
    let (status, body) = cluster.internal_request(addr, "GET", &path);
    assert_eq!(status, 200, "reads are served");
    assert_eq!(&body[..], b"kept on a full disk");
    let new_path = larder_proto::blob_path(parsed.partition, "a-new-key");
    let (status, _) = cluster.internal_request(addr, "PUT", &new_path);
    assert_eq!(status, 507, "writes are refused as out of space");
    drop(node);
}
