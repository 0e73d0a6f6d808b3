//! Storage nodes whose disks count as full (below `store.min_free_space`): writes of blobs, large
//! blobs and documents get 507 with a clear message from the frontend, and deletes still land.

mod common;

use common::{curl, file_with, random_bytes, Cluster};
use larder_cluster::{BlobId, BlobKind};

#[test]
fn full_disks_refuse_writes_with_507_and_still_take_deletes() {
    // A reserve larger than any disk: every node is below it.
    let cluster = Cluster::start_full(3, 4, "", "[store]\nmin_free_space = \"1000 TiB\"\n");
    let dir = cluster.dir.path();
    for size in [1000, 9 << 20] {
        let file = format!("@{}", file_with(dir, &random_bytes(size)));
        let put = curl(
            dir,
            &[
                "--http2-prior-knowledge",
                "--data-binary",
                &file,
                &cluster.url("/v1/blobs"),
            ],
        );
        assert_eq!(
            put.status,
            507,
            "{size} B: {}",
            String::from_utf8_lossy(&put.body)
        );
        assert_eq!(put.json()["error"]["code"], "OutOfSpace");
        let message = put.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains("out of space"), "{message}");
    }
    let doc = curl(
        dir,
        &[
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "--data",
            r#"{"fields":{"title":"x"}}"#,
            &cluster.url("/document/v1/ns/doc/docid/1"),
        ],
    );
    assert_eq!(doc.status, 507, "{}", String::from_utf8_lossy(&doc.body));
    assert!(doc.json()["message"].is_string());
    // Deletes write small tombstones and are what frees space: they are still taken.
    let id = BlobId::mint(BlobKind::Simple, 0, 1).to_string();
    let delete = curl(
        dir,
        &["-X", "DELETE", &cluster.url(&format!("/v1/blobs/{id}"))],
    );
    assert_eq!(
        delete.status,
        202,
        "{}",
        String::from_utf8_lossy(&delete.body)
    );
    let remove = curl(
        dir,
        &["-X", "DELETE", &cluster.url("/document/v1/ns/doc/docid/1")],
    );
    assert_eq!(
        remove.status,
        200,
        "{}",
        String::from_utf8_lossy(&remove.body)
    );
}
