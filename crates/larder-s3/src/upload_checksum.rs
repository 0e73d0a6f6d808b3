//! A multipart object's additional checksum, made from its parts' (S3's `x-amz-checksum-type`).
//!
//! CreateMultipartUpload names the algorithm (`x-amz-checksum-algorithm`) and how the parts'
//! checksums make the object's (`x-amz-checksum-type`):
//!
//! - **COMPOSITE** (CRC32, CRC32C, SHA-1, SHA-256): the algorithm over the parts' binary
//!   checksums one after the other, then `-<parts>`, as the multipart ETag is made of MD5s. It
//!   checks each part, not the object's bytes as a whole.
//! - **FULL_OBJECT** (CRC32, CRC32C, CRC64NVME): the CRC of the whole object's bytes, made here
//!   from the parts' CRCs and sizes without reading a byte again (`combine`).
//!
//! Every UploadPart of such an upload is checksummed with its algorithm (computed here when the
//! client sends no value), and the part's value is kept in the upload's record.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::checksums::{Algorithm, ObjectChecksum};
use crate::error::S3Error;

/// How the object's checksum is made from the parts' checksums.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Combine {
    Composite,
    FullObject,
}

impl Combine {
    /// S3's name of it (`x-amz-checksum-type`).
    pub fn name(self) -> &'static str {
        match self {
            Combine::Composite => "COMPOSITE",
            Combine::FullObject => "FULL_OBJECT",
        }
    }
}

/// The checksum an upload's parts, and so its object, carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UploadChecksum {
    pub algorithm: Algorithm,
    pub combine: Combine,
}

impl UploadChecksum {
    /// What CreateMultipartUpload asked for (its `x-amz-checksum-algorithm` and
    /// `x-amz-checksum-type`, any case); `None` when it names no algorithm. A type is taken
    /// only with an algorithm, and only one S3 makes with it: CRC64NVME is FULL_OBJECT only,
    /// SHA-1 and SHA-256 COMPOSITE only; CRC32 and CRC32C default to COMPOSITE, as S3's do.
    pub fn requested(
        algorithm: Option<&str>,
        combine: Option<&str>,
    ) -> Result<Option<UploadChecksum>, S3Error> {
        let combine = match combine.map(str::to_ascii_uppercase).as_deref() {
            None => None,
            Some("COMPOSITE") => Some(Combine::Composite),
            Some("FULL_OBJECT") => Some(Combine::FullObject),
            Some(other) => {
                let why = format!("Value for x-amz-checksum-type header is invalid: {other}");
                return Err(S3Error::InvalidRequest(why));
            }
        };
        let Some(name) = algorithm else {
            return match combine {
                None => Ok(None),
                Some(_) => Err(S3Error::InvalidRequest(
                    "The x-amz-checksum-type header can only be used with the \
                     x-amz-checksum-algorithm header."
                        .into(),
                )),
            };
        };
        let algorithm = Algorithm::named(name).ok_or_else(|| {
            S3Error::InvalidRequest(format!("Checksum algorithm {name} is not supported"))
        })?;
        let made = match (algorithm, combine) {
            (Algorithm::Crc64nvme, None) => Combine::FullObject,
            (_, None) => Combine::Composite,
            (_, Some(combine)) => combine,
        };
        let allowed = match made {
            Combine::Composite => algorithm != Algorithm::Crc64nvme,
            Combine::FullObject => !matches!(algorithm, Algorithm::Sha1 | Algorithm::Sha256),
        };
        if !allowed {
            return Err(S3Error::InvalidRequest(format!(
                "The {} checksum type cannot be used with the {} checksum algorithm.",
                made.name(),
                algorithm.name().to_ascii_uppercase()
            )));
        }
        Ok(Some(UploadChecksum {
            algorithm,
            combine: made,
        }))
    }

    /// The object's checksum from its parts' checksums (base64 of this algorithm) and sizes, in
    /// order.
    pub fn of_parts(&self, parts: &[(&str, u64)]) -> Result<ObjectChecksum, S3Error> {
        let value = match self.combine {
            Combine::Composite => composite(self.algorithm, parts)?,
            Combine::FullObject => full_object(self.algorithm, parts)?,
        };
        Ok(ObjectChecksum {
            algorithm: self.algorithm,
            value,
        })
    }
}

fn decode(value: &str) -> Result<Vec<u8>, S3Error> {
    base64::engine::general_purpose::STANDARD
        .decode(value)
        .map_err(|_| S3Error::Corrupt(format!("a part's checksum {value:?} is not base64")))
}

fn composite(algorithm: Algorithm, parts: &[(&str, u64)]) -> Result<String, S3Error> {
    let mut hasher = algorithm.hasher();
    for (value, _) in parts {
        hasher.update(&decode(value)?);
    }
    let whole = crate::checksums::value_of(hasher.finalize())?;
    Ok(format!("{whole}-{}", parts.len()))
}

fn full_object(algorithm: Algorithm, parts: &[(&str, u64)]) -> Result<String, S3Error> {
    let crc =
        Crc::of(algorithm).ok_or_else(|| S3Error::Internal(format!("{algorithm:?} is no CRC")))?;
    // Made once for all the parts: combining then costs a multiplication per bit set in a
    // part's length, not a squaring per bit of it (10,000 parts are a Complete's bound).
    let powers = crc.byte_powers();
    let mut whole: Option<u64> = None;
    for (value, size) in parts {
        let bytes = decode(value)?;
        let part = crc.read(&bytes).ok_or_else(|| {
            S3Error::Corrupt(format!("a part's checksum {value:?} has the wrong length"))
        })?;
        whole = Some(match whole {
            None => part,
            Some(before) => crc.combine(&powers, before, part, *size),
        });
    }
    let whole = whole.ok_or_else(|| S3Error::Internal("an upload of no parts".into()))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(crc.bytes(whole)))
}

/// A reflected CRC whose register starts and ends inverted (CRC-32, CRC-32C, CRC-64/NVME), as
/// the polynomial arithmetic of `combine` needs.
#[derive(Clone, Copy)]
struct Crc {
    /// The polynomial, bit-reversed (the lowest bit is x^(width-1)).
    reflected_poly: u64,
    width: u32,
}

impl Crc {
    fn of(algorithm: Algorithm) -> Option<Crc> {
        let (reflected_poly, width) = match algorithm {
            Algorithm::Crc32 => (0xedb8_8320, 32),
            Algorithm::Crc32c => (0x82f6_3b78, 32),
            Algorithm::Crc64nvme => (0x9a6c_9329_ac4b_c9b5, 64),
            Algorithm::Sha1 | Algorithm::Sha256 => return None,
        };
        Some(Crc {
            reflected_poly,
            width,
        })
    }

    /// The CRC as S3 sends it: big-endian bytes of its width.
    fn read(&self, bytes: &[u8]) -> Option<u64> {
        (bytes.len() * 8 == self.width as usize)
            .then(|| bytes.iter().fold(0u64, |crc, b| (crc << 8) | u64::from(*b)))
    }

    fn bytes(&self, crc: u64) -> Vec<u8> {
        crc.to_be_bytes()[(8 - self.width as usize / 8)..].to_vec()
    }

    /// x^0, the polynomial 1, in the reflected representation.
    fn one(&self) -> u64 {
        1 << (self.width - 1)
    }

    /// a(x) · b(x) modulo the polynomial (both reflected).
    fn multiply(&self, a: u64, mut b: u64) -> u64 {
        let mut product = 0;
        let mut bit = self.one();
        while bit != 0 {
            if a & bit != 0 {
                product ^= b;
            }
            bit >>= 1;
            b = if b & 1 != 0 {
                (b >> 1) ^ self.reflected_poly
            } else {
                b >> 1
            };
        }
        product
    }

    /// x^(8·2^k) modulo the polynomial for every k of a 64-bit length: `combine`'s factors.
    fn byte_powers(&self) -> [u64; 64] {
        let mut powers = [0; 64];
        let mut power = self.one() >> 8; // x^8: one byte
        for slot in &mut powers {
            *slot = power;
            power = self.multiply(power, power);
        }
        powers
    }

    /// The CRC of A followed by B from the CRCs of A and B and B's length: A's CRC carried
    /// across B's bits (a multiplication by x^(8·len_b) modulo the polynomial, the product of
    /// `powers` for the bits set in `len_b`), added to B's. The inverted start and end cancel
    /// out, as zlib's `crc32_combine` uses.
    fn combine(&self, powers: &[u64; 64], crc_a: u64, crc_b: u64, len_b: u64) -> u64 {
        let mut shift = self.one();
        for (k, power) in powers.iter().enumerate() {
            if len_b >> k & 1 != 0 {
                shift = self.multiply(*power, shift);
            }
        }
        self.multiply(shift, crc_a) ^ crc_b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn checksum(algorithm: Algorithm, data: &[u8]) -> String {
        let mut hasher = algorithm.hasher();
        hasher.update(data);
        crate::checksums::value_of(hasher.finalize()).unwrap()
    }

    proptest! {
        /// The whole object's CRC made from its parts' equals the CRC of its bytes, for every
        /// CRC S3 combines, whatever the parts' sizes (empty ones too).
        #[test]
        fn a_full_object_crc_of_parts_is_the_crc_of_the_whole(
            parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..6)
        ) {
            let whole: Vec<u8> = parts.concat();
            for algorithm in [Algorithm::Crc32, Algorithm::Crc32c, Algorithm::Crc64nvme] {
                let values: Vec<String> = parts.iter().map(|p| checksum(algorithm, p)).collect();
                let listed: Vec<(&str, u64)> = values
                    .iter()
                    .zip(&parts)
                    .map(|(v, p)| (v.as_str(), p.len() as u64))
                    .collect();
                let made = UploadChecksum { algorithm, combine: Combine::FullObject };
                prop_assert_eq!(made.of_parts(&listed).unwrap().value, checksum(algorithm, &whole));
            }
        }
    }

    #[test]
    fn a_large_part_is_carried_across_by_squaring() {
        // 5 MiB + 3 bytes: the length's bits are walked, not its bytes.
        let a = vec![7u8; 5 << 20];
        let b = b"end".to_vec();
        let whole = [a.as_slice(), b.as_slice()].concat();
        let made = UploadChecksum {
            algorithm: Algorithm::Crc32c,
            combine: Combine::FullObject,
        };
        let (va, vb) = (
            checksum(Algorithm::Crc32c, &a),
            checksum(Algorithm::Crc32c, &b),
        );
        let listed = [(va.as_str(), a.len() as u64), (vb.as_str(), 3)];
        assert_eq!(
            made.of_parts(&listed).unwrap().value,
            checksum(Algorithm::Crc32c, &whole)
        );
    }

    #[test]
    fn a_composite_is_the_checksum_of_the_parts_checksums_and_their_count() {
        let parts = [b"hello".as_slice(), b"world".as_slice()];
        let values: Vec<String> = parts
            .iter()
            .map(|p| checksum(Algorithm::Sha256, p))
            .collect();
        let mut joined = Vec::new();
        for v in &values {
            joined.extend(base64::engine::general_purpose::STANDARD.decode(v).unwrap());
        }
        let made = UploadChecksum {
            algorithm: Algorithm::Sha256,
            combine: Combine::Composite,
        };
        let listed: Vec<(&str, u64)> = values.iter().map(|v| (v.as_str(), 5)).collect();
        assert_eq!(
            made.of_parts(&listed).unwrap().value,
            format!("{}-2", checksum(Algorithm::Sha256, &joined))
        );
    }

    #[test]
    fn what_an_upload_may_ask_for() {
        let asked = |a: Option<&str>, t: Option<&str>| UploadChecksum::requested(a, t);
        assert_eq!(asked(None, None).unwrap(), None);
        let crc32 = asked(Some("crc32"), None).unwrap().unwrap();
        assert_eq!(crc32.combine, Combine::Composite);
        let nvme = asked(Some("CRC64NVME"), None).unwrap().unwrap();
        assert_eq!(nvme.combine, Combine::FullObject);
        let full = asked(Some("CRC32C"), Some("FULL_OBJECT")).unwrap().unwrap();
        assert_eq!(
            (full.algorithm, full.combine),
            (Algorithm::Crc32c, Combine::FullObject)
        );
        for (a, t) in [
            (None, Some("COMPOSITE")),
            (Some("SHA256"), Some("FULL_OBJECT")),
            (Some("CRC64NVME"), Some("COMPOSITE")),
            (Some("MD4"), None),
            (Some("CRC32"), Some("PARTIAL")),
        ] {
            assert!(
                matches!(asked(a, t), Err(S3Error::InvalidRequest(_))),
                "{a:?} {t:?}"
            );
        }
    }
}
