//! The caps a visit runs under, seen by a client: a frontend takes at most
//! `[documents] max_concurrent_visits` visits at once and answers 429 beyond (Vespa's feed and
//! visit clients back off on it), and a visit whose partitions lack a quorum of answering
//! replicas ends in 504 ("operation timed out", as Vespa answers) at the operation timeout,
//! never hangs. Two of three storage nodes are
//! stopped (SIGSTOP) so that visits in progress stay in progress.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::h2::H2Client;
use common::Cluster;
use http::{Method, StatusCode};

const SIGSTOP: i32 = 19;
const SIGCONT: i32 = 18;
const VISIT: &str = "/document/v1/ns/t/docid?wantedDocumentCount=10";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visits_beyond_the_cap_get_429_and_a_visit_without_a_quorum_times_out_with_504() {
    let frontend = "[documents]\nmax_concurrent_visits = 2\n\
                    [router]\noperation_timeout = \"6s\"\nrequest_timeout = \"6s\"\n";
    let cluster = Cluster::start_with(3, 4, frontend);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let (status, _) = client
        .request(
            Method::POST,
            "/document/v1/ns/t/docid/one",
            Bytes::from_static(br#"{"fields":{"n":1}}"#),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = client.request(Method::GET, VISIT, Bytes::new()).await;
    assert_eq!(status, StatusCode::OK, "a visit of a healthy cluster");

    cluster.signal_node(1, SIGSTOP);
    cluster.signal_node(2, SIGSTOP);
    let started = Instant::now();
    let stuck: Vec<_> = (0..2)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.request(Method::GET, VISIT, Bytes::new()).await })
        })
        .collect();
    // Both visits take their slots at once; give a busy machine time to deliver them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, body) = client.request(Method::GET, VISIT, Bytes::new()).await;
    let text = String::from_utf8_lossy(&body);
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "a third visit: {text}"
    );
    assert!(text.contains("too many visits"), "{text}");

    for visit in stuck {
        let (status, body) = visit.await.expect("the visit task");
        assert_eq!(
            status,
            StatusCode::GATEWAY_TIMEOUT,
            "a visit with one replica of three answering: {}",
            String::from_utf8_lossy(&body)
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "visits without a quorum ended by the operation timeout, not hung: {:?}",
        started.elapsed()
    );

    cluster.signal_node(1, SIGCONT);
    cluster.signal_node(2, SIGCONT);
    let (status, body) = client.request(Method::GET, VISIT, Bytes::new()).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "slots are given back: {}",
        String::from_utf8_lossy(&body)
    );
    let answer: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(answer["documentCount"], 1);
}
