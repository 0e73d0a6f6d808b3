//! The run's report: operations by kind and outcome, faults by kind, violations, convergence.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::checker::Violation;
use crate::history::{Completion, Op};
use crate::nemesis::FaultKind;
use crate::Args;

pub struct Summary {
    pub violations: usize,
    pub text: String,
    pub json: String,
}

fn op_name(op: &Op) -> &'static str {
    match op {
        Op::BlobPut { .. } => "blob_put",
        Op::BlobGet => "blob_get",
        Op::BlobDelete => "blob_delete",
        Op::DocPut { .. } => "doc_put",
        Op::DocUpdate { .. } => "doc_update",
        Op::DocRemove => "doc_remove",
        Op::ObjPut { .. } => "object_put",
        Op::ObjGet => "object_get",
        Op::ObjDelete => "object_delete",
        Op::ObjList => "object_list",
    }
}

pub fn summarise(
    args: &Args,
    history: &[Completion],
    (faults, moves): (&BTreeMap<FaultKind, u64>, &BTreeMap<String, u64>),
    violations: &[Violation],
    converged: Duration,
) -> Summary {
    let mut ops: BTreeMap<&str, BTreeMap<String, u64>> = BTreeMap::new();
    for c in history {
        let outcome = format!("{:?}", c.outcome).to_lowercase();
        *ops.entry(op_name(&c.what))
            .or_default()
            .entry(outcome)
            .or_insert(0) += 1;
    }
    let fault_total: u64 = faults.values().sum();
    let count = |kinds: &[FaultKind]| -> u64 { kinds.iter().filter_map(|k| faults.get(k)).sum() };
    let nodes = args.nodes as u64;
    // Every power loss SIGKILLs its node first; a cluster-wide one every node.
    let power_losses =
        count(&[FaultKind::PowerLossStorage]) + nodes * count(&[FaultKind::PowerLossCluster]);
    let sigkills = count(&[FaultKind::KillStorage, FaultKind::KillFrontend]) + power_losses;
    let mut text = format!(
        "torture seed {} ({} s, {} workers): {} operations, {} faults ({} SIGKILLs, {} power losses), \
         {} violations; checks held {:.1} s after healing\n",
        args.seed,
        args.seconds,
        args.workers,
        history.len(),
        fault_total,
        sigkills,
        power_losses,
        violations.len(),
        converged.as_secs_f64()
    );
    for (name, outcomes) in &ops {
        text.push_str(&format!("  {name:12} {outcomes:?}\n"));
    }
    for (kind, n) in faults {
        text.push_str(&format!("  fault {kind:?}: {n}\n"));
    }
    for (what, n) in moves {
        text.push_str(&format!("  move {what}: {n}\n"));
    }
    for v in violations.iter().take(30) {
        text.push_str(&format!(
            "  VIOLATION {}: {} {}\n",
            v.promise, v.id, v.detail
        ));
    }
    let json = serde_json::json!({
        "seed": args.seed, "seconds": args.seconds, "workers": args.workers,
        "operations": ops, "faults": faults, "moves": moves, "sigkills": sigkills, "power_losses": power_losses, "violations": violations,
        "converged_seconds": converged.as_secs_f64(),
    });
    Summary {
        violations: violations.len(),
        text,
        json: serde_json::to_string_pretty(&json).unwrap_or_default(),
    }
}
