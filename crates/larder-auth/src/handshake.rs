//! The per-connection mutual challenge-response handshake, run before the first HTTP byte.
//!
//! ```text
//! server → client  MAGIC (8) ‖ server nonce (32)
//! client → server  MAGIC (8) ‖ client nonce (32) ‖ HMAC(secret, CLIENT_LABEL ‖ sn ‖ cn) (32)
//! server → client  HMAC(matching secret, SERVER_LABEL ‖ sn ‖ cn) (32)
//! ```
//!
//! Every message has a fixed size and the whole exchange a deadline, so a silent or slow peer
//! pins nothing. Both nonces are fresh per connection: a recorded exchange proves nothing on a
//! new one. A failure on either side ends with the connection dropped, never an answer.

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{AuthError, Secret, Secrets};

/// Protocol name and version; a peer sending anything else is refused.
pub const MAGIC: &[u8; 8] = b"LARDRA1\n";
/// How long a whole handshake may take (both sides) before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

const NONCE_LEN: usize = 32;
const PROOF_LEN: usize = 32;
const CLIENT_LABEL: &[u8] = b"larder-internal-v1 client";
const SERVER_LABEL: &[u8] = b"larder-internal-v1 server";

type Nonce = [u8; NONCE_LEN];
type HmacSha256 = Hmac<Sha256>;

/// The server side: challenges the client, and proves itself only to a client that proved it
/// holds one of `secrets.accepted()`.
pub async fn accept<S>(io: &mut S, secrets: &Secrets, timeout: Duration) -> Result<(), AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    tokio::time::timeout(timeout, accept_inner(io, secrets))
        .await
        .map_err(|_| AuthError::Timeout(timeout))?
}

/// The client side: proves it holds `secrets.signing()` and checks that the server holds it too.
pub async fn connect<S>(io: &mut S, secrets: &Secrets, timeout: Duration) -> Result<(), AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    tokio::time::timeout(timeout, connect_inner(io, secrets.signing()))
        .await
        .map_err(|_| AuthError::Timeout(timeout))?
}

async fn accept_inner<S>(io: &mut S, secrets: &Secrets) -> Result<(), AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let server_nonce: Nonce = rand::random();
    let mut hello = [0u8; 8 + NONCE_LEN];
    hello[..8].copy_from_slice(MAGIC);
    hello[8..].copy_from_slice(&server_nonce);
    io.write_all(&hello).await?;
    io.flush().await?;
    let mut answer = [0u8; 8 + NONCE_LEN + PROOF_LEN];
    io.read_exact(&mut answer).await?;
    let (magic, rest) = answer.split_at(8);
    let (client_nonce, proof) = rest.split_at(NONCE_LEN);
    if magic != MAGIC {
        return Err(AuthError::BadMagic);
    }
    let secret = secrets
        .accepted()
        .iter()
        .find(|secret| {
            mac(secret, CLIENT_LABEL, &server_nonce, client_nonce)
                .verify_slice(proof)
                .is_ok()
        })
        .ok_or(AuthError::Refused)?;
    let reply = mac(secret, SERVER_LABEL, &server_nonce, client_nonce).finalize();
    io.write_all(&reply.into_bytes()).await?;
    io.flush().await?;
    Ok(())
}

async fn connect_inner<S>(io: &mut S, secret: &Secret) -> Result<(), AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut hello = [0u8; 8 + NONCE_LEN];
    io.read_exact(&mut hello).await?;
    let (magic, server_nonce) = hello.split_at(8);
    if magic != MAGIC {
        return Err(AuthError::BadMagic);
    }
    let client_nonce: Nonce = rand::random();
    io.write_all(&client_message(secret, server_nonce, &client_nonce))
        .await?;
    io.flush().await?;
    let mut proof = [0u8; PROOF_LEN];
    io.read_exact(&mut proof).await?;
    mac(secret, SERVER_LABEL, server_nonce, &client_nonce)
        .verify_slice(&proof)
        .map_err(|_| AuthError::Refused)
}

fn client_message(secret: &Secret, server_nonce: &[u8], client_nonce: &Nonce) -> Vec<u8> {
    let proof = mac(secret, CLIENT_LABEL, server_nonce, client_nonce).finalize();
    [MAGIC.as_slice(), client_nonce, &proof.into_bytes()].concat()
}

/// HMAC-SHA256 over a fixed-length label and the two fixed-length nonces: no ambiguity in
/// where one ends, and a server's proof can never pass as a client's.
fn mac(secret: &Secret, label: &[u8], server_nonce: &[u8], client_nonce: &[u8]) -> HmacSha256 {
    let mut mac =
        HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(label);
    mac.update(server_nonce);
    mac.update(client_nonce);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tokio::io::{duplex, DuplexStream};

    const T: Duration = Duration::from_secs(2);

    fn secrets(keys: &[u8]) -> Secrets {
        let mut all = keys.iter().map(|k| Secret::from_bytes([*k; 32]));
        Secrets::new(all.next().unwrap(), all)
    }

    /// Runs both sides; each drops its end when done, as a real connection would be closed.
    async fn run(
        client: &Secrets,
        server: &Secrets,
    ) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let (mut c, mut s) = duplex(1024);
        let server = async move {
            let result = accept(&mut s, server, T).await;
            drop(s);
            result
        };
        let client = async move {
            let result = connect(&mut c, client, T).await;
            drop(c);
            result
        };
        tokio::join!(client, server)
    }

    #[tokio::test]
    async fn the_right_secret_authenticates_both_sides() {
        let (client, server) = run(&secrets(&[1]), &secrets(&[1])).await;
        client.unwrap();
        server.unwrap();
    }

    #[tokio::test]
    async fn a_wrong_secret_is_refused_and_learns_nothing() {
        let (client, server) = run(&secrets(&[2]), &secrets(&[1])).await;
        assert!(matches!(server, Err(AuthError::Refused)), "{server:?}");
        // The server closed without proving anything.
        assert!(matches!(client, Err(AuthError::Io(_))), "{client:?}");
    }

    #[tokio::test]
    async fn rotation_accepts_old_and_new_while_both_are_listed() {
        let server = secrets(&[1, 2]);
        for client in [secrets(&[1]), secrets(&[2]), secrets(&[2, 1])] {
            let (c, s) = run(&client, &server).await;
            c.unwrap();
            s.unwrap();
        }
        let (c, s) = run(&secrets(&[1]), &secrets(&[2])).await;
        assert!(c.is_err() && s.is_err());
    }

    #[tokio::test]
    async fn the_client_refuses_an_impostor_server() {
        // An impostor that accepts anything but does not hold the secret cannot prove itself.
        let (mut c, mut s) = duplex(1024);
        let impostor = async move {
            s.write_all(&[MAGIC.as_slice(), &[7; 32]].concat())
                .await
                .unwrap();
            let mut answer = [0u8; 72];
            s.read_exact(&mut answer).await.unwrap();
            s.write_all(&[9; 32]).await.unwrap();
            s
        };
        let ours = secrets(&[1]);
        let (client, _s) = tokio::join!(connect(&mut c, &ours, T), impostor);
        assert!(matches!(client, Err(AuthError::Refused)), "{client:?}");
    }

    /// Reads a server's hello from `s`, as a client would.
    async fn server_nonce(c: &mut DuplexStream) -> Vec<u8> {
        let mut hello = [0u8; 40];
        c.read_exact(&mut hello).await.unwrap();
        hello[8..].to_vec()
    }

    #[tokio::test]
    async fn a_replayed_client_message_is_refused_on_a_new_connection() {
        let server_secrets = secrets(&[1]);
        // First connection: a genuine client message, recorded.
        let (mut c, mut s) = duplex(1024);
        let server = tokio::spawn({
            let secrets = server_secrets.clone();
            async move { accept(&mut s, &secrets, T).await }
        });
        let nonce = server_nonce(&mut c).await;
        let recorded = client_message(server_secrets.signing(), &nonce, &[5; 32]);
        c.write_all(&recorded).await.unwrap();
        server.await.unwrap().unwrap();
        // Second connection: the same bytes against a fresh server nonce.
        let (mut c, mut s) = duplex(1024);
        let server = tokio::spawn(async move { accept(&mut s, &server_secrets, T).await });
        let _ = server_nonce(&mut c).await;
        c.write_all(&recorded).await.unwrap();
        let result = server.await.unwrap();
        assert!(matches!(result, Err(AuthError::Refused)), "{result:?}");
    }

    #[tokio::test]
    async fn a_silent_client_times_out() {
        let (_c, mut s) = duplex(1024);
        let started = std::time::Instant::now();
        let result = accept(&mut s, &secrets(&[1]), Duration::from_millis(100)).await;
        assert!(matches!(result, Err(AuthError::Timeout(_))), "{result:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_silent_server_times_out() {
        let (mut c, _s) = duplex(1024);
        let result = connect(&mut c, &secrets(&[1]), Duration::from_millis(100)).await;
        assert!(matches!(result, Err(AuthError::Timeout(_))), "{result:?}");
    }

    #[tokio::test]
    async fn garbage_is_refused_both_ways() {
        // An HTTP/2 client's preface where the handshake should be.
        let (mut c, mut s) = duplex(1024);
        let server = tokio::spawn(async move { accept(&mut s, &secrets(&[1]), T).await });
        let _ = server_nonce(&mut c).await;
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".repeat(3);
        c.write_all(&preface[..72]).await.unwrap();
        let result = server.await.unwrap();
        assert!(matches!(result, Err(AuthError::BadMagic)), "{result:?}");
        // A plain HTTP server answering where the handshake should be.
        let (mut c, mut s) = duplex(1024);
        s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n0123456789ab")
            .await
            .unwrap();
        let result = connect(&mut c, &secrets(&[1]), T).await;
        assert!(matches!(result, Err(AuthError::BadMagic)), "{result:?}");
    }

    proptest! {
        /// Whatever 72 bytes a client sends, a server without the secret's help never accepts.
        #[test]
        fn arbitrary_client_bytes_are_never_accepted(bytes in proptest::collection::vec(any::<u8>(), 72)) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let result = runtime.block_on(async {
                let (mut c, mut s) = duplex(1024);
                let server = tokio::spawn(async move { accept(&mut s, &secrets(&[1]), T).await });
                let _ = server_nonce(&mut c).await;
                c.write_all(&bytes).await.unwrap();
                server.await.unwrap()
            });
            prop_assert!(result.is_err());
        }
    }
}
