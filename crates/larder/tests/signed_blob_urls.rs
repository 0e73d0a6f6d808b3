//! `[auth] require_signed_blob_urls`: the native blob API takes only presigned URLs (made by
//! `larder s3 presign … /v1/blobs[/<id>]`) of keys from the cluster's key ring, with curl as
//! the client; unsigned, tampered, expired and under-granted requests are refused with 403
//! before anything is stored.

mod common;

use std::process::Command;

use common::{Cluster, LARDER};

fn larder(args: &[&str]) -> String {
    let out = Command::new(LARDER).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn the_blob_api_takes_only_presigned_urls_of_keys_that_may() {
    let extra = "[auth]\nsecret_file = \"cluster.secret\"\nrequire_signed_blob_urls = true\n";
    let cluster = Cluster::start_with(3, 4, extra);
    let dir = cluster.dir.path();
    let config = cluster.path("frontend-dc1.toml");
    let key = |grant: &str| {
        let created = larder(&["s3", "key", "create", "--config", &config, "--grant", grant]);
        let created: serde_json::Value = serde_json::from_str(&created).unwrap();
        created["access_key_id"].as_str().unwrap().to_owned()
    };
    let (writer, reader, other) = (key("*:write"), key("*:read"), key("photos:owner"));
    let presign = |id: &str, method: &str, path: &str, expires: &str| {
        let args = ["s3", "presign", "--config", &config, "--access-key-id", id];
        larder(
            &[
                &args[..],
                &["--method", method, "--expires-in", expires, path],
            ]
            .concat(),
        )
    };

    // Unsigned: refused, nothing stored.
    let unsigned = common::curl(dir, &["--data-binary", "x", &cluster.url("/v1/blobs")]);
    assert_eq!(
        (unsigned.status, unsigned.error_code()),
        (403, "SignatureRequired".to_owned())
    );

    let upload = presign(&writer, "POST", "/v1/blobs", "300");
    let created = common::curl(dir, &["--data-binary", "signed bytes", &upload]);
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/blobs/{id}");

    // Read with a read key, over HTTP/1.1 and HTTP/2 (the host is `:authority` there).
    let get = presign(&reader, "GET", &path, "300");
    assert_eq!(common::curl(dir, &[&get]).body, b"signed bytes");
    let h2 = common::curl(dir, &["--http2-prior-knowledge", &get]);
    assert_eq!((h2.status, h2.body), (200, b"signed bytes".to_vec()));
    let head = presign(&reader, "HEAD", &path, "300");
    assert_eq!(common::curl(dir, &["-I", &head]).status, 200);

    // Refusals: unsigned, another method than signed, a tampered path or expiry, a key without
    // the grant (read cannot delete; a key for one bucket cannot touch blobs), a revoked key.
    let refused = |args: &[&str], code: &str| {
        let answer = common::curl(dir, args);
        assert_eq!(
            (answer.status, answer.error_code()),
            (403, code.to_owned()),
            "{args:?}"
        );
    };
    refused(&[&cluster.url(&path)], "SignatureRequired");
    refused(&["-X", "DELETE", &get], "SignatureDoesNotMatch");
    let tampered = get.replace(&id[..6], "AAAAAA");
    refused(&[&tampered], "SignatureDoesNotMatch");
    refused(
        &[&get.replace("X-Amz-Expires=300", "X-Amz-Expires=3000")],
        "SignatureDoesNotMatch",
    );
    refused(
        &["-X", "DELETE", &presign(&reader, "DELETE", &path, "300")],
        "AccessDenied",
    );
    refused(&[&presign(&other, "GET", &path, "300")], "AccessDenied");
    let soon = presign(&reader, "GET", &path, "1");
    std::thread::sleep(std::time::Duration::from_millis(2100));
    refused(&[&soon], "SignatureExpired");
    let malformed = common::curl(dir, &[&get.replace("AWS4-HMAC-SHA256", "AWS4-HMAC-MD5")]);
    assert_eq!(malformed.status, 400);

    let delete = presign(&writer, "DELETE", &path, "300");
    assert_eq!(common::curl(dir, &["-X", "DELETE", &delete]).status, 202);
    assert_eq!(common::curl(dir, &[&get]).status, 410);

    larder(&["s3", "key", "revoke", "--config", &config, &reader]);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    refused(&[&get], "InvalidAccessKeyId");
}
