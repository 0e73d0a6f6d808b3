//! A real client on a real socket opens many streams and cancels each before the node can
//! accept it, as the frontend's pool does with hedged reads that lost their race.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const END_STREAM_AND_HEADERS: u8 = 0x5;
const ACK: u8 = 0x1;
const CANCEL: u32 = 0x8;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// Streams opened and cancelled in one burst: far above h2's default of 20 pending-accept
/// resets, well below the trusted default.
const CANCELLED_STREAMS: u32 = 400;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// HPACK literals without indexing or Huffman coding (all fields are shorter than 127 bytes).
fn get_headers() -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/internal/v1/health"),
        (":authority", "node"),
    ] {
        out.push(0);
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.push(value.len() as u8);
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// Serves one connection with `builder` and answers every request at once.
async fn serve_one(builder: auto::Builder<TokioExecutor>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let service = service_fn(|_| async {
            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new())))
        });
        let _ = builder
            .serve_connection(TokioIo::new(stream), service)
            .await;
    });
    addr
}

/// What the server did after the burst: `None` when it answered a PING on the same connection,
/// or the GOAWAY error code it closed the connection with.
async fn burst_of_cancelled_streams(addr: std::net::SocketAddr) -> Option<u32> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    let headers = get_headers();
    for i in 0..CANCELLED_STREAMS {
        let id = 2 * i + 1;
        out.extend(frame(HEADERS, END_STREAM_AND_HEADERS, id, &headers));
        out.extend(frame(RST_STREAM, 0, id, &CANCEL.to_be_bytes()));
    }
    out.extend(frame(PING, 0, 0, b"larder!!"));
    // One write: the server reads every frame before it gets to accept any stream.
    stream.write_all(&out).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut head = [0u8; 9];
        let read = tokio::time::timeout_at(deadline, stream.read_exact(&mut head)).await;
        let Ok(Ok(_)) = read else {
            panic!("the connection ended without a GOAWAY or a PING answer");
        };
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0; len];
        stream.read_exact(&mut payload).await.unwrap();
        match (head[3], head[4]) {
            (PING, ACK) => return None,
            (GOAWAY, _) => return Some(u32::from_be_bytes(payload[4..8].try_into().unwrap())),
            _ => {}
        }
    }
}

#[tokio::test]
async fn strict_connections_close_on_a_burst_of_cancelled_streams() {
    let addr = serve_one(connection_builder(&Http2Settings::default(), false)).await;
    assert_eq!(
        burst_of_cancelled_streams(addr).await,
        Some(ENHANCE_YOUR_CALM)
    );
}

#[tokio::test]
async fn trusted_connections_survive_a_burst_of_cancelled_streams() {
    let addr = serve_one(connection_builder(&Http2Settings::default(), true)).await;
    assert_eq!(burst_of_cancelled_streams(addr).await, None);
}
