//! Blob IDs: versioned, self-locating, unguessable, base64url without padding.
//!
//! Binary layout (27 bytes, version 1):
//!
//! | bytes | field |
//! | --- | --- |
//! | 1 | format version (1) |
//! | 1 | kind: 0 simple, 1 composite, 2 chunk |
//! | 1 | datacenter of origin (map id) |
//! | 2 | account (0: reserved for multi-tenancy) |
//! | 2 | container (0: reserved) |
//! | 4 | partition, big-endian |
//! | 16 | random bits (the unguessable part) |

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rand::RngCore;

use crate::map::PartitionId;

const VERSION: u8 = 1;
const LEN: usize = 27;
/// Length of the text form: 27 bytes are exactly 36 base64 characters (no padding, no spare bits).
const TEXT_LEN: usize = 36;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlobKind {
    /// An ordinary blob stored in one record.
    Simple,
    /// A large blob: its record lists chunk IDs.
    Composite,
    /// One chunk of a composite blob.
    Chunk,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlobId {
    pub kind: BlobKind,
    pub datacenter: u8,
    pub account: u16,
    pub container: u16,
    pub partition: PartitionId,
    pub random: [u8; 16],
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlobIdError {
    #[error("blob id is not base64url")]
    NotBase64,
    #[error("blob id has {0} bytes, expected {LEN}")]
    BadLength(usize),
    /// The text form has the wrong length (checked before decoding, so nothing long is decoded).
    #[error("blob id is {0} characters long, expected {TEXT_LEN}")]
    BadTextLength(usize),
    #[error("blob id version {0} is not supported")]
    UnsupportedVersion(u8),
    #[error("blob id kind {0} is unknown")]
    UnknownKind(u8),
}

impl BlobId {
    /// Mints a new ID with 128 bits from the OS-seeded thread RNG.
    pub fn mint(kind: BlobKind, datacenter: u8, partition: PartitionId) -> BlobId {
        let mut random = [0u8; 16];
        rand::rng().fill_bytes(&mut random);
        BlobId {
            kind,
            datacenter,
            account: 0,
            container: 0,
            partition,
            random,
        }
    }

    pub fn to_bytes(&self) -> [u8; LEN] {
        let mut out = [0u8; LEN];
        out[0] = VERSION;
        out[1] = match self.kind {
            BlobKind::Simple => 0,
            BlobKind::Composite => 1,
            BlobKind::Chunk => 2,
        };
        out[2] = self.datacenter;
        out[3..5].copy_from_slice(&self.account.to_be_bytes());
        out[5..7].copy_from_slice(&self.container.to_be_bytes());
        out[7..11].copy_from_slice(&self.partition.to_be_bytes());
        out[11..27].copy_from_slice(&self.random);
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<BlobId, BlobIdError> {
        if bytes.len() != LEN {
            return Err(BlobIdError::BadLength(bytes.len()));
        }
        if bytes[0] != VERSION {
            return Err(BlobIdError::UnsupportedVersion(bytes[0]));
        }
        let kind = match bytes[1] {
            0 => BlobKind::Simple,
            1 => BlobKind::Composite,
            2 => BlobKind::Chunk,
            other => return Err(BlobIdError::UnknownKind(other)),
        };
        let u16_at = |i: usize| u16::from_be_bytes([bytes[i], bytes[i + 1]]);
        Ok(BlobId {
            kind,
            datacenter: bytes[2],
            account: u16_at(3),
            container: u16_at(5),
            partition: u32::from_be_bytes(bytes[7..11].try_into().expect("4 bytes")),
            random: bytes[11..27].try_into().expect("16 bytes"),
        })
    }
}

impl fmt::Display for BlobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&URL_SAFE_NO_PAD.encode(self.to_bytes()))
    }
}

impl FromStr for BlobId {
    type Err = BlobIdError;
    fn from_str(s: &str) -> Result<BlobId, BlobIdError> {
        // 27 bytes encode to exactly 36 characters; reject any other length before decoding.
        if s.len() != TEXT_LEN {
            return Err(BlobIdError::BadTextLength(s.chars().count()));
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| BlobIdError::NotBase64)?;
        BlobId::from_bytes(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_length() {
        let id = BlobId::mint(BlobKind::Composite, 2, 41);
        let text = id.to_string();
        assert_eq!(text.len(), 36);
        assert_eq!(text.parse::<BlobId>().unwrap(), id);
        assert_ne!(
            BlobId::mint(BlobKind::Simple, 2, 41),
            BlobId::mint(BlobKind::Simple, 2, 41)
        );
    }

    #[test]
    fn malformed_ids_are_errors() {
        assert!("".parse::<BlobId>().is_err());
        assert!("not-an-id".parse::<BlobId>().is_err());
        assert_eq!(
            "!".repeat(36).parse::<BlobId>(),
            Err(BlobIdError::NotBase64)
        );
        let mut bytes = BlobId::mint(BlobKind::Simple, 1, 1).to_bytes();
        bytes[0] = 9;
        let text = URL_SAFE_NO_PAD.encode(bytes);
        assert_eq!(
            text.parse::<BlobId>(),
            Err(BlobIdError::UnsupportedVersion(9))
        );
    }

    #[test]
    fn wrong_lengths_say_what_is_wrong() {
        let text = BlobId::mint(BlobKind::Simple, 1, 1).to_string();
        let err = format!("{text}x").parse::<BlobId>().unwrap_err();
        assert_eq!(err, BlobIdError::BadTextLength(37));
        assert_eq!(
            err.to_string(),
            "blob id is 37 characters long, expected 36"
        );
        assert_eq!(
            "é".repeat(20).parse::<BlobId>(),
            Err(BlobIdError::BadTextLength(20))
        );
    }

    proptest! {
        #[test]
        fn parsing_never_panics(s in ".{0,80}") {
            if let Ok(id) = s.parse::<BlobId>() {
                prop_assert_eq!(id.to_string(), s);
            }
        }

        #[test]
        fn base64_text_never_panics_and_round_trips(s in "[A-Za-z0-9_-]{34,38}") {
            if let Ok(id) = s.parse::<BlobId>() {
                prop_assert_eq!(id.to_string(), s);
            }
        }

        #[test]
        fn every_id_round_trips(kind in 0..3u8, dc in any::<u8>(), partition in any::<u32>(), random in any::<[u8; 16]>()) {
            let kind = [BlobKind::Simple, BlobKind::Composite, BlobKind::Chunk][usize::from(kind)];
            let id = BlobId { kind, datacenter: dc, account: 0, container: 0, partition, random };
            prop_assert_eq!(id.to_string().parse::<BlobId>(), Ok(id));
        }

        #[test]
        fn decoding_bytes_never_panics(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(id) = BlobId::from_bytes(&b) {
                prop_assert_eq!(&id.to_bytes()[..], &b[..]);
            }
        }
    }
}
