//! Stable placement of keys (document IDs) on partitions.

use crate::map::PartitionId;

/// Maps a key to a partition with FNV-1a (64 bit), a hash that is fixed forever: changing it would
/// move every stored document.
pub fn partition_for_key(key: &[u8], partitions: u32) -> PartitionId {
    assert!(partitions > 0, "a cluster has at least one partition");
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % u64::from(partitions)) as PartitionId
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_values() {
        // Pinned: these must never change, or stored documents become unreachable.
        assert_eq!(
            partition_for_key(b"id:ns:music::1", 1000),
            partition_for_key(b"id:ns:music::1", 1000)
        );
        assert_eq!(
            partition_for_key(b"", 7),
            (0xcbf2_9ce4_8422_2325u64 % 7) as u32
        );
        assert_eq!(partition_for_key(b"a", 1_000_000), 641_996);
    }

    #[test]
    fn spreads_keys() {
        let mut counts = [0u32; 16];
        for i in 0..16_000 {
            counts[partition_for_key(format!("doc-{i}").as_bytes(), 16) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }
}
