//! Interoperability with real HTTP/2 clients other than curl, over TLS and cleartext: nghttp,
//! Python httpx (HTTP/2 via the h2 package) and h2load, all fetching the same blob.

mod common;

use std::process::Command;

use common::{curl, file_with, python, random_bytes, tool, Cluster};

fn cluster_with_blob() -> (Cluster, String, Vec<u8>) {
    let cluster = Cluster::start_tls(3, 4, "");
    let data = random_bytes(50_000);
    let file = format!("@{}", file_with(cluster.dir.path(), &data));
    let put = curl(
        cluster.dir.path(),
        &["--data-binary", &file, &cluster.url("/v1/blobs")],
    );
    assert_eq!(put.status, 201);
    let path = format!("/v1/blobs/{}", put.json()["id"].as_str().unwrap());
    (cluster, path, data)
}

#[test]
fn nghttp_over_h2c_and_tls() {
    let (cluster, path, data) = cluster_with_blob();
    for url in [cluster.url(&path), cluster.https_url(&path)] {
        // nghttp speaks h2c by prior knowledge on http:// and ALPN h2 on https://.
        let out = Command::new(tool("nghttp")).arg(&url).output().unwrap();
        assert!(
            out.status.success(),
            "nghttp {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, data, "nghttp {url}");
    }
}

#[test]
fn python_httpx_with_http2_over_h2c_and_tls() {
    let (cluster, path, data) = cluster_with_blob();
    let ca = cluster.certs.as_ref().unwrap().ca_path();
    let script = r#"
import sys, httpx
url, ca, mode = sys.argv[1], sys.argv[2], sys.argv[3]
# Cleartext: HTTP/2 by prior knowledge (http1=False); TLS: h2 offered in ALPN next to http/1.1.
kwargs = {"http1": False, "http2": True} if mode == "h2c" else {"http2": True, "verify": ca}
if mode == "h1":
    kwargs = {"http2": False, "verify": ca}
with httpx.Client(**kwargs) as client:
    r = client.get(url)
    sys.stdout.write(r.http_version + "\n")
    sys.stdout.flush()
    sys.stdout.buffer.write(r.content)
"#;
    for (url, mode, version) in [
        (cluster.url(&path), "h2c", "HTTP/2"),
        (cluster.https_url(&path), "tls", "HTTP/2"),
        (cluster.https_url(&path), "h1", "HTTP/1.1"),
    ] {
        let out = Command::new(python())
            .args(["-c", script, &url, &ca, mode])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "httpx {mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let split = out.stdout.iter().position(|&b| b == b'\n').unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout[..split]),
            version,
            "{mode}"
        );
        assert_eq!(out.stdout[split + 1..], data[..], "httpx {mode}");
    }
}

#[test]
fn h2load_over_every_protocol_and_port() {
    let (cluster, path, _) = cluster_with_blob();
    for (url, h1) in [
        (cluster.url(&path), false),
        (cluster.url(&path), true),
        (cluster.https_url(&path), false),
        (cluster.https_url(&path), true),
    ] {
        let mut command = Command::new(tool("h2load"));
        command.args(["-n", "200", "-c", "2", "-m", "10"]);
        if h1 {
            command.arg("--h1");
        }
        let out = command.arg(&url).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("200 succeeded") && text.contains("200 2xx"),
            "h2load {url} (h1: {h1}):\n{text}"
        );
        let protocol = if h1 { "http/1.1" } else { "h2" };
        assert!(
            text.contains(&format!("Application protocol: {protocol}"))
                || !url.starts_with("https"),
            "h2load {url} negotiated something else:\n{text}"
        );
    }
}
