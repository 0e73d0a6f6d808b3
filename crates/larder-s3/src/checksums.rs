//! S3's additional checksums (`x-amz-checksum-*`): CRC32, CRC32C, CRC64NVME, SHA-1, SHA-256.
//!
//! A PutObject or UploadPart names at most one algorithm: a header with the value
//! (`x-amz-checksum-crc32: <base64>`), the same name in `x-amz-trailer` (the value comes after
//! an aws-chunked body), or only the algorithm (`x-amz-sdk-checksum-algorithm`: the server
//! computes it). The body is hashed as it streams; a value that does not match is `BadDigest`
//! and nothing is kept. An object's checksum is stored in its entry and returned by PutObject,
//! and by GetObject/HeadObject when asked (`x-amz-checksum-mode: ENABLED`) for the whole object.

use base64::Engine as _;
use http::HeaderMap;
use s3s::checksum::ChecksumHasher;
use s3s::crypto::{Checksum as _, Crc32, Crc32c, Crc64Nvme, Sha1, Sha256};
use s3s::TrailingHeaders;
use serde::{Deserialize, Serialize};

use crate::error::S3Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    Crc32,
    Crc32c,
    Crc64nvme,
    Sha1,
    Sha256,
}

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::Crc32,
    Algorithm::Crc32c,
    Algorithm::Crc64nvme,
    Algorithm::Sha1,
    Algorithm::Sha256,
];

impl Algorithm {
    /// The header that carries its value.
    pub fn header(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "x-amz-checksum-crc32",
            Algorithm::Crc32c => "x-amz-checksum-crc32c",
            Algorithm::Crc64nvme => "x-amz-checksum-crc64nvme",
            Algorithm::Sha1 => "x-amz-checksum-sha1",
            Algorithm::Sha256 => "x-amz-checksum-sha256",
        }
    }

    /// Its name in `x-amz-sdk-checksum-algorithm` (any case).
    pub fn name(self) -> &'static str {
        &self.header()["x-amz-checksum-".len()..]
    }

    /// As s3s's `ChecksumAlgorithm` (upper case, as S3 names it).
    pub fn dto(self) -> s3s::dto::ChecksumAlgorithm {
        s3s::dto::ChecksumAlgorithm::from(self.name().to_ascii_uppercase())
    }

    /// Its code in a parts record that keeps each part's checksum (`PartChecksums`): never 0,
    /// and never changed once written.
    pub fn code(self) -> u8 {
        match self {
            Algorithm::Crc32 => 1,
            Algorithm::Crc32c => 2,
            Algorithm::Crc64nvme => 3,
            Algorithm::Sha1 => 4,
            Algorithm::Sha256 => 5,
        }
    }

    pub fn from_code(code: u8) -> Option<Algorithm> {
        ALGORITHMS.into_iter().find(|a| a.code() == code)
    }

    /// The algorithm of that name (any case).
    pub fn named(name: &str) -> Option<Algorithm> {
        let name = name.trim().to_ascii_lowercase();
        ALGORITHMS.into_iter().find(|a| a.name() == name)
    }

    /// Bytes of a digest.
    fn len(self) -> usize {
        match self {
            Algorithm::Crc32 | Algorithm::Crc32c => 4,
            Algorithm::Crc64nvme => 8,
            Algorithm::Sha1 => 20,
            Algorithm::Sha256 => 32,
        }
    }

    pub fn hasher(self) -> ChecksumHasher {
        let mut hasher = ChecksumHasher::default();
        match self {
            Algorithm::Crc32 => hasher.crc32 = Some(Crc32::new()),
            Algorithm::Crc32c => hasher.crc32c = Some(Crc32c::new()),
            Algorithm::Crc64nvme => hasher.crc64nvme = Some(Crc64Nvme::new()),
            Algorithm::Sha1 => hasher.sha1 = Some(Sha1::new()),
            Algorithm::Sha256 => hasher.sha256 = Some(Sha256::new()),
        }
        hasher
    }
}

/// An object's (or part's) checksum: its algorithm and base64 value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectChecksum {
    pub algorithm: Algorithm,
    pub value: String,
}

impl ObjectChecksum {
    /// Part `number`'s checksum as its object's parts record keeps it (version 3).
    pub fn of_part(parts: &larder_router::PartsManifest, number: usize) -> Option<ObjectChecksum> {
        let (code, digest) = parts.part_checksum(number)?;
        let algorithm = Algorithm::from_code(code)?;
        let value = base64::engine::general_purpose::STANDARD.encode(digest);
        Some(ObjectChecksum { algorithm, value })
    }

    /// How it covers the object: a multipart upload's COMPOSITE checksum ends in `-<parts>`
    /// (`upload_checksum.rs`; base64 has no `-`), any other is of the whole object's bytes.
    pub fn checksum_type(&self) -> s3s::dto::ChecksumType {
        let composite = self.value.contains('-');
        s3s::dto::ChecksumType::from_static(if composite {
            s3s::dto::ChecksumType::COMPOSITE
        } else {
            s3s::dto::ChecksumType::FULL_OBJECT
        })
    }

    /// The value of `algorithm` that a part listed in CompleteMultipartUpload carries.
    pub fn listed_value(dto: &s3s::dto::CompletedPart, algorithm: Algorithm) -> Option<&str> {
        match algorithm {
            Algorithm::Crc32 => dto.checksum_crc32.as_deref(),
            Algorithm::Crc32c => dto.checksum_crc32c.as_deref(),
            Algorithm::Crc64nvme => dto.checksum_crc64nvme.as_deref(),
            Algorithm::Sha1 => dto.checksum_sha1.as_deref(),
            Algorithm::Sha256 => dto.checksum_sha256.as_deref(),
        }
    }

    /// The whole object's checksum a CompleteMultipartUpload sent (`x-amz-checksum-*`).
    pub fn sent_whole(input: &s3s::dto::CompleteMultipartUploadInput) -> Option<ObjectChecksum> {
        let sent = [
            (Algorithm::Crc32, &input.checksum_crc32),
            (Algorithm::Crc32c, &input.checksum_crc32c),
            (Algorithm::Crc64nvme, &input.checksum_crc64nvme),
            (Algorithm::Sha1, &input.checksum_sha1),
            (Algorithm::Sha256, &input.checksum_sha256),
        ];
        sent.into_iter().find_map(|(algorithm, value)| {
            let value = value.as_ref()?.trim().to_owned();
            Some(ObjectChecksum { algorithm, value })
        })
    }

    /// As s3s's output fields (one of them set).
    pub fn to_dto(&self) -> s3s::dto::Checksum {
        let mut dto = s3s::dto::Checksum {
            checksum_type: Some(self.checksum_type()),
            ..Default::default()
        };
        let value = Some(self.value.clone());
        match self.algorithm {
            Algorithm::Crc32 => dto.checksum_crc32 = value,
            Algorithm::Crc32c => dto.checksum_crc32c = value,
            Algorithm::Crc64nvme => dto.checksum_crc64nvme = value,
            Algorithm::Sha1 => dto.checksum_sha1 = value,
            Algorithm::Sha256 => dto.checksum_sha256 = value,
        }
        dto
    }
}

/// Where the client's value of the checksum is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Sent {
    /// In a header, already checked to be a digest of the right length.
    Header(String),
    /// In the aws-chunked body's trailer, once the body is read.
    Trailer,
    /// Nowhere: the server computes it.
    Nothing,
}

/// The checksum a request asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requested {
    algorithm: Algorithm,
    sent: Sent,
}

impl Requested {
    /// What `headers` ask for: `None` when they name no checksum. More than one algorithm, or
    /// a value that is no base64 digest of the algorithm's length, is refused.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Requested>, S3Error> {
        let mut found = None;
        for algorithm in ALGORITHMS {
            let Some(value) = headers.get(algorithm.header()) else {
                continue;
            };
            if found.is_some() {
                return Err(S3Error::InvalidRequest(
                    "Expecting a single x-amz-checksum- header. Multiple checksum Types are not \
                     allowed."
                        .into(),
                ));
            }
            let value = value
                .to_str()
                .ok()
                .filter(|v| decodes_to(v, algorithm.len()));
            let value = value.ok_or_else(|| {
                S3Error::InvalidRequest(format!(
                    "Value for {} header is invalid.",
                    algorithm.header()
                ))
            })?;
            found = Some(Requested {
                algorithm,
                sent: Sent::Header(value.to_owned()),
            });
        }
        if found.is_some() {
            return Ok(found);
        }
        let named = |header: &str| {
            let value = headers
                .get(header)?
                .to_str()
                .ok()?
                .trim()
                .to_ascii_lowercase();
            Some(value)
        };
        if let Some(trailer) = named("x-amz-trailer") {
            if let Some(algorithm) = ALGORITHMS.into_iter().find(|a| a.header() == trailer) {
                return Ok(Some(Requested {
                    algorithm,
                    sent: Sent::Trailer,
                }));
            }
        }
        match named("x-amz-sdk-checksum-algorithm") {
            None => Ok(None),
            Some(name) => match ALGORITHMS.into_iter().find(|a| a.name() == name) {
                Some(algorithm) => Ok(Some(Requested {
                    algorithm,
                    sent: Sent::Nothing,
                })),
                None => Err(S3Error::InvalidRequest(format!(
                    "Checksum algorithm {name} is not supported"
                ))),
            },
        }
    }

    /// The checksum an UploadPart computes: the upload's algorithm (computed here when the
    /// request sends no value). A part of an upload without one keeps what it asked for; a
    /// part naming another algorithm than its upload's is refused.
    pub fn for_part(
        requested: Option<Requested>,
        upload: Option<crate::upload_checksum::UploadChecksum>,
    ) -> Result<Option<Requested>, S3Error> {
        let Some(wanted) = upload else {
            return Ok(requested);
        };
        match requested {
            None => Ok(Some(Requested {
                algorithm: wanted.algorithm,
                sent: Sent::Nothing,
            })),
            Some(r) if r.algorithm == wanted.algorithm => Ok(Some(r)),
            Some(r) => Err(S3Error::InvalidRequest(format!(
                "Checksum Type mismatch occurred, expected checksum Type: {}, actual checksum \
                 Type: {}",
                wanted.algorithm.name(),
                r.algorithm.name()
            ))),
        }
    }

    /// A hasher of the body for this checksum.
    pub fn hasher(&self) -> ChecksumHasher {
        self.algorithm.hasher()
    }

    /// The checksum of the body `computed` holds, if it is the one the client sent (or the
    /// client sent none); `BadDigest` if not.
    pub fn verify(
        &self,
        computed: ChecksumHasher,
        trailers: Option<&TrailingHeaders>,
    ) -> Result<ObjectChecksum, S3Error> {
        let value = value_of(computed.finalize())?;
        let sent = match &self.sent {
            Sent::Header(value) => Some(value.clone()),
            Sent::Trailer => Some(self.trailer_value(trailers)?),
            Sent::Nothing => None,
        };
        if sent.is_some_and(|sent| sent != value) {
            return Err(S3Error::BadChecksum(
                self.algorithm.name().to_ascii_uppercase(),
            ));
        }
        Ok(ObjectChecksum {
            algorithm: self.algorithm,
            value,
        })
    }

    /// The value in the body's trailer, which the client promised (`x-amz-trailer`).
    fn trailer_value(&self, trailers: Option<&TrailingHeaders>) -> Result<String, S3Error> {
        let header = self.algorithm.header();
        let value = trailers
            .and_then(|t| {
                t.read(|map| {
                    map.get(header)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                })
            })
            .flatten();
        value
            .filter(|v| decodes_to(v, self.algorithm.len()))
            .ok_or_else(|| {
                S3Error::InvalidRequest(format!("Value for {header} trailer is invalid."))
            })
    }
}

/// The one value a hasher of one algorithm computed.
pub fn value_of(dto: s3s::dto::Checksum) -> Result<String, S3Error> {
    [
        dto.checksum_crc32,
        dto.checksum_crc32c,
        dto.checksum_crc64nvme,
        dto.checksum_sha1,
        dto.checksum_sha256,
    ]
    .into_iter()
    .flatten()
    .next()
    .ok_or_else(|| S3Error::Internal("no checksum was computed".into()))
}

/// Whether `value` is standard base64 of exactly `len` bytes.
fn decodes_to(value: &str, len: usize) -> bool {
    base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .is_ok_and(|d| d.len() == len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    fn checksum_of(algorithm: Algorithm, data: &[u8]) -> String {
        let mut hasher = algorithm.hasher();
        hasher.update(data);
        let requested = Requested {
            algorithm,
            sent: Sent::Nothing,
        };
        requested.verify(hasher, None).unwrap().value
    }

    #[test]
    fn known_values_of_each_algorithm() {
        // CRC32 and CRC32C of "hello" (zlib.crc32 and the Castagnoli polynomial), big-endian.
        assert_eq!(checksum_of(Algorithm::Crc32, b"hello"), "NhCmhg==");
        assert_eq!(checksum_of(Algorithm::Crc32c, b"hello"), "mnG7TA==");
        assert_eq!(
            checksum_of(Algorithm::Sha256, b"hello"),
            "LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ="
        );
        assert_eq!(
            checksum_of(Algorithm::Sha1, b"hello"),
            "qvTGHdzF6KLavt4PO0gs2a6pQ00="
        );
        assert_eq!(checksum_of(Algorithm::Crc64nvme, b"").len(), 12);
    }

    #[test]
    fn a_header_value_is_checked_against_the_body() {
        let sent = headers(&[("x-amz-checksum-crc32", "NhCmhg==")]);
        let requested = Requested::from_headers(&sent).unwrap().unwrap();
        let mut hasher = requested.hasher();
        hasher.update(b"hello");
        let checksum = requested.verify(hasher, None).unwrap();
        assert_eq!(checksum.algorithm, Algorithm::Crc32);
        let mut hasher = requested.hasher();
        hasher.update(b"hellp");
        assert!(matches!(
            requested.verify(hasher, None),
            Err(S3Error::BadChecksum(name)) if name == "CRC32"
        ));
    }

    #[test]
    fn malformed_or_several_checksums_are_refused() {
        for bad in [
            "nope",
            "NhCmhgAA",
            "",
            "LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=",
        ] {
            let sent = headers(&[("x-amz-checksum-crc32", bad)]);
            assert!(
                matches!(
                    Requested::from_headers(&sent),
                    Err(S3Error::InvalidRequest(_))
                ),
                "{bad}"
            );
        }
        let two = headers(&[
            ("x-amz-checksum-crc32", "NhCmhg=="),
            ("x-amz-checksum-crc32c", "mnG7TA=="),
        ]);
        assert!(Requested::from_headers(&two).is_err());
        let unknown = headers(&[("x-amz-sdk-checksum-algorithm", "MD4")]);
        assert!(Requested::from_headers(&unknown).is_err());
    }

    #[test]
    fn an_algorithm_alone_or_in_the_trailer_is_understood() {
        let named = headers(&[("x-amz-sdk-checksum-algorithm", "SHA256")]);
        let requested = Requested::from_headers(&named).unwrap().unwrap();
        assert_eq!(requested.algorithm, Algorithm::Sha256);
        assert_eq!(requested.sent, Sent::Nothing);
        let trailer = headers(&[
            ("x-amz-sdk-checksum-algorithm", "CRC32"),
            ("x-amz-trailer", "x-amz-checksum-crc32c"),
        ]);
        let requested = Requested::from_headers(&trailer).unwrap().unwrap();
        assert_eq!(requested.algorithm, Algorithm::Crc32c);
        assert_eq!(requested.sent, Sent::Trailer);
        // A promised trailer that never came is refused, not taken as "nothing sent".
        let hasher = requested.hasher();
        assert!(requested.verify(hasher, None).is_err());
        assert_eq!(Requested::from_headers(&HeaderMap::new()).unwrap(), None);
    }
}
