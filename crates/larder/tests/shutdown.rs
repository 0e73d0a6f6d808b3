//! Graceful shutdown of the frontend, as a client sees it: on SIGTERM an upload in flight on an
//! HTTP/2 connection completes, the connection gets GOAWAY (new streams are refused), new
//! connections are refused, and the process exits cleanly.

mod common;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Channel, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};

use common::{signal, wait_timeout, Cluster};

#[test]
fn sigterm_finishes_in_flight_uploads_then_refuses_new_work() {
    let mut cluster = Cluster::start(3, 4);
    let addr = cluster.frontend_addr;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .unwrap();
        tokio::spawn(connection);
        // A slow upload: half the body now, the rest after the server was told to stop.
        let (mut body_tx, body) = Channel::<Bytes, Infallible>::new(4);
        let upload = http::Request::post(format!("http://{addr}/v1/blobs"))
            .header("content-length", "2048")
            .body(body.boxed())
            .unwrap();
        let mut upload_sender = sender.clone();
        let in_flight = tokio::spawn(async move { upload_sender.send_request(upload).await });
        body_tx
            .send_data(Bytes::from(vec![1u8; 1024]))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;

        signal(cluster.frontend_mut(), 15);

        // GOAWAY: a new stream on the same connection is refused...
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let probe = http::Request::get(format!("http://{addr}/healthz"))
                .body(Empty::<Bytes>::new().map_err(|n| match n {}).boxed())
                .unwrap();
            if sender.clone().send_request(probe).await.is_err() {
                break;
            }
            assert!(Instant::now() < deadline, "no GOAWAY after SIGTERM");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // ...and so is a new connection.
        let deadline = Instant::now() + Duration::from_secs(5);
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            assert!(Instant::now() < deadline, "still accepting after SIGTERM");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The upload in flight finishes and is acknowledged.
        body_tx
            .send_data(Bytes::from(vec![2u8; 1024]))
            .await
            .unwrap();
        drop(body_tx);
        let response = in_flight.await.unwrap().expect("in-flight upload answered");
        assert_eq!(response.status(), 201);
        let json = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(json["size"], 2048);
    });
    let status = wait_timeout(cluster.frontend_mut(), Duration::from_secs(15))
        .expect("frontend exits after its in-flight work");
    assert!(status.success(), "{status}");
}
