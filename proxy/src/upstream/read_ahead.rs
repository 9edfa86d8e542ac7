//! An upstream's response to an HTTP/2 client, read ahead of the client by a task.
//!
//! hyper's HTTP/2 server stops polling a response body while the client's stream has no send
//! window, and a client can grant none while it keeps reading its socket, so no write of the
//! proxy's ever blocks and no timer inside the body can fire. What the unread body holds:
//! - toward an HTTP/2 upstream, its data stays charged to the shared upstream connection's
//!   window: a client that never opens its window would leave up to a stream window (2 MiB)
//!   unread, and a few such clients would freeze the connection for every request it carries;
//! - toward an HTTP/1.1 upstream, the upstream connection itself: an answer that fit in the
//!   socket buffers is never read, so the upstream sees nothing wrong and the connection is
//!   held for as long as the client's connection lives.
//!
//! The task reads the upstream's frames into a small channel (hyper gives the window back as
//! soon as a frame is read; an HTTP/1.1 connection goes back to its pool once the answer is
//! read whole), so a client that keeps up leaves nothing unread. A client that falls behind
//! leaves at most a stream window unread (`upstreams[].http2`), or the socket buffers. It must
//! then take at least `MIN_TAKEN` bytes in every `limits.sendTimeout`, or the task drops the
//! upstream body (RST_STREAM, which returns what it held to the connection window; an
//! HTTP/1.1 connection closes) and fails the request body still streaming beside it, so the
//! upstream stream ends even in a gRPC bidirectional call. The client's body then ends with an
//! error, not a clean end, which hyper sends as RST_STREAM once it polls the body again (when
//! the client opens its window or the connection ends). This is Envoy's stream idle timeout for
//! a stream blocked on flow control, with a floor on the rate so that a client taking a frame
//! now and then cannot hold the window for ever. An HTTP/1.1 client needs none of this: its
//! blocked socket trips `limits.sendTimeout` (send_timeout.rs); an HTTP/3 response is written
//! with each write bounded by it (http3/request.rs).

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Frames held ahead of the client: with hyper's 16 KiB frames, at most 64 KiB per stream.
const AHEAD: usize = 4;

/// What a client that has fallen behind must take in every `limits.sendTimeout` (about
/// 1 KiB/s at the default 60 s; a frame a minute is far below it).
const MIN_TAKEN: u64 = 64 * 1024;

/// The client took nothing for `limits.sendTimeout`; the upstream stream was reset.
#[derive(Debug, thiserror::Error)]
#[error("the client took no data for limits.sendTimeout; the upstream stream was reset")]
pub struct ClientStalled;

/// What the task passes on: a frame, the last frame (the body ends with it, so hyper sends
/// END_STREAM on it), the upstream's clean end, or its error.
enum Ahead {
    Frame(Frame<Bytes>),
    Last(Frame<Bytes>),
    End,
    Failed(BoxError),
}

impl Ahead {
    fn len(&self) -> u64 {
        match self {
            Self::Frame(f) | Self::Last(f) => f.data_ref().map_or(0, |d| d.len() as u64),
            _ => 0,
        }
    }
}

/// Cancelled when the task gives up on a client: the request body streaming to the same
/// upstream stream watches it (`UpstreamBody::cut_by` in body.rs). Travels in the request's
/// extensions from the handler to the body.
#[derive(Clone, Default)]
pub struct StreamCut(pub CancellationToken);

/// The client's side: the frames that had arrived with the response, then those the task read.
pub struct ReadAhead {
    /// Frames already there when the response came, passed on first.
    arrived: std::vec::IntoIter<Frame<Bytes>>,
    /// The rest, from the task; none when the body had ended by then (a small answer, which
    /// needs no task).
    rx: Option<mpsc::Receiver<Ahead>>,
    /// The upstream's hint, less what has been passed on.
    hint: SizeHint,
    done: bool,
}

/// What `arrivals` found.
enum Arrivals {
    /// The body ended with the frames that had arrived.
    Ended,
    /// More is to come.
    Open,
    Failed(BoxError),
}

/// Takes the frames `body` already holds, at most `AHEAD - 1`, without waiting: a small
/// answer has usually arrived whole with its head.
fn arrivals<B>(body: &mut B, arrived: &mut Vec<Frame<Bytes>>) -> Arrivals
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut cx = Context::from_waker(std::task::Waker::noop());
    while arrived.len() < AHEAD - 1 {
        match Pin::new(&mut *body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => {
                arrived.push(frame);
                if body.is_end_stream() {
                    return Arrivals::Ended;
                }
            }
            Poll::Ready(Some(Err(e))) => return Arrivals::Failed(e.into()),
            Poll::Ready(None) => return Arrivals::Ended,
            Poll::Pending => break,
        }
    }
    Arrivals::Open
}

impl ReadAhead {
    /// Reads `body`, a response body still open (hyper's `Incoming`, our HTTP/1.1 relay's), ahead of the client: what
    /// has arrived at once, the rest by a task; `cut` is cancelled if the task gives up on the
    /// client.
    pub fn start<B>(mut body: B, limit: Duration, cut: Option<StreamCut>) -> Self
    where
        B: Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        let hint = body.size_hint();
        let mut arrived = Vec::new();
        let found = arrivals(&mut body, &mut arrived);
        if let Arrivals::Ended = found {
            return Self {
                done: arrived.is_empty(),
                arrived: arrived.into_iter(),
                rx: None,
                hint,
            };
        }
        // The channel takes what arrived (fewer than AHEAD frames) and an error after it.
        let (tx, rx) = mpsc::channel(AHEAD);
        // A new channel with room for all of it and `rx` alive: these sends cannot fail.
        for frame in arrived {
            let _ = tx.try_send(Ahead::Frame(frame));
        }
        match found {
            Arrivals::Failed(e) => {
                let _ = tx.try_send(Ahead::Failed(e));
            }
            _ => {
                tokio::spawn(async move {
                    if pump(body, tx, limit).await == Pumped::GaveUp {
                        if let Some(cut) = cut {
                            cut.0.cancel();
                        }
                    }
                });
            }
        }
        Self {
            arrived: Vec::new().into_iter(),
            rx: Some(rx),
            hint,
            done: false,
        }
    }
}

/// How the task ended.
#[derive(Debug, PartialEq)]
enum Pumped {
    /// The body was passed on whole, or the client went away.
    Done,
    /// The client fell behind and took less than `MIN_TAKEN` in a `limit`.
    GaveUp,
}

/// Reads `body` into `tx` until it ends, the client's side is dropped (a reset client stream),
/// or the client falls behind and stays too slow; dropping `body` then resets the upstream
/// stream.
async fn pump<B>(mut body: B, tx: mpsc::Sender<Ahead>, limit: Duration) -> Pumped
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut behind: Option<Behind> = None;
    loop {
        let mut waited = false;
        let next = tokio::select! {
            biased;
            () = tx.closed() => return Pumped::Done,
            next = std::future::poll_fn(|cx| {
                let polled = Pin::new(&mut body).poll_frame(cx);
                waited |= polled.is_pending();
                polled
            }) => next.map(|f| f.map_err(Into::into)),
        };
        if waited {
            behind = None; // the upstream was the slower side: nothing piled up unread
        }
        let item = match next {
            Some(Ok(frame)) if body.is_end_stream() => Ahead::Last(frame),
            Some(Ok(frame)) => Ahead::Frame(frame),
            Some(Err(e)) => Ahead::Failed(e),
            None => Ahead::End,
        };
        if !matches!(item, Ahead::Frame(_)) {
            // The upstream is done: nothing of it is left to charge the window, so the end
            // waits for the client without a clock.
            let _ = tx.send(item).await;
            return Pumped::Done;
        }
        let len = item.len();
        // A free slot is the rule; only a client that fell behind needs a clock.
        let passed = match tx.try_send(item) {
            Ok(()) => behind.as_mut().map_or(Passed::Yes, |b| b.took(len, limit)),
            Err(mpsc::error::TrySendError::Full(item)) => {
                let b = behind.get_or_insert_with(|| Behind::since(Instant::now()));
                b.wait(&tx, item, limit).await
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Passed::Gone,
        };
        match passed {
            Passed::Yes => {}
            Passed::Gone => return Pumped::Done,
            Passed::TooSlow => return Pumped::GaveUp,
        }
    }
}

/// Whether a frame reached the channel.
enum Passed {
    Yes,
    /// The client's side is gone.
    Gone,
    /// The client fell behind and took less than `MIN_TAKEN` in a `limit`.
    TooSlow,
}

/// A client that fell behind: the current period, and what it took in it.
struct Behind {
    since: Instant,
    taken: u64,
}

impl Behind {
    fn since(since: Instant) -> Self {
        Self { since, taken: 0 }
    }

    /// Counts `len` bytes taken, and judges the periods that have ended.
    fn took(&mut self, len: u64, limit: Duration) -> Passed {
        self.taken += len;
        let now = Instant::now();
        while now >= self.since + limit {
            if self.taken < MIN_TAKEN {
                return Passed::TooSlow;
            }
            *self = Self::since(self.since + limit);
        }
        Passed::Yes
    }

    /// Waits for room for `item`, judging each period as it ends.
    async fn wait(&mut self, tx: &mpsc::Sender<Ahead>, item: Ahead, limit: Duration) -> Passed {
        loop {
            match tokio::time::timeout_at(self.since + limit, tx.reserve()).await {
                Ok(Ok(permit)) => {
                    let len = item.len();
                    permit.send(item);
                    return self.took(len, limit);
                }
                Ok(Err(_)) => return Passed::Gone,
                Err(_) if self.taken < MIN_TAKEN => return Passed::TooSlow,
                Err(_) => *self = Self::since(self.since + limit),
            }
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
        if let Some(frame) = self.arrived.next() {
            self.passed(&frame);
            self.done = self.arrived.len() == 0 && self.rx.is_none();
            return Poll::Ready(Some(Ok(frame)));
        }
        let Some(rx) = self.rx.as_mut() else {
            self.done = true;
            return Poll::Ready(None);
        };
        let item = ready!(rx.poll_recv(cx));
        Poll::Ready(match item {
            Some(Ahead::Frame(frame)) => {
                self.passed(&frame);
                Some(Ok(frame))
            }
            Some(Ahead::Last(frame)) => {
                self.done = true;
                self.passed(&frame);
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
            // The task gave up on a client that fell behind.
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

impl ReadAhead {
    /// Counts `frame` out of the hint.
    fn passed(&mut self, frame: &Frame<Bytes>) {
        if let Some(data) = frame.data_ref() {
            self.hint = less(self.hint, data.len() as u64);
        }
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

    use http_body_util::BodyExt;

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
        let mut ahead = ReadAhead::start(body, LIMIT, None);
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
    async fn a_slow_client_that_takes_enough_is_never_cut_and_sees_the_trailers_and_the_end() {
        let (upstream, body, dropped) = source();
        let mut ahead = ReadAhead::start(body, LIMIT, None);
        let frame = Bytes::from(vec![b'x'; 40 * 1024]);
        let feed = async move {
            for _ in 0..20 {
                upstream.send(Frame::data(frame.clone())).await.unwrap();
            }
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            upstream.send(Frame::trailers(trailers)).await.unwrap();
        };
        let take = async {
            let (mut data, mut trailers) = (0, None);
            while let Some(frame) = ahead.frame().await {
                // Far behind the upstream, but two frames (80 KiB) or more inside every
                // period, above MIN_TAKEN.
                tokio::time::sleep(LIMIT / 3).await;
                let frame = frame.unwrap();
                data += frame.data_ref().map_or(0, |d| d.len());
                trailers = frame.into_trailers().ok().or(trailers);
            }
            (data, trailers)
        };
        let ((), (data, trailers)) = tokio::join!(feed, take);
        assert_eq!(data, 20 * 40 * 1024);
        assert_eq!(trailers.unwrap()["grpc-status"], "0");
        assert!(dropped.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_takes_a_frame_now_and_then_is_cut_and_the_request_body_with_it() {
        let (upstream, body, dropped) = source();
        let cut = StreamCut::default();
        let mut ahead = ReadAhead::start(body, LIMIT, Some(cut.clone()));
        let frame = Bytes::from(vec![b'x'; 16 * 1024]);
        for _ in 0..(AHEAD + 20) {
            upstream.send(Frame::data(frame.clone())).await.unwrap();
        }
        // One frame just inside each period: 16 KiB, below MIN_TAKEN.
        let mut taken = 0;
        let end = loop {
            tokio::time::sleep(LIMIT - Duration::from_secs(1)).await;
            match ahead.frame().await {
                Some(Ok(_)) => taken += 1,
                other => break other,
            }
        };
        assert!(dropped.load(Ordering::SeqCst), "the upstream stream was reset");
        assert!(cut.0.is_cancelled(), "the request body beside it is cut");
        assert!(taken <= AHEAD + 2, "cut within the second period, after {taken} frames");
        assert!(end.expect("an error").unwrap_err().is::<ClientStalled>());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_gone_resets_an_idle_upstream_stream_at_once() {
        let (_upstream, body, dropped) = source();
        let ahead = ReadAhead::start(body, LIMIT, None);
        tokio::task::yield_now().await;
        drop(ahead);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(
            dropped.load(Ordering::SeqCst),
            "the upstream stream was dropped with the client's"
        );
    }

    fn kib16() -> Frame<Bytes> {
        Frame::data(Bytes::from(vec![b'x'; 16 * 1024]))
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_that_arrived_whole_needs_no_task() {
        let (upstream, body, dropped) = source();
        upstream.send(kib16()).await.unwrap();
        upstream.send(Frame::trailers(http::HeaderMap::new())).await.unwrap();
        drop(upstream);
        let mut ahead = ReadAhead::start(body, LIMIT, None);
        assert!(
            ahead.rx.is_none() && dropped.load(Ordering::SeqCst),
            "read at once, nothing left open"
        );
        assert!(ahead.frame().await.unwrap().unwrap().is_data());
        assert!(ahead.frame().await.unwrap().unwrap().is_trailers());
        assert!(ahead.is_end_stream());
        assert!(ahead.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_behind_a_quiet_upstream_is_not_judged_for_the_quiet() {
        let (upstream, body, dropped) = source();
        let mut ahead = ReadAhead::start(body, LIMIT, None);
        for _ in 0..(AHEAD + 2) {
            upstream.send(kib16()).await.unwrap();
        }
        // Behind for a while, then it takes three frames; the upstream has nothing more.
        tokio::time::sleep(LIMIT / 2).await;
        for _ in 0..3 {
            assert!(ahead.frame().await.unwrap().is_ok());
        }
        // A long quiet upstream: the frames still queued are the upstream's pace, not the client's.
        tokio::time::sleep(LIMIT * 2).await;
        upstream.send(kib16()).await.unwrap();
        drop(upstream);
        let mut frames = 3;
        while let Some(frame) = ahead.frame().await {
            assert!(frame.is_ok(), "not cut");
            frames += 1;
        }
        assert_eq!(frames, AHEAD + 3);
        assert!(dropped.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_read_whole_waits_for_its_client_without_a_clock() {
        let (upstream, body, _dropped) = source();
        let cut = StreamCut::default();
        let mut ahead = ReadAhead::start(body, LIMIT, Some(cut.clone()));
        for _ in 0..AHEAD {
            upstream.send(kib16()).await.unwrap();
        }
        drop(upstream);
        // The upstream is done; only the client is slow. Nothing is charged to the window.
        tokio::time::sleep(LIMIT * 3).await;
        let mut frames = 0;
        while let Some(frame) = ahead.frame().await {
            assert!(frame.is_ok(), "not cut");
            frames += 1;
        }
        assert_eq!(frames, AHEAD);
        assert!(!cut.0.is_cancelled(), "the request body is left alone");
    }

    #[test]
    fn the_hint_shrinks_by_what_was_passed_on() {
        let after = less(SizeHint::with_exact(100), 30);
        assert_eq!(after.exact(), Some(70));
        let open = less(SizeHint::new(), 30);
        assert_eq!((open.lower(), open.upper()), (0, None));
    }
}
