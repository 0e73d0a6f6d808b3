//! Reading Prometheus / OpenMetrics text the way a scraper would, and waiting for a series to
//! reach a value.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The value of one series, written as it appears in the exposition:
/// `name{label="value",...}` (labels in the order the server writes them). `None` if absent.
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// GET /metrics over a fresh cleartext HTTP/1.1 connection that closes after the answer (so the
/// scrape itself is an `h1`/`cleartext` connection while it runs). `None` if the connection was
/// refused or cut short.
pub fn scrape_frontend(addr: SocketAddr) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let request = "GET /metrics HTTP/1.1\r\nHost: larder\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// Scrapes with `scrape` until every `(series, value)` holds; panics with the last text after
/// 20 s.
pub fn wait_for(mut scrape: impl FnMut() -> Option<String>, expected: &[(&str, f64)]) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = scrape().unwrap_or_default();
        if expected
            .iter()
            .all(|(series, want)| value(&text, series) == Some(*want))
        {
            return text;
        }
        if Instant::now() > deadline {
            let seen: Vec<_> = expected
                .iter()
                .map(|(series, want)| {
                    format!("{series}: want {want}, got {:?}", value(&text, series))
                })
                .collect();
            panic!(
                "metrics never reached the expected values:\n{}",
                seen.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
