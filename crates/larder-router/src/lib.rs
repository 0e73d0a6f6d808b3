//! The router: turns a blob operation into requests to the right replicas. It owns placement
//! (which partition, which replicas, in which order), quorum, failover, timeouts and node health;
//! the pool below it owns connections, the frontend above it owns the public API.

mod batch;
mod blob_body;
mod chunked;
mod config;
mod documents;
mod download_budget;
mod find;
mod get_batch;
mod health;
mod hlc;
mod journal;
mod latency;
mod manifest;
mod map_cell;
mod order;
mod park;
mod parts_manifest;
mod pick;
mod put_batch;
mod read;
mod replies;
mod reserve;
mod resume;
mod router;
mod visit;
mod write;

pub use blob_body::BlobBody;
pub use chunked::{ChunkStream, ChunkingConfig, Upload};
pub use config::RouterConfig;
pub use documents::{Checked, DocError, DocRouter, DocState, Written};
pub use download_budget::{DownloadBudget, Share};
pub use find::Everywhere;
pub use health::{NodeHealth, NodeState};
pub use hlc::{Hlc, VersionExhausted};
pub use journal::{JournalEntry, Leftover, OpenEntry, UploadJournal};
pub use manifest::{ChunkSlice, Composite, Manifest, ManifestError};
pub use map_cell::{revision_in, MapCell};
pub use parts_manifest::{Part, PartChecksums, PartsManifest, MAX_PARTS};
pub use router::{
    FoundBlob, GetAnswer, GoneReason, Missing, Readiness, Router, RouterError, RouterMetrics,
};
pub use visit::{PageRequest, PartitionPage, VisitedDoc};
