//! A real cluster of processes, started as an operator would: `larder cluster init` writes the
//! map and the secret, then one `larder storage` per node and one `larder frontend` per
//! datacenter, each with its own config, data and log under the run's directory. Storage nodes
//! sit behind proxies (`proxy.rs`) and, for power losses, on a lossy file system (`lossyfs`).

use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use larder_cluster::ClusterMap;

use crate::clock::Clocks;
use crate::proxy::{Isolated, Proxy};

pub struct Settings {
    pub larder: PathBuf,
    /// `larder-lossyfs`: each storage node's data directory is mounted through it.
    pub lossyfs: Option<PathBuf>,
    pub dir: PathBuf,
    pub nodes: usize,
    pub partitions: u32,
    pub datacenters: Vec<String>,
    /// `durable` or `relaxed-no-sync-for-benchmarks` (the checker's own test).
    pub durability: String,
    /// The storage nodes' `[replication] caught_up_window`: the settle window of deletes.
    pub caught_up_window_ms: u64,
    /// Every `larder` process on its own skewable clock (`clock.rs`).
    pub clocks: Option<Clocks>,
    /// Storage nodes prepared but not in the map (their proxy listens, their config is
    /// written): the moves stream (`moves.rs`) adds them, or replaces a node with one.
    pub spares: usize,
    /// The storage nodes' `[redistribution] auto_replace_after`, in seconds (0: off).
    pub auto_replace_after_s: u64,
}

pub struct Process {
    pub name: String,
    args: Vec<String>,
    /// Added to the inherited environment (the clock's, when skewed).
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    /// SIGSTOPped right now.
    pub stopped: bool,
}

/// What a storage node slot of the harness is now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Started and kept running: the nemesis may kill, pause, partition or power-cut it, and
    /// healing restarts it. Whether it holds replicas is the map's business.
    Active,
    /// Not in the map yet, never started: waits for `add-node` or `replace-node`.
    Spare,
    /// Killed for good by the moves stream (to be replaced, or rebuilt elsewhere): neither the
    /// nemesis nor healing touches it.
    Retired,
}

pub struct StorageNode {
    pub process: Process,
    pub internal: SocketAddr,
    /// Its address in the map: its proxy's.
    pub address: SocketAddr,
    pub datacenter: String,
    /// Its config (for `larder cluster` commands, which take credentials and the map from it).
    pub config: PathBuf,
    pub role: Role,
    proxy: Proxy,
    data: LossyDir,
}

/// A directory a process writes, mounted through lossyfs when the run uses it: only what was
/// synced survives a power loss.
pub struct LossyDir {
    name: String,
    path: PathBuf,
    backing: PathBuf,
    mount: Option<Process>,
}

pub struct Frontend {
    pub process: Process,
    pub addr: SocketAddr,
    /// Its S3 port (`[s3] listen`).
    pub s3_addr: SocketAddr,
    pub datacenter: String,
    /// Its upload journal (`upload_journal_dir`).
    journal: LossyDir,
}

pub struct Cluster {
    pub dir: PathBuf,
    pub map: ClusterMap,
    pub secret_file: PathBuf,
    pub storage: Vec<StorageNode>,
    pub frontends: Vec<Frontend>,
    lossyfs: Option<PathBuf>,
    /// Storage nodes cut off from their peers' proxies too (two-way partitions).
    isolated: Isolated,
    /// The nodes a move copies from or to right now (the moves stream keeps it), which half of
    /// the storage faults aim at.
    pub moving: Vec<String>,
}

impl Process {
    fn new(name: &str, args: Vec<String>, log: PathBuf) -> Process {
        Process {
            name: name.to_owned(),
            args,
            env: Vec::new(),
            log,
            child: None,
            stopped: false,
        }
    }

    pub fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut command = Command::new(&self.args[0]);
        command
            .args(&self.args[1..])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Children die with the harness, even when it is SIGKILLed.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", self.name))?;
        self.child = Some(child);
        self.stopped = false;
        Ok(())
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    pub fn signal(&self, signal: i32) {
        if let Some(pid) = self.pid() {
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }

    /// SIGKILL and reap (a stopped process dies too).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            crate::clock::forget(child.id());
        }
        self.stopped = false;
    }

    pub fn is_running(&mut self) -> bool {
        self.exit_status().is_none() && self.child.is_some()
    }

    /// How the process ended, if it has ended by itself since it was started (reaped here).
    fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(Some(status))) => {
                self.child = None;
                Some(status)
            }
            Some(Err(_)) => {
                self.child = None;
                None
            }
            _ => None,
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn terminate(&mut self, grace: Duration) {
        if self.stopped {
            self.signal(libc::SIGCONT);
        }
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && self.is_running() {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }
}

/// A free loopback port for a process that the nemesis kills and restarts on it.
///
/// Never one the kernel hands out by itself (`127.0.0.1:0`, or the local end of an outgoing
/// connection): while a node is down, any connection on the machine (the cluster's own pool
/// and replication links, a test running beside this one) could take its port from the
/// ephemeral range and hold it for good, and the node could never listen again (CI: a storage
/// node silent for three minutes after a whole-cluster power loss). So below that range.
fn free_port() -> anyhow::Result<SocketAddr> {
    let port = free_port_run(1)?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// A base port with `n` consecutive free ports after it (`larder cluster init`), below the
/// ephemeral range (`free_port`).
fn free_port_run(n: usize) -> anyhow::Result<u16> {
    let (low, high) = ports_outside_ephemeral_range();
    let span = u32::from(high - low);
    let n = u16::try_from(n).context("too many ports")?;
    anyhow::ensure!(u32::from(n) < span, "no room for {n} ports");
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..500 {
        let first = low + (next_pick() % (span - u32::from(n))) as u16;
        let run = first..first + n;
        if run.clone().any(|port| handed_out.contains(&port)) {
            continue;
        }
        let held: Vec<_> = run
            .clone()
            .map_while(|port| TcpListener::bind(("127.0.0.1", port)).ok())
            .collect();
        if held.len() == usize::from(n) {
            handed_out.extend(run);
            return Ok(first);
        }
    }
    anyhow::bail!("no run of {n} free ports in {low}..{high}")
}

/// Every port this process has handed out. A port is free when picked but taken only later
/// (a node's process starts after every port is chosen; the map's addresses are bound by the
/// proxies one by one), so without this two nodes could be given one port: one of them cannot
/// listen and the other answers for it (CI: the frontend's "primary s3" answered as s1).
static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Ports from 10000 up to the start of the kernel's ephemeral range.
fn ports_outside_ephemeral_range() -> (u16, u16) {
    const LOW: u16 = 10_000;
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    (LOW, start.max(LOW + 1_000))
}

/// Spread over the range, differently in each process (tests run side by side).
fn next_pick() -> u32 {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // RandomState is keyed from the OS's randomness, once per process.
    let hash = std::collections::hash_map::RandomState::new().hash_one(n);
    (hash >> 32) as u32
}

pub fn wait_for_port(addr: SocketAddr, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn larder_args(larder: &Path, command: &str, config: &Path) -> Vec<String> {
    vec![
        larder.display().to_string(),
        command.into(),
        "--config".into(),
        config.display().to_string(),
    ]
}

impl Cluster {
    /// Writes the map and configs and starts everything (inside a tokio runtime: the proxies).
    pub async fn start(settings: &Settings) -> anyhow::Result<Cluster> {
        let dir = &settings.dir;
        std::fs::create_dir_all(dir.join("logs"))?;
        let map_path = dir.join("cluster.toml");
        let base = free_port_run(settings.nodes)?;
        let status = Command::new(&settings.larder)
            .args(["cluster", "init", "--nodes", &settings.nodes.to_string()])
            .args(["--partitions", &settings.partitions.to_string()])
            .args(["--datacenters", &settings.datacenters.join(",")])
            .args(["--base-port", &base.to_string(), "-o"])
            .arg(&map_path)
            .stdout(Stdio::null())
            .status()
            .context("running larder cluster init")?;
        anyhow::ensure!(status.success(), "larder cluster init failed");
        let map = ClusterMap::load(&map_path)?;
        let mut cluster = Cluster {
            dir: dir.clone(),
            secret_file: dir.join("cluster.secret"),
            map,
            storage: Vec::new(),
            frontends: Vec::new(),
            lossyfs: settings.lossyfs.clone(),
            isolated: Isolated::default(),
            moving: Vec::new(),
        };
        let mut slots: Vec<(String, String, Option<SocketAddr>)> = cluster
            .map
            .nodes
            .iter()
            .map(|n| (n.id.clone(), n.datacenter.clone(), Some(n.address)))
            .collect();
        for k in 0..settings.spares {
            let dc = &settings.datacenters[k % settings.datacenters.len()];
            slots.push((format!("s{}", settings.nodes + k + 1), dc.clone(), None));
        }
        for (id, datacenter, address) in slots {
            let internal = free_port()?;
            let address = match address {
                Some(a) => a,
                None => free_port()?,
            };
            let config = dir.join(format!("{id}.toml"));
            std::fs::write(&config, storage_config(&id, internal, settings))?;
            let data = LossyDir::new(dir, &id)?;
            let log = dir.join("logs").join(format!("{id}.log"));
            let mut process =
                Process::new(&id, larder_args(&settings.larder, "storage", &config), log);
            if let Some(clocks) = &settings.clocks {
                process.env = clocks.env(&id)?;
            }
            let role = match cluster.map.nodes.iter().any(|n| n.id == id) {
                true => Role::Active,
                false => Role::Spare,
            };
            cluster.storage.push(StorageNode {
                process,
                internal,
                address,
                datacenter,
                config,
                role,
                proxy: Proxy::start(address, internal, &cluster.isolated).await?,
                data,
            });
        }
        for i in cluster.active() {
            cluster.storage[i]
                .data
                .mount(dir, settings.lossyfs.as_deref())?;
            cluster.storage[i].process.start()?;
        }
        for i in cluster.active() {
            anyhow::ensure!(
                wait_for_port(cluster.storage[i].internal, Duration::from_secs(60)),
                "storage node {} did not start",
                cluster.storage[i].process.name
            );
        }
        for dc in &settings.datacenters {
            let addr = free_port()?;
            let s3_addr = free_port()?;
            let config = dir.join(format!("frontend-{dc}.toml"));
            // A short `replaced_blob_grace`, so overwritten and deleted objects' blobs are
            // tombstoned (and compacted away) within the run; small index leaves, so buckets
            // split into many under the faults, written as deltas from base blobs past ~1 KB
            // and folded again every second change or so (`larder-s3/src/leaf_base.rs`); leaves
            // of one name merged into a left neighbour of one, with it; merged leaves' stubs
            // removed after 30 s (6 times the longest pause a frontend takes
            // here), so that removals happen within a run too.
            std::fs::write(
                &config,
                format!(
                    "listen = \"{addr}\"\ncluster_map = \"cluster.toml\"\ndatacenter = {dc:?}\n\
                     upload_journal_dir = \"frontend-{dc}-uploads\"\n\n[auth]\nsecret_file = \"cluster.secret\"\n\n\
                     [s3]\nlisten = \"{s3_addr}\"\nreplaced_blob_grace = \"5s\"\nsweep_interval = \"2s\"\n\
                     index_leaf_entries = 2\nindex_merge_entries = 1\nindex_delta_bytes = 256\nmerged_leaf_grace = \"30s\"\n"
                ),
            )?;
            let mut journal = LossyDir::new(dir, &format!("frontend-{dc}-uploads"))?;
            journal.mount(dir, settings.lossyfs.as_deref())?;
            let log = dir.join("logs").join(format!("frontend-{dc}.log"));
            let mut process = Process::new(
                &format!("frontend-{dc}"),
                larder_args(&settings.larder, "frontend", &config),
                log,
            );
            if let Some(clocks) = &settings.clocks {
                process.env = clocks.env(&process.name)?;
            }
            process.start()?;
            anyhow::ensure!(
                wait_for_port(addr, Duration::from_secs(60)),
                "frontend {dc} did not start"
            );
            cluster.frontends.push(Frontend {
                process,
                addr,
                s3_addr,
                datacenter: dc.clone(),
                journal,
            });
        }
        Ok(cluster)
    }

    /// Power loss of node `i`: the node dies, then its file system loses everything not synced
    /// (the lossyfs process, which alone held it, is killed), and is mounted again.
    pub fn power_loss(&mut self, i: usize) -> anyhow::Result<()> {
        if self.storage[i].role != Role::Active {
            return Ok(());
        }
        self.storage[i].process.kill();
        self.storage[i]
            .data
            .power_loss(&self.dir, self.lossyfs.as_deref())
    }

    /// Power loss of frontend `i`: it dies, and its upload journal loses what was not synced.
    /// Without lossyfs, a kill.
    pub fn power_loss_frontend(&mut self, i: usize) -> anyhow::Result<()> {
        self.frontends[i].process.kill();
        self.frontends[i]
            .journal
            .power_loss(&self.dir, self.lossyfs.as_deref())
    }

    /// Fills node `i`'s disk, or empties it again (lossyfs's SIGUSR1).
    pub fn toggle_disk_full(&self, i: usize) {
        if let Some(mount) = &self.storage[i].data.mount {
            mount.signal(libc::SIGUSR1);
        }
    }

    pub fn uses_lossyfs(&self) -> bool {
        self.lossyfs.is_some()
    }

    /// Starts node `i` again, unless it was retired meanwhile (the moves stream).
    pub fn restart_storage(&mut self, i: usize) -> anyhow::Result<()> {
        match self.storage[i].role {
            Role::Active => self.storage[i].process.start(),
            _ => Ok(()),
        }
    }

    /// The slots whose nodes run (or are to run: healing restarts them).
    pub fn active(&self) -> Vec<usize> {
        (0..self.storage.len())
            .filter(|&i| self.storage[i].role == Role::Active)
            .collect()
    }

    /// A storage node for a fault drawn as `pick`: one of the active nodes, or, when
    /// `to_moving` and replicas are moving, a source or target of a move.
    pub fn storage_target(&self, pick: u64, to_moving: bool) -> Option<usize> {
        let moving: Vec<usize> = self
            .moving
            .iter()
            .filter_map(|id| self.slot(id))
            .filter(|&i| self.storage[i].role == Role::Active)
            .collect();
        let among = match to_moving && !moving.is_empty() {
            true => moving,
            false => self.active(),
        };
        match among.len() {
            0 => None,
            n => Some(among[(pick % n as u64) as usize]),
        }
    }

    /// The slot of node `id`.
    pub fn slot(&self, id: &str) -> Option<usize> {
        self.storage.iter().position(|n| n.process.name == id)
    }

    /// A spare (or retired) node joins: its file system is mounted and it starts. The caller
    /// waits for its port (without the lock).
    pub fn activate(&mut self, i: usize) -> anyhow::Result<()> {
        if self.storage[i].role == Role::Active {
            return Ok(());
        }
        if self.storage[i].data.mount.is_none() {
            self.storage[i]
                .data
                .mount(&self.dir, self.lossyfs.as_deref())?;
        }
        self.storage[i].role = Role::Active;
        self.storage[i].process.start()
    }

    /// Node `i` dies for good (SIGKILL; its data stays where it is, unused).
    pub fn retire(&mut self, i: usize) {
        self.storage[i].role = Role::Retired;
        self.storage[i].process.kill();
    }

    /// Cuts node `i` off both ways (`proxy.rs`), or joins it again.
    pub fn set_partitioned(&self, i: usize, partitioned: bool) {
        self.storage[i].proxy.set_blocked(partitioned);
        if let Some(pid) = self.storage[i].process.pid() {
            self.isolated.set(pid, partitioned);
        }
    }

    /// Everything up and reachable again: restarts what is down, continues what is stopped.
    pub fn heal(&mut self) -> anyhow::Result<()> {
        self.isolated.clear();
        for i in 0..self.storage.len() {
            self.set_partitioned(i, false);
        }
        for i in self.active() {
            heal_process(&mut self.storage[i].process)?;
        }
        for frontend in &mut self.frontends {
            heal_process(&mut frontend.process)?;
        }
        let mut silent = Vec::new();
        for i in self.active() {
            if !wait_for_port(self.storage[i].internal, Duration::from_secs(60)) {
                silent.push(&self.storage[i].process);
            }
        }
        for frontend in &self.frontends {
            if !wait_for_port(frontend.addr, Duration::from_secs(60)) {
                silent.push(&frontend.process);
            }
        }
        // The checks that follow only see "no answer"; the cause is in the process's log.
        for process in silent {
            eprintln!(
                "torture: {} does not listen 60 s after healing; its log: {}",
                process.name,
                process.log.display()
            );
        }
        Ok(())
    }

    pub fn shutdown(&mut self) {
        for frontend in &mut self.frontends {
            frontend.process.terminate(Duration::from_secs(10));
        }
        for node in &mut self.storage {
            node.process.terminate(Duration::from_secs(20));
        }
        for node in &mut self.storage {
            node.data.unmount();
        }
        for frontend in &mut self.frontends {
            frontend.journal.unmount();
        }
    }
}

impl LossyDir {
    /// `<run>/<name>`, backed by `<run>/<name>.backing` when mounted.
    fn new(run: &Path, name: &str) -> anyhow::Result<LossyDir> {
        let dir = LossyDir {
            name: name.to_owned(),
            path: run.join(name),
            backing: run.join(format!("{name}.backing")),
            mount: None,
        };
        std::fs::create_dir_all(&dir.path)?;
        std::fs::create_dir_all(&dir.backing)?;
        Ok(dir)
    }

    /// Mounts it through `lossyfs` (nothing without one).
    fn mount(&mut self, run: &Path, lossyfs: Option<&Path>) -> anyhow::Result<()> {
        let Some(lossyfs) = lossyfs else {
            return Ok(());
        };
        let log = run.join("logs").join(format!("{}-lossyfs.log", self.name));
        let args = vec![
            lossyfs.display().to_string(),
            self.backing.display().to_string(),
            self.path.display().to_string(),
        ];
        let mut mount = Process::new(&format!("{}-lossyfs", self.name), args, log);
        mount.start()?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while !is_mountpoint(&self.path) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "lossyfs did not mount {}",
                self.path.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.mount = Some(mount);
        Ok(())
    }

    fn unmount(&mut self) {
        if let Some(mut mount) = self.mount.take() {
            mount.kill();
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }

    /// What was not synced is gone (the lossyfs process, which alone held it, is killed); the
    /// synced state is mounted again. The process using it must be dead already.
    fn power_loss(&mut self, run: &Path, lossyfs: Option<&Path>) -> anyhow::Result<()> {
        self.unmount();
        self.mount(run, lossyfs)
    }
}

fn heal_process(process: &mut Process) -> anyhow::Result<()> {
    if process.stopped {
        process.signal(libc::SIGCONT);
        process.stopped = false;
    }
    if let Some(status) = process.exit_status() {
        eprintln!(
            "torture: {} had exited by itself ({status}); restarting it",
            process.name
        );
    }
    if process.child.is_none() {
        process.start()?;
    }
    Ok(())
}

fn is_mountpoint(path: &Path) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    let path = path.display().to_string();
    mounts
        .lines()
        .any(|line| line.split(' ').nth(1) == Some(path.as_str()))
}

/// Small segments and a fast compaction with a short tombstone retention, so that a run of
/// minutes seals, compacts and drops tombstones many times; the caught-up window is the
/// checker's settle window for deletes.
fn storage_config(node: &str, internal: SocketAddr, settings: &Settings) -> String {
    format!(
        "node_id = {node:?}\ncluster_map = \"cluster.toml\"\ndata_dir = {node:?}\nlisten = \"{internal}\"\n\
         shutdown_grace = \"5s\"\n\n\
         [auth]\nsecret_file = \"cluster.secret\"\n\n\
         [store]\nsegment_size = \"8 MiB\"\ndurability = {:?}\nmin_free_space = \"16 MiB\"\n\n\
         [compaction]\ninterval = \"3s\"\nmin_garbage_ratio = 0.2\ntombstone_retention = \"10s\"\n\n\
         [replication]\ncaught_up_window = \"{}ms\"\n\n\
         [redistribution]\nremoval_grace = \"2s\"\nauto_replace_after = \"{}s\"\n",
        settings.durability, settings.caught_up_window_ms, settings.auto_replace_after_s
    )
}
