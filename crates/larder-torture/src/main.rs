//! `larder-torture`: Larder's nemesis suite. Starts a real cluster of `larder` processes, runs a
//! seeded workload through both frontends while a seeded nemesis kills, pauses, partitions and
//! power-cuts its processes, records every operation in a JSON-lines history, heals everything,
//! and checks the promises written in `TORTURE.md`. Exit status 0: no violation.
//!
//! A separate binary rather than a `larder` subcommand: the suite needs nothing from Larder but
//! its command line, and its dependencies (and root-only tricks) stay out of the shipped binary.

mod checker;
mod client;
mod clock;
mod cluster;
mod content;
mod history;
mod moves;
mod nemesis;
mod object_check;
mod object_ops;
mod objects;
mod proxy;
mod report;
mod workload;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;

#[derive(Parser, Clone)]
#[command(
    name = "larder-torture",
    about = "Faults under load against a real Larder cluster, and a checker"
)]
pub struct Args {
    /// Seeds every choice: operations, sizes, contents and the fault schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long the workload and the nemesis run.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 6)]
    workers: usize,
    /// Mean pause between the end of one fault and the start of the next, in ms.
    #[arg(long, default_value_t = 1500)]
    mean_gap_ms: u64,
    /// Storage nodes (dealt round-robin to the datacenters; 3 replicas in each).
    #[arg(long, default_value_t = 6)]
    nodes: usize,
    #[arg(long, default_value_t = 8)]
    partitions: u32,
    /// The `larder` binary (default: next to this one).
    #[arg(long)]
    larder: Option<PathBuf>,
    /// The `larder-lossyfs` binary (default: next to this one, if there and run as root):
    /// enables power losses.
    #[arg(long)]
    lossyfs: Option<PathBuf>,
    /// No power losses, even where lossyfs could run.
    #[arg(long)]
    no_power_loss: bool,
    /// Run directory (default: a new one under the system's temp dir, removed after a clean run).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the run directory after a clean run.
    #[arg(long)]
    keep: bool,
    /// Largest blob, in bytes.
    #[arg(long, default_value_t = 8 << 20)]
    max_blob: u64,
    /// After a delete is acknowledged, reads through the same datacenter may still see the blob
    /// this long (ms), whatever the faults: the storage nodes' `caught_up_window`, which the
    /// harness sets to it.
    #[arg(long, default_value_t = 5000)]
    settle_ms: u64,
    /// After healing, replicas must agree within this long (s).
    #[arg(long, default_value_t = 120)]
    converge_seconds: u64,
    /// The checker's own test: storage nodes in the relaxed (no fdatasync) mode, and a
    /// whole-cluster power loss at the end. Exit status 0 only if the checker finds violations.
    #[arg(long)]
    broken_durability: bool,
    /// End with a whole-cluster power loss (every node at once), then check.
    #[arg(long)]
    final_cluster_power_loss: bool,
    /// No clock skew, even where libfaketime is installed (`clock.rs`).
    #[arg(long)]
    no_clock_skew: bool,
    /// No moves: no spare nodes, no add-node, drain-node, replace-node, cancel-moves or
    /// automatic re-replication (`moves.rs`). Implied by --broken-durability.
    #[arg(long)]
    no_moves: bool,
    /// Spare storage nodes the moves stream adds (dealt to the datacenters in turn).
    #[arg(long, default_value_t = 2)]
    spares: usize,
    /// Mean pause between two steps of the moves stream, in ms.
    #[arg(long, default_value_t = 22000)]
    move_gap_ms: u64,
    /// The storage nodes' `auto_replace_after`, in seconds (0: off): longer than any fault of
    /// the nemesis keeps a node away, so only nodes killed for good are rebuilt elsewhere.
    #[arg(long, default_value_t = 15)]
    auto_replace_after: u64,
    /// After healing, the moves in progress must finish within this long (s).
    #[arg(long, default_value_t = 120)]
    moves_seconds: u64,
}

impl Args {
    fn moves(&self) -> bool {
        !(self.no_moves || self.broken_durability)
    }
}

fn main() {
    let args = Args::parse();
    let code = match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("torture: {e:#}");
            2
        }
    };
    std::process::exit(code);
}

fn sibling(name: &str) -> Option<PathBuf> {
    let path = std::env::current_exe().ok()?.with_file_name(name);
    path.exists().then_some(path)
}

fn run(args: Args) -> anyhow::Result<i32> {
    let larder = args
        .larder
        .clone()
        .or_else(|| sibling("larder"))
        .ok_or_else(|| anyhow::anyhow!("no larder binary next to this one; pass --larder"))?;
    let is_root = unsafe { libc::geteuid() } == 0;
    let lossyfs = match args.no_power_loss {
        true => None,
        false => args.lossyfs.clone().or_else(|| {
            sibling("larder-lossyfs")
                .filter(|_| is_root && std::path::Path::new("/dev/fuse").exists())
        }),
    };
    anyhow::ensure!(
        !(args.broken_durability || args.final_cluster_power_loss) || lossyfs.is_some(),
        "power losses need larder-lossyfs, root and /dev/fuse"
    );
    let temp;
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::Builder::new()
                .prefix("larder-torture-")
                .tempdir()?;
            temp.keep()
        }
    };
    let settings = cluster::Settings {
        larder,
        lossyfs,
        dir: dir.clone(),
        nodes: args.nodes,
        partitions: args.partitions,
        datacenters: vec!["dc1".into(), "dc2".into()],
        durability: match args.broken_durability {
            true => "relaxed-no-sync-for-benchmarks".into(),
            false => "durable".into(),
        },
        caught_up_window_ms: args.settle_ms,
        clocks: match args.no_clock_skew {
            false if std::path::Path::new(clock::LIBFAKETIME).exists() => {
                Some(clock::Clocks::new(&dir, clock::LIBFAKETIME.into())?)
            }
            _ => None,
        },
        spares: match args.moves() {
            true => args.spares,
            false => 0,
        },
        auto_replace_after_s: match args.moves() {
            true => args.auto_replace_after,
            false => 0,
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let summary = runtime.block_on(torture(&args, settings))?;
    let failed = summary.violations > 0;
    println!("{}", summary.text);
    let code = match (args.broken_durability, failed) {
        (false, false) | (true, true) => 0,
        _ => 1,
    };
    if code == 0 && !args.keep && args.dir.is_none() && !args.broken_durability {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("run directory (history, logs, report): {}", dir.display());
    }
    Ok(code)
}

async fn torture(args: &Args, settings: cluster::Settings) -> anyhow::Result<report::Summary> {
    std::fs::create_dir_all(&settings.dir)?;
    let history = history::History::create(&settings.dir.join("history.jsonl"))?;
    let started = cluster::Cluster::start(&settings).await;
    let cluster = Arc::new(Mutex::new(started?));
    let clocks = settings.clocks.clone();
    let (targets, power_loss, frontends, processes) = {
        let c = cluster.lock().unwrap_or_else(|e| e.into_inner());
        let targets: Vec<_> = c
            .frontends
            .iter()
            .map(|f| workload::Target {
                addr: f.addr,
                s3: f.s3_addr,
                datacenter: f.datacenter.clone(),
            })
            .collect();
        let processes: Vec<String> = c
            .storage
            .iter()
            .map(|n| n.process.name.clone())
            .chain(c.frontends.iter().map(|f| f.process.name.clone()))
            .collect();
        (targets, c.uses_lossyfs(), c.frontends.len(), processes)
    };
    let s3_ports: Vec<_> = targets
        .iter()
        .map(|t| (t.datacenter.clone(), t.s3))
        .collect();
    let first_frontend = settings
        .dir
        .join(format!("frontend-{}.toml", settings.datacenters[0]));
    let s3_key = objects::prepare(&settings.larder, &first_frontend, &s3_ports).await?;
    history.note("harness", "s3", "key created, one bucket per datacenter");
    let faults = nemesis::schedule(&nemesis::ScheduleSpec {
        seed: args.seed,
        duration: Duration::from_secs(args.seconds),
        frontends,
        power_loss,
        final_cluster_power_loss: args.broken_durability || args.final_cluster_power_loss,
        mean_gap_ms: args.mean_gap_ms,
    });
    history.note("harness", "schedule", &serde_json::to_string(&faults)?);
    let skews = match &clocks {
        Some(_) => clock::schedule(args.seed, Duration::from_secs(args.seconds), &processes),
        None => Vec::new(),
    };
    history.note("harness", "clock-schedule", &serde_json::to_string(&skews)?);
    let skewing = clocks.map(|clocks| {
        let history = history.clone();
        std::thread::spawn(move || clock::run(&skews, &clocks, &history))
    });
    let move_steps = match args.moves() {
        true => moves::schedule(
            args.seed,
            Duration::from_secs(args.seconds),
            args.move_gap_ms,
        ),
        false => Vec::new(),
    };
    history.note(
        "harness",
        "moves-schedule",
        &serde_json::to_string(&move_steps)?,
    );
    let mut mover = moves::Mover {
        larder: settings.larder.clone(),
        secret_file: cluster
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .secret_file
            .clone(),
        cluster: cluster.clone(),
        history: history.clone(),
        cancel_moves: moves::has_cancel_moves(&settings.larder),
        auto_replace: args.auto_replace_after > 0,
        counts: Default::default(),
    };
    // The thread lives until the cluster is shut down: the processes it starts die with it.
    let (moves_done, moves_counts) = std::sync::mpsc::channel();
    let (release_moves, moves_released) = std::sync::mpsc::channel::<()>();
    let handle = tokio::runtime::Handle::current();
    let moving = std::thread::spawn(move || {
        mover.run(&move_steps, &handle);
        let _ = moves_done.send(mover.counts);
        let _ = moves_released.recv();
    });
    let stop = Arc::new(AtomicBool::new(false));
    let workload = Arc::new(workload::Workload {
        seed: args.seed,
        targets,
        history: history.clone(),
        known: Default::default(),
        stop: stop.clone(),
        max_blob: args.max_blob,
        timeout: Duration::from_secs(20),
        pin_documents: skewing.is_some(),
        s3_key: s3_key.clone(),
    });
    let workers: Vec<_> = (0..args.workers)
        .map(|w| tokio::spawn(workload.clone().run_worker(w)))
        .collect();
    let seconds = args.seconds;
    let load = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        stop.store(true, Ordering::Relaxed);
        for worker in workers {
            let _ = worker.await;
        }
    });
    // On this thread, which lives as long as the run: children get SIGKILL when the thread that
    // started them ends (PR_SET_PDEATHSIG), and the nemesis restarts processes.
    let mut fault_counts =
        tokio::task::block_in_place(|| nemesis::run(&faults, &cluster, &history));
    load.await?;
    if let Some(skewing) = skewing {
        let applied = tokio::task::block_in_place(|| skewing.join())
            .map_err(|_| anyhow::anyhow!("the clock-skew thread panicked"))?;
        fault_counts.insert(nemesis::FaultKind::ClockSkew, applied);
    }
    let move_counts = tokio::task::block_in_place(|| moves_counts.recv()).unwrap_or_default();
    history.note("harness", "healing", "");
    tokio::task::block_in_place(|| cluster.lock().unwrap_or_else(|e| e.into_inner()).heal())?;
    let secret_file = settings.dir.join("cluster.secret");
    let (final_map, unsettled) = moves::settle(
        &cluster,
        &secret_file,
        &history,
        Duration::from_secs(args.moves_seconds),
    )
    .await;
    history.note(
        "harness",
        "settled",
        &format!(
            "map revision {:?}: {}",
            final_map.as_ref().map(|m| m.revision),
            unsettled
                .as_deref()
                .unwrap_or("no moves, every node runs it")
        ),
    );
    let final_check = {
        let mut c = cluster.lock().unwrap_or_else(|e| e.into_inner());
        tokio::task::block_in_place(|| c.heal())?;
        checker::FinalCheck {
            secret_file: c.secret_file.clone(),
            map: final_map.unwrap_or_else(|| c.map.clone()),
            internal: moves::internal_addresses(&c),
            frontends: c
                .frontends
                .iter()
                .map(|f| (f.datacenter.clone(), f.addr))
                .collect(),
            s3: s3_ports.clone(),
            s3_key,
        }
    };
    let completions = history.completions();
    let mut violations = checker::check_reads(&completions, Duration::from_millis(args.settle_ms));
    violations.extend(object_check::check_reads(&completions));
    if let Some(why) = unsettled {
        violations.push(checker::Violation {
            promise: "moves-finish",
            id: String::new(),
            detail: format!("{} s after healing: {why}", args.moves_seconds),
        });
    }
    let (final_violations, converged) = final_check
        .run(&completions, Duration::from_secs(args.converge_seconds))
        .await;
    violations.extend(final_violations);
    for v in &violations {
        history.note("checker", "violation", &serde_json::to_string(v)?);
    }
    history.flush();
    let summary = report::summarise(
        args,
        &completions,
        (&fault_counts, &move_counts),
        &violations,
        converged,
    );
    std::fs::write(settings.dir.join("report.json"), &summary.json)?;
    tokio::task::block_in_place(|| cluster.lock().unwrap_or_else(|e| e.into_inner()).shutdown());
    drop(release_moves);
    let _ = tokio::task::block_in_place(|| moving.join());
    Ok(summary)
}
