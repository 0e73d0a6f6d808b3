//! The future of one request through the pool is moved into a box for every replica of every
//! frontend request (`larder-router`'s `Replies`), and the copy shows in the frontend's
//! profile under PUT. An async fn is as large as its largest state: connecting (TCP, TLS and
//! HTTP/2 handshakes) inline made it 8.5 KiB; boxed, the path every request takes was ~2 KiB
//! (2,128 bytes in this test). Retrying a request on another connection is rare too: boxed as
//! well, what is left is 1,464 bytes (a request, a sender and hyper's send future).

use larder_pool::{PoolConfig, StoragePool};

#[tokio::test]
async fn a_request_future_does_not_carry_the_connect_path() {
    let addr = "127.0.0.1:1".parse().expect("an address");
    let pool =
        StoragePool::new([("s1".to_owned(), addr)], PoolConfig::default(), None).expect("a pool");
    let request = http::Request::get("/x")
        .body(larder_pool::empty())
        .expect("a request");
    let send = pool.send("s1", request);
    let size = std::mem::size_of_val(&send);
    assert!(size <= 1792, "pool.send's future is {size} bytes");
}
