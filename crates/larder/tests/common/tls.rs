//! TLS clients for tests: rustls configs with a chosen ALPN offer and identity, the certificate a
//! server presents, and GETs over a fresh mutual-TLS HTTP/2 connection (the storage nodes').
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use larder_tls::rustls::pki_types::{CertificateDer, ServerName};
use larder_tls::rustls::{ClientConfig, RootCertStore};
use larder_tls::{load_certs, load_key, TlsConnector};

use super::certs::ClusterCerts;

/// A client trusting the CA file `ca`, offering `alpn`, presenting `identity` (cert, key) if any.
pub fn client_config(
    ca: &str,
    alpn: Vec<Vec<u8>>,
    identity: Option<(PathBuf, PathBuf)>,
) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(Path::new(ca)).unwrap() {
        roots.add(cert).unwrap();
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(larder_tls::provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(&cert).unwrap(), load_key(&key).unwrap())
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn;
    config
}

/// The frontend's storage-client certificate and key: what a cluster member presents.
pub fn member_identity(certs: &ClusterCerts) -> (PathBuf, PathBuf) {
    (
        certs.dir.join("frontend-client.pem"),
        certs.dir.join("frontend-client-key.pem"),
    )
}

pub async fn connect(
    config: ClientConfig,
    addr: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::IpAddress(addr.ip().into());
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// The leaf certificate `addr` presents to a new connection made with `config` (a fresh config
/// each time, so nothing is resumed).
pub fn served_certificate(config: ClientConfig, addr: SocketAddr) -> CertificateDer<'static> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tls = connect(config, addr).await.unwrap();
        tls.get_ref().1.peer_certificates().unwrap()[0]
            .clone()
            .into_owned()
    })
}

/// GET `path` over h2 on a fresh mutual-TLS connection: status and body, or why not.
pub async fn internal_get(
    config: ClientConfig,
    addr: SocketAddr,
    path: &str,
) -> Result<(u16, String), String> {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let tls = connect(config, addr).await.map_err(|e| e.to_string())?;
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake::<_, _, Empty<bytes::Bytes>>(
            TokioExecutor::new(),
            TokioIo::new(tls),
        )
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let request = http::Request::get(format!("https://{addr}{path}"))
        .body(Empty::new())
        .unwrap();
    let exchange = async {
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, hyper::Error>((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())
}
