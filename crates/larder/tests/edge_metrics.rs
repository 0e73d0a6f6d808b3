//! The frontend's edge metrics on /metrics, moved by real clients: open connections by protocol
//! and transport, accepts, refusals by the per-IP limit, failed and timed-out TLS handshakes, and
//! connections closed by the header-read and idle timeouts.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::time::{Duration, Instant};

use common::metrics::{scrape_frontend, value, wait_for};
use common::tls::{client_config, connect};
use common::{connect_from, Cluster};
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;

const H2_TLS: &str = r#"larder_frontend_client_connections{protocol="h2",transport="tls"}"#;
const H1_TLS: &str = r#"larder_frontend_client_connections{protocol="h1",transport="tls"}"#;
const H2_CLEARTEXT: &str =
    r#"larder_frontend_client_connections{protocol="h2",transport="cleartext"}"#;
const H1_CLEARTEXT: &str =
    r#"larder_frontend_client_connections{protocol="h1",transport="cleartext"}"#;
const ACCEPTED_TLS: &str = r#"larder_frontend_client_connections_accepted_total{transport="tls"}"#;
const REFUSED_PER_IP: &str =
    r#"larder_frontend_client_connections_refused_total{reason="per_ip_limit"}"#;
const HANDSHAKE_ERRORS: &str = r#"larder_frontend_tls_handshake_failures_total{reason="error"}"#;
const HANDSHAKE_TIMEOUTS: &str =
    r#"larder_frontend_tls_handshake_failures_total{reason="timeout"}"#;
const HEADER_READ_TIMEOUTS: &str =
    r#"larder_frontend_client_connections_timed_out_total{timeout="header_read"}"#;
const IDLE_TIMEOUTS: &str = r#"larder_frontend_client_connections_timed_out_total{timeout="idle"}"#;

#[test]
fn open_connections_are_counted_by_protocol_and_transport() {
    let cluster = Cluster::start_tls(3, 4, "");
    let scrape = || scrape_frontend(cluster.frontend_addr);
    let before = scrape().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ca = cluster.certs.as_ref().unwrap().ca_path();
    let tls_addr = cluster.tls_addr.unwrap();
    // One connection of each kind, each served one request and then held open. (The scrapes are
    // HTTP/1.1 on the cleartext port, so they count themselves there.)
    let held: Vec<Held> = rt.block_on(async {
        let h2_tls = connect(client_config(&ca, vec![b"h2".to_vec()], None), tls_addr);
        let h1_tls = connect(
            client_config(&ca, vec![b"http/1.1".to_vec()], None),
            tls_addr,
        );
        let h2c = tokio::net::TcpStream::connect(cluster.frontend_addr);
        vec![
            hold_h2(h2_tls.await.unwrap()).await,
            hold_h1(h1_tls.await.unwrap()).await,
            hold_h2(h2c.await.unwrap()).await,
        ]
    });
    let mut h1_cleartext = TcpStream::connect(cluster.frontend_addr).unwrap();
    get_healthz(&mut h1_cleartext);
    wait_for(
        scrape,
        &[
            (H2_TLS, 1.0),
            (H1_TLS, 1.0),
            (H2_CLEARTEXT, 1.0),
            (H1_CLEARTEXT, 2.0),
        ],
    );
    drop(held);
    drop(h1_cleartext);
    // (The harness's readiness probes were accepted before the held connections, so they are
    // in this count already.)
    let after = wait_for(
        scrape,
        &[
            (H2_TLS, 0.0),
            (H1_TLS, 0.0),
            (H2_CLEARTEXT, 0.0),
            (H1_CLEARTEXT, 1.0),
        ],
    );

    // A TCP probe that closes without a byte is not a failed handshake; a client speaking
    // plain HTTP to the TLS port is. Both are accepted connections.
    let errors = value(&before, HANDSHAKE_ERRORS).unwrap();
    let accepted = value(&after, ACCEPTED_TLS).unwrap();
    drop(TcpStream::connect(tls_addr).unwrap());
    let mut plain = TcpStream::connect(tls_addr).unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let _ = plain.read_to_end(&mut Vec::new());
    wait_for(
        scrape,
        &[
            (HANDSHAKE_ERRORS, errors + 1.0),
            (ACCEPTED_TLS, accepted + 2.0),
        ],
    );
}

#[test]
fn timeouts_close_connections_and_are_counted() {
    let limits = "[limits]\nheader_read_timeout = \"1s\"\nidle_timeout = \"2s\"\n";
    let cluster = Cluster::start_tls(3, 4, limits);
    let scrape = || scrape_frontend(cluster.frontend_addr);
    wait_for(
        scrape,
        &[
            (HEADER_READ_TIMEOUTS, 0.0),
            (IDLE_TIMEOUTS, 0.0),
            (HANDSHAKE_TIMEOUTS, 0.0),
        ],
    );
    // Connects and says nothing; sends half a request head; starts no TLS handshake.
    let silent = TcpStream::connect(cluster.frontend_addr).unwrap();
    let mut partial = TcpStream::connect(cluster.frontend_addr).unwrap();
    partial
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let silent_tls = TcpStream::connect(cluster.tls_addr.unwrap()).unwrap();
    // Served one request over h2c, then silent.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let idle = rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(cluster.frontend_addr).await;
        hold_h2(tcp.unwrap()).await
    });
    for stream in [silent, partial, silent_tls] {
        assert_closed_within(stream, Duration::from_secs(10));
    }
    wait_for(
        scrape,
        &[
            (HEADER_READ_TIMEOUTS, 2.0),
            (HANDSHAKE_TIMEOUTS, 1.0),
            (IDLE_TIMEOUTS, 1.0),
            (H2_CLEARTEXT, 0.0),
        ],
    );
    // The server counts the closure just before it drops the socket; give the client's
    // connection task a moment to read the end of the stream.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !idle.connection.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        idle.connection.is_finished(),
        "the idle h2c connection was not closed"
    );
}

#[test]
fn connections_over_the_per_ip_limit_are_refused_and_counted() {
    let cluster = Cluster::start_tls(3, 4, "[limits]\nmax_connections_per_ip = 2\n");
    let scrape = || scrape_frontend(cluster.frontend_addr);
    wait_for(scrape, &[(REFUSED_PER_IP, 0.0)]);
    // The scrapes come from 127.0.0.1; the greedy client from 127.0.0.2.
    let greedy: IpAddr = "127.0.0.2".parse().unwrap();
    let mut held: Vec<TcpStream> = (0..2)
        .map(|_| connect_from(greedy, cluster.frontend_addr))
        .collect();
    for stream in &mut held {
        get_healthz(stream);
    }
    let third = connect_from(greedy, cluster.frontend_addr);
    assert_closed_within(third, Duration::from_secs(5));
    // The greedy address is cut off; another address is still served.
    wait_for(scrape, &[(REFUSED_PER_IP, 1.0), (H1_CLEARTEXT, 3.0)]);
}

/// A client connection that has been served GET /healthz, kept open until dropped.
struct Held {
    connection: JoinHandle<()>,
    /// A connection with no sender left closes itself.
    _sender: Box<dyn std::any::Any + Send>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

async fn hold_h2<I>(io: I) -> Held
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake::<_, _, Empty<bytes::Bytes>>(
            TokioExecutor::new(),
            TokioIo::new(io),
        )
        .await
        .unwrap();
    let connection = tokio::spawn(async move {
        let _ = connection.await;
    });
    let response = sender.send_request(healthz()).await.unwrap();
    assert_eq!(response.status(), 200);
    Held {
        connection,
        _sender: Box::new(sender),
    }
}

async fn hold_h1<I>(io: I) -> Held
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Empty<bytes::Bytes>>(TokioIo::new(io))
            .await
            .unwrap();
    let connection = tokio::spawn(async move {
        let _ = connection.await;
    });
    let response = sender.send_request(healthz()).await.unwrap();
    assert_eq!(response.status(), 200);
    Held {
        connection,
        _sender: Box::new(sender),
    }
}

fn healthz() -> http::Request<Empty<bytes::Bytes>> {
    http::Request::get("/healthz")
        .header("host", "localhost")
        .body(Empty::new())
        .unwrap()
}

/// Sends GET /healthz over a raw keep-alive HTTP/1.1 connection and reads the answer's head.
fn get_healthz(stream: &mut TcpStream) {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "closed before answering");
        answer.extend_from_slice(&buf[..n]);
    }
    assert!(answer.starts_with(b"HTTP/1.1 200"));
}

/// The server closes `stream` (EOF or reset) within `limit`, without sending an HTTP answer.
fn assert_closed_within(mut stream: TcpStream, limit: Duration) {
    let started = Instant::now();
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut seen = Vec::new();
    match stream.read_to_end(&mut seen) {
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(err) => panic!("not closed after {:?}: {err}", started.elapsed()),
    }
    assert!(!seen.starts_with(b"HTTP/1.1 200"), "answered instead");
}
