//! The cluster map file: datacenters, storage nodes, partitions and their replicas.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Version of the map file format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

pub type NodeId = String;
pub type PartitionId = u32;

/// A whole cluster's layout. Validated on load: every value of this type is consistent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterMap {
    pub format_version: u32,
    /// Grows by one with every change of the map; nodes and frontends say which revision they
    /// run, and a node never takes an older map for a newer one. Maps written before revisions
    /// existed are revision 1.
    #[serde(default = "first_revision")]
    pub revision: u64,
    pub datacenters: Vec<Datacenter>,
    pub nodes: Vec<Node>,
    pub partitions: Vec<Partition>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Datacenter {
    pub name: String,
    /// Small number carried in blob IDs as the datacenter of origin.
    pub id: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub id: NodeId,
    pub datacenter: String,
    /// Address of the node's internal HTTP/2 API.
    pub address: SocketAddr,
    /// Disk names; a replica names the disk it lives on.
    pub disks: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PartitionState {
    ReadWrite,
    ReadOnly,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Partition {
    pub id: PartitionId,
    pub state: PartitionState,
    pub replicas: Vec<Replica>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replica {
    pub node: NodeId,
    pub disk: String,
    /// The replica's life (`../shared/DESIGN.md` section 6.1); absent in the file means live.
    #[serde(default, skip_serializing_if = "ReplicaState::is_live")]
    pub state: ReplicaState,
}

/// Where a replica is in its life. Only live replicas count toward quorums.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplicaState {
    /// Caught up and serving.
    #[default]
    Live,
    /// Receiving writes and copying its peers' data; serves no read, counts for no quorum, is
    /// no source for others.
    Bootstrapping,
    /// Still written to and readable until the replica replacing it is live, then deleted.
    Leaving,
}

impl ReplicaState {
    pub fn is_live(&self) -> bool {
        *self == ReplicaState::Live
    }

    /// Holds every acknowledged write: live, or leaving (it was live and is still written).
    /// Such replicas count toward write quorums and serve reads; bootstrapping ones do neither.
    pub fn is_caught_up(&self) -> bool {
        *self != ReplicaState::Bootstrapping
    }
}

fn first_revision() -> u64 {
    1
}

#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("cannot read cluster map {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write cluster map {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("cluster map is not valid TOML: {0}")]
    Syntax(String),
    #[error("invalid cluster map: {0}")]
    Invalid(String),
    #[error("map revision {offered} is older than the current {current}; keeping the current map")]
    Older { offered: u64, current: u64 },
    #[error("map revision {0} is the current revision with different content; a change needs a new revision")]
    Conflict(u64),
    #[error("map revision {offered} is not the next revision after {current}; re-read the map and plan again")]
    NotNext { offered: u64, current: u64 },
}

fn invalid(msg: impl Into<String>) -> MapError {
    MapError::Invalid(msg.into())
}

impl ClusterMap {
    pub fn from_toml(text: &str) -> Result<ClusterMap, MapError> {
        let map: ClusterMap = toml::from_str(text).map_err(|e| MapError::Syntax(e.to_string()))?;
        map.validate()?;
        Ok(map)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a cluster map always serialises")
    }

    pub fn load(path: &Path) -> Result<ClusterMap, MapError> {
        let text = std::fs::read_to_string(path).map_err(|source| MapError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// Writes the map atomically (temporary file, then rename).
    pub fn save(&self, path: &Path) -> Result<(), MapError> {
        let tmp = path.with_extension("toml.tmp");
        let write = |p: &Path| std::fs::write(p, self.to_toml());
        write(&tmp)
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|source| MapError::Write {
                path: path.display().to_string(),
                source,
            })
    }

    /// Checks every cross-reference and uniqueness rule; the error names the first problem found.
    pub fn validate(&self) -> Result<(), MapError> {
        if self.format_version != FORMAT_VERSION {
            return Err(invalid(format!(
                "format_version {} is not supported (this build reads {FORMAT_VERSION})",
                self.format_version
            )));
        }
        self.validate_datacenters()?;
        self.validate_nodes()?;
        self.validate_partitions()
    }

    fn validate_datacenters(&self) -> Result<(), MapError> {
        if self.datacenters.is_empty() {
            return Err(invalid("no datacenters"));
        }
        let mut names = BTreeSet::new();
        let mut ids = BTreeSet::new();
        for dc in &self.datacenters {
            if !names.insert(&dc.name) {
                return Err(invalid(format!("duplicate datacenter name {:?}", dc.name)));
            }
            if !ids.insert(dc.id) {
                return Err(invalid(format!("duplicate datacenter id {}", dc.id)));
            }
        }
        Ok(())
    }

    fn validate_nodes(&self) -> Result<(), MapError> {
        if self.nodes.is_empty() {
            return Err(invalid("no storage nodes"));
        }
        let mut ids = BTreeSet::new();
        let mut addresses = BTreeSet::new();
        for node in &self.nodes {
            if node.id.is_empty()
                || !node
                    .id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(invalid(format!(
                    "node id {:?} must be non-empty [A-Za-z0-9_-]",
                    node.id
                )));
            }
            if !ids.insert(&node.id) {
                return Err(invalid(format!("duplicate node id {:?}", node.id)));
            }
            if !addresses.insert(node.address) {
                return Err(invalid(format!(
                    "duplicate address {} (node {:?})",
                    node.address, node.id
                )));
            }
            if self.datacenter(&node.datacenter).is_none() {
                return Err(invalid(format!(
                    "node {:?} is in unknown datacenter {:?}",
                    node.id, node.datacenter
                )));
            }
            if node.disks.is_empty() {
                return Err(invalid(format!("node {:?} has no disks", node.id)));
            }
        }
        Ok(())
    }

    fn validate_partitions(&self) -> Result<(), MapError> {
        if self.partitions.is_empty() {
            return Err(invalid("no partitions"));
        }
        for (index, partition) in self.partitions.iter().enumerate() {
            if partition.id as usize != index {
                return Err(invalid(format!(
                    "partition ids must be 0..{} in order; found {} at position {index}",
                    self.partitions.len(),
                    partition.id
                )));
            }
            self.validate_replicas(partition)?;
        }
        Ok(())
    }

    fn validate_replicas(&self, partition: &Partition) -> Result<(), MapError> {
        if partition.replicas.is_empty() {
            return Err(invalid(format!(
                "partition {} has no replicas",
                partition.id
            )));
        }
        let mut nodes = BTreeSet::new();
        for replica in &partition.replicas {
            let Some(node) = self.node(&replica.node) else {
                return Err(invalid(format!(
                    "partition {} has a replica on unknown node {:?}",
                    partition.id, replica.node
                )));
            };
            if !node.disks.contains(&replica.disk) {
                return Err(invalid(format!(
                    "partition {} has a replica on unknown disk {:?} of node {:?}",
                    partition.id, replica.disk, replica.node
                )));
            }
            if !nodes.insert(&replica.node) {
                return Err(invalid(format!(
                    "partition {} has two replicas on node {:?}",
                    partition.id, replica.node
                )));
            }
        }
        Ok(())
    }

    pub fn node(&self, id: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    pub fn datacenter(&self, name: &str) -> Option<&Datacenter> {
        self.datacenters.iter().find(|d| d.name == name)
    }

    pub fn datacenter_by_id(&self, id: u8) -> Option<&Datacenter> {
        self.datacenters.iter().find(|d| d.id == id)
    }

    pub fn partition(&self, id: PartitionId) -> Option<&Partition> {
        self.partitions.get(id as usize)
    }

    /// The datacenter a node lives in.
    pub fn datacenter_of(&self, node: &str) -> Option<&str> {
        self.node(node).map(|n| n.datacenter.as_str())
    }

    /// The partitions with a replica on `node`, with the disk each lives on.
    pub fn replicas_on(&self, node: &str) -> Vec<(PartitionId, String)> {
        let mut out = Vec::new();
        for p in &self.partitions {
            for r in p.replicas.iter().filter(|r| r.node == node) {
                out.push((p.id, r.disk.clone()));
            }
        }
        out
    }

    /// How many replicas each node holds (for balance checks and `/v1/cluster`).
    pub fn replica_counts(&self) -> BTreeMap<&str, usize> {
        let mut counts: BTreeMap<&str, usize> =
            self.nodes.iter().map(|n| (n.id.as_str(), 0)).collect();
        for p in &self.partitions {
            for r in &p.replicas {
                *counts.entry(r.node.as_str()).or_default() += 1;
            }
        }
        counts
    }

    /// Node ids by datacenter.
    pub fn nodes_by_datacenter(&self) -> HashMap<&str, Vec<&str>> {
        let mut out: HashMap<&str, Vec<&str>> = HashMap::new();
        for n in &self.nodes {
            out.entry(n.datacenter.as_str())
                .or_default()
                .push(n.id.as_str());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{init_map, LayoutSpec};

    fn base() -> ClusterMap {
        init_map(&LayoutSpec {
            datacenters: vec!["dc1".into()],
            node_addresses: (0..3)
                .map(|i| format!("127.0.0.1:{}", 7100 + i).parse().unwrap())
                .collect(),
            partitions: 4,
            replicas_per_datacenter: 3,
        })
        .unwrap()
    }

    fn check(mutate: impl FnOnce(&mut ClusterMap), expected: &str) {
        let mut map = base();
        mutate(&mut map);
        let err = ClusterMap::from_toml(&map.to_toml())
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "expected {expected:?} in {err:?}");
    }

    #[test]
    fn validation_names_the_problem() {
        check(
            |m| m.partitions[1].replicas[0].node = "s9".into(),
            "unknown node \"s9\"",
        );
        check(
            |m| m.partitions[2].replicas[1].node = m.partitions[2].replicas[0].node.clone(),
            "two replicas on node",
        );
        check(
            |m| m.nodes[1].address = m.nodes[0].address,
            "duplicate address",
        );
        check(|m| m.nodes[2].id = "s1".into(), "duplicate node id");
        check(
            |m| m.nodes[0].datacenter = "mars".into(),
            "unknown datacenter \"mars\"",
        );
        check(
            |m| m.partitions[0].replicas[0].disk = "disk7".into(),
            "unknown disk",
        );
        check(|m| m.partitions[3].id = 9, "partition ids must be");
        check(
            |m| m.format_version = 2,
            "format_version 2 is not supported",
        );
        check(|m| m.partitions.clear(), "no partitions");
    }

    #[test]
    fn syntax_errors_and_unknown_fields() {
        assert!(matches!(
            ClusterMap::from_toml("nodes = 3"),
            Err(MapError::Syntax(_))
        ));
        let text = base()
            .to_toml()
            .replace("format_version = 1", "format_version = 1\nextra = true");
        assert!(matches!(
            ClusterMap::from_toml(&text),
            Err(MapError::Syntax(_))
        ));
    }

    #[test]
    fn maps_written_before_revisions_and_states_read_as_revision_one_all_live() {
        let mut map = base();
        map.partitions[0].replicas[1].state = ReplicaState::Bootstrapping;
        map.revision = 7;
        let text = map.to_toml();
        assert!(text.contains("state = \"bootstrapping\""), "{text}");
        assert!(!text.contains("\"live\""), "live is not written");
        assert_eq!(ClusterMap::from_toml(&text).expect("reads back"), map);

        let old = base().to_toml().replace("revision = 1\n", "");
        assert!(!old.contains("revision"), "{old}");
        let read = ClusterMap::from_toml(&old).expect("an old map reads");
        assert_eq!(read.revision, 1);
        assert!(read
            .partitions
            .iter()
            .all(|p| p.replicas.iter().all(|r| r.state == ReplicaState::Live)));
    }
}
