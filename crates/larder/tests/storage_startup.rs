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
