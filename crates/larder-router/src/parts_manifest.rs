//! The composite record's second form (version 2): an object assembled from parts of different
//! sizes, such as an S3 multipart upload's. Version 1 (`manifest.rs`) cuts one body into
//! chunks of one size; here every part keeps its own size, and a part is itself a simple blob
//! or a version-1 composite (a part longer than a chunk was stored chunked). Nesting goes one
//! level deep only: a part is never a version-2 record.
//!
//! Binary layout (version 2, all integers big-endian):
//!
//! | bytes | field |
//! | --- | --- |
//! | 4 | magic `LCMP` (as version 1) |
//! | 1 | format version (2) |
//! | 8 | size of the whole object (the sum of the parts' sizes) |
//! | 4 | number of parts `n` (at least 1) |
//! | 35 × n | each part: its blob ID (27 bytes, `BlobId::to_bytes`: simple or composite), then its size (8) |
//! | 4 | CRC32C of everything before it |
//!
//! Why a record of its own rather than the parts listed where the name lives: a name's entry
//! sits in an index record that every write and read in its key range rewrites or reads whole,
//! and 10,000 parts are most of a megabyte. Here the list is written once, beside the parts,
//! and read only by reads of that object.

use std::ops::Range;

use larder_cluster::{BlobId, BlobKind};

use crate::manifest::{ManifestError, MAGIC};

/// The format version this module writes and reads.
pub const PARTS_VERSION: u8 = 2;
const ID_LEN: usize = 27;
const PART_LEN: usize = ID_LEN + 8;
const HEADER_LEN: usize = 4 + 1 + 8 + 4;

/// Parts one record may list (S3 allows 10,000 per upload): bounds the record to 350 KB.
pub const MAX_PARTS: usize = 10_000;

/// One part: a simple blob or a version-1 composite, and how many bytes it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub id: BlobId,
    pub size: u64,
}

/// The parts of one object, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartsManifest {
    pub size: u64,
    pub parts: Vec<Part>,
}

impl PartsManifest {
    /// The record of `parts`, in order; `None` if they are none, too many, of a kind a part
    /// cannot be, or their sizes overflow.
    pub fn new(parts: Vec<Part>) -> Option<PartsManifest> {
        let size = total_size(&parts)?;
        let valid = !parts.is_empty()
            && parts.len() <= MAX_PARTS
            && parts.iter().all(|p| is_part_kind(p.id.kind));
        valid.then_some(PartsManifest { size, parts })
    }

    /// Size of the encoded record of `parts` parts.
    pub fn encoded_len(parts: usize) -> usize {
        HEADER_LEN + PART_LEN * parts + 4
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::encoded_len(self.parts.len()));
        out.extend_from_slice(MAGIC);
        out.push(PARTS_VERSION);
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&(self.parts.len() as u32).to_be_bytes());
        for part in &self.parts {
            out.extend_from_slice(&part.id.to_bytes());
            out.extend_from_slice(&part.size.to_be_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    /// Decodes a version-2 record (the caller has read the version byte: `manifest::Composite`).
    pub fn decode(bytes: &[u8]) -> Result<PartsManifest, ManifestError> {
        if bytes.len() < HEADER_LEN + 4 {
            return Err(ManifestError::BadLength);
        }
        if &bytes[..4] != MAGIC {
            return Err(ManifestError::BadMagic);
        }
        if bytes[4] != PARTS_VERSION {
            return Err(ManifestError::UnsupportedVersion(bytes[4]));
        }
        let size = u64::from_be_bytes(bytes[5..13].try_into().expect("8 bytes"));
        let count = u32::from_be_bytes(bytes[13..17].try_into().expect("4 bytes")) as usize;
        if count > MAX_PARTS || bytes.len() != Self::encoded_len(count) {
            return Err(ManifestError::BadLength);
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().expect("4 bytes")) {
            return Err(ManifestError::BadChecksum);
        }
        let parts = body[HEADER_LEN..]
            .chunks_exact(PART_LEN)
            .map(|raw| {
                let (id, len) = raw.split_at(ID_LEN);
                let size = u64::from_be_bytes(len.try_into().expect("8 bytes"));
                match BlobId::from_bytes(id) {
                    Ok(id) if is_part_kind(id.kind) => Ok(Part { id, size }),
                    _ => Err(ManifestError::Inconsistent(
                        "a part is neither a simple blob nor a version-1 composite",
                    )),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        if parts.is_empty() {
            return Err(ManifestError::Inconsistent("no parts"));
        }
        if total_size(&parts) != Some(size) {
            return Err(ManifestError::Inconsistent(
                "the parts' sizes do not add up to the size",
            ));
        }
        Ok(PartsManifest { size, parts })
    }

    /// The bytes of part `number` (1-based) within the object; `None` past the last part.
    pub fn part_range(&self, number: usize) -> Option<Range<u64>> {
        let index = number.checked_sub(1).filter(|i| *i < self.parts.len())?;
        let start: u64 = self.parts[..index].iter().map(|p| p.size).sum();
        Some(start..start + self.parts[index].size)
    }

    /// The parts a read of `range` (half-open, inside the object) touches, and the bytes of
    /// each within it, in order.
    pub fn slices(&self, range: Range<u64>) -> Vec<(&Part, Range<u64>)> {
        let mut out = Vec::new();
        let mut start = 0u64;
        for part in &self.parts {
            let end = start + part.size;
            if start >= range.end {
                break;
            }
            let (from, to) = (range.start.max(start), range.end.min(end));
            if from < to {
                out.push((part, from - start..to - start));
            }
            start = end;
        }
        out
    }
}

fn is_part_kind(kind: BlobKind) -> bool {
    matches!(kind, BlobKind::Simple | BlobKind::Composite)
}

/// The sum of the parts' sizes, `None` on overflow (a record from disk may say anything).
fn total_size(parts: &[Part]) -> Option<u64> {
    parts
        .iter()
        .try_fold(0u64, |sum, p| sum.checked_add(p.size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parts(sizes: &[u64]) -> PartsManifest {
        let parts = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                let kind = if i % 2 == 0 {
                    BlobKind::Simple
                } else {
                    BlobKind::Composite
                };
                Part {
                    id: BlobId::mint(kind, 1, i as u32),
                    size,
                }
            })
            .collect();
        PartsManifest::new(parts).expect("valid parts")
    }

    #[test]
    fn round_trip() {
        let m = parts(&[5 << 20, 7 << 20, 3]);
        let bytes = m.encode();
        assert_eq!(bytes.len(), PartsManifest::encoded_len(3));
        assert_eq!(PartsManifest::decode(&bytes).unwrap(), m);
        assert_eq!(m.size, (12 << 20) + 3);
    }

    #[test]
    fn damaged_or_inconsistent_records_are_errors() {
        let bytes = parts(&[10, 20]).encode();
        let decode = PartsManifest::decode;
        assert_eq!(
            decode(&bytes[..bytes.len() - 1]),
            Err(ManifestError::BadLength)
        );
        let mut flipped = bytes.clone();
        flipped[30] ^= 1;
        assert_eq!(decode(&flipped), Err(ManifestError::BadChecksum));
        let mut version = bytes.clone();
        version[4] = 1;
        assert_eq!(decode(&version), Err(ManifestError::UnsupportedVersion(1)));
        // A size that the parts do not add up to, with a valid checksum.
        let mut m = parts(&[10, 20]);
        m.size = 31;
        assert!(matches!(
            decode(&m.encode()),
            Err(ManifestError::Inconsistent(_))
        ));
        // A chunk is no part; nor is an empty list.
        let chunk = Part {
            id: BlobId::mint(BlobKind::Chunk, 1, 0),
            size: 1,
        };
        assert!(PartsManifest::new(vec![chunk.clone()]).is_none());
        let forged = PartsManifest {
            size: 1,
            parts: vec![chunk],
        };
        assert!(matches!(
            decode(&forged.encode()),
            Err(ManifestError::Inconsistent(_))
        ));
        assert!(PartsManifest::new(Vec::new()).is_none());
    }

    #[test]
    fn part_ranges_follow_the_sizes() {
        let m = parts(&[100, 50, 0, 7]);
        assert_eq!(m.part_range(1), Some(0..100));
        assert_eq!(m.part_range(2), Some(100..150));
        assert_eq!(m.part_range(3), Some(150..150));
        assert_eq!(m.part_range(4), Some(150..157));
        assert_eq!(m.part_range(5), None);
        assert_eq!(m.part_range(0), None);
    }

    proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = PartsManifest::decode(&bytes);
        }

        #[test]
        fn slices_cover_the_range_exactly(
            sizes in proptest::collection::vec(0u64..5_000, 1..20),
            a in any::<u64>(),
            b in any::<u64>(),
        ) {
            let m = parts(&sizes);
            prop_assume!(m.size > 0);
            let (a, b) = (a % m.size, b % m.size + 1);
            let (a, b) = (a.min(b), a.max(b));
            let slices = m.slices(a..b);
            let total: u64 = slices.iter().map(|(_, r)| r.end - r.start).sum();
            prop_assert_eq!(total, b - a);
            prop_assert!(slices.iter().all(|(p, r)| !r.is_empty() && r.end <= p.size));
            // In order, and each part once.
            let ids: Vec<_> = slices.iter().map(|(p, _)| p.id).collect();
            let mut sorted = ids.clone();
            sorted.dedup();
            prop_assert_eq!(ids, sorted);
        }
    }
}
