//! Telling HTTP/2 prior knowledge from HTTP/1.1 by a connection's first bytes. hyper-util's
//! `auto` builder can do this itself, but then nobody outside it learns which protocol it chose;
//! doing it here lets the edge count connections by protocol and bound the wait for the first
//! bytes by the header-read timeout. The rule is hyper-util's: HTTP/2 exactly when the bytes are
//! the 24-byte client preface, HTTP/1.1 as soon as one byte differs.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a client connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    H1,
    H2,
}

impl Protocol {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Protocol::H1 => "h1",
            Protocol::H2 => "h2",
        }
    }
}

/// Reads until the bytes so far are the whole HTTP/2 preface or differ from it, and returns the
/// protocol with an I/O object that replays those bytes. `None` when the client closed first.
pub(crate) async fn sniff<I>(mut io: I) -> io::Result<Option<(Protocol, Rewind<I>)>>
where
    I: AsyncRead + Unpin,
{
    let mut buf = [0u8; H2_PREFACE.len()];
    let mut filled = 0;
    let protocol = loop {
        let n = io.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Ok(None);
        }
        filled += n;
        if buf[..filled] != H2_PREFACE[..filled] {
            break Protocol::H1;
        }
        if filled == H2_PREFACE.len() {
            break Protocol::H2;
        }
    };
    let rewind = Rewind {
        prefix: buf,
        start: 0,
        end: filled,
        inner: io,
    };
    Ok(Some((protocol, rewind)))
}

/// An I/O object whose reads return the sniffed bytes first.
pub(crate) struct Rewind<I> {
    prefix: [u8; H2_PREFACE.len()],
    start: usize,
    end: usize,
    inner: I,
}

impl<I: AsyncRead + Unpin> AsyncRead for Rewind<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.start < self.end {
            let n = (self.end - self.start).min(buf.remaining());
            let start = self.start;
            buf.put_slice(&self.prefix[start..start + n]);
            self.start += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Rewind<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn check(sent: &[&[u8]], expected: Option<Protocol>) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let (mut client, server) = tokio::io::duplex(1024);
            for piece in sent {
                client.write_all(piece).await.unwrap();
            }
            drop(client);
            let sniffed = sniff(server).await.unwrap();
            assert_eq!(sniffed.as_ref().map(|(p, _)| *p), expected, "{sent:?}");
            if let Some((_, mut io)) = sniffed {
                // Nothing is lost: the reader sees every byte the client sent.
                let mut all = Vec::new();
                io.read_to_end(&mut all).await.unwrap();
                assert_eq!(all, sent.concat());
            }
        });
    }

    #[test]
    fn the_preface_means_h2_and_anything_else_h1() {
        check(
            &[b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\x12\x04"],
            Some(Protocol::H2),
        );
        check(
            &[b"PRI * HTTP/2", b".0\r\n\r\nSM\r\n\r\n"],
            Some(Protocol::H2),
        );
        check(&[b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"], Some(Protocol::H1));
        check(&[b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"], Some(Protocol::H1));
        check(&[b"G"], Some(Protocol::H1));
        check(&[b"PRI * HT"], None);
        check(&[], None);
    }
}
