//! `limits.sendTimeout`: a client connection whose writes stay blocked that long (the client
//! stopped reading, its window is shut) fails with `TimedOut`, so hyper drops it with the
//! response and the upstream connection it held — as nginx's `send_timeout` does. hyper polls
//! its writes again whenever the connection task wakes, so the timer's wake-up reaches
//! `poll_write`/`poll_flush` here.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::stall::Wait;

pub struct SendTimeout<I> {
    inner: I,
    limit: Duration,
    wait: Wait,
}

impl<I> SendTimeout<I> {
    pub fn new(inner: I, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            wait: Wait::default(),
        }
    }

    /// Passes a write's result on; a write pending for `limit` becomes an error.
    fn timed<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending if self.wait.expired(cx, self.limit) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing for limits.sendTimeout",
            ))),
            Poll::Pending => Poll::Pending,
            ready => {
                self.wait.progressed();
                ready
            }
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for SendTimeout<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for SendTimeout<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.timed(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.timed(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.timed(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.timed(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_stops_reading_times_out_and_one_that_reads_does_not() {
        let (ours, mut theirs) = tokio::io::duplex(1024);
        let mut w = SendTimeout::new(ours, Duration::from_secs(60));
        let chunk = vec![7u8; 512];
        // The peer reads slowly but keeps reading: never timed out.
        let reader = async {
            let mut buf = vec![0u8; 512];
            for _ in 0..8 {
                tokio::time::sleep(Duration::from_secs(30)).await;
                tokio::io::AsyncReadExt::read_exact(&mut theirs, &mut buf)
                    .await
                    .unwrap();
            }
            theirs
        };
        let writer = async {
            for _ in 0..10 {
                w.write_all(&chunk).await.unwrap();
            }
        };
        let (mut theirs, ()) = tokio::join!(reader, writer);
        // Now it stops reading: the next blocked write fails after 60 s.
        let started = tokio::time::Instant::now();
        let err = loop {
            if let Err(e) = w.write_all(&chunk).await {
                break e;
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        drop(theirs.flush().await);
    }
}
