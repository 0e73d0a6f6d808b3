use std::sync::Arc;

use larder_router::{DocRouter, Router};

use crate::metrics::Metrics;
use crate::FrontendConfig;

/// Everything a request handler needs, shared by all connections.
pub struct AppState {
    pub config: FrontendConfig,
    pub router: Arc<Router>,
    pub documents: DocRouter,
    /// Updates and conditional writes of one document run one at a time.
    pub document_locks: crate::api::DocLocks,
    /// Bounds the document parsing and updating that runs on the blocking pool.
    pub document_work: crate::api::DocWork,
    /// Slots for visits in progress (`documents.max_concurrent_visits`).
    pub visits: Arc<tokio::sync::Semaphore>,
    pub metrics: Metrics,
    /// All buffered request bodies of this process (`limits.buffered_bodies_per_process`).
    pub body_budget: crate::body_budget::BodyBudget,
    /// Checks `/v1/blobs` requests' presigned URLs (`[auth] require_signed_blob_urls`).
    pub signed_urls: Option<larder_s3::SignedUrls>,
}
