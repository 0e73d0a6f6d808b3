//! The S3 API on its own port, through real clients (boto3, curl with presigned URLs, the aws
//! cli; installed by `scripts/test`), with keys made by `larder s3 key create`: buckets,
//! objects, ranges, listings, a 100 MiB multipart upload, bad requests; and the reclaiming of a
//! replaced object's blob from the bucket record's garbage list.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{python, Cluster, LARDER};

/// 1 MiB chunks, so that a few MiB make a composite blob with chunk boundaries to range across;
/// a short grace and sweep, so that replaced blobs go within the test.
fn s3_cluster() -> (Cluster, String) {
    let s3 = common::free_addresses(1)[0];
    let extra = format!(
        "[chunking]\nchunk_size = \"1MiB\"\n\n[s3]\nlisten = \"{s3}\"\nreplaced_blob_grace = \"1s\"\nsweep_interval = \"1s\"\n"
    );
    let cluster = Cluster::start_with(3, 8, &extra);
    common::wait_for_port(s3);
    (cluster, format!("http://{s3}"))
}

/// `larder s3 key create` with `grants`: (access key ID, secret).
fn create_key(cluster: &Cluster, grants: &[&str]) -> (String, String) {
    common::s3_key(cluster, grants)
}

/// Runs the client script `tests/s3/<name>` with `args`; it asserts, and fails the test with
/// its output.
fn run_script(name: &str, args: &[&str]) {
    let script = format!("{}/tests/s3/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python())
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `tests/s3/<name>` with the endpoint and a key that owns every bucket.
fn run_owner_script(name: &str) {
    let (cluster, endpoint) = s3_cluster();
    let (id, secret) = create_key(&cluster, &["*:owner"]);
    run_script(name, &[&endpoint, &id, &secret]);
}

#[test]
fn boto3_curl_and_the_aws_cli_use_buckets_and_objects() {
    let (cluster, endpoint) = s3_cluster();
    let (owner, owner_secret) = create_key(&cluster, &["*:owner"]);
    let (reader, reader_secret) = create_key(&cluster, &["photos:read"]);
    let workdir = cluster.dir.path().to_str().unwrap();
    let args = [&endpoint, &owner, &owner_secret, &reader, &reader_secret];
    let args: Vec<&str> = args.iter().map(|a| a.as_str()).chain([workdir]).collect();
    run_script("clients.py", &args);
}

#[test]
fn conditional_gets_upload_listings_and_larder_presign() {
    let (cluster, endpoint) = s3_cluster();
    let (id, secret) = create_key(&cluster, &["*:owner"]);
    let config = cluster.path("frontend-dc1.toml");
    run_script("operations.py", &[&endpoint, &id, &secret, LARDER, &config]);
}

#[test]
fn conditional_copies_puts_and_completes() {
    run_owner_script("conditional_writes.py");
}

/// `x-amz-checksum-*`: checked on PutObject and UploadPart (in a header or an aws-chunked
/// trailer), kept with the object, returned when asked; a mismatch stores nothing.
#[test]
fn additional_checksums_are_checked_kept_and_returned() {
    run_owner_script("checksums.py");
}

/// A PUT with `Expect: 100-continue` refused before its body is read (here: anonymous, of a
/// bucket that does not exist, 404 as S3 answers it)
/// ends its connection: the client never sends that body, and hyper would read the next
/// request's first bytes as it (boto3's next PUT arrived as `T /…`, SignatureDoesNotMatch).
#[test]
fn a_refused_put_whose_body_was_withheld_closes_its_connection() {
    let (_cluster, endpoint) = s3_cluster();
    let address = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let head = format!(
        "PUT /cond/key HTTP/1.1\r\nHost: {address}\r\nExpect: 100-continue\r\n\
         Content-Length: 2\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    // Everything the server sends until it closes: the 404, then end of stream.
    let mut answer = Vec::new();
    let read = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    assert!(answer.starts_with("http/1.1 404"), "{answer}");
    assert!(answer.contains("<code>nosuchbucket</code>"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(
        read.is_ok(),
        "the connection stayed open: {read:?}\n{answer}"
    );
}

#[test]
fn what_ceph_s3_tests_found_listing_details_versions_digests_and_retries() {
    run_owner_script("listing_details.py");
}

#[test]
fn objects_keep_their_standard_headers_and_bound_their_metadata() {
    run_owner_script("object_headers.py");
}

#[test]
fn parts_copy_ranges_of_objects_attributes_page_parts_and_answers_name_requests() {
    let (cluster, endpoint) = s3_cluster();
    let (owner, owner_secret) = create_key(&cluster, &["*:owner"]);
    // May write parts into `dst` but read nothing else: its copies from `src` are refused.
    let (writer, writer_secret) = create_key(&cluster, &["dst:write"]);
    let args = [&endpoint, &owner, &owner_secret, &writer, &writer_secret];
    let args: Vec<&str> = args.iter().map(|a| a.as_str()).collect();
    run_script("part_copies_and_attributes.py", &args);
}

#[test]
fn requests_signed_long_ago_are_refused_and_sigv2_clients_work() {
    run_owner_script("signature_times.py");
}

/// `[s3] signature_v2 = false` refuses SigV2 (headers and presigned URLs) with 400.
#[test]
fn sigv2_is_refused_when_switched_off() {
    let s3 = common::free_addresses(1)[0];
    let extra = format!("[s3]\nlisten = \"{s3}\"\nsignature_v2 = false\n");
    let cluster = Cluster::start_with(3, 8, &extra);
    common::wait_for_port(s3);
    let (id, secret) = create_key(&cluster, &["*:owner"]);
    run_script(
        "signature_v2_off.py",
        &[&format!("http://{s3}"), &id, &secret],
    );
}

#[test]
fn canned_acls_open_and_close_buckets_and_single_objects_to_anonymous_reads() {
    run_owner_script("canned_acls.py");
}

#[test]
fn objects_and_buckets_carry_tags_through_puts_copies_and_uploads_within_s3s_rules() {
    run_owner_script("object_tagging.py");
}

#[test]
fn a_revoked_key_is_refused_and_keys_are_listed_without_secrets() {
    let (cluster, endpoint) = s3_cluster();
    let (id, secret) = create_key(&cluster, &["*:owner"]);
    let config = cluster.path("frontend-dc1.toml");
    let listed = Command::new(LARDER)
        .args(["s3", "key", "list", "--config", &config])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains(&id) && listed.contains("*:owner"),
        "{listed}"
    );
    assert!(!listed.contains(&secret), "{listed}");
    let script = r#"
import sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=sys.argv[1], aws_access_key_id=sys.argv[2],
                  aws_secret_access_key=sys.argv[3], region_name="us-east-1",
                  config=Config(retries={"max_attempts": 1}))
try:
    s3.list_buckets()
    print("ok")
except Exception as err:
    print(err.response["Error"]["Code"])
"#;
    let ask = || {
        let out = Command::new(python())
            .args(["-c", script, &endpoint, &id, &secret])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(ask(), "ok");
    let revoked = Command::new(LARDER)
        .args(["s3", "key", "revoke", "--config", &config, &id])
        .status()
        .unwrap();
    assert!(revoked.success());
    // The frontend reuses a key ring read for at most a second.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(ask(), "InvalidAccessKeyId");
}

/// A client script run in two halves: it prints a line and waits on its stdin; `start` returns
/// that line, `resume` lets the script go on and waits for it to succeed.
struct PausedScript(std::process::Child);

impl PausedScript {
    fn start(script: &str, args: &[&str]) -> (PausedScript, String) {
        use std::io::BufRead;
        let mut child = Command::new(python())
            .arg("-c")
            .arg(script)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        (PausedScript(child), line)
    }

    fn resume(mut self) {
        self.0.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        assert!(self.0.wait().unwrap().success());
    }
}

/// The bucket index record of `bucket` as each storage node holds it (replicas converge).
fn bucket_records(cluster: &Cluster, bucket: &str) -> Vec<serde_json::Value> {
    records(cluster, &format!("larder-s3:bucket:{bucket}"))
}

/// The S3 layer's record `key` as each storage node holds it.
fn records(cluster: &Cluster, key: &str) -> Vec<serde_json::Value> {
    cluster.doc_copies(key)
}

#[test]
fn an_overwritten_objects_blob_is_tombstoned_after_the_grace_period() {
    let (cluster, endpoint) = s3_cluster();
    let (id, secret) = create_key(&cluster, &["*:owner"]);
    let script = r#"
import sys, boto3
s3 = boto3.client("s3", endpoint_url=sys.argv[1], aws_access_key_id=sys.argv[2],
                  aws_secret_access_key=sys.argv[3], region_name="us-east-1")
s3.create_bucket(Bucket="reclaim")
s3.put_object(Bucket="reclaim", Key="k", Body=b"first")
print(sys.argv[4], flush=True)
sys.stdin.readline()
s3.put_object(Bucket="reclaim", Key="k", Body=b"second")
assert s3.get_object(Bucket="reclaim", Key="k")["Body"].read() == b"second"
"#;
    let (paused, line) = PausedScript::start(script, &[&endpoint, &id, &secret, "stored"]);
    assert_eq!(line.trim(), "stored");
    let first_blob = wait_for(|| {
        bucket_records(&cluster, "reclaim").iter().find_map(|r| {
            r["objects"]["k"]["body"][0]["blob"]
                .as_str()
                .map(str::to_owned)
        })
    });
    paused.resume();
    let blob_url = cluster.url(&format!("/v1/blobs/{first_blob}"));
    // Gone once the grace (1 s) is over and a sweep (every 1 s) ran: 410 from the main port,
    // and the garbage list empty again.
    wait_for(|| {
        let status = common::curl(cluster.dir.path(), &[&blob_url]).status;
        let records = bucket_records(&cluster, "reclaim");
        let swept = records.len() == 3
            && records.iter().all(|r| {
                r["objects"]["k"]["body"][0]["blob"].as_str() != Some(first_blob.as_str())
                    && r["garbage"].as_array().is_none_or(|g| g.is_empty())
            });
        (status == 410 && swept).then_some(())
    });
}

/// A multipart object's entry names one record, a composite of version 2 that lists its parts
/// (a chunked one and a simple one here) with their sizes; the blob API refuses to read or
/// delete it piecewise; and deleting the object tombstones the record and every part after the
/// grace period.
#[test]
fn a_multipart_objects_parts_live_in_one_record_that_goes_with_the_object() {
    let (cluster, endpoint) = s3_cluster();
    let (id, secret) = create_key(&cluster, &["*:owner"]);
    let script = r#"
import sys, boto3
s3 = boto3.client("s3", endpoint_url=sys.argv[1], aws_access_key_id=sys.argv[2],
                  aws_secret_access_key=sys.argv[3], region_name="us-east-1")
s3.create_bucket(Bucket="parts")
upload = s3.create_multipart_upload(Bucket="parts", Key="mp")["UploadId"]
first, second = b"a" * (5 << 20), b"b" * 1000
tags = [s3.upload_part(Bucket="parts", Key="mp", UploadId=upload, PartNumber=n, Body=body)["ETag"]
        for n, body in ((1, first), (2, second))]
s3.complete_multipart_upload(Bucket="parts", Key="mp", UploadId=upload, MultipartUpload={
    "Parts": [{"PartNumber": n + 1, "ETag": tag} for n, tag in enumerate(tags)]})
assert s3.get_object(Bucket="parts", Key="mp")["Body"].read() == first + second
print("stored", flush=True)
sys.stdin.readline()
s3.delete_object(Bucket="parts", Key="mp")
"#;
    let (paused, line) = PausedScript::start(script, &[&endpoint, &id, &secret]);
    assert_eq!(line.trim(), "stored");
    let body = wait_for(|| {
        bucket_records(&cluster, "parts")
            .iter()
            .find_map(|r| r["objects"]["mp"]["body"].as_array().cloned())
    });
    assert_eq!(body.len(), 1, "one piece: {body:?}");
    let record = body[0]["blob"].as_str().unwrap().to_owned();
    let record_id: larder_cluster::BlobId = record.parse().unwrap();
    assert_eq!(record_id.kind, larder_cluster::BlobKind::Composite);
    // The record as a storage node holds it: version 2, the two parts in order.
    let path = larder_proto::blob_path(record_id.partition, &record);
    let (status, bytes) = cluster.internal_request(cluster.node_addr(0), "GET", &path);
    assert_eq!(status, 200);
    let larder_router::Composite::Parts(parts) = larder_router::Composite::decode(&bytes).unwrap()
    else {
        panic!("not a parts record");
    };
    let sizes: Vec<u64> = parts.parts.iter().map(|p| p.size).collect();
    assert_eq!(sizes, [5 << 20, 1000]);
    let kinds: Vec<_> = parts.parts.iter().map(|p| p.id.kind).collect();
    use larder_cluster::BlobKind::{Composite, Simple};
    assert_eq!(kinds, [Composite, Simple], "5 MiB is chunked at 1 MiB");
    let native = |id: &str| {
        common::curl(
            cluster.dir.path(),
            &[&cluster.url(&format!("/v1/blobs/{id}"))],
        )
    };
    let refused = native(&record);
    assert_eq!(refused.status, 400);
    assert!(String::from_utf8_lossy(&refused.body).contains("S3ObjectBody"));
    let record_url = cluster.url(&format!("/v1/blobs/{record}"));
    let delete = common::curl(cluster.dir.path(), &["-X", "DELETE", &record_url]);
    assert_eq!(
        delete.status, 400,
        "the blob API deletes no S3 object's parts record"
    );
    for part in &parts.parts {
        assert_eq!(native(&part.id.to_string()).status, 200);
    }

    paused.resume();
    // HEADs: a GET of the 5 MiB part while its chunks are being tombstoned may have its
    // transfer cut after the headers (a chunk gone mid-stream), which is no answer to poll.
    let status = |id: &str| {
        common::curl(
            cluster.dir.path(),
            &["-I", &cluster.url(&format!("/v1/blobs/{id}"))],
        )
        .status
    };
    wait_for(|| {
        let parts_gone = parts.parts.iter().all(|p| status(&p.id.to_string()) == 410);
        (parts_gone && status(&record) == 410).then_some(())
    });
}

/// A name overwritten without pause does not grow its index record for the whole grace
/// period: past `[s3] max_held_garbage` replaced blobs (4 here), the oldest are tombstoned at
/// once (here long before their 1 h grace), and the record holds about the bound.
#[test]
fn replaced_blobs_past_the_bound_go_before_their_grace() {
    let s3 = common::free_addresses(1)[0];
    let extra = format!(
        "[s3]\nlisten = \"{s3}\"\nreplaced_blob_grace = \"1h\"\nsweep_interval = \"1h\"\nmax_held_garbage = 4\n"
    );
    let cluster = Cluster::start_with(3, 8, &extra);
    common::wait_for_port(s3);
    let endpoint = format!("http://{s3}");
    let (id, secret) = create_key(&cluster, &["*:owner"]);
    let script = r#"
import sys, boto3
s3 = boto3.client("s3", endpoint_url=sys.argv[1], aws_access_key_id=sys.argv[2],
                  aws_secret_access_key=sys.argv[3], region_name="us-east-1")
s3.create_bucket(Bucket="hot")
s3.put_object(Bucket="hot", Key="k", Body=b"version 0")
print(flush=True)
sys.stdin.readline()
for i in range(1, 21):
    s3.put_object(Bucket="hot", Key="k", Body=b"version %d" % i)
assert s3.get_object(Bucket="hot", Key="k")["Body"].read() == b"version 20"
"#;
    let (paused, _) = PausedScript::start(script, &[&endpoint, &id, &secret]);
    let first = wait_for(|| {
        bucket_records(&cluster, "hot").iter().find_map(|r| {
            r["objects"]["k"]["body"][0]["blob"]
                .as_str()
                .map(str::to_owned)
        })
    });
    paused.resume();
    let url = cluster.url(&format!("/v1/blobs/{first}"));
    wait_for(|| {
        let gone = common::curl(cluster.dir.path(), &[&url]).status == 410;
        let records = bucket_records(&cluster, "hot");
        let held = records
            .iter()
            .map(|r| r["garbage"].as_array().map_or(0, Vec::len))
            .max()
            .unwrap_or(0);
        (gone && held <= 4).then_some(())
    });
}

/// S3 deletes a bucket whose only contents are uploads in progress; Larder does too, and
/// aborts them: the upload is gone, its part's blob tombstoned, and a bucket made again with
/// the name lists no uploads.
#[test]
fn deleting_a_bucket_aborts_its_uploads_and_tombstones_their_parts() {
    let (cluster, endpoint) = s3_cluster();
    let (id, secret) = create_key(&cluster, &["*:owner"]);
    let script = r#"
import sys, boto3
from botocore.exceptions import ClientError
s3 = boto3.client("s3", endpoint_url=sys.argv[1], aws_access_key_id=sys.argv[2],
                  aws_secret_access_key=sys.argv[3], region_name="us-east-1")
s3.create_bucket(Bucket="pending")
upload = s3.create_multipart_upload(Bucket="pending", Key="big")["UploadId"]
s3.upload_part(Bucket="pending", Key="big", UploadId=upload, PartNumber=1, Body=b"part")
print(upload, flush=True)
sys.stdin.readline()
s3.delete_bucket(Bucket="pending")
try:
    s3.head_bucket(Bucket="pending")
    raise AssertionError("the bucket is still there")
except ClientError as err:
    assert err.response["ResponseMetadata"]["HTTPStatusCode"] == 404, err
s3.create_bucket(Bucket="pending")
assert "Uploads" not in s3.list_multipart_uploads(Bucket="pending")
try:
    s3.list_parts(Bucket="pending", Key="big", UploadId=upload)
    raise AssertionError("the upload is still there")
except ClientError as err:
    assert err.response["Error"]["Code"] == "NoSuchUpload", err
"#;
    let (paused, upload) = PausedScript::start(script, &[&endpoint, &id, &secret]);
    let record = format!("larder-s3:upload:pending:{}", upload.trim());
    let part_blob = wait_for(|| {
        records(&cluster, &record)
            .iter()
            .find_map(|r| r["parts"]["1"]["blob"].as_str().map(str::to_owned))
    });
    let blob_url = cluster.url(&format!("/v1/blobs/{part_blob}"));
    assert_eq!(common::curl(cluster.dir.path(), &[&blob_url]).status, 200);
    paused.resume();
    wait_for(|| (common::curl(cluster.dir.path(), &[&blob_url]).status == 410).then_some(()));
}

fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(value) = f() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out");
        std::thread::sleep(Duration::from_millis(200));
    }
}
