//! A frontend that dies between storing an object's body and linking its name leaks nothing,
//! and one that dies after linking it loses nothing (`larder-s3/src/held.rs`): the body is
//! stored under an upload journal entry held for the name, and the next start settles it
//! (a fence on the name's index record, then the name read: the body is tombstoned unless the
//! name points at it). The crash is a real exit of the frontend process in the middle of a
//! PutObject (`LARDER_S3_CRASH`), and the check reads the blob through the blob API.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Cluster;

struct Signer(common::Presigner);

impl Signer {
    fn url(&self, method: &str, object: &str) -> String {
        self.0.url(method, "crashes", object, &[])
    }

    fn url_with(&self, method: &str, object: &str, query: &[(&str, &str)]) -> String {
        self.0.url(method, "crashes", object, query)
    }
}

/// The journal's open entries but reserved ones: (held for a name, blob IDs). A running
/// frontend keeps some entries reserved ahead of need (`larder-router`'s `reserve.rs`).
fn entries(journal: &Path) -> Vec<(bool, Vec<String>)> {
    if !journal.exists() {
        return Vec::new();
    }
    larder_router::UploadJournal::inspect(journal)
        .unwrap()
        .into_iter()
        .filter(|e| !e.reserved)
        .map(|e| {
            (
                e.held_for.is_some(),
                e.ids.iter().map(|id| id.to_string()).collect(),
            )
        })
        .collect()
}

/// The IDs the journal's reserved entries list.
fn reserved_ids(journal: &Path) -> Vec<String> {
    larder_router::UploadJournal::inspect(journal)
        .unwrap()
        .into_iter()
        .filter(|e| e.reserved)
        .flat_map(|e| e.ids)
        .map(|id| id.to_string())
        .collect()
}

fn wait_until_settled(journal: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !entries(journal).is_empty() {
        assert!(
            Instant::now() < deadline,
            "held entries were never settled: {:?}",
            entries(journal)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Puts `name` through a frontend that exits at `crash`; returns the blob IDs its journal
/// entry holds.
fn put_through_a_crash(
    cluster: &mut Cluster,
    signer: &Signer,
    journal: &Path,
    (name, crash): (&str, &str),
) -> Vec<String> {
    put_url_through_a_crash(
        cluster,
        signer,
        journal,
        (&signer.url("PUT", name), name, crash),
    )
}

fn put_url_through_a_crash(
    cluster: &mut Cluster,
    signer: &Signer,
    journal: &Path,
    (url, name, crash): (&str, &str, &str),
) -> Vec<String> {
    cluster.restart_frontend_with_env(&[("LARDER_S3_CRASH", crash)]);
    common::wait_for_port(signer.0.s3);
    let dir = cluster.dir.path().to_path_buf();
    let body = format!("the body of {name}");
    put_unanswered(&dir, url, &body);
    let held = entries(journal);
    assert_eq!(held.len(), 1, "one held entry: {held:?}");
    assert!(held[0].0, "the entry is held for the name");
    assert_eq!(held[0].1.len(), 1, "a one-chunk body is one blob");
    held[0].1.clone()
}

/// PUTs `body` at `url` and checks that the frontend exited before answering.
fn put_unanswered(dir: &Path, url: &str, body: &str) {
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "30",
            "-X",
            "PUT",
            "--data-binary",
            body,
            url,
        ])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        !out.status.success() || out.stdout.is_empty(),
        "the PUT was answered although the frontend exited: {out:?}"
    );
}

/// A cluster whose frontend keeps an upload journal, an S3 port (returned), a key that may do
/// anything and a bucket `crashes`.
fn start() -> (Cluster, Signer, std::net::SocketAddr) {
    let s3 = common::free_addresses(1)[0];
    let extra = format!("upload_journal_dir = \"frontend-uploads\"\n[s3]\nlisten = \"{s3}\"\n");
    let cluster = Cluster::start_with(3, 4, &extra);
    common::wait_for_port(s3);
    let signer = Signer(common::Presigner::new(&cluster, s3, &["*:owner"]));
    let made = common::curl(cluster.dir.path(), &["-X", "PUT", &signer.url("PUT", "")]);
    assert_eq!(made.status, 200);
    (cluster, signer, s3)
}

#[test]
fn a_crash_before_the_link_leaks_no_body_and_one_after_it_loses_no_name() {
    let (mut cluster, signer, s3) = start();
    let dir = cluster.dir.path().to_path_buf();
    let journal = dir.join("frontend-uploads");

    // Died after the body was stored, before the name was linked: the body goes.
    let ids = put_through_a_crash(&mut cluster, &signer, &journal, ("lost", "before-link"));
    assert!(
        cluster.replicas_holding(&ids[0]) >= 2,
        "stored before the crash"
    );
    cluster.restart_frontend_with_env(&[]);
    common::wait_for_port(s3);
    wait_until_settled(&journal);
    assert_eq!(
        cluster.replicas_holding(&ids[0]),
        0,
        "the unnamed body was tombstoned"
    );
    let got = common::curl(&dir, &[&signer.url("GET", "lost")]);
    assert_eq!(got.status, 404);

    // The same two crashes for a PutObject under a reserved entry (the process's second PUT:
    // its first finds none ready and reserves), whose body carries its name and whose entry
    // gets no line at all: the leftover's blob is read to find the name, then settled.
    // A third body is tombstoned on every node before the restart: its leftover finds it
    // gone and is forgotten.
    for (name, crash, named, tombstoned) in [
        ("lost-reserved", "before-link", false, false),
        ("kept-reserved", "after-link", true, false),
        ("gone-reserved", "before-link", false, true),
    ] {
        cluster.restart_frontend_with_env(&[
            ("LARDER_S3_CRASH", crash),
            ("LARDER_S3_CRASH_SKIP", "1"),
        ]);
        common::wait_for_port(s3);
        wait_until_settled(&journal);
        let warm = common::curl(&dir, &["-X", "PUT", "-d", "x", &signer.url("PUT", "warm")]);
        assert_eq!(warm.status, 200, "the first PUT passes the crash point");
        wait_for(|| !reserved_ids(&journal).is_empty(), "entries reserved");
        let body = format!("the body of {name}");
        put_unanswered(&dir, &signer.url("PUT", name), &body);
        assert!(
            entries(&journal).is_empty(),
            "no line held it: {:?}",
            entries(&journal)
        );
        let crashed = reserved_ids(&journal);
        let stored: Vec<&String> = crashed
            .iter()
            .filter(|id| cluster.replicas_holding(id) >= 2)
            .collect();
        assert_eq!(stored.len(), 1, "one reserved ID was stored: {crashed:?}");
        let stored = stored[0].clone();
        if tombstoned {
            let blob: larder_cluster::BlobId = stored.parse().unwrap();
            let path = larder_proto::blob_path(blob.partition, &stored);
            for i in 0..3 {
                let (status, _) = cluster.internal_request(cluster.node_addr(i), "DELETE", &path);
                assert_eq!(status, 202, "tombstoned on node {i}");
            }
        }
        cluster.restart_frontend_with_env(&[]);
        common::wait_for_port(s3);
        let deadline = Instant::now() + Duration::from_secs(60);
        while reserved_ids(&journal).iter().any(|id| crashed.contains(id)) {
            assert!(
                Instant::now() < deadline,
                "the crashed run's reserved entries stay"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let got = common::curl(&dir, &[&signer.url("GET", name)]);
        if named {
            assert!(
                cluster.replicas_holding(&stored) >= 2,
                "a named body is kept"
            );
            assert_eq!((got.status, got.body), (200, body.into_bytes()));
        } else {
            assert_eq!(
                cluster.replicas_holding(&stored),
                0,
                "the unnamed body went"
            );
            assert_eq!(got.status, 404);
        }
    }

    // Died after the name was linked, before the entry went: the body stays, named.
    let ids = put_through_a_crash(&mut cluster, &signer, &journal, ("kept", "after-link"));
    cluster.restart_frontend_with_env(&[]);
    common::wait_for_port(s3);
    wait_until_settled(&journal);
    assert!(
        cluster.replicas_holding(&ids[0]) >= 2,
        "a named body is kept"
    );
    let got = common::curl(&dir, &[&signer.url("GET", "kept")]);
    assert_eq!(got.status, 200);
    assert_eq!(got.body, b"the body of kept");

    // An UploadPart that died before the part was added to its upload: the part goes, the
    // upload stays, listing no part.
    let created = common::curl(
        &dir,
        &[
            "-X",
            "POST",
            &signer.url_with("POST", "multi", &[("uploads", "")]),
        ],
    );
    assert_eq!(created.status, 200);
    let text = String::from_utf8(created.body).unwrap();
    let upload = text
        .split("<UploadId>")
        .nth(1)
        .unwrap()
        .split("</UploadId>")
        .next()
        .unwrap();
    let part_url = signer.url_with("PUT", "multi", &[("partNumber", "1"), ("uploadId", upload)]);
    let ids = put_url_through_a_crash(
        &mut cluster,
        &signer,
        &journal,
        (&part_url, "multi", "before-add-part"),
    );
    assert!(
        cluster.replicas_holding(&ids[0]) >= 2,
        "the part was stored before the crash"
    );
    cluster.restart_frontend_with_env(&[]);
    common::wait_for_port(s3);
    wait_until_settled(&journal);
    assert_eq!(
        cluster.replicas_holding(&ids[0]),
        0,
        "the part no upload lists was tombstoned"
    );
    let parts = common::curl(
        &dir,
        &[&signer.url_with("GET", "multi", &[("uploadId", upload)])],
    );
    assert_eq!(parts.status, 200);
    assert!(!String::from_utf8(parts.body).unwrap().contains("<Part>"));

    // And a PUT that runs to the end leaves no entry behind.
    let put = common::curl(
        &dir,
        &[
            "-X",
            "PUT",
            "--data-binary",
            "plain",
            &signer.url("PUT", "plain"),
        ],
    );
    assert_eq!(put.status, 200);
    wait_until_settled(&journal);

    // A clean shutdown releases the entries it reserved and never used.
    wait_for(|| !reserved_ids(&journal).is_empty(), "entries reserved");
    common::signal(cluster.frontend_mut(), common::libc_sigterm());
    let exited = common::wait_timeout(cluster.frontend_mut(), Duration::from_secs(30));
    assert!(exited.is_some_and(|s| s.success()), "{exited:?}");
    assert_eq!(reserved_ids(&journal), Vec::<String>::new());
}

/// The upload's record as storage holds it (read on every node's internal port, once all
/// replicas agree: the last one to get a change may lag a little): its parts' blob IDs by
/// number, and whether a completion's token is in it (`None`: no record).
fn upload_record(cluster: &Cluster, upload: &str) -> Option<(Vec<(u32, String)>, bool)> {
    let doc = format!("larder-s3:upload:crashes:{upload}");
    let partition = larder_cluster::partition_for_key(doc.as_bytes(), 4);
    let path = larder_proto::doc_path(partition, &doc);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (status, body) = loop {
        let answers: Vec<(u16, Vec<u8>)> = (0..cluster.map.nodes.len())
            .map(|i| cluster.internal_request(cluster.node_addr(i), "GET", &path))
            .collect();
        if answers.windows(2).all(|w| w[0] == w[1]) {
            break answers[0].clone();
        }
        assert!(Instant::now() < deadline, "replicas disagree for 30 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    if status != 200 {
        return None;
    }
    let record: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let parts = record["parts"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(n, p)| (n.parse().unwrap(), p["blob"].as_str().unwrap().to_owned()))
        .collect();
    Some((parts, record.get("completing").is_some()))
}

/// Starts an upload of `key` with parts 1 and 2; returns its ID and part 1's ETag.
fn upload_two_parts(dir: &Path, signer: &Signer, key: &str) -> (String, String) {
    let created = common::curl(
        dir,
        &[
            "-X",
            "POST",
            &signer.url_with("POST", key, &[("uploads", "")]),
        ],
    );
    assert_eq!(created.status, 200);
    let text = String::from_utf8(created.body).unwrap();
    let upload = text.split("<UploadId>").nth(1).unwrap();
    let upload = upload.split("</UploadId>").next().unwrap().to_owned();
    let mut etag = String::new();
    for number in ["1", "2"] {
        let query = [("partNumber", number), ("uploadId", upload.as_str())];
        let body = format!("part {number} of {key}");
        let put = common::curl(
            dir,
            &[
                "-X",
                "PUT",
                "--data-binary",
                &body,
                &signer.url_with("PUT", key, &query),
            ],
        );
        assert_eq!(put.status, 200);
        if number == "1" {
            etag = put.header("etag").unwrap().to_owned();
        }
    }
    (upload, etag)
}

/// CompleteMultipartUpload of part 1 alone; `crash` set: through a frontend that exits there.
fn complete(dir: &Path, signer: &Signer, (key, upload, etag): (&str, &str, &str)) -> u16 {
    let xml = format!(
        "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{etag}</ETag></Part>\
         </CompleteMultipartUpload>"
    );
    let url = signer.url_with("POST", key, &[("uploadId", upload)]);
    common::status_if_answered(dir, &["-X", "POST", "--data-binary", &xml, &url]).unwrap_or(0)
}

#[test]
fn a_crash_while_completing_an_upload_leaks_no_part_and_loses_no_object() {
    let (mut cluster, signer, s3) = start();
    let dir = cluster.dir.path().to_path_buf();
    let journal = dir.join("frontend-uploads");
    let crash_at = |cluster: &mut Cluster, at: &str, (key, upload, etag): (&str, &str, &str)| {
        // The parts' own entries go after their answers, in the background: gone first, so
        // that the one entry left is the completion's.
        wait_until_settled(&journal);
        cluster.restart_frontend_with_env(&[("LARDER_S3_CRASH", at)]);
        common::wait_for_port(s3);
        wait_until_settled(&journal);
        let status = complete(&dir, &signer, (key, upload, etag));
        assert_ne!(status, 200, "answered although the frontend exited at {at}");
        let held = entries(&journal);
        assert_eq!(
            held.len(),
            1,
            "one entry, held for the completion: {held:?}"
        );
        // It lists the object's parts record once that is written, and nothing else.
        let (is_held, records) = held[0].clone();
        assert!(is_held && records.len() <= 1, "{held:?}");
        let (_, completing) = upload_record(cluster, upload).expect("the record stays");
        assert!(completing, "the token is in the record");
        cluster.restart_frontend_with_env(&[]);
        common::wait_for_port(s3);
        wait_until_settled(&journal);
        records
    };

    // Died after the token went into the record, before the link was sent: the upload is
    // given back whole, and completes on the client's next try.
    let (upload, etag) = upload_two_parts(&dir, &signer, "given-back");
    let (parts, _) = upload_record(&cluster, &upload).unwrap();
    let records = crash_at(
        &mut cluster,
        "after-complete-mark",
        ("given-back", &upload, &etag),
    );
    assert!(records.is_empty(), "no parts record yet: {records:?}");
    // Read from one replica: the last one to get the change may lag a little.
    wait_for(
        || upload_record(&cluster, &upload) == Some((parts.clone(), false)),
        "the upload is given back",
    );
    assert_eq!(
        common::curl(&dir, &[&signer.url("GET", "given-back")]).status,
        404
    );
    assert_eq!(complete(&dir, &signer, ("given-back", &upload, &etag)), 200);
    let got = common::curl(&dir, &[&signer.url("GET", "given-back")]);
    assert_eq!(got.body, b"part 1 of given-back");
    wait_for(
        || upload_record(&cluster, &upload).is_none(),
        "the record goes",
    );
    wait_for(
        || cluster.replicas_holding(&parts[1].1) == 0,
        "the unused part goes",
    );
    assert!(
        cluster.replicas_holding(&parts[0].1) >= 2,
        "the used part stays"
    );

    // Died with the object's parts record written, before the link could be sent: the record
    // alone goes, and the upload is given back whole.
    let (upload, etag) = upload_two_parts(&dir, &signer, "record-dropped");
    let (parts, _) = upload_record(&cluster, &upload).unwrap();
    let records = crash_at(
        &mut cluster,
        "after-complete-parts-record",
        ("record-dropped", &upload, &etag),
    );
    assert_eq!(records.len(), 1, "the parts record is listed");
    wait_for(
        || upload_record(&cluster, &upload) == Some((parts.clone(), false)),
        "the upload is given back",
    );
    wait_for(
        || cluster.replicas_holding(&records[0]) == 0,
        "the parts record no name points at goes",
    );
    for (_, blob) in &parts {
        assert!(cluster.replicas_holding(blob) >= 2, "part {blob} stays");
    }
    assert_eq!(
        complete(&dir, &signer, ("record-dropped", &upload, &etag)),
        200
    );
    let got = common::curl(&dir, &[&signer.url("GET", "record-dropped")]);
    assert_eq!(got.body, b"part 1 of record-dropped");

    // Died once the link may have been sent, but it was not: the name may have been linked
    // and replaced since, so the parts are given up rather than given back.
    let (upload, etag) = upload_two_parts(&dir, &signer, "given-up");
    let (parts, _) = upload_record(&cluster, &upload).unwrap();
    let records = crash_at(
        &mut cluster,
        "before-complete-link",
        ("given-up", &upload, &etag),
    );
    assert_eq!(records.len(), 1, "the parts record is listed");
    wait_for(
        || upload_record(&cluster, &upload).is_none(),
        "the upload is gone",
    );
    assert_eq!(
        common::curl(&dir, &[&signer.url("GET", "given-up")]).status,
        404
    );
    for blob in parts.iter().map(|(_, b)| b).chain(&records) {
        assert_eq!(
            cluster.replicas_holding(blob),
            0,
            "no part and no parts record is left behind"
        );
    }
    assert_ne!(complete(&dir, &signer, ("given-up", &upload, &etag)), 200);

    // Died after the link, before the record went: the object stays, the upload is finished
    // (its unused part tombstoned).
    let (upload, etag) = upload_two_parts(&dir, &signer, "linked");
    let (parts, _) = upload_record(&cluster, &upload).unwrap();
    let records = crash_at(
        &mut cluster,
        "after-complete-link",
        ("linked", &upload, &etag),
    );
    assert_eq!(records.len(), 1, "the parts record is listed");
    wait_for(
        || upload_record(&cluster, &upload).is_none(),
        "the upload is finished",
    );
    let got = common::curl(&dir, &[&signer.url("GET", "linked")]);
    assert_eq!(got.status, 200);
    assert_eq!(got.body, b"part 1 of linked");
    assert_eq!(
        cluster.replicas_holding(&parts[1].1),
        0,
        "the unused part went"
    );
    assert!(
        cluster.replicas_holding(&parts[0].1) >= 2,
        "the used part stays"
    );
    assert!(
        cluster.replicas_holding(&records[0]) >= 2,
        "the parts record the name points at stays"
    );
    // The client's retry of the lost answer is answered with the object.
    assert_eq!(complete(&dir, &signer, ("linked", &upload, &etag)), 200);

    // Died after the completion finished (the upload's record gone), before its entry went:
    // the settlement cannot tell what the name was made of since, and tombstones nothing.
    let (upload, etag) = upload_two_parts(&dir, &signer, "finished");
    let (parts, _) = upload_record(&cluster, &upload).unwrap();
    let records = {
        wait_until_settled(&journal);
        cluster.restart_frontend_with_env(&[("LARDER_S3_CRASH", "after-complete-finish")]);
        common::wait_for_port(s3);
        let status = complete(&dir, &signer, ("finished", &upload, &etag));
        assert_ne!(status, 200, "answered although the frontend exited");
        let held = entries(&journal);
        assert_eq!(held.len(), 1, "{held:?}");
        assert!(upload_record(&cluster, &upload).is_none(), "finished");
        cluster.restart_frontend_with_env(&[]);
        common::wait_for_port(s3);
        wait_until_settled(&journal);
        held[0].1.clone()
    };
    assert_eq!(records.len(), 1, "the parts record is listed");
    let got = common::curl(&dir, &[&signer.url("GET", "finished")]);
    assert_eq!(got.status, 200);
    assert_eq!(got.body, b"part 1 of finished");
    for blob in [&parts[0].1, &records[0]] {
        assert!(cluster.replicas_holding(blob) >= 2, "{blob} stays");
    }
    assert_eq!(
        cluster.replicas_holding(&parts[1].1),
        0,
        "the unused part went"
    );
}

fn wait_for(done: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 30 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}
