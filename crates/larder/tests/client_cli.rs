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
    assert_eq!(
        std::fs::read(&output).unwrap(),
        data,
        "a failed download leaves the existing file as it was"
    );
    let fresh = dir.join("fresh.bin");
    let gone = larder(&[
        "get",
        &id,
        "-o",
        fresh.to_str().unwrap(),
        "--endpoint",
        &endpoint,
    ]);
    assert!(!gone.status.success());
    assert!(!fresh.exists(), "a failed download leaves no partial file");

    let unreachable = larder(&["get", &id, "--endpoint", "http://127.0.0.1:1"]);
    assert!(!unreachable.status.success());
}

/// What a user sees when something is wrong on their side: one line naming the problem (and the
/// path), before any network I/O, and never a panic or a backtrace.
#[test]
fn user_mistakes_are_one_clear_line_before_any_network_io() {
    let cluster = Cluster::start(3, 8);
    let endpoint = format!("http://{}", cluster.frontend_addr);
    let dir = cluster.dir.path();
    let run = |args: &[&str]| {
        let output = Command::new(LARDER)
            .args(args)
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        assert!(!stderr.contains("backtrace"), "{stderr}");
        stderr
    };
    let dir_arg = dir.to_str().unwrap();
    // An ID that is not one: no URI is built from it (this panicked).
    for id in ["a b", "a/b", "", "x?y"] {
        let message = run(&["get", id, "--endpoint", &endpoint]);
        assert!(message.contains("is not a blob ID"), "{message}");
        let message = run(&["delete", id, "--endpoint", &endpoint]);
        assert!(message.contains("is not a blob ID"), "{message}");
    }
    // Local files are checked first: the same answers with the frontend up or unreachable.
    let missing = dir.join("missing.file");
    for endpoint in [endpoint.as_str(), "http://127.0.0.1:1"] {
        let message = run(&["put", dir_arg, "--endpoint", endpoint]);
        assert!(
            message.contains(dir_arg) && message.contains("is a directory"),
            "{message}"
        );
        let message = run(&["put", missing.to_str().unwrap(), "--endpoint", endpoint]);
        assert!(message.contains(missing.to_str().unwrap()), "{message}");
        assert_eq!(
            message.matches("No such file or directory").count(),
            1,
            "{message}"
        );
        let message = run(&["get", "AAAA", "-o", dir_arg, "--endpoint", endpoint]);
        assert!(message.contains("is a directory"), "{message}");
    }
    // A failed download leaves an existing output file as it was.
    let precious = dir.join("precious.txt");
    std::fs::write(&precious, b"keep me").unwrap();
    let unknown = "AQABAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let message = run(&[
        "get",
        unknown,
        "-o",
        precious.to_str().unwrap(),
        "--endpoint",
        &endpoint,
    ]);
    assert!(message.contains(unknown), "{message}");
    assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
    let message = run(&[
        "put",
        precious.to_str().unwrap(),
        "--endpoint",
        "http://127.0.0.1:1",
    ]);
    assert!(
        message.contains("cannot reach http://127.0.0.1:1"),
        "{message}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("larder-partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Endpoint mistakes name the fix: the CA flag for a private CA, http:// for a cleartext port, no
/// path (it would be ignored).
#[test]
fn endpoint_mistakes_say_what_to_do() {
    let cluster = common::Cluster::start_tls(3, 4, "");
    let input = common::file_with(cluster.dir.path(), b"hello");
    let https = cluster.https_url("");
    let cleartext_as_https = format!("https://{}", cluster.frontend_addr);
    let with_path = format!("http://{}/v1", cluster.frontend_addr);
    for (endpoint, expected) in [
        (https.as_str(), "--ca-certificates"),
        (cleartext_as_https.as_str(), "cleartext port (http://)"),
        (with_path.as_str(), "(with no path)"),
    ] {
        let output = larder(&["put", &input, "--endpoint", endpoint]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{endpoint}: {stderr}");
        assert!(stderr.contains(expected), "{endpoint}: {stderr}");
    }
}

/// A reader that stops early (`| head`, an `awk` that exits at its match) is not an error:
/// `larder config defaults` into a pipe whose reader is gone exits 0, quietly.
#[test]
fn config_defaults_into_a_closed_pipe_ends_quietly() {
    let mut child = Command::new(LARDER)
        .args(["config", "defaults"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And read to its end, it is every setting.
    let whole = larder(&["config", "defaults"]);
    let text = String::from_utf8_lossy(&whole.stdout);
    assert!(
        text.contains("cursor_save_every") && text.contains("[s3]"),
        "{text}"
    );
}
