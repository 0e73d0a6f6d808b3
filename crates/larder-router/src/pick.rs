//! Which partition a new blob goes to: a uniformly random writable one, preferring those whose
//! local replicas are all up.

use larder_cluster::{Partition, PartitionId};
use rand::seq::IndexedRandom;
use rand::Rng;

/// Random draws tried before a scan of every partition. With every node up the first draw is
/// taken; a scan health-checked every replica of every partition (a lock and a lookup each: 6 %
/// of the frontend's CPU per 1 KiB PUT at 32 partitions x 3 replicas).
const DRAWS: usize = 8;

/// A uniformly random partition among those `writable` and `healthy`; when none is healthy, a
/// uniformly random `writable` one; `None` when none is writable.
///
/// Drawing uniformly and keeping the first draw that passes is a uniform choice among the ones
/// that pass; the scan after `DRAWS` misses is one too, so the mix of both stays uniform.
pub(crate) fn pick_partition<R: Rng + ?Sized>(
    partitions: &[Partition],
    writable: impl Fn(&Partition) -> bool,
    healthy: impl Fn(&Partition) -> bool,
    rng: &mut R,
) -> Option<PartitionId> {
    for _ in 0..DRAWS {
        let p = partitions.choose(rng)?;
        if writable(p) && healthy(p) {
            return Some(p.id);
        }
    }
    let writable: Vec<&Partition> = partitions.iter().filter(|p| writable(p)).collect();
    let healthy: Vec<&&Partition> = writable.iter().filter(|p| healthy(p)).collect();
    healthy
        .choose(rng)
        .map(|p| p.id)
        .or_else(|| writable.choose(rng).map(|p| p.id))
}

/// Whether `pick_partition` could choose `p` from `partitions`: `p` is writable, and healthy
/// unless no writable partition is. An ID minted ahead of need (a reserved upload entry) is
/// used only when this holds, so it lands where a fresh pick could have.
pub(crate) fn could_pick(
    partitions: &[Partition],
    p: &Partition,
    writable: impl Fn(&Partition) -> bool,
    healthy: impl Fn(&Partition) -> bool,
) -> bool {
    writable(p) && (healthy(p) || !partitions.iter().any(|q| writable(q) && healthy(q)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use larder_cluster::PartitionState;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn partitions(n: PartitionId) -> Vec<Partition> {
        (0..n)
            .map(|id| Partition {
                id,
                state: PartitionState::ReadWrite,
                replicas: Vec::new(),
            })
            .collect()
    }

    /// Counts of each partition picked in `draws` picks.
    fn histogram(
        parts: &[Partition],
        writable: impl Fn(&Partition) -> bool,
        healthy: impl Fn(&Partition) -> bool,
        draws: usize,
    ) -> Vec<usize> {
        let mut rng = StdRng::seed_from_u64(7);
        let mut counts = vec![0; parts.len()];
        for _ in 0..draws {
            let id = pick_partition(parts, &writable, &healthy, &mut rng).unwrap();
            counts[id as usize] += 1;
        }
        counts
    }

    #[test]
    fn every_partition_gets_its_share_when_all_are_up() {
        let parts = partitions(32);
        let counts = histogram(&parts, |_| true, |_| true, 64_000);
        // 2,000 expected each; the seeded draws make this exact, the bound says what matters.
        assert!(
            counts.iter().all(|&c| (1_700..2_300).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn unhealthy_and_unwritable_partitions_are_passed_over() {
        let parts = partitions(32);
        // Most partitions down: the draws miss often and the scan decides. Three pass (3, 19,
        // 27), so 13,333 expected each.
        let healthy = |p: &Partition| p.id % 8 == 3;
        let writable = |p: &Partition| p.id != 11;
        let counts = histogram(&parts, writable, healthy, 40_000);
        for (id, &c) in counts.iter().enumerate() {
            if id % 8 == 3 && id != 11 {
                assert!((12_300..14_300).contains(&c), "partition {id}: {c}");
            } else {
                assert_eq!(c, 0, "partition {id}");
            }
        }
    }

    #[test]
    fn with_none_healthy_any_writable_one_is_taken() {
        let parts = partitions(4);
        let counts = histogram(&parts, |p| p.id != 2, |_| false, 3_000);
        assert_eq!(counts[2], 0);
        assert!(counts.iter().enumerate().all(|(id, &c)| id == 2 || c > 800));
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(pick_partition(&parts, |_| false, |_| true, &mut rng), None);
        assert_eq!(pick_partition(&[], |_| true, |_| true, &mut rng), None);
    }

    proptest::proptest! {
        /// `could_pick` says yes exactly for the partitions `pick_partition` is seen to pick,
        /// whatever mix of writable and healthy partitions there is.
        #[test]
        fn could_pick_is_what_pick_partition_picks(
            flags in proptest::collection::vec((proptest::bool::ANY, proptest::bool::ANY), 1..6),
            seed in proptest::num::u64::ANY,
        ) {
            let parts = partitions(flags.len() as PartitionId);
            let writable = |p: &Partition| flags[p.id as usize].0;
            let healthy = |p: &Partition| flags[p.id as usize].1;
            let mut rng = StdRng::seed_from_u64(seed);
            let mut picked = vec![false; parts.len()];
            // Six partitions at most, each possible pick at least a sixth of the time: 200
            // draws miss one with odds below 1e-15.
            for _ in 0..200 {
                if let Some(id) = pick_partition(&parts, writable, healthy, &mut rng) {
                    picked[id as usize] = true;
                }
            }
            for p in &parts {
                proptest::prop_assert_eq!(
                    could_pick(&parts, p, writable, healthy),
                    picked[p.id as usize],
                    "partition {} of {:?}", p.id, flags
                );
            }
        }
    }
}
