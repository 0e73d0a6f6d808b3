//! A third-party conformance suite against the S3 port: `s3s-e2e` (crates.io, the s3s
//! project's end-to-end cases on the AWS Rust SDK), installed by `scripts/test` with
//! `cargo install --locked` into a per-machine cache (`~/.cache/larder-tools`) and named by
//! `$LARDER_TEST_S3S_E2E` (else `<target>/tools`). It reads the endpoint and a key from the usual AWS variables.
//!
//! Without the tool the test is skipped with a message, unless `LARDER_REQUIRE_INTEROP=1` (as
//! `scripts/test` sets it) and `scripts/test` did not record that the install failed
//! (`LARDER_S3S_E2E_UNAVAILABLE`, e.g. crates.io unreachable): then a missing tool fails.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{Cluster, LARDER};

/// Cases that test what Larder deliberately does not do, left out by name.
const NOT_LARDER: &[(&str, &str)] = &[
    // STS AssumeRole: Larder's keys are made with `larder s3 key create`; there is no STS
    // endpoint, role or session token.
    ("Advanced/STS/test_assume_role", "no STS"),
];

/// The tool, or `None` (with a message) when it is not installed and may be missing.
fn s3s_e2e() -> Option<PathBuf> {
    let path = match std::env::var_os("LARDER_TEST_S3S_E2E") {
        Some(path) => PathBuf::from(path),
        None => {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
            target.join("tools/bin/s3s-e2e")
        }
    };
    if path.is_file() {
        return Some(path);
    }
    let why_missing = std::env::var("LARDER_S3S_E2E_UNAVAILABLE").ok();
    assert!(
        why_missing.is_some() || std::env::var("LARDER_REQUIRE_INTEROP").as_deref() != Ok("1"),
        "s3s-e2e is not installed at {} (scripts/test installs it)",
        path.display()
    );
    eprintln!(
        "skipping: s3s-e2e is not installed at {} ({}); scripts/test installs it with cargo install",
        path.display(),
        why_missing.as_deref().unwrap_or("not installed")
    );
    None
}

/// The suite's case names (`suite/fixture/case`), less the ones Larder does not do.
fn cases(tool: &PathBuf) -> Vec<String> {
    let out = Command::new(tool).arg("--list").output().unwrap();
    assert!(out.status.success(), "s3s-e2e --list: {out:?}");
    let listed = String::from_utf8(out.stdout).unwrap();
    let cases: Vec<String> = listed
        .lines()
        .map(str::trim)
        .filter(|l| l.matches('/').count() == 2)
        .filter(|l| NOT_LARDER.iter().all(|(name, _)| l != name))
        .map(str::to_owned)
        .collect();
    assert!(cases.len() >= 10, "s3s-e2e lists too few cases: {listed}");
    cases
}

#[test]
fn the_s3s_e2e_suite_passes() {
    let Some(tool) = s3s_e2e() else {
        return;
    };
    let s3 = common::free_addresses(1)[0];
    let extra = format!("[chunking]\nchunk_size = \"1MiB\"\n\n[s3]\nlisten = \"{s3}\"\n");
    let cluster = Cluster::start_with(3, 8, &extra);
    common::wait_for_port(s3);
    let config = cluster.path("frontend-dc1.toml");
    let out = Command::new(LARDER)
        .args([
            "s3", "key", "create", "--config", &config, "--grant", "*:owner",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let key: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut command = Command::new(&tool);
    for case in cases(&tool) {
        // Exact names: the filter is a set of regular expressions, any of which selects.
        command.args(["--filter", &format!("^{}$", regex_escape(&case))]);
    }
    let out = command
        // It reads a `.env` from its working directory: the cluster's, which has none.
        .current_dir(cluster.dir.path())
        .env("AWS_ENDPOINT_URL", format!("http://{s3}"))
        .env("AWS_ACCESS_KEY_ID", key["access_key_id"].as_str().unwrap())
        .env(
            "AWS_SECRET_ACCESS_KEY",
            key["secret_access_key"].as_str().unwrap(),
        )
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .env("AWS_CONFIG_FILE", cluster.path("no-aws-config"))
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            cluster.path("no-aws-credentials"),
        )
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "s3s-e2e failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("FAILED"), "{stdout}");
}

/// Case names are letters, digits, `_` and `/`; anything else is escaped for the regex.
fn regex_escape(name: &str) -> String {
    name.chars()
        .flat_map(
            |c| match c.is_ascii_alphanumeric() || c == '_' || c == '/' {
                true => vec![c],
                false => vec!['\\', c],
            },
        )
        .collect()
}
