//! A pool connection outlives any number of cancelled requests.
//!
//! The frontend cancels requests all the time (the slower replica of a hedged read, a client
//! that went away). Each cancel resets the stream, and the storage node's frames for it may
//! already be on the wire. h2 remembers only a few reset streams (10 by default); frames for a
//! forgotten one count as a protocol error of the peer, and after 1,024 of those over the
//! connection's whole life h2 closes it with GOAWAY, failing every request in flight on it. Seen
//! in B6 (16,384 connections of GETs): 784 non-2xx answers.
//!
//! The server here is a few lines of raw HTTP/2 frames, so that its answer to a reset stream is
//! exactly the worst case: the response's DATA frame arrives after the client has reset it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use larder_pool::{empty, PoolConfig, StoragePool};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

const SETTINGS: u8 = 4;
const PING: u8 = 6;
const HEADERS: u8 = 1;
const DATA: u8 = 0;
const ACK: u8 = 1;
const END_STREAM: u8 = 1;
const END_HEADERS: u8 = 4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// Answers every request with `200` at once and its body `DATA_DELAY` later, whatever the
/// client did with the stream in between.
async fn serve(socket: TcpStream) -> std::io::Result<()> {
    const DATA_DELAY: Duration = Duration::from_millis(100);
    let (mut rd, wr) = socket.into_split();
    let wr = Arc::new(Mutex::new(wr));
    let mut preface = [0u8; 24];
    rd.read_exact(&mut preface).await?;
    wr.lock()
        .await
        .write_all(&frame(SETTINGS, 0, 0, &[]))
        .await?;
    loop {
        let mut head = [0u8; 9];
        rd.read_exact(&mut head).await?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        rd.read_exact(&mut payload).await?;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let reply = match (head[3], head[4] & ACK) {
            (SETTINGS, 0) => frame(SETTINGS, ACK, 0, &[]),
            (PING, 0) => frame(PING, ACK, 0, &payload),
            // 0x88: `:status: 200`, entry 8 of HPACK's static table.
            (HEADERS, _) => frame(HEADERS, END_HEADERS, stream, &[0x88]),
            _ => continue,
        };
        wr.lock().await.write_all(&reply).await?;
        if head[3] == HEADERS {
            let wr = wr.clone();
            tokio::spawn(async move {
                tokio::time::sleep(DATA_DELAY).await;
                let data = frame(DATA, END_STREAM, stream, b"late body");
                let _ = wr.lock().await.write_all(&data).await;
            });
        }
    }
}

#[tokio::test]
async fn a_connection_survives_thousands_of_cancelled_requests() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(socket));
        }
    });
    let cfg = PoolConfig {
        connections_per_node: 1,
        ..PoolConfig::default()
    };
    let pool = StoragePool::new([("s1".to_owned(), addr)], cfg, None).unwrap();

    // 15 rounds of 100 requests whose responses are dropped at their headers: 1,500 resets,
    // and 1,500 late DATA frames for them.
    for round in 0..15 {
        let requests = (0..100).map(|_| {
            let pool = pool.clone();
            async move {
                let request = http::Request::get("/late").body(empty()).unwrap();
                pool.send("s1", request).await.map(drop)
            }
        });
        for outcome in futures_join_all(requests).await {
            outcome.unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the last round's late frames arrive, then one more request on the same connection.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let request = http::Request::get("/after").body(empty()).unwrap();
    pool.send("s1", request).await.unwrap();
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "the pool had to reconnect: its connection was closed under it"
    );
}

/// `join_all` without another dependency: spawn each and await them in order.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.expect("request task"));
    }
    out
}
