//! The checker: the promises of TORTURE.md, checked against the history (during the run) and
//! against every replica and both frontends (after healing). Only these promises, nothing more.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use larder_cluster::{BlobId, BlobKind};
use serde::Serialize;

use crate::client::Connection;
use crate::content;
use crate::history::{Completion, Op, Outcome};
use crate::workload::DOC_PATH;

#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    pub promise: &'static str,
    pub id: String,
    pub detail: String,
}

/// What the history says about one blob acknowledged by a PUT.
#[derive(Debug)]
struct BlobFacts {
    sha256: String,
    put_dc: String,
    put_ack_ms: u64,
    /// A DELETE was sent (whatever its outcome): the blob may be gone.
    delete_sent_ms: Option<u64>,
    /// A DELETE was acknowledged: (datacenter, time of the acknowledgement).
    delete_ack: Option<(String, u64)>,
}

fn blob_facts(history: &[Completion]) -> HashMap<String, BlobFacts> {
    let mut blobs = HashMap::new();
    for c in history {
        if let (Op::BlobPut { sha256, .. }, Outcome::Ok, Some(id)) = (&c.what, c.outcome, &c.id) {
            blobs.insert(
                id.clone(),
                BlobFacts {
                    sha256: sha256.clone(),
                    put_dc: c.dc.clone(),
                    put_ack_ms: c.complete_ms,
                    delete_sent_ms: None,
                    delete_ack: None,
                },
            );
        }
    }
    for c in history {
        let (Op::BlobDelete, Some(facts)) =
            (&c.what, c.id.as_ref().and_then(|id| blobs.get_mut(id)))
        else {
            continue;
        };
        facts.delete_sent_ms = Some(c.invoke_ms);
        if c.outcome == Outcome::Ok {
            facts.delete_ack = Some((c.dc.clone(), c.complete_ms));
        }
    }
    blobs
}

/// Promises 1–3, on every GET of the run.
pub fn check_reads(history: &[Completion], settle: Duration) -> Vec<Violation> {
    let blobs = blob_facts(history);
    let settle_ms = settle.as_millis() as u64;
    let mut out = Vec::new();
    for c in history {
        let (Op::BlobGet, Some(id)) = (&c.what, &c.id) else {
            continue;
        };
        let Some(facts) = blobs.get(id) else {
            continue;
        };
        let v = |promise, detail: String| Violation {
            promise,
            id: id.clone(),
            detail: format!(
                "op {} ({}, {}, t={}ms): {detail}",
                c.op, c.process, c.dc, c.invoke_ms
            ),
        };
        let deleted_before = facts.delete_sent_ms.is_some_and(|t| t < c.complete_ms);
        match (c.outcome, c.status) {
            (Outcome::Ok, _) => {
                if c.read_sha256.as_deref() != Some(facts.sha256.as_str()) {
                    out.push(v(
                        "read-returns-written-bytes",
                        format!("read sha256 {:?}, written {}", c.read_sha256, facts.sha256),
                    ));
                }
                if let Some((dc, ack)) = &facts.delete_ack {
                    if deleted_through(dc, *ack, settle_ms, &c.dc, c.invoke_ms) {
                        out.push(v(
                            "deleted-stays-deleted",
                            format!(
                                "read as present {}ms after the delete was acknowledged in {dc}",
                                c.invoke_ms - ack
                            ),
                        ));
                    }
                }
            }
            (Outcome::Fail, Some(410)) if !deleted_before => {
                out.push(v(
                    "no-phantom-delete",
                    "410 for a blob never deleted".into(),
                ));
            }
            (Outcome::Fail, Some(404))
                if !deleted_before && c.dc == facts.put_dc && c.invoke_ms > facts.put_ack_ms =>
            {
                out.push(v(
                    "acknowledged-blob-readable",
                    format!(
                        "404 from the datacenter that acknowledged the put at {}ms",
                        facts.put_ack_ms
                    ),
                ));
            }
            _ => {}
        }
    }
    out
}

/// Whether GET `c` came after a delete acknowledged through its datacenter `dc` at `ack`, by
/// more than the settle window (the storage nodes' caught-up window): from then on no replica
/// there serves the blob on its own word (`ARCHITECTURE.md`, "The read path").
fn deleted_through(dc: &str, ack: u64, settle_ms: u64, get_dc: &str, invoke_ms: u64) -> bool {
    dc == get_dc && invoke_ms > ack.saturating_add(settle_ms)
}

/// The document states the history allows at the end: the last acknowledged write's, or that
/// of any write sent after it whose outcome is not known. `None` is "absent".
fn allowed_doc_states(history: &[Completion]) -> BTreeMap<String, Vec<Option<u64>>> {
    let mut per_doc: BTreeMap<String, Vec<&Completion>> = BTreeMap::new();
    for c in history {
        if matches!(
            c.what,
            Op::DocPut { .. } | Op::DocUpdate { .. } | Op::DocRemove
        ) {
            if let Some(id) = &c.id {
                per_doc.entry(id.clone()).or_default().push(c);
            }
        }
    }
    let mut out = BTreeMap::new();
    for (doc, mut writes) in per_doc {
        writes.sort_by_key(|c| c.invoke_ms);
        let state = |c: &Completion| match c.what {
            Op::DocPut { value } | Op::DocUpdate { value } => Some(value),
            _ => None,
        };
        let last_ok = writes.iter().rposition(|c| c.outcome == Outcome::Ok);
        let mut allowed = vec![match last_ok {
            Some(i) => state(writes[i]),
            None => None,
        }];
        let after = last_ok.map_or(0, |i| i + 1);
        for c in &writes[after..] {
            if c.outcome == Outcome::Unknown {
                allowed.push(state(c));
            }
        }
        out.insert(doc, allowed);
    }
    out
}

pub struct FinalCheck {
    pub secret_file: PathBuf,
    pub map: larder_cluster::ClusterMap,
    /// node id → internal address (behind no proxy).
    pub internal: HashMap<String, std::net::SocketAddr>,
    /// (datacenter, frontend address)
    pub frontends: Vec<(String, std::net::SocketAddr)>,
    /// (datacenter, frontend S3 port)
    pub s3: Vec<(String, std::net::SocketAddr)>,
    pub s3_key: crate::objects::S3Key,
}

impl FinalCheck {
    /// Promises 4–7 after healing, retried until they hold or `bound` has passed (convergence).
    pub async fn run(&self, history: &[Completion], bound: Duration) -> (Vec<Violation>, Duration) {
        let start = Instant::now();
        loop {
            let violations = self.once(history).await;
            if violations.is_empty() || start.elapsed() > bound {
                return (violations, start.elapsed());
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    async fn once(&self, history: &[Completion]) -> Vec<Violation> {
        let mut out = Vec::new();
        let timeout = Duration::from_secs(30);
        let mut nodes: HashMap<String, Connection> = self
            .internal
            .iter()
            .map(|(id, addr)| {
                (
                    id.clone(),
                    Connection::internal(*addr, self.secret_file.clone(), timeout),
                )
            })
            .collect();
        let mut fronts: Vec<(String, Connection)> = self
            .frontends
            .iter()
            .map(|(dc, addr)| (dc.clone(), Connection::public(*addr, timeout)))
            .collect();
        let blobs = blob_facts(history);
        let mut ids: Vec<_> = blobs.keys().cloned().collect();
        ids.sort();
        for id in ids {
            let facts = &blobs[&id];
            self.check_blob(&id, facts, &mut nodes, &mut fronts, &mut out)
                .await;
        }
        for (doc, allowed) in allowed_doc_states(history) {
            for (dc, conn) in &mut fronts {
                let path = format!("{DOC_PATH}/{doc}");
                let state = match conn.send(Method::GET, &path, &[], Bytes::new()).await {
                    Ok(a) if a.status == 404 => Ok(None),
                    Ok(a) if a.status == 200 => doc_value(&a.body).map(Some).ok_or("no v".into()),
                    Ok(a) => Err(format!("status {}", a.status)),
                    Err(e) => Err(e.why),
                };
                match state {
                    Ok(s) if allowed.contains(&s) => {}
                    other => out.push(Violation {
                        promise: "document-final-state",
                        id: doc.clone(),
                        detail: format!("read {other:?} through {dc}, allowed {allowed:?}"),
                    }),
                }
            }
        }
        self.check_objects(history, timeout, &mut out).await;
        out
    }

    /// Every named object reads, through both datacenters' S3 ports, as its last acknowledged
    /// write left it or as a write of unknown outcome did.
    async fn check_objects(
        &self,
        history: &[Completion],
        timeout: Duration,
        out: &mut Vec<Violation>,
    ) {
        for (dc, s3) in &self.s3 {
            let mut conn = Connection::public(*s3, timeout);
            for (id, allowed) in crate::object_check::allowed_final(history) {
                let Some((bucket, key)) = id.split_once('/') else {
                    continue;
                };
                let read = crate::objects::send(
                    &mut conn,
                    *s3,
                    &self.s3_key,
                    Method::GET,
                    (bucket, key),
                    &[],
                    Bytes::new(),
                )
                .await;
                let state = match read {
                    Ok(a) if a.status == 200 => Ok(Some(content::sha256_hex(&a.body))),
                    Ok(a) if a.status == 404 => Ok(None),
                    Ok(a) => Err(format!(
                        "status {}: {}",
                        a.status,
                        String::from_utf8_lossy(&a.body[..a.body.len().min(200)])
                    )),
                    Err(e) => Err(e.why),
                };
                match state {
                    Ok(s) if allowed.contains(&s) => {}
                    other => out.push(Violation {
                        promise: "object-final-state",
                        id,
                        detail: format!("read {other:?} through {dc}, allowed {allowed:?}"),
                    }),
                }
            }
        }
    }

    async fn check_blob(
        &self,
        id: &str,
        facts: &BlobFacts,
        nodes: &mut HashMap<String, Connection>,
        fronts: &mut [(String, Connection)],
        out: &mut Vec<Violation>,
    ) {
        let Ok(parsed) = id.parse::<BlobId>() else {
            out.push(Violation {
                promise: "blob-id",
                id: id.into(),
                detail: "unparsable".into(),
            });
            return;
        };
        let composite = parsed.kind == BlobKind::Composite;
        let Some(partition) = self.map.partition(parsed.partition) else {
            return;
        };
        let mut seen = Vec::new();
        // The final map's replica sets: a drained node no longer counts, a new one must hold
        // its share. A replica still bootstrapping (moves that did not finish: reported on
        // their own) serves nothing yet.
        for replica in partition
            .replicas
            .iter()
            .filter(|r| r.state != larder_cluster::ReplicaState::Bootstrapping)
        {
            let Some(conn) = nodes.get_mut(&replica.node) else {
                seen.push((replica.node.clone(), "not running".to_owned()));
                continue;
            };
            let path = format!("/internal/v1/partitions/{}/blobs/{id}", parsed.partition);
            let state = match conn.send(Method::GET, &path, &[], Bytes::new()).await {
                Ok(a) if a.status == 200 && composite => "present".to_owned(),
                Ok(a) if a.status == 200 => match content::sha256_hex(&a.body) == facts.sha256 {
                    true => "present".to_owned(),
                    false => format!("different bytes (sha256 {})", content::sha256_hex(&a.body)),
                },
                Ok(a) if a.status == 404 || a.status == 410 => "absent".to_owned(),
                Ok(a) => format!(
                    "status {}: {}",
                    a.status,
                    String::from_utf8_lossy(&a.body[..a.body.len().min(200)])
                ),
                Err(e) => format!("no answer: {}", e.why),
            };
            seen.push((replica.node.clone(), state));
        }
        let expect = match (&facts.delete_ack, facts.delete_sent_ms) {
            (Some(_), _) => Some("absent"),
            (None, None) => Some("present"),
            // A delete of unknown outcome: either, but every replica the same.
            (None, Some(_)) => None,
        };
        let first = seen.first().map(|(_, s)| s.clone()).unwrap_or_default();
        let agreed = seen.iter().all(|(_, s)| *s == first);
        let ok = match expect {
            Some(e) => seen.iter().all(|(_, s)| s == e),
            None => agreed && (first == "present" || first == "absent"),
        };
        if !ok {
            let promise = match expect {
                Some("present") => "acknowledged-blob-on-every-replica",
                Some(_) => "deleted-blob-absent-on-every-replica",
                None => "replicas-converge",
            };
            out.push(Violation {
                promise,
                id: id.into(),
                detail: format!("replicas: {seen:?}; {facts:?}"),
            });
        }
        if composite && expect == Some("present") {
            for (dc, conn) in fronts.iter_mut() {
                let read = conn
                    .send(Method::GET, &format!("/v1/blobs/{id}"), &[], Bytes::new())
                    .await;
                let good = matches!(&read, Ok(a) if a.status == 200 && content::sha256_hex(&a.body) == facts.sha256);
                if !good {
                    out.push(Violation {
                        promise: "acknowledged-blob-on-every-replica",
                        id: id.into(),
                        detail: format!(
                            "composite read through {dc}: {:?}",
                            read.map(|a| a.status).map_err(|e| e.why)
                        ),
                    });
                }
            }
        }
    }
}

fn doc_value(body: &[u8]) -> Option<u64> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    value.get("fields")?.get("v")?.as_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delete_settles_after_the_window_whatever_the_faults() {
        assert!(!deleted_through("dc1", 1000, 5000, "dc1", 6000));
        assert!(deleted_through("dc1", 1000, 5000, "dc1", 6001));
        assert!(!deleted_through("dc1", 1000, 5000, "dc2", 60000));
    }
}
