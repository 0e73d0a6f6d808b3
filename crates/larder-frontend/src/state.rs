use std::sync::Arc;

use larder_router::{DocRouter, Router};

use crate::metrics::Metrics;
use crate::FrontendConfig;

/// Everything a request handler needs, shared by all connections.
pub struct AppState {
    pub config: FrontendConfig,
    pub router: Arc<Router>,
    pub documents: DocRouter,
    pub metrics: Metrics,
}
