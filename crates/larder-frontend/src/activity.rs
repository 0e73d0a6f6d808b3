//! Knowing when a connection last moved a byte, for the idle timeout, and since when its
//! socket has taken nothing (its client reads nothing), for `limits.stalled_send_timeout`.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// The time of a connection's last read or write, shared between its I/O and its watchdog.
#[derive(Clone)]
pub(crate) struct Activity {
    start: Instant,
    /// Milliseconds after `start` of the last byte moved. An atomic store per read/write is far
    /// cheaper than the syscall it accompanies.
    last_ms: Arc<AtomicU64>,
    /// Milliseconds after `start`, plus one, of the first write the socket refused since its
    /// last accepted one (0: it takes writes).
    blocked_ms: Arc<AtomicU64>,
}

impl Activity {
    pub(crate) fn new() -> Activity {
        Activity {
            start: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
            blocked_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// A write moved bytes: the socket takes them.
    fn wrote(&self) {
        self.touch();
        if self.blocked_ms.load(Ordering::Relaxed) != 0 {
            self.blocked_ms.store(0, Ordering::Relaxed);
        }
    }

    /// The socket refused a write (its buffer is full): blocked from now, unless already.
    fn refused(&self) {
        if self.blocked_ms.load(Ordering::Relaxed) == 0 {
            let ms = self.start.elapsed().as_millis() as u64 + 1;
            self.blocked_ms.store(ms, Ordering::Relaxed);
        }
    }

    /// How long the socket has taken nothing the server had to write; `None` while it takes
    /// writes (or nothing was refused).
    pub(crate) fn write_blocked_for(&self) -> Option<Duration> {
        match self.blocked_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(
                self.start
                    .elapsed()
                    .saturating_sub(Duration::from_millis(ms - 1)),
            ),
        }
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// Resolves once no byte has moved for `limit`.
    pub(crate) async fn idle_for(&self, limit: Duration) {
        loop {
            let deadline = self.last() + limit;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// An I/O object that records activity on every read and write that moved bytes.
pub(crate) struct Tracked<T> {
    inner: T,
    activity: Activity,
}

impl<T> Tracked<T> {
    pub(crate) fn new(inner: T, activity: Activity) -> Tracked<T> {
        Tracked { inner, activity }
    }

    fn note_write(&self, result: &Poll<io::Result<usize>>) {
        match result {
            Poll::Ready(Ok(n)) if *n > 0 => self.activity.wrote(),
            Poll::Pending => self.activity.refused(),
            _ => {}
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note_write(&result);
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note_write(&result);
        result
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_socket_that_takes_nothing_is_blocked_until_it_takes_a_byte() {
        let activity = Activity::new();
        let (near, mut far) = tokio::io::duplex(64);
        let mut near = Tracked::new(near, activity.clone());
        near.write_all(&[1; 64]).await.unwrap();
        assert_eq!(activity.write_blocked_for(), None, "it took every byte");
        // The buffer is full: the next write waits, and the socket counts as blocked.
        let waiting = tokio::time::timeout(Duration::from_millis(50), near.write_all(&[2; 8]));
        assert!(waiting.await.is_err());
        tokio::time::sleep(Duration::from_millis(20)).await;
        let blocked = activity.write_blocked_for().expect("blocked");
        assert!(blocked >= Duration::from_millis(20), "{blocked:?}");
        let mut buf = [0; 64];
        far.read_exact(&mut buf).await.unwrap();
        near.write_all(&[3; 8]).await.unwrap();
        assert_eq!(activity.write_blocked_for(), None, "it takes bytes again");
    }
}
