//! A client for Larder's public blob API: streaming uploads and downloads of any size over one
//! HTTP/2 connection (TLS with ALPN h2, or h2c prior knowledge), so memory stays a few frames
//! whatever the blob.
//!
//! ```no_run
//! # async fn example() -> Result<(), larder_client::ClientError> {
//! let client = larder_client::Client::connect("http://127.0.0.1:8080").await?;
//! let stored = client.put(larder_client::bytes_body("hello"), Some(5)).await?;
//! let response = client.get(&stored.id).await?;
//! client.delete(&stored.id).await?;
//! # Ok(()) }
//! ```

mod transfer;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

pub use transfer::{
    create_output, get_into_file, get_to, open_upload, put_from, put_source, OutputFile, Progress,
    Upload,
};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A request body: a stream of bytes the client sends as it is produced.
pub type Body = BoxBody<Bytes, BoxError>;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("endpoint {0:?} is not an https://host[:port] or http://host:port URL (with no path)")]
    BadEndpoint(String),
    #[error("cannot reach {endpoint}: {detail}")]
    Connect { endpoint: String, detail: String },
    /// The whole chain of causes is in the message (hyper's own Display says only "http2 error").
    #[error("request failed: {}", larder_tls::error_chain(.0))]
    Transport(hyper::Error),
    /// A blob ID that cannot be one: it would not even make a request path.
    #[error("{0:?} is not a blob ID (IDs are letters, digits, '-' and '_', as `larder put` prints them)")]
    BadId(String),
    /// A local file or stream that cannot be uploaded or written, named by its path.
    #[error("{path}: {detail}")]
    File { path: String, detail: String },
    /// The server answered with an error status and (usually) a stable code.
    #[error("{status} {code}: {message}")]
    Api {
        status: StatusCode,
        code: String,
        message: String,
    },
    #[error("unexpected answer: {0}")]
    Protocol(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Tls(#[from] larder_tls::TlsError),
}

impl From<hyper::Error> for ClientError {
    fn from(e: hyper::Error) -> ClientError {
        ClientError::Transport(e)
    }
}

/// The request path of blob `id`. An ID is one path segment of URL-safe characters; anything else
/// is refused here, before it could become a malformed URI (or a different path).
pub fn blob_path(id: &str) -> Result<String, ClientError> {
    let url_safe = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if id.is_empty() || !id.chars().all(url_safe) {
        return Err(ClientError::BadId(id.to_owned()));
    }
    Ok(format!("/v1/blobs/{id}"))
}

/// What an upload stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub id: String,
    pub size: u64,
}

/// One HTTP/2 connection to a frontend; cheap to clone, many requests at once.
#[derive(Clone)]
pub struct Client {
    scheme: &'static str,
    authority: String,
    sender: SendRequest<Body>,
}

pub fn bytes_body(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

impl Client {
    /// Connects to `endpoint` (`http://host:port`) with HTTP/2 prior knowledge. Windows and
    /// frames are sized for multi-MiB transfers, like the frontend's own storage pool.
    pub async fn connect(endpoint: &str) -> Result<Client, ClientError> {
        Client::connect_with(endpoint, &larder_tls::ClientTls::default()).await
    }

    /// Connects to `endpoint`: `https://host[:port]` (TLS with `tls`'s trust and identity,
    /// HTTP/2 by ALPN) or `http://host:port` (HTTP/2 prior knowledge).
    pub async fn connect_with(
        endpoint: &str,
        tls: &larder_tls::ClientTls,
    ) -> Result<Client, ClientError> {
        let uri: Uri = endpoint
            .parse()
            .map_err(|_| ClientError::BadEndpoint(endpoint.into()))?;
        let (scheme, default_port) = match uri.scheme_str() {
            Some("https") => ("https", 443),
            Some("http") => ("http", 80),
            _ => return Err(ClientError::BadEndpoint(endpoint.into())),
        };
        let (Some(authority), Some(host)) = (uri.authority(), uri.host()) else {
            return Err(ClientError::BadEndpoint(endpoint.into()));
        };
        // Requests go to /v1/blobs at the root: a path here would be silently ignored.
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(ClientError::BadEndpoint(endpoint.into()));
        }
        let target = format!("{host}:{}", uri.port_u16().unwrap_or(default_port));
        let connect_error = |detail: String| ClientError::Connect {
            endpoint: endpoint.into(),
            detail,
        };
        let stream = tokio::net::TcpStream::connect(&target)
            .await
            .map_err(|e| connect_error(e.to_string()))?;
        stream.set_nodelay(true)?;
        let sender = if scheme == "https" {
            let stream = larder_tls::connect_h2(tls.config()?, host, stream)
                .await
                .map_err(|e| connect_error(format!("TLS: {e}")))?;
            handshake(stream).await
        } else {
            handshake(stream).await
        }
        .map_err(|e| connect_error(e.to_string()))?;
        Ok(Client {
            scheme,
            authority: authority.to_string(),
            sender,
        })
    }

    fn uri(&self, path: &str) -> String {
        format!("{}://{}{path}", self.scheme, self.authority)
    }

    async fn send(&self, request: Request<Body>) -> Result<Response<Incoming>, ClientError> {
        let response = self.sender.clone().send_request(request).await?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(api_error(response).await)
    }

    /// Uploads `body` (of `size` bytes, if known: sent as Content-Length). Returns the new ID.
    pub async fn put(&self, body: Body, size: Option<u64>) -> Result<Stored, ClientError> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(self.uri("/v1/blobs"));
        if let Some(size) = size {
            request = request.header(http::header::CONTENT_LENGTH, size);
        }
        let request = request
            .body(body)
            .expect("a request from a parsed endpoint and a fixed path is valid");
        let response = self.send(request).await?;
        let bytes = response.into_body().collect().await?.to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Protocol(format!("upload answer is not JSON: {e}")))?;
        match (json["id"].as_str(), json["size"].as_u64()) {
            (Some(id), Some(size)) => Ok(Stored {
                id: id.to_owned(),
                size,
            }),
            _ => Err(ClientError::Protocol(format!("upload answer {json}"))),
        }
    }

    /// Starts a download; the body streams as the caller reads it.
    pub async fn get(&self, id: &str) -> Result<Response<Incoming>, ClientError> {
        let request = Request::get(self.uri(&blob_path(id)?))
            .body(empty())
            .expect("blob_path makes a valid path of any ID it accepts");
        self.send(request).await
    }

    pub async fn delete(&self, id: &str) -> Result<(), ClientError> {
        let request = Request::delete(self.uri(&blob_path(id)?))
            .body(empty())
            .expect("blob_path makes a valid path of any ID it accepts");
        self.send(request).await.map(drop)
    }
}

/// The HTTP/2 handshake over `stream`, with windows and frames sized for multi-MiB transfers.
async fn handshake<S>(stream: S) -> Result<SendRequest<Body>, hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(4 << 20)
        .initial_connection_window_size(16 << 20)
        .max_frame_size(1 << 20)
        .max_send_buf_size(4 << 20)
        .handshake(TokioIo::new(stream))
        .await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// Turns an error answer (`{"error":{"code","message"}}`) into `ClientError::Api`.
async fn api_error(response: Response<Incoming>) -> ClientError {
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    ClientError::Api {
        status,
        code: text(&json["error"]["code"]),
        message: text(&json["error"]["message"]),
    }
}
