//! Internal API paths.

pub const HEALTH_PATH: &str = "/internal/v1/health";
pub const METRICS_PATH: &str = "/internal/v1/metrics";
/// `POST`: compact every replica of the node now.
pub const COMPACTION_PATH: &str = "/internal/v1/compaction";
/// `GET`: the node's cluster map (TOML); `PUT`: offer it a new one (see `INTERNAL_API.md`).
pub const MAP_PATH: &str = "/internal/v1/map";
/// `POST`: small blobs for several partitions in one request (`batch.rs`).
pub const PUT_BATCH_PATH: &str = "/internal/v1/put-batch";
/// `POST`: small blobs of several partitions read in one request (`get_batch.rs`).
pub const GET_BATCH_PATH: &str = "/internal/v1/get-batch";
const PARTITIONS: &str = "/internal/v1/partitions/";

pub fn blob_path(partition: u32, key: &str) -> String {
    format!("{PARTITIONS}{partition}/blobs/{key}")
}

pub fn changes_path(partition: u32, after: &str, limit: usize) -> String {
    format!("{PARTITIONS}{partition}/changes?after={after}&limit={limit}")
}

/// The bulk bootstrap stream of a partition's replica after `after` (`export.rs`), naming the
/// pulling replica like the change feed does.
pub fn export_path(partition: u32, after: &str, replica: &str) -> String {
    format!("{PARTITIONS}{partition}/export?after={after}&replica={replica}")
}

/// A replica's life on this node: state and bootstrap progress (JSON).
pub fn replica_path(partition: u32) -> String {
    format!("{PARTITIONS}{partition}/replica")
}

/// A parsed internal path (the query is parsed by the handler).
#[derive(Debug, PartialEq, Eq)]
pub enum InternalPath<'a> {
    Health,
    Metrics,
    Compaction,
    Map,
    /// Small blobs of several partitions in one request (`batch.rs`).
    PutBatch,
    /// Small blobs of several partitions read in one request (`get_batch.rs`).
    GetBatch,
    /// The bulk bootstrap stream (`export.rs`).
    Export {
        partition: u32,
    },
    /// The local replica's state and bootstrap progress.
    Replica {
        partition: u32,
    },
    Blob {
        partition: u32,
        key: &'a str,
    },
    Changes {
        partition: u32,
    },
    /// A page of the partition's documents in visiting order (`visit.rs`).
    Visit {
        partition: u32,
    },
    /// A document record; `key` is still percent-encoded (see `decode_key`).
    Doc {
        partition: u32,
        key: &'a str,
    },
}

impl InternalPath<'_> {
    /// The partition a path addresses, if any.
    pub fn partition(&self) -> Option<u32> {
        match self {
            InternalPath::Blob { partition, .. }
            | InternalPath::Changes { partition }
            | InternalPath::Visit { partition }
            | InternalPath::Doc { partition, .. }
            | InternalPath::Export { partition }
            | InternalPath::Replica { partition } => Some(*partition),
            InternalPath::Health
            | InternalPath::Metrics
            | InternalPath::Compaction
            | InternalPath::Map
            | InternalPath::PutBatch
            | InternalPath::GetBatch => None,
        }
    }
}

/// Parses an internal path; `None` for anything else (a 404).
pub fn parse_path(path: &str) -> Option<InternalPath<'_>> {
    if path == HEALTH_PATH {
        return Some(InternalPath::Health);
    }
    if path == METRICS_PATH {
        return Some(InternalPath::Metrics);
    }
    if path == COMPACTION_PATH {
        return Some(InternalPath::Compaction);
    }
    if path == MAP_PATH {
        return Some(InternalPath::Map);
    }
    if path == PUT_BATCH_PATH {
        return Some(InternalPath::PutBatch);
    }
    if path == GET_BATCH_PATH {
        return Some(InternalPath::GetBatch);
    }
    let rest = path.strip_prefix(PARTITIONS)?;
    let (partition, rest) = rest.split_once('/')?;
    let partition: u32 = partition.parse().ok()?;
    if rest == "changes" {
        return Some(InternalPath::Changes { partition });
    }
    if rest == "visit" {
        return Some(InternalPath::Visit { partition });
    }
    if rest == "export" {
        return Some(InternalPath::Export { partition });
    }
    if rest == "replica" {
        return Some(InternalPath::Replica { partition });
    }
    if let Some(key) = rest.strip_prefix("docs/") {
        return (!key.is_empty() && !key.contains('/'))
            .then_some(InternalPath::Doc { partition, key });
    }
    let key = rest.strip_prefix("blobs/")?;
    if key.is_empty() || key.contains('/') {
        return None;
    }
    Some(InternalPath::Blob { partition, key })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        assert_eq!(
            parse_path(&blob_path(7, "abc")),
            Some(InternalPath::Blob {
                partition: 7,
                key: "abc"
            })
        );
        let changes = changes_path(3, "0.0", 10);
        let path = changes.split('?').next().unwrap();
        assert_eq!(
            parse_path(path),
            Some(InternalPath::Changes { partition: 3 })
        );
        assert_eq!(parse_path(HEALTH_PATH), Some(InternalPath::Health));
        assert_eq!(parse_path(MAP_PATH), Some(InternalPath::Map));
        assert_eq!(parse_path(PUT_BATCH_PATH), Some(InternalPath::PutBatch));
        assert_eq!(parse_path(GET_BATCH_PATH), Some(InternalPath::GetBatch));
        let export = export_path(4, "0.0", "s4");
        let path = export.split('?').next().unwrap();
        assert_eq!(
            parse_path(path),
            Some(InternalPath::Export { partition: 4 })
        );
        assert_eq!(
            parse_path(&replica_path(4)),
            Some(InternalPath::Replica { partition: 4 })
        );
        assert_eq!(parse_path("/internal/v1/partitions/x/blobs/a"), None);
        assert_eq!(parse_path("/internal/v1/partitions/1/blobs/"), None);
        assert_eq!(parse_path("/internal/v1/partitions/1/blobs/a/b"), None);
    }
}
