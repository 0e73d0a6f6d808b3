//! A small Rust HTTP/2 (prior knowledge) client for tests: one connection, many concurrent streams.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

#[derive(Clone)]
pub struct H2Client {
    addr: SocketAddr,
    sender: SendRequest<Full<Bytes>>,
}

impl H2Client {
    pub async fn connect(addr: SocketAddr) -> H2Client {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        Self::over(addr, stream).await
    }

    /// A connection to a storage node's internal port that first proves the cluster secret in
    /// `secret_file` (larder-auth's handshake), as the frontend's pool does.
    pub async fn connect_authenticated(addr: SocketAddr, secret_file: &Path) -> H2Client {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let secrets = larder_auth::Secrets::load(secret_file).unwrap();
        larder_auth::connect(&mut stream, &secrets, larder_auth::HANDSHAKE_TIMEOUT)
            .await
            .unwrap();
        Self::over(addr, stream).await
    }

    async fn over(addr: SocketAddr, stream: tokio::net::TcpStream) -> H2Client {
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(connection);
        H2Client { addr, sender }
    }

    pub async fn request(&self, method: Method, path: &str, body: Bytes) -> (StatusCode, Bytes) {
        let request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .body(Full::new(body))
            .unwrap();
        let response = self.sender.clone().send_request(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, body)
    }

    /// Like `request`, with failures as errors: the request's (a stream reset before the
    /// answer), or its body's (a stream reset mid-way).
    pub async fn request_to_end(
        &self,
        method: Method,
        path: &str,
    ) -> Result<(StatusCode, Result<Bytes, String>), String> {
        let request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = self.sender.clone().send_request(request).await;
        let response = response.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response.into_body().collect().await;
        Ok((
            status,
            body.map(|b| b.to_bytes()).map_err(|e| e.to_string()),
        ))
    }

    /// Sends `request` as built (its URI's path; headers included) and reads the whole answer.
    pub async fn send(
        &self,
        request: Request<Full<Bytes>>,
    ) -> (StatusCode, http::HeaderMap, Bytes) {
        let response = self.sender.clone().send_request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        (parts.status, parts.headers, body)
    }

    /// Uploads `data`; returns the status and, on 201, the new ID.
    pub async fn put(&self, data: Bytes) -> (StatusCode, Option<String>, serde_json::Value) {
        let (status, body) = self.request(Method::POST, "/v1/blobs", data).await;
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let id = json["id"].as_str().map(str::to_owned);
        (status, id, json)
    }

    pub async fn get(&self, id: &str) -> (StatusCode, Bytes) {
        self.request(Method::GET, &format!("/v1/blobs/{id}"), Bytes::new())
            .await
    }
}
