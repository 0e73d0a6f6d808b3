//! `larder dev` as a user runs it: one command, a whole cluster; Ctrl-C/SIGTERM stops every
//! process; a restart finds every acknowledged blob again.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{curl, file_with, free_addresses, signal, wait_timeout, Reaped, LARDER};

fn start_dev(data_dir: &str, listen: std::net::SocketAddr) -> Reaped {
    let mut dev = Command::new(LARDER);
    dev.args(["dev", "--data-dir", data_dir, "--partitions", "12"])
        .args(["--listen", &listen.to_string()])
        .env("LARDER_LOG", "warn");
    spawn_until_banner(dev, listen)
}

/// Spawns `larder dev` and returns once it has printed its banner, which it does only after its
/// frontend is listening (a port that merely accepts could be someone else's).
fn spawn_until_banner(mut dev: Command, listen: std::net::SocketAddr) -> Reaped {
    use std::io::{BufRead, BufReader};
    let mut child = Reaped(dev.stdout(Stdio::piped()).spawn().unwrap());
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // Drains stdout to the end, so the banner's later lines never meet a closed pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(banner) => assert!(banner.contains(&format!("http://{listen}")), "{banner}"),
        Err(e) => panic!("larder dev printed no banner ({e}): {:?}", child.try_wait()),
    }
    child
}

/// Processes whose command line mentions `needle` (the test's unique data dir).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let out = Command::new("pgrep").args(["-f", needle]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn wait_until_gone(needle: &str) {
    for _ in 0..200 {
        if processes_mentioning(needle).is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("processes left behind: {:?}", processes_mentioning(needle));
}

#[test]
fn dev_cluster_survives_restart_and_leaves_no_process() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("larder-data").display().to_string();
    let listen = free_addresses(1)[0];
    let url = |path: &str| format!("http://{listen}{path}");

    let mut dev = start_dev(&data_dir, listen);
    let mut blobs = Vec::new();
    for i in 0..25u32 {
        let data = format!("blob number {i} ").repeat(i as usize * 50 + 1);
        let file = format!("@{}", file_with(tmp.path(), data.as_bytes()));
        let r = curl(tmp.path(), &["--data-binary", &file, &url("/v1/blobs")]);
        assert_eq!(r.status, 201);
        blobs.push((r.json()["id"].as_str().unwrap().to_owned(), data));
    }
    signal(&dev, 15);
    let status =
        wait_timeout(&mut dev, Duration::from_secs(40)).expect("larder dev stops on SIGTERM");
    assert!(status.success(), "{status}");
    wait_until_gone(&data_dir);

    let mut dev = start_dev(&data_dir, listen);
    for (id, data) in &blobs {
        let r = curl(
            tmp.path(),
            &["--http2-prior-knowledge", &url(&format!("/v1/blobs/{id}"))],
        );
        let text = String::from_utf8_lossy(&r.body);
        assert_eq!(
            r.status,
            200,
            "{id}: {}",
            text.chars().take(500).collect::<String>()
        );
        assert_eq!(r.body, data.as_bytes());
    }
    // Even a SIGKILLed parent takes its storage nodes with it (parent-death signal).
    dev.kill().unwrap();
    dev.wait().unwrap();
    wait_until_gone(&data_dir);
}

#[test]
fn dev_tls_prints_both_urls_and_serves_https_with_its_own_ca() {
    use std::io::{BufRead, BufReader};
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("larder-data").display().to_string();
    let [listen, tls_listen] = free_addresses(2)[..] else {
        unreachable!()
    };
    let mut dev = Reaped(
        Command::new(LARDER)
            .args(["dev", "--tls", "--data-dir", &data_dir, "--partitions", "8"])
            .args(["--listen", &listen.to_string()])
            .args(["--tls-listen", &tls_listen.to_string()])
            .env("LARDER_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(dev.stdout.take().unwrap()).lines();
    let banner: Vec<String> = (0..3).map(|_| lines.next().unwrap().unwrap()).collect();
    let text = banner.join("\n");
    assert!(text.contains(&format!("http://{listen}")), "{text}");
    let https = format!("https://localhost:{}", tls_listen.port());
    assert!(text.contains(&https), "{text}");
    let ca = format!("{data_dir}/tls/ca.pem");
    // A blob stored over HTTPS (and written over mutual TLS to the storage nodes) reads back over
    // the cleartext port.
    let file = format!("@{}", file_with(tmp.path(), b"over tls"));
    let put = curl(
        tmp.path(),
        &[
            "--cacert",
            &ca,
            "--data-binary",
            &file,
            &format!("{https}/v1/blobs"),
        ],
    );
    assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
    assert_eq!(put.version, "HTTP/2");
    let id = put.json()["id"].as_str().unwrap().to_owned();
    let get = curl(tmp.path(), &[&format!("http://{listen}/v1/blobs/{id}")]);
    assert_eq!(get.body, b"over tls");
    signal(&dev, 15);
    let status = wait_timeout(&mut dev, Duration::from_secs(40)).expect("stops on SIGTERM");
    assert!(status.success(), "{status}");
    wait_until_gone(&data_dir);
}

/// Runs `larder dev` with its stderr (its own log and its storage nodes') in `log`, until the
/// frontend answers, then stops it cleanly.
fn run_dev_logging_to(data_dir: &str, listen: std::net::SocketAddr, extra: &[&str], log: &Path) {
    let mut dev = Command::new(LARDER);
    dev.args(["dev", "--data-dir", data_dir])
        .args(["--listen", &listen.to_string()])
        .args(extra)
        .env("LARDER_LOG", "info")
        .stderr(std::fs::File::create(log).unwrap());
    let mut dev = spawn_until_banner(dev, listen);
    signal(&dev, 15);
    let status = wait_timeout(&mut dev, Duration::from_secs(40)).expect("stops on SIGTERM");
    assert!(status.success(), "{status}");
    wait_until_gone(data_dir);
}

#[test]
fn dev_logs_plain_text_to_files_and_names_layout_flags_an_existing_cluster_ignores() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("larder-data").display().to_string();
    let listen = free_addresses(1)[0];
    let log = tmp.path().join("dev.log");

    run_dev_logging_to(&data_dir, listen, &["--partitions", "8"], &log);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("frontend serving") && text.contains("storage node serving"),
        "the frontend's and the storage nodes' logs: {text}"
    );
    assert!(
        !text.contains('\x1b'),
        "no terminal colour codes in a file: {text:?}"
    );
    assert!(!text.contains("warning"), "{text}");

    let extra = ["--nodes", "5", "--partitions", "8", "--replicas", "2"];
    run_dev_logging_to(&data_dir, listen, &extra, &log);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("--nodes 5 ignored") && text.contains("has 3"),
        "{text}"
    );
    assert!(text.contains("--replicas 2 ignored"), "{text}");
    assert!(
        !text.contains("--partitions"),
        "the same value is no surprise: {text}"
    );
    let map = std::fs::read_to_string(format!("{data_dir}/cluster.toml")).unwrap();
    assert_eq!(map.matches("[[nodes]]").count(), 3, "{map}");
}

#[test]
fn cluster_init_refuses_to_replace_a_map_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let map = tmp.path().join("cluster.toml");
    let init = |extra: &[&str]| {
        Command::new(LARDER)
            .args(["cluster", "init", "--output", map.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    assert!(init(&["--nodes", "3"]).status.success());
    let first = std::fs::read_to_string(&map).unwrap();
    let refused = init(&["--nodes", "5"]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{message}");
    assert!(
        message.contains("already exists") && message.contains("--force"),
        "{message}"
    );
    assert_eq!(std::fs::read_to_string(&map).unwrap(), first, "untouched");
    assert!(init(&["--nodes", "5", "--force"]).status.success());
    let replaced = std::fs::read_to_string(&map).unwrap();
    assert_eq!(replaced.matches("[[nodes]]").count(), 5, "{replaced}");
    // Ports past 65535 are an error, not an overflow (a panic in debug builds, wrapped in release).
    let past = init(&["--nodes", "3", "--base-port", "65535", "--force"]);
    let message = String::from_utf8_lossy(&past.stderr);
    assert_eq!(past.status.code(), Some(1), "{message}");
    assert!(message.contains("past port 65535"), "{message}");
    assert_eq!(
        std::fs::read_to_string(&map).unwrap(),
        replaced,
        "untouched"
    );
}

#[test]
fn settings_files_are_merged_into_the_configs_dev_writes_at_each_start() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("larder-data").display().to_string();
    let [listen, s3] = free_addresses(2)[..] else {
        unreachable!()
    };
    let storage = file_with(tmp.path(), b"[store]\ndirect_cold_reads_from = \"2 MiB\"\n");
    let frontend = format!("[s3]\nlisten = \"{s3}\"\nindex_leaf_entries = 50\n");
    let frontend = file_with(tmp.path(), frontend.as_bytes());
    let log = tmp.path().join("dev.log");
    let mut dev = Command::new(LARDER);
    dev.args(["dev", "--data-dir", &data_dir, "--partitions", "8"])
        .args(["--listen", &listen.to_string()])
        .args([
            "--storage-settings",
            &storage,
            "--frontend-settings",
            &frontend,
        ])
        .env("LARDER_LOG", "info")
        .stderr(std::fs::File::create(&log).unwrap());
    let mut dev = spawn_until_banner(dev, listen);
    // The frontend's S3 port is where the settings put it (the default is a free port).
    common::wait_for_port(s3);
    let answer = curl(tmp.path(), &[&format!("http://{s3}/")]);
    assert_eq!(answer.status, 403, "an anonymous ListBuckets");
    signal(&dev, 15);
    let status = wait_timeout(&mut dev, Duration::from_secs(40)).expect("stops on SIGTERM");
    assert!(status.success(), "{status}");
    wait_until_gone(&data_dir);

    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches("storage node serving").count(), 3, "{text}");
    let node: toml::Table = std::fs::read_to_string(format!("{data_dir}/s1.toml"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        node["store"]["direct_cold_reads_from"].as_str(),
        Some("2 MiB")
    );
    assert_eq!(
        node["node_id"].as_str(),
        Some("s1"),
        "what dev writes stays"
    );
    let front: toml::Table = std::fs::read_to_string(format!("{data_dir}/frontend-dc1.toml"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(front["s3"]["index_leaf_entries"].as_integer(), Some(50));
    assert_eq!(front["datacenter"].as_str(), Some("dc1"));
}
