//! What this node knows of its peers' positions in its own change feeds, and from it each
//! partition's tombstone horizon (`DESIGN.md` 6.1, `larder-store/FORMAT.md` "Dropping
//! tombstones").
//!
//! A peer replica pulling `GET .../changes?after=<cursor>&replica=<its node id>` has applied,
//! durably, every change up to that cursor (a replication cursor moves only once its page is
//! durable there). Kept in memory per partition and peer, from the last pull: after a restart
//! every position is unknown until that peer pulls again, and an unknown position means no
//! horizon (nothing is dropped). A position in another incarnation of the local replica (the
//! peer pulled from an older one, or starts from the beginning) counts as 0.
//!
//! It also holds the other half of "rebuilt, never rejoined": whether this replica may serve a
//! peer at all (`may_serve`), from how that peer answered our own pulls since we started; and
//! whether this replica may answer a read alone (`vouches`): only while its own pulls reached
//! the head of every caught-up peer's feed in its datacenter recently (`ARCHITECTURE.md`, "The
//! read path").

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use larder_cluster::{ClusterMap, PartitionId, ReplicaState};
use larder_store::Cursor;

struct Peer {
    node: String,
    /// The sequence (in the local replica's current incarnation) it last pulled after.
    seq: Option<u64>,
    /// Since this process started, the peer answered our pull of its feed without refusing
    /// our cursor: the local replica is not behind tombstones the peer dropped.
    checked: bool,
    /// The peer refused our cursor (409): the local replica is behind tombstones it dropped
    /// and must be rebuilt.
    behind: bool,
    /// The peer is a bootstrapping replica (`DESIGN.md` 6.1): it is new, so it cannot hold
    /// anything our dropped tombstones removed, and nobody pulls from it (so the check above
    /// could never happen): it is served without it. Its position still holds the horizon.
    bootstrapping: bool,
    /// In this node's datacenter: a delete acknowledged here reached a quorum of such peers.
    local: bool,
    /// Our last pull of its feed got no answer at all (refused connection, timeout): it cannot
    /// confirm a read either, so reads do not wait for its check (`checked_for_reads`).
    unreachable: bool,
    /// When our last pull of its feed that reached its head was sent (the page applied here
    /// since): every change the peer held then is here. `None` since this process started.
    head_at: Option<Instant>,
}

/// Whether a peer replica may pull the local replica's feed (`Horizons::may_serve`).
#[derive(Debug, PartialEq, Eq)]
pub enum Serve {
    Yes,
    /// Not before our own pull of that peer was answered (425 Too Early, it retries).
    NotChecked,
    /// Never: that peer said the local replica is behind its dropped tombstones (409).
    Behind,
}

pub struct Horizons {
    retention: Duration,
    /// How recently every local peer's head must have been reached for `vouches`.
    caught_up_window: Duration,
    /// Without replication this node never pulls, so it can never check itself: it serves.
    check_before_serving: bool,
    /// Per hosted partition; replaced as the map changes (`update`).
    partitions: RwLock<HashMap<PartitionId, Mutex<Vec<Peer>>>>,
    /// Partitions whose local replica was empty when this process opened it (`opened_empty`).
    empty_at_open: Mutex<HashSet<PartitionId>>,
}

impl Horizons {
    /// Every other current replica, from the cluster map, of each partition `node_id` hosts.
    pub fn new(
        map: &ClusterMap,
        node_id: &str,
        retention: Duration,
        check_before_serving: bool,
        caught_up_window: Duration,
    ) -> Horizons {
        let horizons = Horizons {
            retention,
            caught_up_window,
            check_before_serving,
            partitions: RwLock::default(),
            empty_at_open: Mutex::default(),
        };
        horizons.update(map, node_id);
        horizons
    }

    /// Follows a new map: the peers of each partition `node_id` hosts are the map's other
    /// replicas of it, every state included (a bootstrapping replica must see every tombstone,
    /// a leaving one is still a replica). What is known of a peer that stays is kept; a new
    /// peer's position is unknown, which holds every drop of that partition until it pulls.
    pub fn update(&self, map: &ClusterMap, node_id: &str) {
        let mut partitions = self.partitions.write().unwrap_or_else(|e| e.into_inner());
        let mut next = HashMap::new();
        let here = map.datacenter_of(node_id);
        for (partition, _) in map.replicas_on(node_id) {
            let Some(entry) = map.partition(partition) else {
                continue;
            };
            let mut known = partitions
                .remove(&partition)
                .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
                .unwrap_or_default();
            let peers = entry
                .replicas
                .iter()
                .filter(|r| r.node != node_id)
                .map(|r| {
                    let bootstrapping = r.state == ReplicaState::Bootstrapping;
                    let local = here.is_some() && map.datacenter_of(&r.node) == here;
                    match known.iter().position(|p| p.node == r.node) {
                        Some(i) => Peer {
                            bootstrapping,
                            local,
                            ..known.swap_remove(i)
                        },
                        None => Peer {
                            node: r.node.clone(),
                            seq: None,
                            checked: false,
                            behind: false,
                            bootstrapping,
                            local,
                            unreachable: false,
                            head_at: None,
                        },
                    }
                })
                .collect();
            next.insert(partition, Mutex::new(peers));
        }
        *partitions = next;
    }

    /// How old a tombstone must be before it may be dropped (`[compaction] tombstone_retention`).
    pub fn retention_ms(&self) -> u64 {
        u64::try_from(self.retention.as_millis()).unwrap_or(u64::MAX)
    }

    /// Runs `f` on the peers of `partition` (`None` when not hosted).
    fn with_peers<R>(
        &self,
        partition: PartitionId,
        f: impl FnOnce(&mut Vec<Peer>) -> R,
    ) -> Option<R> {
        let partitions = self.partitions.read().unwrap_or_else(|e| e.into_inner());
        let peers = partitions.get(&partition)?;
        // A poisoned lock only means a panic elsewhere; positions stay meaningful.
        let mut peers = peers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Some(f(&mut peers))
    }

    /// Notes that `peer` pulled the local replica (of incarnation `incarnation`) after `after`.
    /// Returns false when `peer` is not a current replica of the partition (nothing noted).
    pub fn pulled(
        &self,
        partition: PartitionId,
        peer: &str,
        after: Cursor,
        incarnation: u64,
    ) -> bool {
        self.with_peers(partition, |peers| {
            let Some(p) = peers.iter_mut().find(|p| p.node == peer) else {
                return false;
            };
            p.seq = Some(if after.incarnation == incarnation {
                after.sequence
            } else {
                0
            });
            true
        })
        .unwrap_or(false)
    }

    /// The largest sequence every other current replica has replicated past: tombstones up to
    /// it may be dropped (once old enough). `None` while any peer's position is unknown. A
    /// partition with no other replica has nothing to wait for.
    pub fn horizon(&self, partition: PartitionId) -> Option<u64> {
        self.with_peers(partition, |peers| {
            peers
                .iter()
                .try_fold(u64::MAX, |min, p| p.seq.map(|s| min.min(s)))
        })
        .flatten()
    }

    /// Notes how `peer` answered our pull of its feed: `refused` when it said our cursor is
    /// behind tombstones it dropped.
    pub fn answered(&self, partition: PartitionId, peer: &str, refused: bool) {
        self.with_peers(partition, |peers| {
            if let Some(p) = peers.iter_mut().find(|p| p.node == peer) {
                p.checked = true;
                p.behind |= refused;
                p.unreachable = false;
            }
        });
    }

    /// Notes that our pull of `peer`'s feed got no answer (a refused connection, a timeout).
    pub fn unreachable(&self, partition: PartitionId, peer: &str) {
        self.with_peers(partition, |peers| {
            if let Some(p) = peers.iter_mut().find(|p| p.node == peer) {
                p.unreachable = true;
            }
        });
    }

    /// Forgets what the peers said of the local replica of `partition`, which was just
    /// replaced by an empty one (`rebuild.rs`): it is behind no one, and checked by no one yet.
    pub fn reset(&self, partition: PartitionId) {
        self.lock_empty_at_open().remove(&partition);
        self.with_peers(partition, |peers| {
            for p in peers.iter_mut() {
                p.checked = false;
                p.behind = false;
                p.unreachable = false;
                p.head_at = None;
            }
        });
    }

    /// Whether the local replica of `partition` may answer "found" to a read while it does not
    /// vouch: once every local peer that answers at all has answered our pull since this
    /// process started without refusing it. Before that, the replica may be one whose data
    /// went back behind tombstones a peer dropped (a restored copy): its "found" for a deleted
    /// blob would be confirmed by that peer's 404 (`ARCHITECTURE.md`, "The read path"), so
    /// it answers 503 instead and the frontend asks elsewhere. Without replication this node
    /// never checks itself: it answers.
    pub fn checked_for_reads(&self, partition: PartitionId) -> bool {
        if !self.check_before_serving {
            return true;
        }
        let empty_at_open = self.was_empty_at_open(partition);
        self.with_peers(partition, |peers| {
            peers
                .iter()
                .filter(|p| p.local && !p.bootstrapping)
                .all(|p| (p.checked || p.unreachable || empty_at_open) && !p.behind)
        })
        .unwrap_or(true)
    }

    /// Notes that the local replica of `partition` held nothing when this process opened it
    /// (a new cluster's replicas, a wiped disk). Everything it holds since came from this
    /// process's life: from frontends, or from peers' feeds that serve nothing unchecked. So it
    /// cannot hold a blob whose tombstone a peer dropped, and needs no peer's check before it
    /// answers reads or serves its feed. Without this, a cluster just created answered reads of
    /// blobs it had just acknowledged with 503 `ReplicaUnchecked` until replication's first
    /// round reached every peer (seconds on a loaded machine). A 409 from a peer still counts.
    pub fn opened_empty(&self, partition: PartitionId) {
        self.lock_empty_at_open().insert(partition);
    }

    fn was_empty_at_open(&self, partition: PartitionId) -> bool {
        self.lock_empty_at_open().contains(&partition)
    }

    fn lock_empty_at_open(&self) -> std::sync::MutexGuard<'_, HashSet<PartitionId>> {
        // A poisoned lock only means a panic elsewhere; the set stays meaningful.
        self.empty_at_open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `peer` may pull the local replica's feed. A replica whose data went back (a
    /// restore, a replica re-added to the map with old data) may hold blobs whose tombstones a
    /// peer dropped; it finds out when it pulls that peer (409), and until then it must not
    /// hand anything to it. So after every start a replica serves a peer only once its own
    /// pull of that peer was answered without a refusal: no race with the peer's pulls.
    pub fn may_serve(&self, partition: PartitionId, peer: &str) -> Serve {
        let check = self.check_before_serving && !self.was_empty_at_open(partition);
        self.with_peers(partition, |peers| {
            match peers.iter().find(|p| p.node == peer) {
                Some(p) if p.behind => Serve::Behind,
                Some(p) if !p.checked && check && !p.bootstrapping => Serve::NotChecked,
                _ => Serve::Yes,
            }
        })
        .unwrap_or(Serve::Yes)
    }

    /// Notes that our pull of `peer`'s feed of `partition` sent at `sent` reached its head
    /// (a page that was not full), and that page is applied here.
    pub fn reached_head(&self, partition: PartitionId, peer: &str, sent: Instant) {
        self.with_peers(partition, |peers| {
            if let Some(p) = peers.iter_mut().find(|p| p.node == peer) {
                p.head_at = Some(p.head_at.map_or(sent, |at| at.max(sent)));
            }
        });
    }

    /// Whether the local replica of `partition` may answer "found" alone: our pulls reached
    /// the head of every caught-up peer in this datacenter within `caught_up_window` of now.
    /// A delete acknowledged here reached a quorum of them; so once its acknowledgement is
    /// that old, a replica that vouches has its tombstone. Call it before the lookup it
    /// vouches for. A replica that does not vouch (it started recently and has not caught up,
    /// it cannot reach a peer, it does not replicate) still answers; the frontend confirms
    /// with another replica. A partition with no local peer has nothing to miss.
    pub fn vouches(&self, partition: PartitionId) -> bool {
        let now = Instant::now();
        let window = self.caught_up_window;
        self.with_peers(partition, |peers| {
            peers
                .iter()
                .filter(|p| p.local && !p.bootstrapping)
                .all(|p| {
                    p.head_at
                        .is_some_and(|at| now.saturating_duration_since(at) <= window)
                })
        })
        .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(5);

    fn map() -> ClusterMap {
        let node = |id: &str, port: u16| {
            format!("[[nodes]]\nid = \"{id}\"\ndatacenter = \"dc1\"\naddress = \"127.0.0.1:{port}\"\ndisks = [\"d0\"]\n")
        };
        let text = format!(
            "format_version = 1\n[[datacenters]]\nname = \"dc1\"\nid = 1\n{}{}{}\
             [[partitions]]\nid = 0\nstate = \"read-write\"\nreplicas = [{{ node = \"s1\", disk = \"d0\" }}, \
             {{ node = \"s2\", disk = \"d0\" }}, {{ node = \"s3\", disk = \"d0\" }}]\n",
            node("s1", 1),
            node("s2", 2),
            node("s3", 3)
        );
        ClusterMap::from_toml(&text).unwrap()
    }

    #[test]
    fn the_horizon_waits_for_every_peer_and_follows_the_slowest() {
        let h = Horizons::new(&map(), "s1", Duration::from_secs(1), true, WINDOW);
        let at = |sequence| Cursor {
            incarnation: 7,
            sequence,
        };
        assert_eq!(h.horizon(0), None, "nobody pulled yet");
        assert!(h.pulled(0, "s2", at(40), 7));
        assert_eq!(h.horizon(0), None, "s3 unknown");
        assert!(!h.pulled(0, "s9", at(90), 7), "not a replica");
        assert!(h.pulled(0, "s3", at(30), 7));
        assert_eq!(h.horizon(0), Some(30));
        // s3 pulls from the beginning (rebuilt) or from another incarnation of ours.
        assert!(h.pulled(0, "s3", at(50), 8));
        assert_eq!(h.horizon(0), Some(0));
        assert_eq!(h.horizon(1), None, "not hosted");
    }

    #[test]
    fn a_bootstrapping_replica_holds_the_horizon_until_it_pulled() {
        let h = Horizons::new(&map(), "s1", Duration::from_secs(1), true, WINDOW);
        let at = |sequence| Cursor {
            incarnation: 7,
            sequence,
        };
        assert!(h.pulled(0, "s2", at(40), 7));
        assert!(h.pulled(0, "s3", at(30), 7));
        assert_eq!(h.horizon(0), Some(30));
        // s4 is added to partition 0, bootstrapping: nothing is dropped until it pulled.
        let mut moved = map();
        moved.revision += 1;
        let text = moved.to_toml().replace(
            "[[partitions]]",
            "[[nodes]]\nid = \"s4\"\ndatacenter = \"dc1\"\naddress = \"127.0.0.1:4\"\ndisks = [\"d0\"]\n\n[[partitions]]",
        );
        let mut moved = ClusterMap::from_toml(&text).unwrap();
        moved.partitions[0].replicas.push(larder_cluster::Replica {
            node: "s4".into(),
            disk: "d0".into(),
            state: ReplicaState::Bootstrapping,
        });
        h.update(&moved, "s1");
        assert_eq!(h.horizon(0), None, "s4 has seen nothing yet");
        assert_eq!(
            h.may_serve(0, "s4"),
            Serve::Yes,
            "a new replica is served unchecked"
        );
        assert!(h.pulled(0, "s4", at(10), 7));
        assert_eq!(h.horizon(0), Some(10), "the others' positions were kept");
    }

    #[test]
    fn a_peer_is_served_only_once_our_pull_of_it_was_not_refused() {
        let h = Horizons::new(&map(), "s1", Duration::from_secs(1), true, WINDOW);
        assert_eq!(h.may_serve(0, "s2"), Serve::NotChecked);
        h.answered(0, "s2", false);
        assert_eq!(h.may_serve(0, "s2"), Serve::Yes);
        h.answered(0, "s3", true);
        assert_eq!(h.may_serve(0, "s3"), Serve::Behind);
        h.answered(0, "s3", false);
        assert_eq!(h.may_serve(0, "s3"), Serve::Behind, "until rebuilt");
        let unchecked = Horizons::new(&map(), "s1", Duration::from_secs(1), false, WINDOW);
        assert_eq!(unchecked.may_serve(0, "s2"), Serve::Yes);
    }

    #[test]
    fn a_replica_empty_at_open_needs_no_check_but_a_refusal_still_counts() {
        let h = Horizons::new(&map(), "s1", Duration::from_secs(1), true, WINDOW);
        assert!(!h.checked_for_reads(0));
        assert_eq!(h.may_serve(0, "s2"), Serve::NotChecked);
        h.opened_empty(0);
        assert!(h.checked_for_reads(0));
        assert_eq!(h.may_serve(0, "s2"), Serve::Yes);
        h.answered(0, "s3", true);
        assert!(!h.checked_for_reads(0), "a peer's 409 wins");
        assert_eq!(h.may_serve(0, "s3"), Serve::Behind);
        h.reset(0);
        assert!(
            !h.checked_for_reads(0),
            "a rebuilt replica is checked as before"
        );
    }

    #[test]
    fn a_replica_vouches_only_while_it_reached_every_local_peers_head_recently() {
        let h = Horizons::new(&map(), "s1", Duration::from_secs(1), true, WINDOW);
        assert!(!h.vouches(0), "nothing pulled since the start");
        let now = Instant::now();
        h.reached_head(0, "s2", now);
        assert!(!h.vouches(0), "s3 not reached yet");
        h.reached_head(0, "s3", now);
        assert!(h.vouches(0));
        h.reached_head(0, "s3", now - WINDOW * 2);
        assert!(h.vouches(0), "an older pull does not move the time back");
        let stale = Horizons::new(&map(), "s1", Duration::from_secs(1), true, WINDOW);
        stale.reached_head(0, "s2", now);
        stale.reached_head(0, "s3", now - WINDOW * 2);
        assert!(!stale.vouches(0), "s3's head was reached too long ago");
        assert!(!h.vouches(1), "not hosted");
    }
}
