//! Named objects through the frontends' S3 ports: an access key made with `larder s3 key
//! create`, one bucket per datacenter, and PutObject, GetObject, DeleteObject and
//! ListObjectsV2 signed as presigned URLs (SigV4 in the query, `larder-s3`'s own signer, the
//! one `larder s3 presign` uses). Each worker owns its keys, so one key's writes are sequential;
//! they go through either datacenter, whose frontends both decide S3 changes in one home
//! datacenter (`crates/larder-s3/README.md`, "One datacenter decides").

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::Method;

use crate::client::{Answer, Connection, NoAnswer};

/// Keys each worker owns (in each worker's bucket).
pub const KEYS_PER_WORKER: u64 = 4;
/// The largest object the workload writes: most are small, a few are chunked (over 4 MiB).
pub const MAX_OBJECT: u64 = 6 << 20;

/// The access key every request is signed with.
#[derive(Clone)]
pub struct S3Key {
    pub access_key_id: String,
    pub secret: String,
}

pub fn bucket_of(datacenter: &str) -> String {
    format!("torture-{datacenter}")
}

pub fn object_key(worker: usize, k: u64) -> String {
    format!("w{worker}/k{k}")
}

/// The path and query of a presigned request to `s3` (the URL less its endpoint). Signed an
/// hour in the past and valid for three: a frontend whose clock the nemesis moved by up to 30
/// minutes either way still accepts it.
pub fn presigned(
    s3: SocketAddr,
    key: &S3Key,
    method: &Method,
    bucket: &str,
    object: &str,
    query: &[(&str, &str)],
) -> String {
    let endpoint = format!("http://{s3}");
    let request = larder_s3::Presign {
        method: method.as_str(),
        endpoint: &endpoint,
        bucket,
        key: object,
        access_key_id: &key.access_key_id,
        secret: &key.secret,
        region: "us-east-1",
        expires: Duration::from_secs(3 * 3600),
        now: SystemTime::now() - Duration::from_secs(3600),
    };
    let url = larder_s3::presign_with_query(&request, query).expect("valid endpoint and expiry");
    url[endpoint.len()..].to_owned()
}

/// Sends one presigned request to the S3 port `s3`.
pub async fn send(
    conn: &mut Connection,
    s3: SocketAddr,
    key: &S3Key,
    method: Method,
    (bucket, object): (&str, &str),
    query: &[(&str, &str)],
    body: Bytes,
) -> Result<Answer, NoAnswer> {
    let path = presigned(s3, key, &method, bucket, object, query);
    conn.send(method, &path, &[], body).await
}

/// Creates a key with every permission (through `frontend_config`'s datacenter), then one
/// bucket per datacenter through that datacenter's S3 port, retrying while the new key
/// replicates to the other datacenter.
pub async fn prepare(
    larder: &Path,
    frontend_config: &Path,
    s3_ports: &[(String, SocketAddr)],
) -> anyhow::Result<S3Key> {
    let key = create_key(larder, frontend_config)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    for (dc, s3) in s3_ports {
        let bucket = bucket_of(dc);
        let mut conn = Connection::public(*s3, Duration::from_secs(10));
        loop {
            let answer = send(
                &mut conn,
                *s3,
                &key,
                Method::PUT,
                (&bucket, ""),
                &[],
                Bytes::new(),
            )
            .await;
            let why = match answer {
                Ok(a) if a.status == 200 => break,
                Ok(a) if String::from_utf8_lossy(&a.body).contains("BucketAlreadyOwnedByYou") => {
                    break
                }
                Ok(a) => format!("{}: {}", a.status, String::from_utf8_lossy(&a.body)),
                Err(e) => e.why,
            };
            anyhow::ensure!(
                Instant::now() < deadline,
                "creating bucket {bucket} in {dc}: {why}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(key)
}

fn create_key(larder: &Path, frontend_config: &Path) -> anyhow::Result<S3Key> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let output = Command::new(larder)
            .args(["s3", "key", "create", "--grant", "*:owner", "--config"])
            .arg(frontend_config)
            .output()?;
        if output.status.success() {
            let created: serde_json::Value = serde_json::from_slice(&output.stdout)?;
            let field = |name: &str| {
                created[name]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| anyhow::anyhow!("no {name} in {created}"))
            };
            return Ok(S3Key {
                access_key_id: field("access_key_id")?,
                secret: field("secret_access_key")?,
            });
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "larder s3 key create: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The keys a ListObjectsV2 answer names (`<Key>…</Key>`, XML-escaped as S3 writes them; the
/// workload's keys have no character that needs escaping). Linear in the body.
pub fn listed_keys(body: &[u8]) -> Option<Vec<String>> {
    let text = std::str::from_utf8(body).ok()?;
    if !text.contains("<ListBucketResult") {
        return None;
    }
    let mut keys = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("<Key>") {
        let after = &rest[start + 5..];
        let end = after.find("</Key>")?;
        keys.push(after[..end].to_owned());
        rest = &after[end + 6..];
    }
    Some(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_read_for_its_keys_and_anything_else_is_not_one() {
        let body = b"<?xml version=\"1.0\"?><ListBucketResult><Name>b</Name>\
            <Contents><Key>w1/k0</Key><Size>3</Size></Contents>\
            <Contents><Key>w1/k3</Key></Contents></ListBucketResult>";
        assert_eq!(
            listed_keys(body),
            Some(vec!["w1/k0".to_owned(), "w1/k3".to_owned()])
        );
        assert_eq!(
            listed_keys(b"<ListBucketResult></ListBucketResult>"),
            Some(vec![])
        );
        assert_eq!(listed_keys(b"<Error><Code>SlowDown</Code></Error>"), None);
        assert_eq!(listed_keys(b"<ListBucketResult><Key>torn"), None);
    }
}
