//! Blob contents derived from a seed, so a read can be checked by hash without keeping the bytes,
//! and the seeded random source that drives every choice of a run.

use sha2::{Digest, Sha256};

/// SplitMix64: tiny, fast, and the same sequence for the same seed on every machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// An independent stream for `purpose` (a worker, the nemesis), from the run's seed.
    pub fn derive(seed: u64, purpose: u64) -> Rng {
        let mut mixer = Rng(seed ^ purpose.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        Rng(mixer.next_u64())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `low..high` (`high > low`).
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low)
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }
}

/// The bytes of a blob: `len` bytes from the stream seeded with `seed`.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn sha256_hex(data: &[u8]) -> String {
    let digest = Sha256::digest(data);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A blob size: mostly small, some medium, a few large enough to be chunked (over 4 MiB).
pub fn blob_size(rng: &mut Rng, max: u64) -> usize {
    let size = match rng.range(0, 100) {
        0..=69 => rng.range(1, 4 << 10),
        70..=89 => rng.range(4 << 10, 256 << 10),
        90..=97 => rng.range(256 << 10, 1 << 20),
        _ => rng.range(1 << 20, 8 << 20),
    };
    size.min(max).max(1) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_bytes_and_streams_differ() {
        assert_eq!(bytes(7, 1000), bytes(7, 1000));
        assert_ne!(bytes(7, 1000), bytes(8, 1000));
        assert_eq!(bytes(7, 13).len(), 13);
        let (mut a, mut b) = (Rng::derive(1, 1), Rng::derive(1, 2));
        assert_ne!(a.next_u64(), b.next_u64());
    }
}
