//! The composite blob's record: the list of chunks a large blob was cut into. This module is the
//! only owner of that format (version 1); `parts_manifest.rs` owns version 2, an object made of
//! parts of different sizes, and `Composite` reads either.
//!
//! Binary layout (version 1, all integers big-endian):
//!
//! | bytes | field |
//! | --- | --- |
//! | 4 | magic `LCMP` |
//! | 1 | format version (1) |
//! | 8 | chunk size: every chunk but the last holds exactly this many bytes |
//! | 8 | size of the whole blob |
//! | 4 | number of chunks `n` |
//! | 27 × n | chunk blob IDs (`BlobId::to_bytes`, each of kind chunk), in order |
//! | 4 | CRC32C of everything before it |
//!
//! The chunk size is written down (rather than taken from the configuration) so that blobs stay
//! readable after the configured chunk size changes.

use std::ops::Range;

use larder_cluster::{BlobId, BlobKind};

use crate::parts_manifest::{PartsManifest, PARTS_CHECKSUMS_VERSION, PARTS_VERSION};

pub(crate) const MAGIC: &[u8; 4] = b"LCMP";
const VERSION: u8 = 1;
const ID_LEN: usize = 27;
const HEADER_LEN: usize = 4 + 1 + 8 + 8 + 4;

/// A composite blob's record, in either of its forms: read through `decode`, which goes by the
/// version byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Composite {
    /// Version 1: one body cut into chunks of one size.
    Chunks(Manifest),
    /// Version 2 (3 with each part's checksum): parts of different sizes, each a simple blob
    /// or a version-1 composite.
    Parts(PartsManifest),
}

impl Composite {
    pub fn decode(bytes: &[u8]) -> Result<Composite, ManifestError> {
        match bytes.get(4) {
            Some(&PARTS_VERSION | &PARTS_CHECKSUMS_VERSION) => {
                PartsManifest::decode(bytes).map(Composite::Parts)
            }
            _ => Manifest::decode(bytes).map(Composite::Chunks),
        }
    }

    /// Size of the whole blob.
    pub fn size(&self) -> u64 {
        match self {
            Composite::Chunks(m) => m.size,
            Composite::Parts(m) => m.size,
        }
    }
}

/// The chunks of one composite blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub chunk_size: u64,
    pub size: u64,
    pub chunks: Vec<BlobId>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("composite record is truncated or has trailing bytes")]
    BadLength,
    #[error("composite record does not start with the manifest magic")]
    BadMagic,
    #[error("composite record version {0} is not supported")]
    UnsupportedVersion(u8),
    #[error("composite record fails its checksum")]
    BadChecksum,
    #[error("composite record is inconsistent: {0}")]
    Inconsistent(&'static str),
}

/// One piece of a read: which chunk, and which bytes of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkSlice {
    pub id: BlobId,
    /// Bytes within the chunk (half-open).
    pub within: Range<u64>,
    /// Size of the whole chunk, to tell a whole-chunk read from a partial one.
    pub chunk_len: u64,
}

impl Manifest {
    /// Size of the encoded manifest of a blob with `chunks` chunks.
    pub fn encoded_len(chunks: usize) -> usize {
        HEADER_LEN + ID_LEN * chunks + 4
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::encoded_len(self.chunks.len()));
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.chunk_size.to_be_bytes());
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&(self.chunks.len() as u32).to_be_bytes());
        for id in &self.chunks {
            out.extend_from_slice(&id.to_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() < HEADER_LEN + 4 {
            return Err(ManifestError::BadLength);
        }
        if &bytes[..4] != MAGIC {
            return Err(ManifestError::BadMagic);
        }
        if bytes[4] != VERSION {
            return Err(ManifestError::UnsupportedVersion(bytes[4]));
        }
        let u64_at = |i: usize| u64::from_be_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let chunk_size = u64_at(5);
        let size = u64_at(13);
        let count = u32::from_be_bytes(bytes[21..25].try_into().expect("4 bytes")) as usize;
        if bytes.len() != Self::encoded_len(count) {
            return Err(ManifestError::BadLength);
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().expect("4 bytes")) {
            return Err(ManifestError::BadChecksum);
        }
        if chunk_size == 0 {
            return Err(ManifestError::Inconsistent("chunk size 0"));
        }
        if count as u64 != size.div_ceil(chunk_size) {
            return Err(ManifestError::Inconsistent(
                "chunk count does not match size",
            ));
        }
        let chunks = body[HEADER_LEN..]
            .chunks_exact(ID_LEN)
            .map(|raw| match BlobId::from_bytes(raw) {
                Ok(id) if id.kind == BlobKind::Chunk => Ok(id),
                _ => Err(ManifestError::Inconsistent("a listed ID is not a chunk ID")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Manifest {
            chunk_size,
            size,
            chunks,
        })
    }

    /// Size of chunk `index`: the chunk size, except for a shorter last chunk.
    pub fn chunk_len(&self, index: usize) -> u64 {
        let start = index as u64 * self.chunk_size;
        self.chunk_size.min(self.size - start)
    }

    /// The chunks a read of `range` (half-open, inside the blob) touches, and the bytes of each.
    pub fn slices(&self, range: Range<u64>) -> Vec<ChunkSlice> {
        if range.is_empty() {
            return Vec::new();
        }
        let first = (range.start / self.chunk_size) as usize;
        let last = ((range.end - 1) / self.chunk_size) as usize;
        (first..=last)
            .map(|index| {
                let chunk_start = index as u64 * self.chunk_size;
                let chunk_len = self.chunk_len(index);
                let start = range.start.max(chunk_start) - chunk_start;
                let end = range.end.min(chunk_start + chunk_len) - chunk_start;
                ChunkSlice {
                    id: self.chunks[index],
                    within: start..end,
                    chunk_len,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn manifest(size: u64, chunk_size: u64) -> Manifest {
        let count = size.div_ceil(chunk_size) as usize;
        Manifest {
            chunk_size,
            size,
            chunks: (0..count)
                .map(|i| BlobId::mint(BlobKind::Chunk, 1, i as u32))
                .collect(),
        }
    }

    #[test]
    fn round_trip() {
        let m = manifest(10 * 1024 + 7, 1024);
        let bytes = m.encode();
        assert_eq!(bytes.len(), Manifest::encoded_len(11));
        assert_eq!(Manifest::decode(&bytes).unwrap(), m);
    }

    #[test]
    fn damaged_records_are_errors() {
        let bytes = manifest(5000, 1000).encode();
        assert_eq!(
            Manifest::decode(&bytes[..bytes.len() - 1]),
            Err(ManifestError::BadLength)
        );
        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        assert_eq!(Manifest::decode(&flipped), Err(ManifestError::BadChecksum));
        let mut version = bytes.clone();
        version[4] = 2;
        assert_eq!(
            Manifest::decode(&version),
            Err(ManifestError::UnsupportedVersion(2))
        );
        assert_eq!(Manifest::decode(b"nope"), Err(ManifestError::BadLength));
    }

    #[test]
    fn slices_at_and_across_boundaries() {
        let m = manifest(3500, 1000);
        let within = |r: Range<u64>| {
            m.slices(r)
                .into_iter()
                .map(|s| (s.id.partition, s.within, s.chunk_len))
                .collect::<Vec<_>>()
        };
        assert_eq!(within(0..3500).len(), 4);
        assert_eq!(within(0..1000), vec![(0, 0..1000, 1000)]);
        assert_eq!(
            within(999..1001),
            vec![(0, 999..1000, 1000), (1, 0..1, 1000)]
        );
        assert_eq!(within(1000..1001), vec![(1, 0..1, 1000)]);
        assert_eq!(within(3000..3500), vec![(3, 0..500, 500)]);
        assert_eq!(
            within(500..3200),
            vec![
                (0, 500..1000, 1000),
                (1, 0..1000, 1000),
                (2, 0..1000, 1000),
                (3, 0..200, 500)
            ]
        );
        assert!(within(7..7).is_empty());
    }

    proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Manifest::decode(&bytes);
        }

        #[test]
        fn slices_cover_the_range_exactly(size in 1u64..20_000, chunk in 1u64..3_000, a in 0u64..20_000, b in 0u64..20_000) {
            let m = manifest(size, chunk);
            let (a, b) = (a.min(b) % size, (a.max(b) % size) + 1);
            let (a, b) = (a.min(b), a.max(b));
            let slices = m.slices(a..b);
            let total: u64 = slices.iter().map(|s| s.within.end - s.within.start).sum();
            prop_assert_eq!(total, b - a);
            prop_assert!(slices.iter().all(|s| !s.within.is_empty() && s.within.end <= s.chunk_len));
        }
    }
}
