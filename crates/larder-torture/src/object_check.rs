//! The named-object promises (TORTURE.md, "Named objects"), from the history: what a read or a
//! listing of a key may see, and what the key must hold after healing.
//!
//! One worker writes a key, one request at a time, so its writes are ordered by invocation.
//! A read invoked at `r0` and answered at `r1` may see the state of the last write acknowledged
//! before `r0` (nothing, if none), of any write after that one invoked before `r1` and not
//! refused, or of any earlier write whose outcome is unknown (it may have taken effect late).
//! Nothing else: an older acknowledged state is a read-after-write violation, bytes no write
//! sent are a phantom.

use std::collections::BTreeMap;

use crate::checker::Violation;
use crate::history::{Completion, Op, Outcome};

/// A key's state: its object's SHA-256, or `None` (no object).
pub type State = Option<String>;

struct Write {
    invoke_ms: u64,
    complete_ms: u64,
    outcome: Outcome,
    state: State,
}

/// Every key's writes, in order.
fn writes_per_key(history: &[Completion]) -> BTreeMap<String, Vec<Write>> {
    let mut keys: BTreeMap<String, Vec<Write>> = BTreeMap::new();
    for c in history {
        let state = match &c.what {
            Op::ObjPut { sha256, .. } => Some(sha256.clone()),
            Op::ObjDelete => None,
            _ => continue,
        };
        let Some(id) = &c.id else { continue };
        keys.entry(id.clone()).or_default().push(Write {
            invoke_ms: c.invoke_ms,
            complete_ms: c.complete_ms,
            outcome: c.outcome,
            state,
        });
    }
    for writes in keys.values_mut() {
        writes.sort_by_key(|w| w.invoke_ms);
    }
    keys
}

/// The states a read of a key with `writes`, invoked at `r0` and answered at `r1`, may see.
fn allowed(writes: &[Write], r0: u64, r1: u64) -> Vec<State> {
    let last_ack = writes
        .iter()
        .rposition(|w| w.outcome == Outcome::Ok && w.complete_ms < r0);
    let mut states = vec![last_ack.and_then(|i| writes[i].state.clone())];
    for (j, w) in writes.iter().enumerate() {
        let later = last_ack.is_none_or(|i| j > i);
        let may_apply = match w.outcome {
            Outcome::Fail => false,
            Outcome::Unknown => true,
            Outcome::Ok => later,
        };
        if may_apply && (later || w.outcome == Outcome::Unknown) && w.invoke_ms <= r1 {
            states.push(w.state.clone());
        }
    }
    states
}

/// Every GetObject and ListObjectsV2 of the run.
pub fn check_reads(history: &[Completion]) -> Vec<Violation> {
    let keys = writes_per_key(history);
    let none = Vec::new();
    let mut out = Vec::new();
    for c in history {
        let Some(id) = &c.id else { continue };
        let v = |id: &str, detail: String| Violation {
            promise: "object-read-after-write",
            id: id.to_owned(),
            detail: format!(
                "op {} ({}, {}, t={}..{}ms): {detail}",
                c.op, c.process, c.dc, c.invoke_ms, c.complete_ms
            ),
        };
        match (&c.what, c.outcome) {
            // A 404 saw no object; a failure without an answer (never sent) saw nothing.
            (Op::ObjGet, Outcome::Ok) | (Op::ObjGet, Outcome::Fail) if c.status.is_some() => {
                let seen = match c.outcome {
                    Outcome::Ok => c.read_sha256.clone(),
                    _ => None,
                };
                let writes = keys.get(id).unwrap_or(&none);
                let states = allowed(writes, c.invoke_ms, c.complete_ms);
                if !states.contains(&seen) {
                    out.push(v(id, format!("read {seen:?}, allowed {states:?}")));
                }
            }
            (Op::ObjList, Outcome::Ok) => {
                let listed = c.listed.as_deref().unwrap_or_default();
                // Every key of the worker's prefix, listed or not.
                for (key, writes) in keys
                    .range(id.clone()..)
                    .take_while(|(k, _)| k.starts_with(id.as_str()))
                {
                    let states = allowed(writes, c.invoke_ms, c.complete_ms);
                    let present = listed.contains(key);
                    let fits = states.iter().any(|s| s.is_some() == present);
                    if !fits {
                        out.push(v(key, format!("listed: {present}, allowed {states:?}")));
                    }
                }
                for key in listed.iter().filter(|k| !keys.contains_key(*k)) {
                    out.push(v(key, "listed, never written".into()));
                }
            }
            _ => {}
        }
    }
    out
}

/// The states each key may hold after healing.
pub fn allowed_final(history: &[Completion]) -> BTreeMap<String, Vec<State>> {
    writes_per_key(history)
        .into_iter()
        .map(|(key, writes)| {
            let states = allowed(&writes, u64::MAX, u64::MAX);
            (key, states)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(invoke_ms: u64, complete_ms: u64, outcome: Outcome, state: &str) -> Write {
        Write {
            invoke_ms,
            complete_ms,
            outcome,
            state: (!state.is_empty()).then(|| state.to_owned()),
        }
    }

    #[test]
    fn a_read_sees_the_last_acknowledged_write_or_a_later_or_unknown_one() {
        let some = |s: &str| Some(s.to_owned());
        let writes = [
            write(0, 10, Outcome::Unknown, "a"),
            write(20, 30, Outcome::Ok, "b"),
            write(40, 50, Outcome::Fail, "c"),
            write(60, 70, Outcome::Ok, ""),
            write(80, 90, Outcome::Ok, "d"),
        ];
        assert_eq!(allowed(&writes, 5, 8), vec![None, some("a")]);
        // After b's acknowledgement: b, or the unknown a; not c (refused), not d (later).
        assert_eq!(allowed(&writes, 35, 45), vec![some("b"), some("a")]);
        // Overlapping the delete: b or absent (and a).
        assert_eq!(allowed(&writes, 55, 65), vec![some("b"), some("a"), None]);
        assert_eq!(allowed(&writes, 95, 99), vec![some("d"), some("a")]);
        assert!(!allowed(&writes, 95, 99).contains(&some("b")), "b is older");
    }
}
