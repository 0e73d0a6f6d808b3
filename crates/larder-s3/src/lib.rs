//! Larder's S3-compatible API: buckets and named objects on the frontend's own S3 port.
//!
//! s3s (an S3 service adapter on hyper 1) does the protocol: routing, XML, SigV4 (header,
//! presigned and streaming), S3's error bodies. This crate is the storage side: names and
//! buckets as records in Larder's replicated, versioned document storage (`records`, `store`),
//! object bodies as Larder blobs (`blobs`), access keys stored in the cluster (`auth`, `keys`).
//! See README.md for the choices and the layout.

mod acl;
mod answers;
mod attributes;
mod auth;
mod blobs;
mod body_cache;
mod checksums;
mod conditions;
mod config;
mod copy_source;
mod error;
mod etag_lanes;
#[doc(hidden)]
pub mod fuzzing;
mod held;
mod index_batch;
mod index_tree;
mod keep;
mod keys;
mod leaf_base;
mod list;
mod metrics;
mod multipart;
mod object_headers;
mod objects;
mod pager;
mod presign;
mod record_cache;
mod records;
mod server;
mod service;
mod sig_checks;
mod signed_urls;
mod stall;
mod store;
mod tagging;
mod upload_checksum;
mod upload_list;
mod use_order;
mod xml_bound;

pub use blobs::BlobLimits;
pub use config::{records_router, S3Config};
pub use error::S3Error;
pub use keys::{KeyAdmin, NewKey};
pub use presign::{presign, presign_with_query, Presign, MAX_EXPIRY};
pub use records::Permission;
pub use server::{S3Api, S3Body};
pub use signed_urls::{PresignedQuery, SignatureError, SignedUrls};
