//! The nemesis: a schedule of faults drawn from the run's seed before the run starts (the same
//! seed gives the same faults at the same offsets), then applied one after another, each healed
//! before the next begins, so a quorum stays reachable in each datacenter most of the time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cluster::Cluster;
use crate::content::Rng;
use crate::history::History;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL a storage node, restart it after the duration.
    KillStorage,
    /// SIGSTOP a storage node for the duration, then SIGCONT.
    PauseStorage,
    /// SIGKILL a frontend (its upload journal loses what it did not sync), restart it after
    /// the duration.
    KillFrontend,
    /// SIGSTOP a frontend for the duration.
    PauseFrontend,
    /// Cut every connection to a storage node (its proxy) for the duration.
    PartitionStorage,
    /// SIGKILL a storage node and drop its file system's unsynced writes.
    PowerLossStorage,
    /// The same for every storage node at once.
    PowerLossCluster,
    /// A storage node's disk reports no free space and refuses to grow files, for the duration.
    DiskFull,
    /// A process's wall clock jumped (`clock.rs`: its own schedule, overlapping these faults).
    ClockSkew,
}

#[derive(Clone, Debug, Serialize)]
pub struct Fault {
    pub at_ms: u64,
    pub kind: FaultKind,
    /// A frontend's index; for a storage node, a number that picks one of the nodes active
    /// when the fault starts (the map changes during a run: `Cluster::storage_target`).
    pub target: u64,
    /// A storage fault aims at a source or target of a move in progress, if there is one.
    pub at_moving: bool,
    pub duration_ms: u64,
}

pub struct ScheduleSpec {
    pub seed: u64,
    pub duration: Duration,
    pub frontends: usize,
    pub power_loss: bool,
    /// End with a whole-cluster power loss (the checker's own test).
    pub final_cluster_power_loss: bool,
    pub mean_gap_ms: u64,
}

pub fn schedule(spec: &ScheduleSpec) -> Vec<Fault> {
    let mut rng = Rng::derive(spec.seed, 1);
    let mut faults = Vec::new();
    let mut at = rng.range(500, 2000);
    let end = spec.duration.as_millis() as u64;
    while at < end {
        let kind = pick_kind(&mut rng, spec.power_loss);
        let target = match kind {
            FaultKind::KillFrontend | FaultKind::PauseFrontend => {
                rng.range(0, spec.frontends as u64)
            }
            _ => rng.range(0, 1 << 20),
        };
        let at_moving = rng.chance(50);
        let duration_ms = match kind {
            FaultKind::PauseStorage | FaultKind::PauseFrontend => rng.range(1000, 5000),
            FaultKind::PartitionStorage | FaultKind::DiskFull => rng.range(2000, 6000),
            _ => rng.range(200, 3000),
        };
        faults.push(Fault {
            at_ms: at,
            kind,
            target,
            at_moving,
            duration_ms,
        });
        at += duration_ms + rng.range(spec.mean_gap_ms / 2, spec.mean_gap_ms * 3 / 2);
    }
    if spec.final_cluster_power_loss {
        faults.push(Fault {
            at_ms: end,
            kind: FaultKind::PowerLossCluster,
            target: 0,
            at_moving: false,
            duration_ms: 500,
        });
    }
    faults
}

fn pick_kind(rng: &mut Rng, power_loss: bool) -> FaultKind {
    loop {
        let kind = match rng.range(0, 100) {
            0..=29 => FaultKind::KillStorage,
            30..=34 => FaultKind::DiskFull,
            35..=49 => FaultKind::PauseStorage,
            50..=59 => FaultKind::KillFrontend,
            60..=64 => FaultKind::PauseFrontend,
            65..=74 => FaultKind::PartitionStorage,
            75..=96 => FaultKind::PowerLossStorage,
            _ => FaultKind::PowerLossCluster,
        };
        // Power losses and full disks are lossyfs's.
        let needs_power = matches!(
            kind,
            FaultKind::PowerLossStorage | FaultKind::PowerLossCluster | FaultKind::DiskFull
        );
        if power_loss || !needs_power {
            return kind;
        }
    }
}

/// Applies `faults` in order (blocking); returns the count per kind.
pub fn run(
    faults: &[Fault],
    cluster: &Arc<Mutex<Cluster>>,
    history: &History,
) -> BTreeMap<FaultKind, u64> {
    let start = Instant::now();
    let mut counts = BTreeMap::new();
    for fault in faults {
        let at = Duration::from_millis(fault.at_ms);
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let node = storage_fault(fault.kind)
            .then(|| lock(cluster).storage_target(fault.target, fault.at_moving))
            .flatten();
        let name = node.map(|i| lock(cluster).storage[i].process.name.clone());
        let detail = serde_json::to_string(fault).unwrap_or_default();
        let detail = match name {
            Some(name) => format!("{detail} on {name}"),
            None => detail,
        };
        history.note("nemesis", "fault", &detail);
        match apply(fault, node, cluster) {
            Ok(()) => *counts.entry(fault.kind).or_insert(0) += 1,
            Err(e) => history.note("nemesis", "fault-failed", &format!("{detail}: {e:#}")),
        }
        history.note("nemesis", "healed", &detail);
    }
    counts
}

fn lock(cluster: &Arc<Mutex<Cluster>>) -> std::sync::MutexGuard<'_, Cluster> {
    cluster.lock().unwrap_or_else(|e| e.into_inner())
}

/// Faults aimed at one storage node.
fn storage_fault(kind: FaultKind) -> bool {
    matches!(
        kind,
        FaultKind::KillStorage
            | FaultKind::PauseStorage
            | FaultKind::PartitionStorage
            | FaultKind::PowerLossStorage
            | FaultKind::DiskFull
    )
}

fn apply(fault: &Fault, node: Option<usize>, cluster: &Arc<Mutex<Cluster>>) -> anyhow::Result<()> {
    let pause = Duration::from_millis(fault.duration_ms);
    let i = match (storage_fault(fault.kind), node) {
        (true, Some(i)) => i,
        (true, None) => anyhow::bail!("no storage node is active"),
        (false, _) => fault.target as usize,
    };
    match fault.kind {
        FaultKind::KillStorage => {
            lock(cluster).storage[i].process.kill();
            std::thread::sleep(pause);
            lock(cluster).restart_storage(i)?;
        }
        FaultKind::PauseStorage => {
            pause_for(cluster, pause, |c| &mut c.storage[i].process);
        }
        FaultKind::KillFrontend => {
            // With lossyfs its upload journal loses what was not synced, as in a power loss.
            lock(cluster).power_loss_frontend(i)?;
            std::thread::sleep(pause);
            lock(cluster).frontends[i].process.start()?;
        }
        FaultKind::PauseFrontend => {
            pause_for(cluster, pause, |c| &mut c.frontends[i].process);
        }
        FaultKind::PartitionStorage => {
            lock(cluster).set_partitioned(i, true);
            std::thread::sleep(pause);
            lock(cluster).set_partitioned(i, false);
        }
        FaultKind::PowerLossStorage => {
            lock(cluster).power_loss(i)?;
            std::thread::sleep(pause);
            lock(cluster).restart_storage(i)?;
        }
        FaultKind::DiskFull => {
            lock(cluster).toggle_disk_full(i);
            std::thread::sleep(pause);
            lock(cluster).toggle_disk_full(i);
        }
        // Scheduled and applied by `clock.rs`, never drawn here.
        FaultKind::ClockSkew => {}
        FaultKind::PowerLossCluster => {
            let active = lock(cluster).active();
            for &node in &active {
                lock(cluster).storage[node].process.kill();
            }
            for &node in &active {
                lock(cluster).power_loss(node)?;
            }
            std::thread::sleep(pause);
            for &node in &active {
                lock(cluster).restart_storage(node)?;
            }
        }
    }
    // The next fault starts once the restarted process answers again.
    lock(cluster).heal()
}

fn pause_for(
    cluster: &Arc<Mutex<Cluster>>,
    pause: Duration,
    process: impl Fn(&mut Cluster) -> &mut crate::cluster::Process,
) {
    {
        let mut guard = lock(cluster);
        let p = process(&mut guard);
        p.signal(libc::SIGSTOP);
        p.stopped = true;
    }
    std::thread::sleep(pause);
    let mut guard = lock(cluster);
    let p = process(&mut guard);
    p.signal(libc::SIGCONT);
    p.stopped = false;
}
