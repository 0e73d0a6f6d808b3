//! The S3 layer's errors, and the one function that maps them to S3's codes and statuses.

use larder_router::{DocError, RouterError};
use s3s::{S3Error as Reply, S3ErrorCode as Code};

/// S3's code for a body whose SHA-256 is not the signed one.
pub const SHA256_MISMATCH: &str = "XAmzContentSHA256Mismatch";

#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    #[error("the specified bucket does not exist")]
    NoSuchBucket,
    #[error("the specified key does not exist")]
    NoSuchKey,
    #[error("you already own this bucket")]
    BucketExists,
    #[error("the bucket is not empty")]
    BucketNotEmpty,
    #[error("at least one of the preconditions you specified did not hold")]
    PreconditionFailed,
    #[error("the requested range is not satisfiable")]
    InvalidRange,
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    InvalidBucketName(String),
    #[error("your key is too long")]
    KeyTooLong,
    /// User metadata past S3's 2 KiB (`object_headers.rs`).
    #[error("{0}")]
    MetadataTooLarge(String),
    #[error("the specified multipart upload does not exist")]
    NoSuchUpload,
    #[error(
        "one or more of the specified parts could not be found, or its entity tag did not match"
    )]
    InvalidPart,
    #[error("the list of parts was not in ascending order")]
    InvalidPartOrder,
    #[error("{0}")]
    EntityTooSmall(String),
    #[error("{0}")]
    MalformedXml(String),
    #[error("{0}")]
    TooLarge(String),
    /// The client stopped sending the request body (`limits.body_read_timeout`).
    #[error("{0}")]
    RequestTimeout(String),
    /// Storage could not do it now (not enough replicas, the primary unreachable, a lost race
    /// on every attempt): retryable.
    #[error("{0}")]
    Unavailable(String),
    /// A stored record cannot be read: this is a bug or corruption, never the client's fault.
    #[error("stored record is unreadable: {0}")]
    Corrupt(String),
    /// An index record is at its hard bound (its split has not finished), or a bucket's list
    /// of uploads in progress is full.
    #[error("{0}")]
    IndexFull(String),
    #[error("{0}")]
    InvalidRequest(String),
    /// A conflicting operation on the same bucket won (a DeleteBucket against another).
    #[error("{0}")]
    OperationAborted(String),
    /// `Content-MD5` is not a base64 MD5.
    #[error("the Content-MD5 you specified is not valid")]
    InvalidDigest,
    /// The body's MD5 is not the `Content-MD5` sent.
    #[error("the Content-MD5 you specified did not match what was received")]
    BadDigest,
    /// The body's additional checksum (`x-amz-checksum-*`) is not the one sent.
    #[error("The {0} you specified did not match the calculated checksum.")]
    BadChecksum(String),
    /// The body's SHA-256 is not the signed `x-amz-content-sha256`.
    #[error("The provided 'x-amz-content-sha256' header does not match what was computed.")]
    Sha256Mismatch,
    /// A request form S3 defines that Larder does not take.
    #[error("{0}")]
    NotImplemented(String),
    #[error("{0}")]
    Internal(String),
}

impl S3Error {
    /// The same failure for another request that shared the operation that failed (a batch of
    /// index changes, `index_batch.rs`): the failures a read-modify-write can end with keep
    /// their kind; any other is storage being unable to do it now.
    pub(crate) fn shared(&self) -> S3Error {
        match self {
            S3Error::NoSuchBucket => S3Error::NoSuchBucket,
            S3Error::TooLarge(m) => S3Error::TooLarge(m.clone()),
            S3Error::InvalidArgument(m) => S3Error::InvalidArgument(m.clone()),
            S3Error::Corrupt(m) => S3Error::Corrupt(m.clone()),
            S3Error::Internal(m) => S3Error::Internal(m.clone()),
            other => S3Error::Unavailable(other.to_string()),
        }
    }
}

impl From<DocError> for S3Error {
    fn from(err: DocError) -> Self {
        match err {
            DocError::TooLarge(m) => S3Error::TooLarge(m),
            DocError::Rejected(m) => S3Error::InvalidArgument(m),
            DocError::NoNewerVersion(e) => S3Error::Internal(e.to_string()),
            other => S3Error::Unavailable(other.to_string()),
        }
    }
}

impl From<RouterError> for S3Error {
    fn from(err: RouterError) -> Self {
        match err {
            RouterError::Rejected(m) => S3Error::InvalidArgument(m),
            other => S3Error::Unavailable(other.to_string()),
        }
    }
}

/// S3's code and status for each error (the only place that decides them).
impl From<S3Error> for Reply {
    fn from(err: S3Error) -> Self {
        let message = err.to_string();
        let code = match &err {
            S3Error::NoSuchBucket => Code::NoSuchBucket,
            S3Error::NoSuchKey => Code::NoSuchKey,
            S3Error::BucketExists => Code::BucketAlreadyOwnedByYou,
            S3Error::BucketNotEmpty => Code::BucketNotEmpty,
            S3Error::PreconditionFailed => Code::PreconditionFailed,
            S3Error::InvalidRange => Code::InvalidRange,
            S3Error::InvalidArgument(_) => Code::InvalidArgument,
            S3Error::InvalidBucketName(_) => Code::InvalidBucketName,
            S3Error::KeyTooLong => Code::KeyTooLongError,
            S3Error::MetadataTooLarge(_) => Code::MetadataTooLarge,
            S3Error::NoSuchUpload => Code::NoSuchUpload,
            S3Error::InvalidPart => Code::InvalidPart,
            S3Error::InvalidPartOrder => Code::InvalidPartOrder,
            S3Error::EntityTooSmall(_) => Code::EntityTooSmall,
            S3Error::MalformedXml(_) => Code::MalformedXML,
            S3Error::TooLarge(_) => Code::EntityTooLarge,
            S3Error::RequestTimeout(_) => Code::RequestTimeout,
            S3Error::Unavailable(_) | S3Error::IndexFull(_) => Code::ServiceUnavailable,
            S3Error::NotImplemented(_) => Code::NotImplemented,
            S3Error::InvalidRequest(_) => Code::InvalidRequest,
            S3Error::OperationAborted(_) => Code::OperationAborted,
            S3Error::InvalidDigest => Code::InvalidDigest,
            S3Error::BadDigest | S3Error::BadChecksum(_) => Code::BadDigest,
            S3Error::Corrupt(_) | S3Error::Internal(_) => Code::InternalError,
            // s3s has no such code: a custom one, with S3's status.
            S3Error::Sha256Mismatch => {
                let mut reply = Reply::with_message(Code::Custom(SHA256_MISMATCH.into()), message);
                reply.set_status_code(http::StatusCode::BAD_REQUEST);
                return reply;
            }
        };
        if matches!(err, S3Error::Corrupt(_) | S3Error::Internal(_)) {
            tracing::error!(%message, "S3 request failed");
        }
        Reply::with_message(code, message)
    }
}
