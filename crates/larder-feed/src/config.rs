//! What a feed needs to know, validated once before it starts.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

/// Receives error messages as they happen (see [`FeedConfig::on_error`]).
pub type ErrorSink = Arc<dyn Fn(&str) + Send + Sync>;

/// Why a feed could not start.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error("bad endpoint {0}")]
    BadEndpoint(String),
    #[error("bad header {0}")]
    BadHeader(String),
    #[error("{0}")]
    Connect(String),
}

/// Whether request bodies are gzipped (vespa-feed-client's `--compression`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// Bodies go as they are: the least client CPU (the default here; vespa-feed-client's is
    /// `Auto`).
    #[default]
    None,
    /// Every body with content is gzipped.
    Gzip,
    /// Bodies over 512 bytes are gzipped, as vespa-feed-client does by default.
    Auto,
}

impl Compression {
    /// Whether a body of `len` bytes is sent gzipped.
    pub fn applies_to(self, len: usize) -> bool {
        match self {
            Compression::None => false,
            Compression::Gzip => len > 0,
            Compression::Auto => len > 512,
        }
    }
}

/// Settings of one feed. Build with [`FeedConfig::new`], then adjust the public fields.
#[derive(Clone)]
pub struct FeedConfig {
    /// The endpoint's addresses, tried in order when a connection opens (`localhost` may be
    /// `::1` and `127.0.0.1`, with the server on only one).
    pub(crate) addrs: Vec<SocketAddr>,
    pub(crate) authority: String,
    /// `https` or `http`: TLS with ALPN h2, or HTTP/2 with prior knowledge.
    pub(crate) scheme: &'static str,
    /// The host part of the authority, which a TLS server's certificate must name.
    pub(crate) host: String,
    /// The endpoint's path prefix without a trailing `/` (usually empty).
    pub(crate) base_path: String,
    /// HTTP/2 connections to open (vespa-feed-client: `--connections`).
    pub connections: usize,
    /// Streams each connection may carry at once; with `connections` it bounds the operations in
    /// flight (vespa-feed-client: `--max-streams-per-connection`).
    pub max_streams_per_connection: usize,
    /// Deadline of each operation, retries included (`--timeout`).
    pub timeout: Duration,
    /// Retries of one operation after 503 or a transport error (429 is retried until the deadline,
    /// as the server asks to slow down, not to give up).
    pub max_retries: u32,
    /// Extra request headers (`--header`).
    pub headers: HeaderMap,
    /// Gzip request bodies (`--compression`).
    pub compression: Compression,
    /// Print a progress line to stderr every second.
    pub progress: bool,
    /// Called with every error as it happens: malformed input (with its line) and failed operations.
    pub on_error: Option<ErrorSink>,
    /// Whom to trust and what to present on an `https://` endpoint.
    pub tls: larder_tls::ClientTls,
}

impl FeedConfig {
    /// A config with defaults for `endpoint`, an `https://host[:port][/path]` URL (TLS, HTTP/2 by
    /// ALPN) or an `http://` one (HTTP/2 with prior knowledge).
    pub fn new(endpoint: &str) -> Result<FeedConfig, FeedError> {
        let bad = |why: &str| FeedError::BadEndpoint(format!("{endpoint:?}: {why}"));
        let (scheme, default_port, rest) = if let Some(rest) = endpoint.strip_prefix("https://") {
            ("https", 443, rest)
        } else if let Some(rest) = endpoint.strip_prefix("http://") {
            ("http", 80, rest)
        } else {
            return Err(bad("expected an https:// or http:// URL"));
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.is_empty() {
            return Err(bad("no host"));
        }
        let with_port = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            authority.to_string()
        } else {
            format!("{authority}:{default_port}")
        };
        let host = match with_port.rsplit_once(':') {
            Some((host, _)) => host.to_string(),
            None => authority.to_string(),
        };
        let addrs: Vec<SocketAddr> = with_port
            .to_socket_addrs()
            .map_err(|e| bad(&format!("cannot resolve: {e}")))?
            .collect();
        if addrs.is_empty() {
            return Err(bad("resolves to no address"));
        }
        Ok(FeedConfig {
            addrs,
            authority: authority.to_string(),
            scheme,
            host,
            base_path: format!("/{}", path.trim_matches('/'))
                .trim_end_matches('/')
                .to_string(),
            connections: 4,
            max_streams_per_connection: 256,
            timeout: Duration::from_secs(60),
            max_retries: 10,
            headers: HeaderMap::new(),
            compression: Compression::None,
            progress: false,
            on_error: None,
            tls: larder_tls::ClientTls::default(),
        })
    }

    /// Adds a header given as `Name: value`.
    pub fn add_header(&mut self, text: &str) -> Result<(), FeedError> {
        let bad = || FeedError::BadHeader(format!("{text:?} (expected \"Name: value\")"));
        let (name, value) = text.split_once(':').ok_or_else(bad)?;
        let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| bad())?;
        let value = HeaderValue::from_str(value.trim()).map_err(|_| bad())?;
        self.headers.append(name, value);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_headers() {
        let c = FeedConfig::new("http://127.0.0.1:8080/").unwrap();
        assert_eq!(
            (
                c.addrs[0].port(),
                c.authority.as_str(),
                c.base_path.as_str()
            ),
            (8080, "127.0.0.1:8080", "")
        );
        let c = FeedConfig::new("http://127.0.0.1:9/prefix/").unwrap();
        assert_eq!(c.base_path, "/prefix");
        let c = FeedConfig::new("https://localhost/").unwrap();
        assert_eq!(
            (c.scheme, c.host.as_str(), c.addrs[0].port()),
            ("https", "localhost", 443)
        );
        let c = FeedConfig::new("https://[::1]:8443").unwrap();
        assert_eq!((c.host.as_str(), c.addrs[0].port()), ("[::1]", 8443));
        assert!(FeedConfig::new("ftp://127.0.0.1:8080/").is_err());
        assert!(FeedConfig::new("http:///").is_err());
        let mut c = FeedConfig::new("http://127.0.0.1:1").unwrap();
        c.add_header("Authorization: Bearer x").unwrap();
        assert_eq!(c.headers["authorization"], "Bearer x");
        assert!(c.add_header("no colon").is_err());
    }
}
