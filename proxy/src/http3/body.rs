//! An HTTP/3 request stream's receiving half as an `http_body::Body`: data frames, then
//! trailers. A body longer or shorter than its `content-length` is an error (RFC 9114 §4.1.2:
//! malformed), which h3 does not check: passed on, the upstream would get another body than
//! the one announced, or hyper would cut it at the length.
//!
//! A body dropped before its end (hyper stops at `content-length` without reading the FIN, a
//! response sent early) is read to its end by a short task instead: dropped unread, quinn would
//! tell the client to stop sending with code 0, which h3 clients take for an error. It is not
//! stopped through h3 with H3_NO_ERROR either: h3-quinn 0.0.10 panics when a stream is stopped
//! while a read of it is pending, and the release build aborts on panic.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};

type RecvStream = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// Where reading the stream is.
enum Phase {
    Data,
    Trailers,
    Done,
}

pub struct H3Body {
    /// Always `Some` until dropped.
    stream: Option<RecvStream>,
    phase: Phase,
    /// What `settle` read ahead: a first chunk, the trailers, or the body's failure.
    ahead: Option<Result<Frame<Bytes>, H3BodyError>>,
    /// `content-length`, when the client sent one.
    length: Option<u64>,
    /// Data bytes read so far.
    received: u64,
    /// Whether the stream was read to its end (or failed): only then is dropping it quiet.
    ended: bool,
}

/// Why an HTTP/3 request body failed.
#[derive(Debug, thiserror::Error)]
pub enum H3BodyError {
    #[error(transparent)]
    Stream(#[from] h3::error::StreamError),
    #[error("the request body does not match its content-length {declared} (at least {received} bytes, or fewer)")]
    Length { declared: u64, received: u64 },
}

impl H3Body {
    pub fn new(stream: RecvStream, length: Option<u64>) -> Self {
        Self {
            stream: Some(stream),
            phase: Phase::Data,
            ahead: None,
            length,
            received: 0,
            ended: false,
        }
    }

    /// Reads ahead until the body's first chunk or its end, for at most `limit`: a request
    /// without a body usually ends with its HEADERS frame, and knowing it lets the request
    /// path retry the request and serve it from 0-RTT. Only for requests that announce no
    /// body: a streaming body may wait for the response before it sends anything.
    pub async fn settle(&mut self, limit: Duration) {
        let _ = tokio::time::timeout(limit, std::future::poll_fn(|cx| self.read_ahead(cx))).await;
    }

    /// Whether what `settle` read ahead is the body's failure (a body longer than its
    /// `content-length`: the request is malformed).
    pub fn failed(&self) -> bool {
        matches!(self.ahead, Some(Err(_)))
    }

    fn read_ahead(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.ahead.is_some() || matches!(self.phase, Phase::Done) {
            return Poll::Ready(());
        }
        match self.next(cx) {
            Poll::Ready(Some(read)) => self.ahead = Some(read),
            Poll::Ready(None) => {}
            Poll::Pending => return Poll::Pending,
        }
        Poll::Ready(())
    }

    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, h3::error::StreamError>> {
        let Some(stream) = self.stream.as_mut() else {
            return Poll::Ready(Ok(None));
        };
        stream
            .poll_recv_data(cx)
            .map_ok(|b| b.map(|mut b| b.copy_to_bytes(b.remaining())))
    }

    /// The next frame from the stream.
    /// A body that went past its `content-length`, or ended short of it.
    fn length_error(&mut self, ended: bool) -> Option<H3BodyError> {
        let declared = self.length?;
        let wrong = self.received > declared || (ended && self.received != declared);
        wrong.then(|| {
            self.phase = Phase::Done;
            H3BodyError::Length {
                declared,
                received: self.received,
            }
        })
    }

    fn next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, H3BodyError>>> {
        loop {
            match self.phase {
                Phase::Data => match self.poll_data(cx) {
                    Poll::Ready(Ok(Some(data))) => {
                        self.received += data.len() as u64;
                        if let Some(e) = self.length_error(false) {
                            return Poll::Ready(Some(Err(e)));
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Poll::Ready(Ok(None)) => {
                        if let Some(e) = self.length_error(true) {
                            return Poll::Ready(Some(Err(e)));
                        }
                        self.phase = Phase::Trailers;
                    }
                    Poll::Ready(Err(e)) => {
                        self.phase = Phase::Done;
                        self.ended = true;
                        return Poll::Ready(Some(Err(e.into())));
                    }
                    Poll::Pending => return Poll::Pending,
                },
                Phase::Trailers => {
                    let Some(stream) = self.stream.as_mut() else {
                        return Poll::Ready(None);
                    };
                    let polled = stream.poll_recv_trailers(cx);
                    if polled.is_ready() {
                        self.phase = Phase::Done;
                        self.ended = true;
                    }
                    return match polled {
                        Poll::Ready(Ok(Some(t))) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
                        Poll::Ready(Ok(None)) => Poll::Ready(None),
                        Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e.into()))),
                        Poll::Pending => Poll::Pending,
                    };
                }
                Phase::Done => return Poll::Ready(None),
            }
        }
    }
}

/// How long a dropped body's rest is read before the stream is given up.
const DRAIN_AT_MOST: Duration = Duration::from_secs(2);

impl Drop for H3Body {
    fn drop(&mut self) {
        // A body refused for its length is Done with the rest (or its trailers) still coming:
        // read that too, or the client's sending half is stopped with code 0 and it takes the
        // whole request for failed, missing the 400 it is answered.
        if self.ended {
            return;
        }
        let (Some(mut stream), Ok(runtime)) = (self.stream.take(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        runtime.spawn(async move {
            let drain = async {
                while let Ok(Some(_)) = stream.recv_data().await {}
                let _ = stream.recv_trailers().await;
            };
            let _ = tokio::time::timeout(DRAIN_AT_MOST, drain).await;
        });
    }
}

impl Body for H3Body {
    type Data = Bytes;
    type Error = H3BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match this.ahead.take() {
            Some(read) => Poll::Ready(Some(read)),
            None => this.next(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.phase, Phase::Done) && self.ahead.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.phase, self.length, &self.ahead) {
            (Phase::Done, _, None) => SizeHint::with_exact(0),
            (_, Some(n), _) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}
