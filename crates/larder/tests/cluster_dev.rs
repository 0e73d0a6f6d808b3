//! `larder cluster` as a user meets it on `larder dev` (the README walk-through's first half):
//! `add-node` plans the move of the new node's share, the map authority accepts it, every node
//! and the frontend take the new revision, `larder dev` starts the added node's process, and
//! `status` shows revisions, replica counts and the moves in progress; the cluster serves
//! throughout. (Moves complete once the data path declares the new replicas caught up.)

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_addresses, signal, wait_for_port, wait_timeout, LARDER};

struct Dev(Option<Child>);

impl Dev {
    fn start(data_dir: &Path, listen: SocketAddr) -> Dev {
        use std::io::{BufRead, BufReader};
        let mut child = Command::new(LARDER)
            .args(["dev", "--partitions", "8", "--data-dir"])
            .arg(data_dir)
            .args(["--listen", &listen.to_string()])
            .env("LARDER_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let banner = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("larder dev printed its banner");
        assert!(banner.contains(&format!("http://{listen}")), "{banner}");
        Dev(Some(child))
    }

    fn stop(&mut self) {
        let mut child = self.0.take().unwrap();
        signal(&child, 15);
        let status = wait_timeout(&mut child, Duration::from_secs(40));
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(
            status.is_some_and(|s| s.success()),
            "larder dev stops cleanly"
        );
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn larder(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(LARDER).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn curl_status(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn add_node_on_a_dev_cluster_starts_the_node_and_its_moves() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("larder-data");
    let addrs = free_addresses(2);
    let (listen, new_node) = (addrs[0], addrs[1]);
    let mut dev = Dev::start(&data_dir, listen);
    let config = data_dir.join("s1.toml").display().to_string();
    let url = format!("http://{listen}");

    let (ok, out, err) = larder(&[
        "cluster",
        "add-node",
        "s4",
        "--address",
        &new_node.to_string(),
        "--config",
        &config,
    ]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("map revision 2 accepted by the map authority s1"),
        "{out}"
    );
    assert!(out.contains("6 replica moves started"), "{out}");
    // `larder dev` saw the node added to its map and started it.
    wait_for_port(new_node);

    // The moves run (bootstrap from the live replicas, then the authority's next revision makes
    // s4's replicas live and drops the leaving ones): everyone ends at revision 3, s4 holding
    // its share and no move left.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let (ok, out, err) = larder(&[
            "cluster",
            "status",
            "--json",
            "--config",
            &config,
            "--frontend",
            &url,
        ]);
        assert!(ok, "{out}{err}");
        let status: serde_json::Value = serde_json::from_str(&out).unwrap();
        let everyone_at_3 = status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["map_revision"] == "3")
            && status["frontends"][0]["map_revision"] == "3";
        if everyone_at_3 && status["moves"].as_array().unwrap().is_empty() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "every node and the frontend at revision 3, the moves done: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let nodes = status["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 4);
    assert_eq!(nodes[3]["id"], "s4");
    assert_eq!(nodes[3]["live"], 6, "{status}");
    let leaving: u64 = nodes.iter().map(|n| n["leaving"].as_u64().unwrap()).sum();
    let live: u64 = nodes.iter().map(|n| n["live"].as_u64().unwrap()).sum();
    assert_eq!(
        (leaving, live),
        (0, 24),
        "8 partitions x 3 replicas: {status}"
    );

    // The plain-text report, and the cluster serving meanwhile.
    let (ok, out, _) = larder(&["cluster", "status", "--config", &config]);
    assert!(ok);
    assert!(out.contains("map revision 3"), "{out}");
    let file = tmp.path().join("blob");
    std::fs::write(&file, b"during a move").unwrap();
    assert_eq!(
        curl_status(&[
            "--data-binary",
            &format!("@{}", file.display()),
            &format!("{url}/v1/blobs")
        ]),
        "201"
    );
    // The next plan, on the cluster that grew.
    let (ok, out, err) = larder(&["cluster", "drain-node", "s2", "--config", &config]);
    assert!(ok, "{out}{err}");
    dev.stop();
}
