//! Where things live in a Larder cluster: the cluster map, blob IDs and document placement.
//!
//! Everything here is pure data and validation: no I/O beyond reading and writing the map file,
//! no networking. Frontends and storage nodes both read the same map.

mod blob_id;
mod layout;
mod map;
mod placement;
mod plan;
mod primary;
mod revision;

pub use blob_id::{BlobId, BlobIdError, BlobKind};
pub use layout::{init_map, LayoutSpec};
pub use map::{
    ClusterMap, Datacenter, MapError, Node, NodeId, Partition, PartitionId, PartitionState,
    Replica, ReplicaState, FORMAT_VERSION,
};
pub use placement::partition_for_key;
pub use plan::{complete_moves, has_moves_to, plan, Operation};
pub use revision::{FileWatch, Offer, MAX_MAP_BYTES};
