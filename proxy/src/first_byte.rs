//! Notices whether a client connection has sent enough to be served.
//!
//! hyper's `header_read_timeout` starts when the first byte of a request arrives, and the auto
//! builder first waits for the 24-byte HTTP/2 preface (or for enough to know it is HTTP/1.1), so
//! a client that connects and sends nothing, or a few bytes of the preface, would hold a
//! connection slot forever. The server closes a connection that has not sent `PREFACE_LEN` bytes
//! within the header-read timeout; this wrapper counts them (and stops counting after that).

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Length of the HTTP/2 connection preface; every HTTP/1.1 request with a Host is longer.
pub const PREFACE_LEN: usize = 24;

pub struct FirstByte<I> {
    inner: I,
    seen: Arc<AtomicUsize>,
}

impl<I> FirstByte<I> {
    pub fn new(inner: I) -> (Self, Arc<AtomicUsize>) {
        let seen = Arc::new(AtomicUsize::new(0));
        (
            Self {
                inner,
                seen: seen.clone(),
            },
            seen,
        )
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for FirstByte<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        // One relaxed load per read once enough has arrived; counting stops there.
        let n = buf.filled().len() - before;
        let seen = self.seen.load(Ordering::Relaxed);
        if n > 0 && seen < PREFACE_LEN {
            if seen == 0 && ends_a_head(&buf.filled()[before..]) {
                self.seen.store(PREFACE_LEN, Ordering::Relaxed);
            } else {
                self.seen.fetch_add(n, Ordering::Relaxed);
            }
        }
        r
    }
}

/// Whether a connection's first read holds a whole HTTP/1.x request head: a request shorter
/// than the HTTP/2 preface (`GET / HTTP/1.0` with no headers) is served, not cut off. The
/// preface's own first line ends the same way, so it never counts.
fn ends_a_head(bytes: &[u8]) -> bool {
    !bytes.starts_with(b"PRI ") && (bytes.windows(2).any(|w| w == b"\n\n") || bytes.windows(3).any(|w| w == b"\n\r\n"))
}

impl<I: AsyncWrite + Unpin> AsyncWrite for FirstByte<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_whole_request_head_counts_as_enough() {
        assert!(ends_a_head(b"GET / HTTP/1.0\r\n\r\n"));
        assert!(ends_a_head(b"GET / HTTP/1.0\n\n"));
        assert!(!ends_a_head(b"PRI * HTTP/2.0\r\n\r\n"), "part of the HTTP/2 preface");
        assert!(!ends_a_head(b"GET / HTTP/1.1\r\nHost"));
    }
}
