//! Vespa's own command-line tool, `vespa` (Go), as a test client. It is published on PyPI as
//! `vespacli` (the wheel carries the binary); `scripts/test` installs it into the test venv
//! of the Python that `python()` finds, or `$LARDER_TEST_VESPA` names the binary.
//!
//! Without it a test is skipped, unless `LARDER_REQUIRE_INTEROP=1` (as `scripts/test` and CI
//! set it), when a missing tool is a failure.

use std::path::PathBuf;
use std::process::{Command, Output};

use super::Cluster;

/// The `vespa` tool, pointed at one frontend, with its home in the cluster's temp dir (it
/// writes config and caches there, never in the user's `~/.vespa`).
pub struct VespaCli {
    binary: PathBuf,
    home: String,
    target: String,
}

impl VespaCli {
    /// The tool aimed at `cluster`'s (first) frontend, or `None` (with a message) when it is
    /// not installed and the run does not require it.
    pub fn new(cluster: &Cluster) -> Option<VespaCli> {
        let binary = installed()?;
        let home = cluster.path("vespa-cli-home");
        std::fs::create_dir_all(&home).expect("the cluster's temp dir is writable");
        Some(VespaCli {
            binary,
            home,
            target: format!("http://{}", cluster.frontend_addr),
        })
    }

    /// Runs `vespa <args> -t <frontend>` (every subcommand that talks to a container takes
    /// `-t`), its output captured.
    pub fn run(&self, args: &[&str]) -> Output {
        Command::new(&self.binary)
            .args(args)
            .args(["-t", &self.target])
            .env("VESPA_CLI_HOME", &self.home)
            .env("VESPA_CLI_CACHE_DIR", &self.home)
            .env("NO_COLOR", "1")
            .output()
            .expect("the vespa tool runs")
    }

    /// Like `run`, and fails the test unless the tool succeeds; its standard output.
    pub fn run_ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "vespa {args:?}: {}\nstdout: {}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("vespa prints UTF-8")
    }
}

/// Where the tool is: `$LARDER_TEST_VESPA`, else the Go binary inside the test venv's
/// `vespacli` package. Not the venv's `bin/vespa`: that Python wrapper always exits 0.
fn installed() -> Option<PathBuf> {
    let candidate = match std::env::var_os("LARDER_TEST_VESPA") {
        Some(path) => Some(PathBuf::from(path)),
        None => binary_in_venv(),
    };
    if let Some(path) = candidate.filter(|p| p.is_file()) {
        return Some(path);
    }
    assert!(
        std::env::var("LARDER_REQUIRE_INTEROP").as_deref() != Ok("1"),
        "Vespa's CLI is not installed: scripts/test installs the PyPI package vespacli into the test venv"
    );
    eprintln!("skipping: Vespa's CLI (`pip install vespacli` into the test venv) is not installed");
    None
}

/// The binary the package carries, as the package itself finds it.
fn binary_in_venv() -> Option<PathBuf> {
    let python = venv_python().filter(|p| p.is_file())?;
    let output = Command::new(python)
        .args(["-c", "import vespacli; print(vespacli.get_binary_path())"])
        .output()
        .ok()?;
    let path = String::from_utf8(output.stdout).ok()?;
    output.status.success().then(|| PathBuf::from(path.trim()))
}

/// The test venv's Python, if there is one (without panicking, unlike `python()`).
fn venv_python() -> Option<PathBuf> {
    if let Some(python) = std::env::var_os("LARDER_TEST_PYTHON") {
        return Some(PathBuf::from(python));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    Some(target.join("test-venv/bin/python"))
}
