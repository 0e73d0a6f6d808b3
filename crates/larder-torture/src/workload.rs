//! Concurrent clients over both frontends: blob PUT/GET/DELETE (contents from a seed), and
//! document put/update/remove, each document written by one worker only (its own IDs).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Method;

use crate::client::{Answer, Connection, NoAnswer};
use crate::content::{self, Rng};
use crate::history::{Completion, History, Op, Outcome};
use crate::objects::{self, S3Key};

/// Documents each worker owns.
pub const DOCS_PER_WORKER: u64 = 4;
pub const DOC_PATH: &str = "/document/v1/torture/doc/docid";

#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    /// Its S3 port.
    pub s3: SocketAddr,
    pub datacenter: String,
}

/// Blobs acknowledged so far, for GETs and DELETEs to pick from.
#[derive(Default)]
pub struct Known {
    blobs: Vec<(String, bool)>,
}

pub struct Workload {
    pub seed: u64,
    pub targets: Vec<Target>,
    pub history: History,
    pub known: Arc<Mutex<Known>>,
    pub stop: Arc<AtomicBool>,
    pub max_blob: u64,
    pub timeout: Duration,
    /// Write each document through one datacenter only (under clock skew).
    pub pin_documents: bool,
    /// The access key of the S3 requests.
    pub s3_key: S3Key,
}

pub fn doc_id(worker: usize, k: u64) -> String {
    format!("w{worker}-d{k}")
}

impl Workload {
    pub async fn run_worker(self: Arc<Self>, worker: usize) {
        let mut rng = Rng::derive(self.seed, 1000 + worker as u64);
        let connect = |addr| Connection::public(addr, self.timeout);
        let mut connections: Vec<Connection> =
            self.targets.iter().map(|t| connect(t.addr)).collect();
        let mut s3_connections: Vec<Connection> =
            self.targets.iter().map(|t| connect(t.s3)).collect();
        let name = format!("w{worker}");
        let mut doc_seq = 0u64;
        while !self.stop.load(Ordering::Relaxed) {
            let mut t = rng.range(0, self.targets.len() as u64) as usize;
            let dc = self.targets[t].datacenter.clone();
            match rng.range(0, 100) {
                0..=29 => {
                    self.blob_put(&mut connections[t], &name, &dc, &mut rng)
                        .await
                }
                30..=54 => {
                    self.blob_get(&mut connections[t], &name, &dc, &mut rng)
                        .await
                }
                55..=62 => {
                    self.blob_delete(&mut connections[t], &name, &dc, &mut rng)
                        .await
                }
                63..=81 => {
                    doc_seq += 1;
                    let value = (worker as u64) << 32 | doc_seq;
                    let k = rng.range(0, DOCS_PER_WORKER);
                    if self.pin_documents {
                        // Versions order one document's writes across datacenters only while
                        // the frontends' clocks agree (last writer wins, TORTURE.md): under
                        // clock skew each document is written through one datacenter.
                        t = (worker + k as usize) % self.targets.len();
                    }
                    let dc = self.targets[t].datacenter.clone();
                    let doc = doc_id(worker, k);
                    self.doc_write(&mut connections[t], &name, &dc, &doc, value, &mut rng)
                        .await
                }
                _ => {
                    // Through either datacenter, to the bucket made through the worker's.
                    let bucket =
                        objects::bucket_of(&self.targets[worker % self.targets.len()].datacenter);
                    let conn = &mut s3_connections[t];
                    self.object_op(conn, worker, &bucket, &self.targets[t], &mut rng)
                        .await;
                    if conn.is_down() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            }
            if connections[t].is_down() {
                // Its frontend is down: do not spin on refused connections.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if rng.chance(5) {
                // An idle moment now and then, so that connections also go quiet.
                tokio::time::sleep(Duration::from_millis(rng.range(1, 50))).await;
            }
        }
    }

    pub(crate) fn record(
        &self,
        (op, invoke_ms): (u64, u64),
        (name, dc): (&str, &str),
        id: Option<String>,
        what: Op,
        result: &Result<Answer, NoAnswer>,
        outcome: Outcome,
    ) -> Completion {
        // A request that never left (no connection) did nothing.
        let outcome = match result {
            Err(NoAnswer { sent: false, .. }) => Outcome::Fail,
            _ => outcome,
        };
        let completion = Completion {
            op,
            process: name.to_owned(),
            dc: dc.to_owned(),
            invoke_ms,
            complete_ms: self.history.now_ms(),
            outcome,
            status: result.as_ref().ok().map(|a| a.status.as_u16()),
            id,
            what,
            read_sha256: None,
            listed: None,
            detail: result.as_ref().err().map(|e| e.why.clone()),
        };
        completion
    }

    async fn blob_put(&self, conn: &mut Connection, name: &str, dc: &str, rng: &mut Rng) {
        let seed = rng.next_u64();
        let len = content::blob_size(rng, self.max_blob);
        let data = content::bytes(seed, len);
        let sha256 = content::sha256_hex(&data);
        let what = Op::BlobPut { seed, len, sha256 };
        let started = self.history.invoke(name, dc, &what, None);
        let result = conn
            .send(Method::POST, "/v1/blobs", &[], Bytes::from(data))
            .await;
        let (outcome, id) = match &result {
            Ok(a) if a.status == 201 => (Outcome::Ok, blob_id_of(&a.body)),
            Ok(a) if a.status.is_client_error() => (Outcome::Fail, None),
            _ => (Outcome::Unknown, None),
        };
        let outcome = match (&outcome, &id) {
            (Outcome::Ok, None) => Outcome::Unknown,
            _ => outcome,
        };
        let completion = self.record(started, (name, dc), id.clone(), what, &result, outcome);
        self.history.complete(completion);
        if let (Outcome::Ok, Some(id)) = (outcome, id) {
            self.known
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .blobs
                .push((id, false));
        }
    }

    fn pick(&self, rng: &mut Rng, for_delete: bool) -> Option<String> {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if known.blobs.is_empty() {
            return None;
        }
        // Recent blobs more often: most races are with fresh writes.
        let n = known.blobs.len() as u64;
        let i = match rng.chance(50) {
            true => n - 1 - rng.range(0, n.min(50)),
            false => rng.range(0, n),
        } as usize;
        let (id, deleting) = &mut known.blobs[i];
        if for_delete {
            if *deleting {
                return None;
            }
            *deleting = true;
        }
        Some(id.clone())
    }

    async fn blob_get(&self, conn: &mut Connection, name: &str, dc: &str, rng: &mut Rng) {
        let Some(id) = self.pick(rng, false) else {
            return;
        };
        let started = self.history.invoke(name, dc, &Op::BlobGet, Some(&id));
        let result = conn
            .send(Method::GET, &format!("/v1/blobs/{id}"), &[], Bytes::new())
            .await;
        let outcome = match &result {
            Ok(a) if a.status == 200 => Outcome::Ok,
            Ok(a) if a.status == 404 || a.status == 410 => Outcome::Fail,
            _ => Outcome::Unknown,
        };
        let mut completion =
            self.record(started, (name, dc), Some(id), Op::BlobGet, &result, outcome);
        if let (Outcome::Ok, Ok(answer)) = (outcome, &result) {
            completion.read_sha256 = Some(content::sha256_hex(&answer.body));
        }
        self.history.complete(completion);
    }

    async fn blob_delete(&self, conn: &mut Connection, name: &str, dc: &str, rng: &mut Rng) {
        let Some(id) = self.pick(rng, true) else {
            return;
        };
        let started = self.history.invoke(name, dc, &Op::BlobDelete, Some(&id));
        let result = conn
            .send(
                Method::DELETE,
                &format!("/v1/blobs/{id}"),
                &[],
                Bytes::new(),
            )
            .await;
        let outcome = match &result {
            Ok(a) if a.status == 202 => Outcome::Ok,
            _ => Outcome::Unknown,
        };
        let completion = self.record(
            started,
            (name, dc),
            Some(id),
            Op::BlobDelete,
            &result,
            outcome,
        );
        self.history.complete(completion);
    }

    async fn doc_write(
        &self,
        conn: &mut Connection,
        name: &str,
        dc: &str,
        doc: &str,
        value: u64,
        rng: &mut Rng,
    ) {
        let path = format!("{DOC_PATH}/{doc}");
        let (what, method, path, body) = match rng.range(0, 10) {
            0..=4 => (
                Op::DocPut { value },
                Method::POST,
                path,
                format!("{{\"fields\":{{\"v\":{value}}}}}"),
            ),
            5..=7 => (
                Op::DocUpdate { value },
                Method::PUT,
                format!("{path}?create=true"),
                format!("{{\"fields\":{{\"v\":{{\"assign\":{value}}}}}}}"),
            ),
            _ => (Op::DocRemove, Method::DELETE, path, String::new()),
        };
        let started = self.history.invoke(name, dc, &what, Some(doc));
        let result = conn
            .send(
                method,
                &path,
                &[("content-type", "application/json")],
                Bytes::from(body),
            )
            .await;
        let outcome = match &result {
            Ok(a) if a.status == 200 => Outcome::Ok,
            // Refused before anything was written (400, 412, 413); 429 and 5xx may have reached
            // a replica, so they are unknown.
            Ok(a) if a.status.is_client_error() && a.status != 429 => Outcome::Fail,
            _ => Outcome::Unknown,
        };
        let completion = self.record(
            started,
            (name, dc),
            Some(doc.to_owned()),
            what,
            &result,
            outcome,
        );
        self.history.complete(completion);
    }
}

fn blob_id_of(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    value.get("id")?.as_str().map(str::to_owned)
}
