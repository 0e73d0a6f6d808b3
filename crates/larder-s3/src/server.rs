//! The S3 API as a request handler the frontend's edge serves on the S3 port(s): the edge owns
//! the connection (TLS, per-address limit, header-read and idle timeouts, HTTP/2 limits, the
//! same as the main port's), this owns each request: the body's stall clock, s3s, metrics.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use s3s::config::{S3Config as S3sConfig, StaticConfigProvider};
use s3s::service::{S3Service, S3ServiceBuilder};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::auth::{Gate, Keys};
use crate::blobs::BlobLimits;
use crate::index_batch::IndexBatches;
use crate::index_tree::IndexTree;
use crate::metrics::{OperationSlot, S3Metrics};
use crate::service::Larder;
use crate::stall::{StallClock, Stalled};
use crate::store::Records;
use crate::xml_bound::{DeclaredLength, Mismatch, PayloadHash, XML_MAX_BODY};
use crate::S3Config;
use larder_router::{Leftover, Router};

/// A response body, boxed as the frontend's are.
pub type S3Body = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Larder's S3 API over one router.
pub struct S3Api {
    service: S3Service,
    metrics: S3Metrics,
    limits: BlobLimits,
    /// `[s3] signature_v2`.
    signature_v2: bool,
}

impl S3Api {
    /// The API over `router`, its metrics registered in `registry`, and its sweeper of
    /// replaced blobs running until `stop` changes or closes. `held`: the upload journal's
    /// entries a previous run left held for names, settled in the background (`held.rs`).
    /// Fails when `[s3] home_datacenter` is not in the cluster map.
    pub fn start(
        router: Arc<Router>,
        limits: BlobLimits,
        config: &S3Config,
        registry: &mut Registry,
        (stop, held): (watch::Receiver<()>, Vec<Leftover>),
    ) -> Result<S3Api, String> {
        let records_router = config.records_router(&router)?;
        let bases = crate::leaf_base::BasePolicy {
            delta_bytes: config.index_delta_bytes,
            grace: crate::leaf_base::base_grace(config.replaced_blob_grace, &router),
            max_blob: (limits.chunking.chunk_size.as_u64() as usize)
                .min(crate::records::MAX_RECORD_BYTES),
        };
        let records = Records::new(router, records_router)
            .with_index_cache(config.index_cache_bytes)
            .with_leaf_bases(bases);
        registry.sub_registry_with_prefix("s3").register(
            "index_cache_reads",
            "Reads of bucket index records by outcome: unchanged (the copy this frontend kept by \
             version answered), changed (the quorum held another version), unkept (none kept)",
            records.index_cache_reads(),
        );
        registry.sub_registry_with_prefix("s3").register(
            "index_leaf_folds",
            "Index leaves whose names were stored as a new base blob (`[s3] index_delta_bytes`)",
            records.leaf_folds(),
        );
        let bodies = crate::body_cache::BodyCache::new(
            config.body_cache_bytes,
            config.body_cache_max_object,
        );
        registry.sub_registry_with_prefix("s3").register(
            "body_cache_reads",
            "Reads of small object bodies by outcome: hit (kept by this frontend by blob ID), \
             miss (read from storage, then kept)",
            bodies.reads(),
        );
        let records = Arc::new(records);
        let tree = Arc::new(IndexTree::new(
            (config.index_leaf_entries, config.index_merge_entries),
            config.max_held_garbage,
            config.merged_leaf_grace,
        ));
        registry.sub_registry_with_prefix("s3").register(
            "index_leaves_merged",
            "Index leaves (empty, or of few names) this frontend merged into the leaf on their left",
            tree.merges(),
        );
        registry.sub_registry_with_prefix("s3").register(
            "index_stubs_removed",
            "Records of merged index leaves this frontend removed once [s3] merged_leaf_grace \
             was over",
            tree.stubs_removed(),
        );
        tokio::spawn(sweep_until(
            records.clone(),
            tree.clone(),
            config.sweep_interval,
            stop,
        ));
        let larder = Larder {
            records: records.clone(),
            keys: Arc::new(Keys::new(records)),
            limits: limits.clone(),
            grace: config.replaced_blob_grace,
            index_batches: Arc::new(IndexBatches::new(tree.clone(), config.max_held_garbage)),
            tree,
            bodies: Arc::new(bodies),
        };
        crate::held::settle_leftovers(larder.clone(), held);
        Ok(S3Api {
            service: service(larder),
            metrics: S3Metrics::register(registry),
            limits,
            signature_v2: config.signature_v2,
        })
    }

    /// What is checked of a signed request before s3s verifies it (`sig_checks.rs`).
    fn check_signed<B>(&self, req: &http::Request<B>) -> Result<(), crate::sig_checks::Refusal> {
        use crate::sig_checks::{check_time, is_signature_v2, Refusal};
        if !self.signature_v2 && is_signature_v2(req.headers(), req.uri()) {
            return Err(Refusal::SignatureV2);
        }
        check_time(req.headers(), SystemTime::now())
    }

    /// Answers one request. A body from which nothing arrives for `body_read_timeout` fails
    /// (`RequestTimeout`); s3s's own failures become 500s, never a dropped connection.
    pub async fn handle(&self, req: http::Request<Incoming>) -> http::Response<S3Body> {
        let started = Instant::now();
        let slot = OperationSlot::default();
        let request_id = crate::answers::request_id();
        let expiry = req
            .uri()
            .query()
            .and_then(crate::presign::expiry_out_of_bounds);
        let refusal = match expiry {
            Some(message) => Some(query_error(message)),
            None if req.method() == http::Method::OPTIONS => Some(preflight_refusal(&req)),
            None if is_form_upload(&req) => Some(form_upload_refusal()),
            None => self.check_signed(&req).err().map(|refusal| {
                let (code, message) = refusal.code_and_message();
                error_answer(refusal.status(), code, message)
            }),
        };
        if let Some(response) = refusal {
            let response = crate::answers::mend(response, false, request_id).await;
            self.metrics
                .observe(slot.get(), response.status(), started.elapsed());
            return response;
        }
        let mut req = req;
        if let Some(uri) = crate::sig_checks::v2_bucket_uri(req.headers(), req.uri()) {
            *req.uri_mut() = uri;
        }
        let head = req.method() == http::Method::HEAD;
        let timeout = self.limits.body_read_timeout;
        let stalled = Stalled::default();
        let declared = http_body::Body::size_hint(req.body()).exact();
        let mismatch = Mismatch::default();
        let hash = PayloadHash::of_request(&req, slot.clone(), mismatch.clone());
        let mut req = req.map(|body| {
            let body = StallClock::new(body, timeout, stalled.clone());
            s3s::Body::http_body(hash.over(body).with_declared(declared))
        });
        req.extensions_mut().insert(DeclaredLength(declared));
        req.extensions_mut().insert(slot.clone());
        req.extensions_mut().insert(stalled.clone());
        let mut response = match self.service.call(req).await {
            Ok(response) => response.map(|body| body.boxed()),
            Err(err) => {
                tracing::error!(?err, "s3s could not answer");
                let mut response = http::Response::new(s3s::Body::empty().boxed());
                *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                response
            }
        };
        if response.status() == http::StatusCode::INTERNAL_SERVER_ERROR {
            response = client_fault(&stalled, &mismatch).unwrap_or(response);
        }
        // s3s writes HeadObject's status itself, always 200; S3 answers a HEAD of a range or
        // a part (the answer's Content-Range says which) with 206, as GET does.
        let partial = response.headers().contains_key(http::header::CONTENT_RANGE);
        if head && partial && response.status() == http::StatusCode::OK {
            *response.status_mut() = http::StatusCode::PARTIAL_CONTENT;
        }
        let attributes = slot.get() == "GetObjectAttributes";
        let response = crate::answers::mend(response, attributes, request_id).await;
        self.metrics
            .observe(slot.get(), response.status(), started.elapsed());
        response
    }
}

/// The answer to a request s3s answered 500 because its body failed, when the client's fault
/// failed it: s3s reads the bodies of most PUTs and POSTs whole and answers any failure of
/// theirs with 500 `InternalError` (`xml_bound.rs`). A streamed body's failures are answered
/// by Larder's own handlers.
fn client_fault(stalled: &Stalled, mismatch: &Mismatch) -> Option<http::Response<S3Body>> {
    if stalled.happened() {
        return Some(error_answer(
            http::StatusCode::BAD_REQUEST,
            "RequestTimeout",
            "Your socket connection to the server was not read from or written to within the timeout period.",
        ));
    }
    mismatch.happened().then(|| {
        error_answer(
            http::StatusCode::BAD_REQUEST,
            crate::error::SHA256_MISMATCH,
            &crate::error::S3Error::Sha256Mismatch.to_string(),
        )
    })
}

/// S3's 403 `AuthorizationQueryParametersError` (a presigned request's query out of SigV4's
/// bounds), as S3's XML error.
fn query_error(message: &str) -> http::Response<S3Body> {
    error_answer(
        http::StatusCode::FORBIDDEN,
        "AuthorizationQueryParametersError",
        message,
    )
}

/// The answer to an `OPTIONS` (a browser's CORS preflight): Larder serves no CORS rules, so
/// S3's answers for a bucket without them: 400 without an `Origin`, else 403.
fn preflight_refusal<B>(req: &http::Request<B>) -> http::Response<S3Body> {
    match req.headers().contains_key(http::header::ORIGIN) {
        false => error_answer(
            http::StatusCode::BAD_REQUEST,
            "BadRequest",
            "Insufficient information. Origin request header needed.",
        ),
        true => error_answer(
            http::StatusCode::FORBIDDEN,
            "AccessForbidden",
            "CORSResponse: CORS is not enabled for this bucket.",
        ),
    }
}

/// A browser's HTML-form upload (POST Object: `POST` with a `multipart/form-data` body). s3s
/// would read its whole file into memory before it checks a signature (up to its
/// `post_object_max_file_size`, 5 GB by default), so an anonymous client could make the
/// frontend hold any amount; Larder does not take them (a presigned PUT URL does the same
/// job, streamed). s3s's own rule, over every `Content-Type` sent (s3s reads a unique one):
/// a media type that parses as `multipart/form-data`. Other `multipart/*` types are an
/// object's own type on CreateMultipartUpload, and pass.
fn is_form_upload<B>(req: &http::Request<B>) -> bool {
    req.method() == http::Method::POST
        && req
            .headers()
            .get_all(http::header::CONTENT_TYPE)
            .iter()
            .filter_map(|value| value.to_str().ok()?.parse::<mime::Mime>().ok())
            .any(|m| m.type_() == mime::MULTIPART && m.subtype() == mime::FORM_DATA)
}

/// 501 `NotImplemented` for an HTML-form upload, answered before its body is read.
fn form_upload_refusal() -> http::Response<S3Body> {
    error_answer(
        http::StatusCode::NOT_IMPLEMENTED,
        "NotImplemented",
        "POST uploads from HTML forms are not supported; use PutObject or a presigned PUT URL",
    )
}

/// An S3 XML error (`message` is a fixed text, not escaped).
fn error_answer(status: http::StatusCode, code: &str, message: &str) -> http::Response<S3Body> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    );
    let mut response = http::Response::new(s3s::Body::from(body).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/xml"),
    );
    response
}

async fn sweep_until(
    records: Arc<Records>,
    tree: Arc<IndexTree>,
    interval: std::time::Duration,
    mut stop: watch::Receiver<()>,
) {
    tokio::select! {
        _ = crate::objects::sweep_forever(records, tree, interval) => {}
        _ = stop.changed() => {}
    }
}

/// The s3s service over Larder.
fn service(larder: Larder) -> S3Service {
    let mut builder = S3ServiceBuilder::new(larder.clone());
    builder.set_auth(Gate(larder.clone()));
    builder.set_access(Gate(larder));
    builder.set_config(Arc::new(StaticConfigProvider::new(Arc::new(bounds()))));
    builder.build()
}

/// What s3s may hold of one request in memory. Its defaults are larger than any request
/// Larder takes needs: XML bodies of 20 MB (Larder's bound is `XML_MAX_BODY`, checked first
/// by the access check, `xml_bound.rs`) and HTML-form uploads of 5 GB, which `handle` refuses
/// before s3s sees them (bounded here all the same, should one get through).
fn bounds() -> S3sConfig {
    let mut bounds = S3sConfig::default();
    bounds.xml_max_body_size = XML_MAX_BODY;
    bounds.post_object_max_file_size = 0;
    bounds.form_max_field_size = 64 << 10;
    bounds.form_max_fields_size = 256 << 10;
    bounds.form_max_parts = 64;
    bounds
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, types: &[&str]) -> http::Request<()> {
        let mut builder = http::Request::builder().method(method).uri("/bucket");
        for value in types {
            builder = builder.header(http::header::CONTENT_TYPE, *value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn only_posts_of_a_multipart_body_are_form_uploads() {
        for types in [
            &["multipart/form-data; boundary=x"][..],
            &["MULTIPART/Form-Data;boundary=x"],
            &["application/xml", "multipart/form-data"],
        ] {
            assert!(is_form_upload(&request("POST", types)), "{types:?}");
        }
        for (method, types) in [
            ("PUT", &["multipart/form-data"][..]),
            ("POST", &["application/xml"]),
            ("POST", &[]),
            ("POST", &["multipart"]),
            // CreateMultipartUpload of an object whose own type is multipart.
            ("POST", &["multipart/mixed; boundary=x"]),
            ("POST", &["multipart/related"]),
        ] {
            assert!(
                !is_form_upload(&request(method, types)),
                "{method} {types:?}"
            );
        }
    }
}
