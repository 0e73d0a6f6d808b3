//! Asking every replica of a blob's partition whether it holds the blob: for settling what a
//! crash left (the S3 layer's reserved journal entries), where "no quorum stored it" is not
//! enough to act on and every replica's own answer is wanted.

use std::sync::Arc;

use http::{Method, Request};
use larder_cluster::BlobId;
use larder_proto::{blob_path, BlobProperties};
use tokio::time::Instant;

use crate::read::{decode, Undecoded};
use crate::{GetAnswer, Missing, Router, RouterError};

/// What the replicas of a blob's partition, all of them, say of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Everywhere {
    /// One or more hold it (none holds its tombstone): its properties.
    Found(BlobProperties),
    /// One or more hold its tombstone (it was deleted or has expired).
    Gone,
    /// Every replica answered that it holds neither the blob nor a tombstone.
    Nowhere,
}

impl Router {
    /// Asks every replica of `id`'s partition, in every datacenter and bootstrapping ones too,
    /// for the blob's properties. Any replica that gives no definite answer (down, not yet
    /// checked against its peers, refusing) makes it an error: the caller asks again later.
    pub async fn find_everywhere(self: &Arc<Self>, id: &BlobId) -> Result<Everywhere, RouterError> {
        let map = self.maps.get();
        let partition = map
            .partition(id.partition)
            .ok_or(RouterError::UnknownPartition(id.partition))?;
        let nodes: Vec<String> = partition.replicas.iter().map(|r| r.node.clone()).collect();
        let deadline = Instant::now() + self.config.operation_timeout;
        let path = blob_path(id.partition, &id.to_string());
        let mut replies = self.fan_out(&nodes, |router, node| {
            let request = Request::builder()
                .method(Method::HEAD)
                .uri(path.clone())
                .body(larder_pool::empty())
                .expect("valid request");
            async move { router.send_by(&node, request, Some(deadline)).await }
        });
        let (mut found, mut gone, mut failed) = (None, false, Vec::new());
        while let Some((node, reply)) = replies.next().await {
            let answer = match reply {
                Ok(response) => {
                    decode(
                        (&node, response.map(crate::BlobBody::Streamed)),
                        None,
                        deadline,
                    )
                    .await
                }
                Err(err) => Err(Undecoded::Failed(err)),
            };
            match answer {
                Ok(GetAnswer::Found(blob)) => found = Some(blob.properties),
                Ok(GetAnswer::Missing(Missing::Gone { .. })) => gone = true,
                Err(Undecoded::NotFound) => {}
                Ok(GetAnswer::Missing(other)) => failed.push(format!("{node}: {other:?}")),
                Err(other) => failed.push(format!("{node}: {other:?}")),
            }
        }
        if gone {
            return Ok(Everywhere::Gone);
        }
        if let Some(properties) = found {
            return Ok(Everywhere::Found(properties));
        }
        match failed.is_empty() {
            true => Ok(Everywhere::Nowhere),
            false => Err(RouterError::Unavailable(format!(
                "not every replica of {id} answered: {}",
                failed.join("; ")
            ))),
        }
    }
}
