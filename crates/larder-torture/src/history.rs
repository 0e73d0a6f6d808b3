//! The history: every operation's invocation and completion, and every fault, one JSON object
//! per line, written as they happen (a crash of the harness keeps what it saw). The checker reads
//! the completed operations from memory; the file is for people and for reruns.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

/// What one operation did, as the client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Acknowledged: the promise applies.
    Ok,
    /// A definite answer that it did not happen as asked (for a GET: not found, gone).
    Fail,
    /// No answer (timeout, connection lost, 5xx): it may take effect later.
    Unknown,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    BlobPut {
        seed: u64,
        len: usize,
        sha256: String,
    },
    BlobGet,
    BlobDelete,
    DocPut {
        value: u64,
    },
    DocUpdate {
        value: u64,
    },
    DocRemove,
    /// A named object's PutObject (its ID in the history: `<bucket>/<key>`).
    ObjPut {
        seed: u64,
        len: usize,
        sha256: String,
    },
    ObjGet,
    ObjDelete,
    /// ListObjectsV2 of one worker's prefix (its ID: `<bucket>/<prefix>`).
    ObjList,
}

#[derive(Clone, Debug, Serialize)]
pub struct Completion {
    pub op: u64,
    pub process: String,
    pub dc: String,
    /// Milliseconds since the run started.
    pub invoke_ms: u64,
    pub complete_ms: u64,
    pub outcome: Outcome,
    /// HTTP status, when there was one.
    pub status: Option<u16>,
    /// Blob ID or document ID.
    pub id: Option<String>,
    #[serde(flatten)]
    pub what: Op,
    /// A GET's answer: SHA-256 of the bytes read (blobs, objects).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_sha256: Option<String>,
    /// A listing's answer: the IDs (`<bucket>/<key>`) it named.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listed: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Clone)]
pub struct History {
    inner: Arc<Mutex<Inner>>,
    start: Instant,
}

struct Inner {
    file: std::io::BufWriter<std::fs::File>,
    completions: Vec<Completion>,
    next_op: u64,
}

impl History {
    pub fn create(path: &Path) -> anyhow::Result<History> {
        let file = std::fs::File::create(path)?;
        Ok(History {
            inner: Arc::new(Mutex::new(Inner {
                file: std::io::BufWriter::new(file),
                completions: Vec::new(),
                next_op: 0,
            })),
            start: Instant::now(),
        })
    }

    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an invocation; returns its operation number and time.
    pub fn invoke(&self, process: &str, dc: &str, what: &Op, id: Option<&str>) -> (u64, u64) {
        let now = self.now_ms();
        let mut inner = self.lock();
        let op = inner.next_op;
        inner.next_op += 1;
        let line = serde_json::json!({
            "type": "invoke", "op": op, "process": process, "dc": dc, "t_ms": now,
            "f": what, "id": id,
        });
        let _ = writeln!(inner.file, "{line}");
        (op, now)
    }

    pub fn complete(&self, completion: Completion) {
        let mut inner = self.lock();
        if let Ok(text) = serde_json::to_string(&completion) {
            let _ = writeln!(inner.file, "{{\"type\":\"complete\",{}", &text[1..]);
        }
        inner.completions.push(completion);
    }

    /// A fault or another event of the harness.
    pub fn note(&self, process: &str, event: &str, detail: &str) {
        let now = self.now_ms();
        let mut inner = self.lock();
        let line = serde_json::json!({
            "type": "info", "process": process, "t_ms": now, "event": event, "detail": detail,
        });
        let _ = writeln!(inner.file, "{line}");
    }

    pub fn flush(&self) {
        let _ = self.lock().file.flush();
    }

    pub fn completions(&self) -> Vec<Completion> {
        self.lock().completions.clone()
    }
}
