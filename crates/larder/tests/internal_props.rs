//! Blob properties on the internal hop travel in one compact header (`x-larder-props`), against a
//! real storage node on its internal port: the node stores the value it received and serves it
//! back unchanged, serves properties that came one header each (a frontend of an earlier
//! release) in the compact form, and refuses a value it cannot read or one past the public
//! API's limits.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::{internal, Cluster};
use http::{Method, StatusCode};
use larder_cluster::{BlobId, BlobKind};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn new_blob_path() -> String {
    let id = BlobId::mint(BlobKind::Simple, 0, 0).to_string();
    larder_proto::blob_path(0, &id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn properties_travel_in_one_header() {
    let cluster = Cluster::start(3, 1);
    let secret = cluster.dir.path().join(common::SECRET_FILE);
    let addr = cluster.node_addr(0);
    let now = now_ms();
    let put = |headers: Vec<(&'static str, String)>| {
        let (secret, path) = (secret.clone(), new_blob_path());
        async move {
            let (status, _, body) =
                internal::send(&secret, addr, Method::PUT, &path, &headers, "x".into()).await;
            (status, body, path)
        }
    };
    let get_props = |path: String| {
        let secret = secret.clone();
        async move {
            let (status, headers, body) =
                internal::send(&secret, addr, Method::GET, &path, &[], Bytes::new()).await;
            assert_eq!((status, &body[..]), (StatusCode::OK, &b"x"[..]));
            headers["x-larder-props"].to_str().unwrap().to_owned()
        }
    };

    let compact = format!("1;{now};;9:image/png;owner=3:ada;");
    let (status, _, path) = put(vec![("x-larder-props", compact.clone())]).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(get_props(path).await, compact, "served as stored");

    let one_each = vec![
        ("x-larder-time-ms", now.to_string()),
        ("content-type", "text/plain".to_owned()),
        ("x-larder-meta-a", "b".to_owned()),
    ];
    let (status, _, path) = put(one_each).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        get_props(path).await,
        format!("1;{now};;10:text/plain;a=1:b;")
    );

    let too_much_metadata = format!("1;{now};;-;big=9000:{};", "v".repeat(9000));
    for refused in [
        "2;1;;-;",
        "1;1;;-;Upper=1:x;",
        "1;1;;9:short;",
        "1;1;;-;=1:x;",
        &too_much_metadata,
    ] {
        let (status, body, _) = put(vec![("x-larder-props", refused.to_owned())]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{refused:.40}");
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"]["code"], "BadProperties", "{refused:.40}");
    }
}
