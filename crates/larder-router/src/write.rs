//! Writes: quorum PUT with one retry on another partition, and quorum DELETE.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode, Uri};
use larder_cluster::{BlobId, BlobKind, ClusterMap, Partition, PartitionId, PartitionState};
use larder_proto::{blob_path, header as h, BlobProperties, PutItem};
use tokio::time::Instant;

use crate::batch::Entered;
use crate::journal::JournalEntry;
use crate::order::{bootstrapping, count_in, replicas_in};
use crate::pick::{could_pick, pick_partition};
use crate::put_batch::{await_batched, Puts};
use crate::replies::Replies;
use crate::router::{Quorum, QuorumError};
use crate::{Router, RouterError};

/// How long a DELETE that reached its quorum waits for the other replicas' answers.
const DELETE_SETTLE: std::time::Duration = std::time::Duration::from_millis(250);

impl Router {
    /// Stores `data` on a quorum of a random writable partition's local replicas (and, when
    /// configured, on one remote replica); on failure, once more on another partition.
    pub async fn put_blob(
        self: &Arc<Self>,
        props: &BlobProperties,
        data: Bytes,
    ) -> Result<BlobId, RouterError> {
        self.put_blob_kind(BlobKind::Simple, props, data, None)
            .await
    }

    /// Like `put_blob`, minting an ID of `kind` (chunks and composites of large blobs), and
    /// recording each ID minted in `journal` before anything is sent under it.
    pub async fn put_blob_kind(
        self: &Arc<Self>,
        kind: BlobKind,
        props: &BlobProperties,
        data: Bytes,
        journal: Option<&JournalEntry>,
    ) -> Result<BlobId, RouterError> {
        let deadline = Instant::now() + self.config.operation_timeout;
        // Built once for every replica and both attempts.
        let put = PutHeaders {
            props: props
                .to_compact()
                .map_err(|e| RouterError::Rejected(e.to_string()))?,
            crc32c: crc32c::crc32c(&data),
        };
        // A reserved journal entry's ID was recorded before the request came: sent as it, the
        // blob waits on no journal sync.
        let first_id = match journal.and_then(JournalEntry::reserved) {
            Some(id) if id.kind == kind && self.may_write_to(&id) => id,
            _ => BlobId::mint(kind, self.datacenter_id, self.pick_partition(None)?),
        };
        let first = first_id.partition;
        let first_error = match self
            .put_on(first_id, &put, data.clone(), deadline, journal)
            .await
        {
            Ok(id) => return Ok(id),
            Err(err) => err,
        };
        tracing::warn!(partition = first, error = %first_error, "put failed; retrying on another partition");
        // A storage node runs a newer map than ours (it answered 421, or said so): retry on it.
        self.maps.catch_up().await;
        let second = self.pick_partition(Some(first))?;
        let second_id = BlobId::mint(kind, self.datacenter_id, second);
        self.put_on(second_id, &put, data, deadline, journal).await.map_err(|second_error| {
            let message = format!(
                "not enough storage replicas acknowledged the write (partition {first}: {first_error}; partition {second}: {second_error})"
            );
            if first_error.out_of_space && second_error.out_of_space {
                RouterError::OutOfSpace(format!("storage is out of space: {message}"))
            } else {
                RouterError::Unavailable(message)
            }
        })
    }

    /// A random read-write partition, preferring those whose local replicas are all up.
    pub(crate) fn pick_partition(
        &self,
        except: Option<PartitionId>,
    ) -> Result<PartitionId, RouterError> {
        let map = self.maps.get();
        let writable = |p: &Partition| p.state == PartitionState::ReadWrite && Some(p.id) != except;
        let healthy = |p: &Partition| self.local_replicas_up(&map, p);
        pick_partition(&map.partitions, writable, healthy, &mut rand::rng())
            .ok_or_else(|| RouterError::Unavailable("no writable partition".into()))
    }

    /// Whether `id`'s partition is one `pick_partition` could choose now: it takes writes,
    /// and its local replicas are all up unless no writable partition's are.
    pub(crate) fn may_write_to(&self, id: &BlobId) -> bool {
        let map = self.maps.get();
        let writable = |p: &Partition| p.state == PartitionState::ReadWrite;
        let healthy = |p: &Partition| self.local_replicas_up(&map, p);
        map.partition(id.partition)
            .is_some_and(|p| could_pick(&map.partitions, p, writable, healthy))
    }

    fn local_replicas_up(&self, map: &ClusterMap, p: &Partition) -> bool {
        // Node names are compared in place: collecting each partition's local replicas cost an
        // allocation per partition and one per name, for every PUT.
        p.replicas.iter().all(|r| {
            map.datacenter_of(&r.node) != Some(self.datacenter.as_str())
                || !self.health.is_marked_down(&r.node)
        })
    }

    async fn put_on(
        self: &Arc<Self>,
        id: BlobId,
        put: &PutHeaders,
        data: Bytes,
        deadline: Instant,
        journal: Option<&JournalEntry>,
    ) -> Result<BlobId, QuorumError> {
        let partition = id.partition;
        if let Some(journal) = journal {
            journal.record(&id).await.map_err(|e| {
                QuorumError::other(format!("cannot record the upload in its journal: {e}"))
            })?;
        }
        let map = self.maps.get();
        let p = map
            .partition(partition)
            .ok_or_else(|| QuorumError::other(format!("no partition {partition} in the map")))?;
        // Writes go to every replica, bootstrapping ones too; only caught-up ones count.
        let local = replicas_in(&map, p, &self.datacenter);
        let uncounted = bootstrapping(p);
        let local_counted = count_in(&map, p, &self.datacenter);
        let remote: Vec<String> = p
            .replicas
            .iter()
            .map(|r| r.node.clone())
            .filter(|n| !local.contains(n))
            .collect();
        let remote_counted = remote.iter().filter(|n| !uncounted.contains(n)).count();
        let rule = Quorum {
            local: self.config.write_quorum.clamp(1, local_counted.max(1)),
            local_total: local_counted,
            remote: usize::from(self.config.wait_for_remote_ack && remote_counted > 0),
            remote_total: remote_counted,
            uncounted,
        };
        // Remote datacenters get the blob by replication, unless one remote acknowledgement is wanted.
        let targets: Vec<String> = if rule.remote > 0 {
            local.iter().chain(&remote).cloned().collect()
        } else {
            local
        };
        let key = id.to_string();
        let uri: Uri = blob_path(partition, &key)
            .parse()
            .map_err(|e| QuorumError::other(format!("blob path: {e}")))?;
        // Small blobs go through the per-node batches (`put_batch.rs`).
        let item = self.batches_puts_of(data.len(), put.props.len()).then(|| {
            Arc::new(PutItem {
                partition,
                key,
                props: Bytes::copy_from_slice(put.props.as_bytes()),
                crc32c: put.crc32c,
                data: data.clone(),
            })
        });
        let mut results = Replies::new();
        for node in targets {
            let router = self.clone();
            match &item {
                Some(item) => match self.enter_batch::<Puts>(&node, || item.clone()) {
                    Entered::Queued(queued) => results.push_detached(async move {
                        (node, await_batched(queued, deadline).await)
                    }),
                    Entered::Alone(slot) => {
                        let item = item.clone();
                        results.push(async move {
                            let answer = router.put_in_slot(slot, &node, &item, deadline).await;
                            (node, answer)
                        })
                    }
                },
                None => {
                    let request = put.request(uri.clone(), data.clone());
                    results.push(async move {
                        let answer = router.send_by(&node, request, Some(deadline)).await;
                        (node, answer.map(|response| response.status()))
                    })
                }
            }
        }
        let stored = |status: &StatusCode| matches!(*status, StatusCode::CREATED | StatusCode::OK);
        match self.await_quorum(&mut results, rule, stored).await {
            Ok(()) => Ok(id),
            Err(err) => {
                // The ID was never handed out, so nothing can read it; tombstone what did land.
                self.spawn_cleanup(partition, id);
                Err(err)
            }
        }
    }

    fn spawn_cleanup(self: &Arc<Self>, partition: PartitionId, id: BlobId) {
        let router = self.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + router.config.operation_timeout;
            let _ = router.delete_on_all(partition, &id, deadline).await;
        });
    }

    /// Deletes at every replica; succeeds once a quorum of local replicas holds the tombstone.
    pub async fn delete_blob(self: &Arc<Self>, id: &BlobId) -> Result<(), RouterError> {
        if self.maps.get().partition(id.partition).is_none() {
            return Err(RouterError::UnknownPartition(id.partition));
        }
        let deadline = Instant::now() + self.config.operation_timeout;
        self.delete_on_all(id.partition, id, deadline)
            .await
            .map_err(|err| {
                RouterError::Unavailable(format!("delete not acknowledged by a quorum: {err}"))
            })
    }

    async fn delete_on_all(
        self: &Arc<Self>,
        partition: PartitionId,
        id: &BlobId,
        deadline: Instant,
    ) -> Result<(), String> {
        let map = self.maps.get();
        let p = map
            .partition(partition)
            .ok_or_else(|| format!("no partition {partition} in the map"))?;
        let all: Vec<String> = p.replicas.iter().map(|r| r.node.clone()).collect();
        let uncounted = bootstrapping(p);
        let local = count_in(&map, p, &self.datacenter);
        let rule = Quorum {
            local: self.config.write_quorum.clamp(1, local.max(1)),
            local_total: local,
            remote: 0,
            remote_total: all.len().saturating_sub(local + uncounted.len()),
            uncounted,
        };
        let time_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let path = blob_path(partition, &id.to_string());
        let mut results = self.fan_out(&all, |router, node| {
            let request = Request::delete(path.clone())
                .header(h::TIME_MS, time_ms)
                .body(larder_pool::empty())
                .expect("valid request");
            async move { router.send_by(&node, request, Some(deadline)).await }
        });
        self.await_quorum(&mut results, rule, |r| r.status() == StatusCode::ACCEPTED)
            .await
            .map_err(|e| e.message)?;
        // Later GETs answer 410, and a GET asks one replica at a time: give the replicas still
        // writing the tombstone a moment, so that a healthy one does not serve the blob after we
        // answered. A slow or dead one gets it by replication; the answer does not wait for it.
        let _ = tokio::time::timeout(DELETE_SETTLE, async {
            while results.next().await.is_some() {}
        })
        .await;
        Ok(())
    }
}

/// The headers of one PUT, the same for every replica: built once, cloned per request (a
/// `HeaderValue` clone shares its bytes).
struct PutHeaders {
    /// Every property in the compact form (`x-larder-props`).
    props: HeaderValue,
    crc32c: u32,
}

impl PutHeaders {
    fn request(&self, uri: Uri, data: Bytes) -> Request<larder_pool::Body> {
        put_request(uri, data, self.crc32c, self.props.clone())
    }
}

/// A blob's internal PUT (also of a small blob that goes alone: `put_batch.rs`).
pub(crate) fn put_request(
    uri: Uri,
    data: Bytes,
    crc32c: u32,
    props: HeaderValue,
) -> Request<larder_pool::Body> {
    let length = data.len();
    let mut request = Request::new(larder_pool::full(data));
    *request.method_mut() = Method::PUT;
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    headers.reserve(3);
    headers.insert(header::CONTENT_LENGTH, length.into());
    headers.insert(h::BODY_CRC32C, crc32c.into());
    headers.insert(h::PROPS, props);
    request
}
