//! Settings of the `/document/v1` API (`[documents]` in the frontend's config).

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DocumentsConfig {
    /// Largest document request body, after gzip decoding; larger ones get 413. A document is
    /// stored as one record, so this must stay below the storage nodes' `max_record_size`.
    pub max_document_size: ByteSize,
    /// FOR TESTS ONLY. The fraction (0.0 to 1.0) of `/document/v1` requests answered 429 or 503
    /// at random before they do anything, to exercise clients' retries. Must be 0 in production.
    pub testing_reject_ratio: f64,
    /// Visits (and update-where, delete-where requests) this frontend runs at once; more answer
    /// 429. Each holds at most one merged page and a chunk's answer (16 MiB) or a stream's
    /// few pages.
    pub max_concurrent_visits: usize,
}

impl Default for DocumentsConfig {
    fn default() -> Self {
        DocumentsConfig {
            max_document_size: ByteSize::mib(10),
            testing_reject_ratio: 0.0,
            max_concurrent_visits: 64,
        }
    }
}

impl DocumentsConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.testing_reject_ratio) {
            return Err("documents.testing_reject_ratio must be between 0 and 1".into());
        }
        if self.max_concurrent_visits == 0 {
            return Err("documents.max_concurrent_visits must be at least 1".into());
        }
        Ok(())
    }
}
