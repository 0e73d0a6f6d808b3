//! Test harness: real `larder` processes on free loopback ports in a temp dir, real clients.
//! Every process is SIGKILLed and reaped when the harness is dropped, so no test leaves one behind.
#![allow(dead_code)]

pub mod certs;
pub mod frames;
pub mod h2;
pub mod internal;
pub mod metrics;
pub mod stream;
pub mod tls;
pub mod vespa_cli;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use larder_cluster::{init_map, ClusterMap, LayoutSpec};

pub const LARDER: &str = env!("CARGO_BIN_EXE_larder");

/// `n` loopback addresses with ports free right now.
///
/// The ports are released before the caller's processes bind them, so another may take one
/// meanwhile: tests of one binary run in parallel, and two clusters given the same port would
/// talk to each other's processes. No port is handed out twice in one test process. They lie
/// below the kernel's ephemeral range, which it never offers by itself: a node killed and
/// restarted on its port could otherwise find it held for good by the local end of some
/// outgoing connection made while it was down (a nemesis run lost a node that way in CI).
pub fn free_addresses(n: usize) -> Vec<SocketAddr> {
    use std::hash::BuildHasher;
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let (low, high) = ports_outside_ephemeral_range();
    // Held until all `n` are chosen, so that none is chosen twice.
    let mut held = Vec::new();
    let mut out = Vec::new();
    // RandomState is keyed from the OS's randomness: each test process starts elsewhere.
    let seed = std::collections::hash_map::RandomState::new().hash_one(0u8);
    for attempt in 0u64.. {
        assert!(attempt < 100_000, "no {n} free ports in {low}..{high}");
        let pick = seed.wrapping_add(attempt.wrapping_mul(7_919)) % u64::from(high - low);
        let port = low + pick as u16;
        if handed_out.contains(&port) {
            continue;
        }
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            handed_out.push(port);
            out.push(listener.local_addr().unwrap());
            held.push(listener);
            if out.len() == n {
                break;
            }
        }
    }
    out
}

/// Ports from 10000 up to the start of the kernel's ephemeral range.
fn ports_outside_ephemeral_range() -> (u16, u16) {
    const LOW: u16 = 10_000;
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    (LOW, start.max(LOW + 1_000))
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub map: ClusterMap,
    pub frontend_addr: SocketAddr,
    pub frontend_addrs: Vec<SocketAddr>,
    /// The (first) frontend's HTTPS port, when started with TLS.
    pub tls_addr: Option<SocketAddr>,
    pub certs: Option<certs::ClusterCerts>,
    nodes: Vec<Option<Child>>,
    frontends: Vec<Child>,
    frontend_configs: Vec<String>,
}

impl Cluster {
    /// `nodes` storage nodes in one datacenter, 3 replicas per partition, one frontend.
    pub fn start(nodes: usize, partitions: u32) -> Cluster {
        Self::start_with(nodes, partitions, "")
    }

    /// Like `start`, with extra TOML appended to the frontend's config.
    pub fn start_with(nodes: usize, partitions: u32, frontend_extra: &str) -> Cluster {
        Self::start_in(&["dc1"], nodes, partitions, frontend_extra)
    }

    /// Storage nodes dealt round-robin to `datacenters`, 3 replicas per partition in each, and one
    /// frontend per datacenter (`frontend_addrs[i]` serves `datacenters[i]`).
    pub fn start_in(
        datacenters: &[&str],
        nodes: usize,
        partitions: u32,
        frontend_extra: &str,
    ) -> Cluster {
        Self::start_in_with(datacenters, nodes, partitions, frontend_extra, "")
    }

    /// Like `start_with`, with extra TOML appended to every storage node's config too.
    pub fn start_full(
        nodes: usize,
        partitions: u32,
        frontend_extra: &str,
        storage_extra: &str,
    ) -> Cluster {
        Self::start_in_with(&["dc1"], nodes, partitions, frontend_extra, storage_extra)
    }

    /// Like `start_in`, with extra TOML for the storage nodes' configs.
    pub fn start_in_with(
        datacenters: &[&str],
        nodes: usize,
        partitions: u32,
        frontend_extra: &str,
        storage_extra: &str,
    ) -> Cluster {
        Self::launch(
            datacenters,
            nodes,
            partitions,
            frontend_extra,
            storage_extra,
            false,
        )
    }

    /// TLS everywhere: an HTTPS port on the frontend, mutual TLS from the frontend to the storage
    /// nodes and between storage nodes, with certificates from a fresh test CA (`cluster.certs`).
    pub fn start_tls(nodes: usize, partitions: u32, frontend_extra: &str) -> Cluster {
        Self::launch(&["dc1"], nodes, partitions, frontend_extra, "", true)
    }

    fn launch(
        datacenters: &[&str],
        nodes: usize,
        partitions: u32,
        frontend_extra: &str,
        storage_extra: &str,
        tls: bool,
    ) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let addresses = free_addresses(nodes + 2 * datacenters.len());
        let certs = tls.then(|| certs::ClusterCerts::write(dir.path()));
        // Without TLS, every internal hop proves the cluster secret, as `larder dev` sets up;
        // with TLS, mutual TLS authenticates and no secret is needed.
        let storage_extra = match tls {
            true => format!(
                "{storage_extra}{}{}",
                certs::STORAGE_TLS,
                certs::STORAGE_POOL_TLS
            ),
            false => with_secret(dir.path(), storage_extra),
        };
        let frontend_extra = match tls {
            true => frontend_extra.to_owned(),
            false => with_secret(dir.path(), frontend_extra),
        };
        let spec = LayoutSpec {
            datacenters: datacenters.iter().map(|d| d.to_string()).collect(),
            node_addresses: addresses[..nodes].to_vec(),
            partitions,
            replicas_per_datacenter: 3,
        };
        let map = init_map(&spec).unwrap();
        map.save(&dir.path().join("cluster.toml")).unwrap();
        for node in &map.nodes {
            let text = format!(
                "node_id = {:?}\ncluster_map = \"cluster.toml\"\ndata_dir = {:?}\n{storage_extra}",
                node.id, node.id
            );
            std::fs::write(dir.path().join(format!("{}.toml", node.id)), text).unwrap();
        }
        let frontend_addrs = addresses[nodes..nodes + datacenters.len()].to_vec();
        let tls_addrs = addresses[nodes + datacenters.len()..].to_vec();
        let mut cluster = Cluster {
            dir,
            map,
            frontend_addr: frontend_addrs[0],
            frontend_addrs: frontend_addrs.clone(),
            tls_addr: tls.then_some(tls_addrs[0]),
            certs,
            nodes: Vec::new(),
            frontends: Vec::new(),
            frontend_configs: Vec::new(),
        };
        for i in 0..nodes {
            let child = cluster.spawn_node(i);
            cluster.nodes.push(Some(child));
        }
        for i in 0..nodes {
            wait_for_port(cluster.node_addr(i));
        }
        for ((dc, addr), tls_addr) in datacenters.iter().zip(&frontend_addrs).zip(&tls_addrs) {
            let name = format!("frontend-{dc}.toml");
            let mut text = format!("listen = \"{addr}\"\ncluster_map = \"cluster.toml\"\ndatacenter = \"{dc}\"\n{frontend_extra}");
            if tls {
                text.push_str(&certs::frontend_tls(*tls_addr));
                text.push_str(certs::POOL_TLS);
            }
            std::fs::write(cluster.dir.path().join(&name), text).unwrap();
            let frontend = spawn(&["frontend", "--config", &cluster.path(&name)]);
            cluster.frontends.push(frontend);
            cluster.frontend_configs.push(cluster.path(&name));
            wait_for_port(*addr);
            if tls {
                wait_for_port(*tls_addr);
            }
        }
        cluster
    }

    /// `https://localhost:<port><path>` on the TLS port (the test certificate names localhost).
    pub fn https_url(&self, path: &str) -> String {
        let port = self.tls_addr.expect("started with TLS").port();
        format!("https://localhost:{port}{path}")
    }

    pub fn frontend_mut(&mut self) -> &mut Child {
        &mut self.frontends[0]
    }

    /// SIGKILLs the (first) frontend, then starts it again with the same config.
    pub fn kill_and_restart_frontend(&mut self) {
        let frontend = &mut self.frontends[0];
        reap(frontend);
        *frontend = spawn(&["frontend", "--config", &self.frontend_configs[0]]);
        wait_for_port(self.frontend_addr);
    }

    /// SIGKILLs frontend `i`, appends `extra` to its config, and starts it again.
    pub fn reconfigure_frontend(&mut self, i: usize, extra: &str) {
        let frontend = &mut self.frontends[i];
        reap(frontend);
        let config = &self.frontend_configs[i];
        let text = std::fs::read_to_string(config).unwrap();
        std::fs::write(config, format!("{text}\n{extra}")).unwrap();
        *frontend = spawn(&["frontend", "--config", config]);
        wait_for_port(self.frontend_addrs[i]);
    }

    /// SIGKILLs the (first) frontend, then starts it again with `env` added to its environment.
    pub fn restart_frontend_with_env(&mut self, env: &[(&str, &str)]) {
        let frontend = &mut self.frontends[0];
        reap(frontend);
        *frontend = Command::new(LARDER)
            .args(["frontend", "--config", &self.frontend_configs[0]])
            .env("LARDER_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_port(self.frontend_addr);
    }

    /// Sends `sig` to storage node `i` (e.g. SIGSTOP = 19, SIGCONT = 18).
    pub fn signal_node(&self, i: usize, sig: i32) {
        signal(self.nodes[i].as_ref().expect("node is running"), sig);
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.frontend_addr)
    }

    /// Process id of the (first) frontend, to read its memory use from /proc.
    pub fn frontend_pid(&self) -> u32 {
        self.frontends[0].id()
    }

    /// Process id of storage node `i`, if it runs.
    pub fn node_pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].as_ref().map(Child::id)
    }

    pub fn node_addr(&self, i: usize) -> SocketAddr {
        self.map.nodes[i].address
    }

    /// An HTTP/2 connection to a storage node's internal port, authenticated with the
    /// cluster's secret (the port serves nobody else).
    pub async fn node_client(&self, addr: SocketAddr) -> h2::H2Client {
        h2::H2Client::connect_authenticated(addr, &self.dir.path().join(SECRET_FILE)).await
    }

    /// How many storage nodes hold blob `id` live (asked on their internal port, so this
    /// works while the frontend is down).
    pub fn replicas_holding(&self, id: &str) -> usize {
        let blob: larder_cluster::BlobId = id.parse().unwrap();
        let path = larder_proto::blob_path(blob.partition, id);
        (0..self.map.nodes.len())
            .filter(|i| self.internal_request(self.node_addr(*i), "GET", &path).0 == 200)
            .count()
    }

    /// Document `key` (a JSON record of the S3 layer, say) as each storage node holding it
    /// has it, asked on their internal ports.
    pub fn doc_copies(&self, key: &str) -> Vec<serde_json::Value> {
        let partitions = self.map.partitions.len() as u32;
        let partition = larder_cluster::partition_for_key(key.as_bytes(), partitions);
        let path = larder_proto::doc_path(partition, key);
        (0..self.map.nodes.len())
            .map(|i| self.internal_request(self.node_addr(i), "GET", &path))
            .filter(|(status, _)| *status == 200)
            .map(|(_, body)| serde_json::from_slice(&body).unwrap())
            .collect()
    }

    /// One request to a storage node's internal port (authenticated), from synchronous tests.
    pub fn internal_request(&self, addr: SocketAddr, method: &str, path: &str) -> (u16, Vec<u8>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let client = self.node_client(addr).await;
            let method = http::Method::from_bytes(method.as_bytes()).unwrap();
            let (status, body) = client.request(method, path, bytes::Bytes::new()).await;
            (status.as_u16(), body.to_vec())
        })
    }

    fn spawn_node(&self, i: usize) -> Child {
        spawn(&[
            "storage",
            "--config",
            &self.path(&format!("{}.toml", self.map.nodes[i].id)),
        ])
    }

    /// SIGKILL: the node gets no chance to sync, checkpoint or say goodbye.
    pub fn kill_node(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].take() {
            reap(&mut child);
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop_node(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].take() {
            signal(&child, libc_sigterm());
            let status = wait_timeout(&mut child, Duration::from_secs(30))
                .expect("storage node stops on SIGTERM");
            assert!(status.success(), "storage node exited with {status}");
        }
    }

    /// Starts stopped node `i` again with `env` added to its environment.
    pub fn restart_node_with_env(&mut self, i: usize, env: &[(&str, &str)]) {
        assert!(self.nodes[i].is_none(), "node {i} is still running");
        let config = self.path(&format!("{}.toml", self.map.nodes[i].id));
        let child = Command::new(LARDER)
            .args(["storage", "--config", &config])
            .env("LARDER_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        self.nodes[i] = Some(child);
        wait_for_port(self.node_addr(i));
    }

    pub fn restart_node(&mut self, i: usize) {
        assert!(self.nodes[i].is_none(), "node {i} is still running");
        let child = self.spawn_node(i);
        self.nodes[i] = Some(child);
        wait_for_port(self.node_addr(i));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self
            .nodes
            .iter_mut()
            .flatten()
            .chain(self.frontends.iter_mut())
        {
            reap(child);
        }
    }
}

/// SIGKILLs and reaps `child`, and removes what libfaketime left in /dev/shm for it (a
/// process on a faked clock creates a semaphore and a segment there and removes them only
/// when it exits by itself).
pub fn reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
    let pid = child.id();
    let _ = std::fs::remove_file(format!("/dev/shm/faketime_shm_{pid}"));
    let _ = std::fs::remove_file(format!("/dev/shm/sem.faketime_sem_{pid}"));
}

/// The name of the cluster secret file the harness writes next to the map.
pub const SECRET_FILE: &str = "cluster.secret";

/// `extra` with an `[auth]` section naming the cluster secret (written on first use), unless
/// the test brings its own `[auth]`.
fn with_secret(dir: &Path, extra: &str) -> String {
    if extra.contains("[auth]") {
        return extra.to_owned();
    }
    let path = dir.join(SECRET_FILE);
    if !path.exists() {
        larder_auth::generate_secret_file(&path).unwrap();
    }
    format!("{extra}\n[auth]\nsecret_file = \"{SECRET_FILE}\"\n")
}

/// A child process SIGKILLed and reaped when dropped, so a test that fails (panics) before
/// stopping it leaves nothing running. A `larder dev` takes its storage nodes with it
/// (parent-death signal); one left running would outlive the test's temporary directory.
pub struct Reaped(pub Child);

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn spawn(args: &[&str]) -> Child {
    Command::new(LARDER)
        .args(args)
        .env("LARDER_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

pub fn libc_sigterm() -> i32 {
    15
}

pub fn signal(child: &Child, sig: i32) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

pub fn wait_for_port(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    // A connection to an ephemeral port with nobody listening can land on itself (TCP
    // simultaneous open): that is not the server.
    let accepted = || {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200))
            .is_ok_and(|s| s.local_addr().ok() != Some(addr))
    };
    while !accepted() {
        assert!(
            Instant::now() < deadline,
            "{addr} never accepted connections"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The result of one curl run: status, headers (lower-case names) and body.
pub struct CurlResponse {
    pub status: u16,
    pub version: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl CurlResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn error_code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

/// The status of a curl request that may get no answer at all (a server that exits in the
/// middle of it): `None` then. The body is dropped; 30 s at most.
pub fn status_if_answered(dir: &Path, args: &[&str]) -> Option<u16> {
    let out = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "30",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    match out.status.success() {
        true => String::from_utf8_lossy(&out.stdout).parse().ok(),
        false => None,
    }
}

/// Runs curl with `args`, capturing headers to a file and the body to stdout.
pub fn curl(dir: &Path, args: &[&str]) -> CurlResponse {
    let headers_file: PathBuf = dir.join(format!("headers-{}", rand::random::<u64>()));
    let output: Output = Command::new("curl")
        .args(["-sS", "--max-time", "60", "-D"])
        .arg(&headers_file)
        .args(args)
        .output()
        .expect("curl is installed");
    assert!(
        output.status.success(),
        "curl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let raw = std::fs::read_to_string(&headers_file).unwrap();
    let _ = std::fs::remove_file(&headers_file);
    // With a 100-continue there can be several header blocks; the last one is the answer.
    let block = raw.trim_end().rsplit("\r\n\r\n").next().unwrap();
    let mut lines = block.lines();
    let status_line = lines.next().unwrap();
    let mut parts = status_line.split_whitespace();
    let version = parts.next().unwrap().to_owned();
    let status = parts.next().unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    CurlResponse {
        status,
        version,
        headers,
        body: output.stdout,
    }
}

/// A request through `cluster`'s frontend over h2c with an optional JSON body, as curl sends it
/// (the `/document/v1` tests' one way of calling the API).
pub fn json_request(
    cluster: &Cluster,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> CurlResponse {
    let dir = cluster.dir.path();
    let url = cluster.url(path);
    let mut args = vec!["--http2-prior-knowledge", "-X", method];
    let file;
    if let Some(body) = body {
        file = format!("@{}", file_with(dir, body));
        args.extend([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &file,
        ]);
    }
    args.push(&url);
    curl(dir, &args)
}

/// Writes `bytes` to a file in `dir` for `curl --data-binary @file`.
pub fn file_with(dir: &Path, bytes: &[u8]) -> String {
    let path = dir.join(format!("body-{}", rand::random::<u64>()));
    std::fs::write(&path, bytes).unwrap();
    path.display().to_string()
}

/// Flips a byte of node `i`'s copy of the blob at `path` (a storage node's path, which names
/// its partition) where `near` is stored.
pub fn damage(cluster: &Cluster, i: usize, path: &str, near: &[u8]) {
    let id = path.rsplit('/').next().unwrap();
    let partition = id.parse::<larder_cluster::BlobId>().unwrap().partition;
    let segment = cluster
        .dir
        .path()
        .join(&cluster.map.nodes[i].id)
        .join("disk0")
        .join(format!("p{partition}"))
        .join("seg-00000001.log");
    let mut bytes = std::fs::read(&segment).unwrap();
    let at = bytes
        .windows(near.len())
        .position(|w| w == near)
        .expect("blob data in the segment");
    bytes[at + 10] ^= 0xff;
    std::fs::write(&segment, bytes).unwrap();
}

pub fn random_bytes(len: usize) -> Vec<u8> {
    (0..len).map(|_| rand::random::<u8>()).collect()
}

/// A test tool by name: on PATH, or where `go install` puts it. `scripts/test` installs them.
pub fn tool(name: &str) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(gopath) = std::env::var_os("GOPATH") {
        dirs.push(PathBuf::from(gopath).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join("go/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not installed; scripts/test installs it"))
}

/// `larder s3 key create` through the first frontend's config with `grants`
/// (`BUCKET:PERMISSION`): (access key ID, secret).
pub fn s3_key(cluster: &Cluster, grants: &[&str]) -> (String, String) {
    let mut command = Command::new(LARDER);
    command.args([
        "s3",
        "key",
        "create",
        "--config",
        &cluster.path("frontend-dc1.toml"),
    ]);
    for grant in grants {
        command.args(["--grant", grant]);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        key["access_key_id"].as_str().unwrap().to_owned(),
        key["secret_access_key"].as_str().unwrap().to_owned(),
    )
}

/// The Python that has `h2` and `httpx[http2]`: `$LARDER_TEST_PYTHON`, else the venv that
/// `scripts/test` makes under the target directory.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("LARDER_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let venv = target.join("test-venv/bin/python");
    assert!(
        venv.is_file(),
        "{} is missing; scripts/test creates it (or set LARDER_TEST_PYTHON)",
        venv.display()
    );
    venv
}

/// A connection to `addr` from the local address `ip` (any 127.0.0.0/8 address works on Linux).
pub fn connect_from(ip: std::net::IpAddr, addr: SocketAddr) -> std::net::TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(ip, 0)).unwrap();
        socket.connect(addr).await.unwrap()
    });
    let stream = stream.into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    stream
}

/// Resident memory of a process in KiB (VmRSS from /proc).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// A second frontend of the cluster's datacenter, killed when dropped.
pub struct SecondFrontend {
    pub child: Child,
    pub addr: SocketAddr,
}

impl SecondFrontend {
    pub fn start(cluster: &Cluster) -> SecondFrontend {
        let addr = free_addresses(1)[0];
        let config = std::fs::read_to_string(cluster.path("frontend-dc1.toml")).unwrap();
        let config = config.replace(
            &format!("listen = \"{}\"", cluster.frontend_addr),
            &format!("listen = \"{addr}\""),
        );
        let path = cluster.path("frontend-second.toml");
        std::fs::write(&path, config).unwrap();
        let child = spawn(&["frontend", "--config", &path]);
        wait_for_port(addr);
        SecondFrontend { child, addr }
    }
}

impl Drop for SecondFrontend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Presigned S3 URLs for one access key on one S3 port (SigV4 in the query, ten minutes), so
/// that curl can be the S3 client.
pub struct Presigner {
    pub s3: SocketAddr,
    pub id: String,
    pub secret: String,
}

impl Presigner {
    /// A key with `grants` (see `s3_key`) on the S3 port `s3`.
    pub fn new(cluster: &Cluster, s3: SocketAddr, grants: &[&str]) -> Presigner {
        let (id, secret) = s3_key(cluster, grants);
        Presigner { s3, id, secret }
    }

    /// `method` on `bucket`/`object` (an empty object: the bucket), with extra query fields.
    pub fn url(&self, method: &str, bucket: &str, object: &str, query: &[(&str, &str)]) -> String {
        let endpoint = format!("http://{}", self.s3);
        let request = larder_s3::Presign {
            method,
            endpoint: &endpoint,
            bucket,
            key: object,
            access_key_id: &self.id,
            secret: &self.secret,
            region: "us-east-1",
            expires: Duration::from_secs(600),
            now: std::time::SystemTime::now(),
        };
        larder_s3::presign_with_query(&request, query).unwrap()
    }
}
