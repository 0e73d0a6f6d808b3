//! The change feed's JSON body: `GET /internal/v1/partitions/<p>/changes?after=<cursor>&limit=<n>`.

use serde::{Deserialize, Serialize};

/// One record of a replica's log, as replication and visiting see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeEntry {
    /// Opaque cursor of this record.
    pub cursor: String,
    /// `put-blob`, `delete-blob`, `put-doc` or `remove-doc`.
    pub op: String,
    pub key: String,
    pub time_ms: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangePage {
    pub changes: Vec<ChangeEntry>,
    /// Pass as `after` to continue.
    pub next: String,
    /// The replica's durable end of log: `next == head` means the reader has caught up.
    pub head: String,
}
