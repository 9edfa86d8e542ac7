//! An HTTP/2 upstream's response to an HTTP/2 client, read ahead of the client by a task.
//!
//! Every stream of a shared upstream connection draws on that connection's receive window, and
//! data the proxy has not read yet stays charged to it. hyper's HTTP/2 server stops polling a
//! response body while the client's stream has no send window, so a client that never opens
//! its window would leave up to a stream window (2 MiB) of unread data charged to the shared
//! connection, and a few such clients would freeze it for every request it carries.
//!
//! The task reads the upstream's frames into a small channel (hyper gives the window back as
//! soon as a frame is read). When the channel stays full for `limits.sendTimeout`, the task
//! drops the upstream stream (RST_STREAM, which returns what it held to the connection window)
//! and the client's body ends with an error, not a clean end — as Envoy's stream idle timeout
//! does for a stream blocked on flow control. An HTTP/1.1 client needs none of this: its
//! blocked socket trips `limits.sendTimeout` (`crate::send_timeout`); an HTTP/3 response is
//! written with each write bounded by it (`crate::http3::request`).

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::mpsc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Frames held ahead of the client: with hyper's 16 KiB frames, at most 64 KiB per stream.
const AHEAD: usize = 4;

/// The client took nothing for `limits.sendTimeout`; the upstream stream was reset.
#[derive(Debug, thiserror::Error)]
#[error("the client took no data for limits.sendTimeout; the upstream stream was reset")]
pub struct ClientStalled;

/// What the task passes on: a frame, the upstream's clean end, or its error.
enum Ahead {
    Frame(Frame<Bytes>),
    End,
    Failed(BoxError),
}

/// The client's side: the frames the task read.
pub struct ReadAhead {
    rx: mpsc::Receiver<Ahead>,
    /// The upstream's hint, less what has been passed on.
    hint: SizeHint,
    done: bool,
}

impl ReadAhead {
    /// Starts the task reading `body`, a response body still open (hyper's `Incoming`).
    pub fn start<B>(body: B, limit: Duration) -> Self
    where
        B: Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let hint = body.size_hint();
        let (tx, rx) = mpsc::channel(AHEAD);
        tokio::spawn(pump(body, tx, limit));
        Self { rx, hint, done: false }
    }
}

/// Reads `body` into `tx` until it ends, the client's side is dropped (a reset client stream),
/// or `tx` stays full for `limit`; dropping `body` then resets the upstream stream.
async fn pump<B>(mut body: B, tx: mpsc::Sender<Ahead>, limit: Duration)
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    loop {
        let next = tokio::select! {
            biased;
            () = tx.closed() => return,
            next = body.frame() => next.map(|f| f.map_err(Into::into)),
        };
        let item = match next {
            Some(Ok(frame)) => Ahead::Frame(frame),
            Some(Err(e)) => Ahead::Failed(e),
            None => Ahead::End,
        };
        let last = !matches!(item, Ahead::Frame(_));
        // A free slot is the rule; only a full channel needs a timer.
        let sent = match tx.try_send(item) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(item)) => tx.send_timeout(item, limit).await.is_ok(),
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        };
        if !sent || last {
            return;
        }
    }
}

impl Body for ReadAhead {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let item = ready!(self.rx.poll_recv(cx));
        Poll::Ready(match item {
            Some(Ahead::Frame(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let passed = data.len() as u64;
                    self.hint = less(self.hint, passed);
                }
                Some(Ok(frame))
            }
            Some(Ahead::End) => {
                self.done = true;
                None
            }
            Some(Ahead::Failed(e)) => {
                self.done = true;
                Some(Err(e))
            }
            // The task gave up on a client that took nothing.
            None => {
                self.done = true;
                Some(Err(ClientStalled.into()))
            }
        })
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

/// `hint` after `passed` bytes went by.
fn less(hint: SizeHint, passed: u64) -> SizeHint {
    let mut next = SizeHint::new();
    next.set_lower(hint.lower().saturating_sub(passed));
    if let Some(upper) = hint.upper() {
        next.set_upper(upper.saturating_sub(passed));
    }
    next
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;

    /// An upstream body fed by the test, which says when it is dropped (the stream reset).
    struct Source {
        rx: mpsc::Receiver<Frame<Bytes>>,
        dropped: Arc<AtomicBool>,
    }

    impl Drop for Source {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::SeqCst);
        }
    }

    impl Body for Source {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.rx.poll_recv(cx).map(|f| f.map(Ok))
        }
    }

    fn source() -> (mpsc::Sender<Frame<Bytes>>, Source, Arc<AtomicBool>) {
        let (tx, rx) = mpsc::channel(64);
        let dropped = Arc::new(AtomicBool::new(false));
        (
            tx,
            Source {
                rx,
                dropped: dropped.clone(),
            },
            dropped,
        )
    }

    const LIMIT: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn a_client_that_takes_nothing_has_its_upstream_stream_reset_at_the_limit() {
        let (upstream, body, dropped) = source();
        let mut ahead = ReadAhead::start(body, LIMIT);
        for _ in 0..(AHEAD + 8) {
            upstream.send(Frame::data(Bytes::from_static(b"x"))).await.unwrap();
        }
        tokio::time::sleep(LIMIT - Duration::from_secs(1)).await;
        assert!(!dropped.load(Ordering::SeqCst), "still read before the limit");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(dropped.load(Ordering::SeqCst), "reset after the limit");
        // What was read ahead is passed on, then an error: not a clean end.
        let mut frames = 0;
        let end = loop {
            match ahead.frame().await {
                Some(Ok(_)) => frames += 1,
                other => break other,
            }
        };
        assert!(frames <= AHEAD + 1, "{frames} frames held");
        let err = end.expect("an error, not a clean end").unwrap_err();
        assert!(err.is::<ClientStalled>(), "{err}");
        assert!(ahead.is_end_stream());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_keeps_taking_is_never_cut_and_sees_the_trailers_and_the_end() {
        let (upstream, body, dropped) = source();
        let mut ahead = ReadAhead::start(body, LIMIT);
        let feed = async move {
            for _ in 0..20 {
                upstream.send(Frame::data(Bytes::from_static(b"x"))).await.unwrap();
            }
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            upstream.send(Frame::trailers(trailers)).await.unwrap();
        };
        let take = async {
            let (mut data, mut trailers) = (0, None);
            while let Some(frame) = ahead.frame().await {
                // Slower than the upstream, but well within the limit each time.
                tokio::time::sleep(LIMIT / 2).await;
                let frame = frame.unwrap();
                data += frame.data_ref().map_or(0, |d| d.len());
                trailers = frame.into_trailers().ok().or(trailers);
            }
            (data, trailers)
        };
        let ((), (data, trailers)) = tokio::join!(feed, take);
        assert_eq!(data, 20);
        assert_eq!(trailers.unwrap()["grpc-status"], "0");
        assert!(dropped.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_gone_resets_an_idle_upstream_stream_at_once() {
        let (_upstream, body, dropped) = source();
        let ahead = ReadAhead::start(body, LIMIT);
        tokio::task::yield_now().await;
        drop(ahead);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(
            dropped.load(Ordering::SeqCst),
            "the upstream stream was dropped with the client's"
        );
    }

    #[test]
    fn the_hint_shrinks_by_what_was_passed_on() {
        let after = less(SizeHint::with_exact(100), 30);
        assert_eq!(after.exact(), Some(70));
        let open = less(SizeHint::new(), 30);
        assert_eq!((open.lower(), open.upper()), (0, None));
    }
}
