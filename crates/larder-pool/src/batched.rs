//! Writes of an HTTP/2 connection gathered into one system call per turn of its task.
//!
//! h2 writes a DATA frame of 256 bytes or more as its own buffer, and must flush before it
//! can take the next one: a connection answering 256 streams of 1 KiB blobs made a `writev`
//! per answer (1.14 per GET on the storage nodes, 1.16 on the frontend, measured by
//! `benchmarks/cpu-per-request/instructions.sh`), each a trip through the kernel's TCP stack.
//! [`BatchedWrites`] copies small writes into one buffer and sends it when the connection's
//! task next reads (or when it shuts down, or when the buffer is full): a flush that finds
//! data waiting wakes the task, which is then polled again after the tasks already queued
//! (the stream tasks that are about to answer), and its first read sends everything written
//! meanwhile in one call. Writes larger than the buffer go out directly, uncopied.
//!
//! This relies on h2 reading in every poll of an open connection (it does: `poll_next` before
//! anything else) and shutting the stream down when it closes. Only for HTTP/2: an HTTP/1.1
//! connection need not read while it writes a body, so a server that may speak either
//! ([`BatchedWrites::after_h2_preface`]) batches only once the peer's first bytes are the
//! HTTP/2 preface, and writes through until then.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest amount held back: enough for some fifty 1 KiB answers with their headers. Bigger
/// writes (large bodies) are not worth a copy: they are one system call each anyway.
const BATCH_BYTES: usize = 64 * 1024;

pub struct BatchedWrites<T> {
    inner: T,
    /// Bytes accepted but not yet written to `inner`, from `sent` on.
    pending: Vec<u8>,
    sent: usize,
    batching: Batching,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Batching {
    On,
    Off,
    /// Off until the peer's first read says which protocol it speaks.
    AfterH2Preface,
}

/// How an HTTP/2 client's first bytes begin (RFC 9113 3.4); no HTTP/1.1 method does.
const H2_PREFACE_START: &[u8] = b"PRI * HTTP/2.0";

impl<T> BatchedWrites<T> {
    /// For a connection that speaks HTTP/2 only.
    pub fn new(inner: T) -> BatchedWrites<T> {
        BatchedWrites::with(inner, Batching::On)
    }

    /// Writes straight through (an HTTP/1.1 connection), for a caller that needs one type.
    pub fn write_through(inner: T) -> BatchedWrites<T> {
        BatchedWrites::with(inner, Batching::Off)
    }

    /// For a server connection that may speak HTTP/1.1: batches only once the peer's first
    /// read begins with the HTTP/2 preface.
    pub fn after_h2_preface(inner: T) -> BatchedWrites<T> {
        BatchedWrites::with(inner, Batching::AfterH2Preface)
    }

    fn with(inner: T, batching: Batching) -> BatchedWrites<T> {
        BatchedWrites {
            inner,
            pending: Vec::new(),
            sent: 0,
            batching,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    fn waiting(&self) -> usize {
        self.pending.len() - self.sent
    }
}

impl<T: AsyncWrite + Unpin> BatchedWrites<T> {
    /// Writes out everything held back.
    fn poll_send_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.pending.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for BatchedWrites<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // The task's next turn: send what its last one wrote. If the socket is full, its write
        // readiness wakes the task; reading goes on meanwhile.
        if this.waiting() > 0 {
            if let Poll::Ready(Err(err)) = this.poll_send_pending(cx) {
                return Poll::Ready(Err(err));
            }
        }
        if this.batching != Batching::AfterH2Preface {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let first = &buf.filled()[before..];
        if !first.is_empty() {
            // A preface cut short by the first read only costs the batching.
            this.batching = if first.starts_with(H2_PREFACE_START) {
                Batching::On
            } else {
                Batching::Off
            };
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for BatchedWrites<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.batching != Batching::On {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        }
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if this.waiting() + len > BATCH_BYTES {
            // Full: out with what waits, then this write goes out directly if it is large.
            ready!(this.poll_send_pending(cx))?;
            if len > BATCH_BYTES {
                return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
            }
        }
        if this.pending.capacity() == 0 {
            this.pending.reserve(BATCH_BYTES);
        }
        for b in bufs {
            this.pending.extend_from_slice(b);
        }
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        // Batched writes take any number of slices at once; written through, the inner
        // stream's own answer holds.
        self.batching == Batching::On || self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.waiting() == 0 {
            return Pin::new(&mut this.inner).poll_flush(cx);
        }
        // Sent on the task's next turn (its first read), after the tasks queued now had
        // their turn to write too. Every such flush wakes the task (a second wake-up in the
        // same turn costs one atomic operation): a turn that flushes without reading, if h2
        // ever had one, is followed by another turn instead of leaving the bytes here.
        cx.waker().wake_by_ref();
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}
