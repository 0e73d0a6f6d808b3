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
//! Version 3 is version 2 with each part's checksum of one algorithm (an S3 multipart upload
//! made with one), between the parts and the CRC: the algorithm's code (1 byte, the writer's
//! own, never 0), the digests' length `L` (1 byte, 1 to 64), then `L × n` bytes, each part's
//! digest in order. A record without checksums is still written as version 2, which builds
//! before version 3 read.
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
/// The format version of a record that keeps each part's checksum too.
pub const PARTS_CHECKSUMS_VERSION: u8 = 3;
/// The longest digest a version-3 record keeps per part (SHA-256's is 32).
pub const MAX_DIGEST_LEN: usize = 64;
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
    /// Each part's checksum, when the record keeps them (version 3).
    pub checksums: Option<PartChecksums>,
}

/// Each part's digest of one algorithm, in the parts' order. What `algorithm` names is the
/// writer's to say (the S3 layer's code for it); the record only keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartChecksums {
    pub algorithm: u8,
    pub digests: Vec<Vec<u8>>,
}

impl PartChecksums {
    /// The digests' one length, if they make a valid list for `parts` parts.
    fn digest_len(&self, parts: usize) -> Option<usize> {
        let len = self.digests.first()?.len();
        let valid = self.algorithm != 0
            && self.digests.len() == parts
            && (1..=MAX_DIGEST_LEN).contains(&len)
            && self.digests.iter().all(|d| d.len() == len);
        valid.then_some(len)
    }
}

impl PartsManifest {
    /// The record of `parts`, in order; `None` if they are none, too many, of a kind a part
    /// cannot be, or their sizes overflow.
    pub fn new(parts: Vec<Part>) -> Option<PartsManifest> {
        let size = total_size(&parts)?;
        let valid = !parts.is_empty()
            && parts.len() <= MAX_PARTS
            && parts.iter().all(|p| is_part_kind(p.id.kind));
        valid.then_some(PartsManifest {
            size,
            parts,
            checksums: None,
        })
    }

    /// The record with each part's checksum too (version 3); `None` if there is not one
    /// digest per part, all of one length from 1 to `MAX_DIGEST_LEN`, or the algorithm is 0.
    pub fn with_checksums(self, checksums: PartChecksums) -> Option<PartsManifest> {
        checksums.digest_len(self.parts.len())?;
        Some(PartsManifest {
            checksums: Some(checksums),
            ..self
        })
    }

    /// Part `number`'s (1-based) digest, when the record keeps them.
    pub fn part_checksum(&self, number: usize) -> Option<(u8, &[u8])> {
        let checksums = self.checksums.as_ref()?;
        let digest = checksums.digests.get(number.checked_sub(1)?)?;
        Some((checksums.algorithm, digest.as_slice()))
    }

    /// Size of the encoded record of `parts` parts.
    pub fn encoded_len(parts: usize) -> usize {
        HEADER_LEN + PART_LEN * parts + 4
    }

    pub fn encode(&self) -> Vec<u8> {
        let n = self.parts.len();
        let checksums = self
            .checksums
            .as_ref()
            .and_then(|c| Some((c, c.digest_len(n)?)));
        let extra = checksums.map_or(0, |(_, len)| 2 + len * n);
        let mut out = Vec::with_capacity(Self::encoded_len(n) + extra);
        out.extend_from_slice(MAGIC);
        out.push(match checksums {
            Some(_) => PARTS_CHECKSUMS_VERSION,
            None => PARTS_VERSION,
        });
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&(n as u32).to_be_bytes());
        for part in &self.parts {
            out.extend_from_slice(&part.id.to_bytes());
            out.extend_from_slice(&part.size.to_be_bytes());
        }
        if let Some((checksums, len)) = checksums {
            out.push(checksums.algorithm);
            out.push(len as u8);
            for digest in &checksums.digests {
                out.extend_from_slice(digest);
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    /// Decodes a version-2 or version-3 record (the caller has read the version byte:
    /// `manifest::Composite`).
    pub fn decode(bytes: &[u8]) -> Result<PartsManifest, ManifestError> {
        if bytes.len() < HEADER_LEN + 4 {
            return Err(ManifestError::BadLength);
        }
        if &bytes[..4] != MAGIC {
            return Err(ManifestError::BadMagic);
        }
        let with_checksums = match bytes[4] {
            PARTS_VERSION => false,
            PARTS_CHECKSUMS_VERSION => true,
            other => return Err(ManifestError::UnsupportedVersion(other)),
        };
        let size = u64::from_be_bytes(bytes[5..13].try_into().expect("8 bytes"));
        let count = u32::from_be_bytes(bytes[13..17].try_into().expect("4 bytes")) as usize;
        if count > MAX_PARTS {
            return Err(ManifestError::BadLength);
        }
        // Where the parts end (and a version-3 record's checksums begin); count is bounded, so
        // none of this overflows.
        let parts_end = HEADER_LEN + PART_LEN * count;
        let digest_len = match with_checksums {
            false => 0,
            true => *bytes.get(parts_end + 1).ok_or(ManifestError::BadLength)? as usize,
        };
        let expected = match with_checksums {
            false => Self::encoded_len(count),
            true => parts_end + 2 + digest_len * count + 4,
        };
        if bytes.len() != expected {
            return Err(ManifestError::BadLength);
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().expect("4 bytes")) {
            return Err(ManifestError::BadChecksum);
        }
        let checksums = match with_checksums {
            false => None,
            true => Some(PartChecksums {
                algorithm: body[parts_end],
                digests: match digest_len {
                    0 => Vec::new(),
                    len => body[parts_end + 2..]
                        .chunks_exact(len)
                        .map(<[u8]>::to_vec)
                        .collect(),
                },
            }),
        };
        if checksums
            .as_ref()
            .is_some_and(|c| c.digest_len(count).is_none())
        {
            return Err(ManifestError::Inconsistent(
                "the parts' checksums are not one of one length per part",
            ));
        }
        let parts = body[HEADER_LEN..parts_end]
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
        Ok(PartsManifest {
            size,
            parts,
            checksums,
        })
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
            checksums: None,
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

    fn with_digests(m: PartsManifest, len: usize) -> PartsManifest {
        let digests = (0..m.parts.len()).map(|i| vec![i as u8; len]).collect();
        m.with_checksums(PartChecksums {
            algorithm: 5,
            digests,
        })
        .expect("one digest per part")
    }

    #[test]
    fn a_record_with_checksums_is_version_3_and_round_trips() {
        let m = with_digests(parts(&[5 << 20, 3]), 32);
        let bytes = m.encode();
        assert_eq!(bytes[4], PARTS_CHECKSUMS_VERSION);
        assert_eq!(bytes.len(), PartsManifest::encoded_len(2) + 2 + 64);
        let back = PartsManifest::decode(&bytes).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.part_checksum(2), Some((5, &[1u8; 32][..])));
        assert_eq!(back.part_checksum(3), None);
        assert_eq!(back.part_checksum(0), None);
        // Without checksums it stays version 2, which earlier builds read.
        assert_eq!(parts(&[1]).encode()[4], PARTS_VERSION);
        // Not one digest per part, of one length from 1 to 64, under an algorithm other than 0.
        let two = parts(&[1, 2]);
        for (algorithm, digests) in [
            (5, vec![vec![1u8; 4]]),
            (5, vec![vec![1u8; 4], vec![1u8; 8]]),
            (5, vec![Vec::new(), Vec::new()]),
            (5, vec![vec![1u8; 65], vec![1u8; 65]]),
            (0, vec![vec![1u8; 4], vec![1u8; 4]]),
        ] {
            let checksums = PartChecksums { algorithm, digests };
            assert!(two.clone().with_checksums(checksums).is_none());
        }
    }

    #[test]
    fn a_damaged_version_3_record_is_an_error() {
        let bytes = with_digests(parts(&[10, 20]), 4).encode();
        let decode = PartsManifest::decode;
        let mut flipped = bytes.clone();
        flipped[bytes.len() - 6] ^= 1; // a digest's byte
        assert_eq!(decode(&flipped), Err(ManifestError::BadChecksum));
        assert_eq!(
            decode(&bytes[..bytes.len() - 1]),
            Err(ManifestError::BadLength)
        );
        // A digest length that does not match the bytes there are.
        let mut longer = bytes[..bytes.len() - 4].to_vec();
        longer[HEADER_LEN + 2 * PART_LEN + 1] = 5;
        let crc = crc32c::crc32c(&longer);
        longer.extend_from_slice(&crc.to_be_bytes());
        assert_eq!(decode(&longer), Err(ManifestError::BadLength));
    }

    proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = PartsManifest::decode(&bytes);
        }

        /// Any byte of a version-3 record changed, and a valid checksum put back: refused, or
        /// decoded to what encodes back to those bytes; never a panic (the CRC alone would
        /// turn most changes away).
        #[test]
        fn a_version_3_record_changed_anywhere_never_panics(
            at in any::<prop::sample::Index>(),
            value in any::<u8>(),
            len in 1usize..40,
        ) {
            let bytes = with_digests(parts(&[10, 20, 30]), len).encode();
            let mut body = bytes[..bytes.len() - 4].to_vec();
            let i = at.index(body.len());
            body[i] = value;
            let crc = crc32c::crc32c(&body);
            body.extend_from_slice(&crc.to_be_bytes());
            if let Ok(decoded) = PartsManifest::decode(&body) {
                // Accepted: it is exactly what encoding it writes.
                prop_assert_eq!(decoded.encode(), body);
            }
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
