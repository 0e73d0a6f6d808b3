//! Reads: one replica at a time in read order, hedged. If the replica asked has not answered
//! within the hedge delay (a percentile of recent latency in its datacenter), the next one is
//! asked as well; the first good answer wins and the others are dropped, which resets their
//! HTTP/2 streams so the storage nodes stop working on them.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use http::{header, Method, Request, StatusCode};
use larder_cluster::BlobId;
use larder_proto::{blob_path, ByteRange};
use tokio::time::Instant;

use crate::order::{read_order, replicas_in};
use crate::router::ReplicaResult;
use crate::{GetAnswer, Router, RouterError};

type Attempt<'a> = Pin<Box<dyn Future<Output = (String, bool, ReplicaResult)> + Send + 'a>>;

impl Router {
    pub async fn get_blob(
        &self,
        id: &BlobId,
        method: Method,
        range: Option<ByteRange>,
    ) -> Result<GetAnswer, RouterError> {
        let partition = self
            .map
            .partition(id.partition)
            .ok_or(RouterError::UnknownPartition(id.partition))?;
        let origin = self
            .map
            .datacenter_by_id(id.datacenter)
            .map(|d| d.name.as_str());
        let order = read_order(&self.map, partition, &self.datacenter, origin, &self.health);
        let local = replicas_in(&self.map, partition, &self.datacenter).len();
        let deadline = Instant::now() + self.config.operation_timeout;
        let path = blob_path(id.partition, &id.to_string());
        let attempt = |node: &str, hedge: bool| -> Attempt<'_> {
            let mut request = Request::builder().method(method.clone()).uri(path.clone());
            if let Some(range) = range {
                request = request.header(header::RANGE, range.to_header());
            }
            let request = request.body(larder_pool::empty()).expect("valid request");
            let node = node.to_owned();
            Box::pin(async move {
                let result = self.send(&node, request).await;
                (node, hedge, result)
            })
        };

        let mut in_flight = FuturesUnordered::new();
        let mut remaining = order.iter();
        let (mut not_found, mut errors) = (0, Vec::new());
        let mut last_asked = String::new();
        let mut pending: Vec<String> = Vec::new();
        loop {
            if in_flight.is_empty() {
                // Nothing pending: ask the next replica now (first try, or failover).
                let Some(node) = remaining.next() else { break };
                last_asked.clone_from(node);
                pending.push(node.clone());
                in_flight.push(attempt(node, false));
            }
            let hedge_delay = self.hedge_delay(&last_asked);
            let can_hedge = self.config.hedging && remaining.len() > 0;
            tokio::select! {
                Some((node, hedged, result)) = in_flight.next() => {
                    pending.retain(|n| n != &node);
                    match result {
                    Ok(response) if response.status() == StatusCode::NOT_FOUND => not_found += 1,
                    Ok(response) if response.status().is_server_error() => errors.push(format!("{node}: status {}", response.status())),
                    Ok(response) => {
                        if hedged {
                            self.metrics.hedges_won.inc();
                            // Replicas still silent after losing the race get a health check.
                            for slow in &pending {
                                self.check_slow_replica(slow);
                            }
                        }
                        return Ok(GetAnswer::Replica(response));
                    }
                    Err(err) => errors.push(err),
                }},
                _ = tokio::time::sleep(hedge_delay), if can_hedge => {
                    let node = remaining.next().expect("can_hedge checked");
                    last_asked.clone_from(node);
                    self.metrics.hedges_sent.inc();
                    pending.push(node.clone());
                    in_flight.push(attempt(node, true));
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(RouterError::Timeout(self.config.operation_timeout));
                }
            }
        }
        // A quorum write reached `write_quorum` local replicas, so once more than the rest say
        // "not found", no acknowledged write can exist.
        let quorum = self.config.write_quorum.clamp(1, local.max(1));
        if not_found > local.saturating_sub(quorum) {
            return Ok(GetAnswer::NotFound);
        }
        Err(RouterError::Unavailable(format!(
            "no replica could answer ({})",
            errors.join("; ")
        )))
    }

    /// How long to wait for `node` before asking the next replica too: the configured percentile
    /// of recent latency in its datacenter, or a fixed delay until there are enough samples.
    pub(crate) fn hedge_delay(&self, node: &str) -> Duration {
        let observed = self.latency.percentile(self.datacenter_of(node));
        observed
            .unwrap_or(self.config.hedge_fallback_delay)
            .max(self.config.hedge_min_delay)
    }
}
