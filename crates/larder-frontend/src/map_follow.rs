//! Following cluster map changes without a restart: the map file is re-read when it changes,
//! and the storage nodes are asked for their revision, every `MAP_POLL_INTERVAL`. A newer map
//! that validates replaces the router's whole; anything else is logged and the old map stays.
//! (Nodes' answers to ordinary requests carry their revision too: see `larder_router::MapCell`.)

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use larder_cluster::{FileWatch, Offer};
use larder_router::Router;

/// How often the map file and the storage nodes are checked.
pub const MAP_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Runs until the process ends.
pub async fn follow(router: Arc<Router>, map_file: PathBuf) {
    let mut file = FileWatch::seen_now(&map_file);
    let mut tick = tokio::time::interval(MAP_POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // A stat per tick; the file is read only when its stamp moved (a small file).
        let changed = file.changed(&map_file);
        match changed.map(|read| read.and_then(|map| router.maps().offer(map))) {
            None | Some(Ok(Offer::Same)) => {}
            Some(Ok(Offer::Newer)) => {
                tracing::info!(file = %map_file.display(), revision = router.maps().revision(), "cluster map file taken")
            }
            Some(Err(err)) => {
                tracing::error!(file = %map_file.display(), %err, "cluster map file refused; keeping the current map")
            }
        }
        router.maps().poll_nodes().await;
    }
}
