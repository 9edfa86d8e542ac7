//! An HTTP/3 request stream's receiving half as an `http_body::Body`: data frames, then
//! trailers.

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
    stream: RecvStream,
    phase: Phase,
    /// What `settle` read ahead: a first chunk, or the trailers.
    ahead: Option<Frame<Bytes>>,
    /// `content-length`, when the client sent one.
    length: Option<u64>,
    /// A read is under way inside h3-quinn (its stream cannot be stopped meanwhile).
    reading: bool,
}

impl H3Body {
    pub fn new(stream: RecvStream, length: Option<u64>) -> Self {
        Self {
            stream,
            phase: Phase::Data,
            ahead: None,
            length,
            reading: false,
        }
    }

    /// Reads ahead until the body's first chunk or its end, for at most `limit`: a request
    /// without a body usually ends with its HEADERS frame, and knowing it lets the request
    /// path retry the request and serve it from 0-RTT. Only for requests that announce no
    /// body: a streaming body may wait for the response before it sends anything.
    pub async fn settle(&mut self, limit: Duration) {
        let _ = tokio::time::timeout(limit, std::future::poll_fn(|cx| self.read_ahead(cx))).await;
    }

    fn read_ahead(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.ahead.is_some() || matches!(self.phase, Phase::Done) {
            return Poll::Ready(());
        }
        match self.next(cx) {
            Poll::Ready(Some(Ok(frame))) => self.ahead = Some(frame),
            Poll::Ready(Some(Err(_))) | Poll::Ready(None) => {}
            Poll::Pending => return Poll::Pending,
        }
        Poll::Ready(())
    }

    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, h3::error::StreamError>> {
        let polled = self.stream.poll_recv_data(cx);
        self.reading = polled.is_pending();
        polled.map_ok(|b| b.map(|mut b| b.copy_to_bytes(b.remaining())))
    }

    /// The next frame from the stream.
    fn next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, h3::error::StreamError>>> {
        loop {
            match self.phase {
                Phase::Data => match self.poll_data(cx) {
                    Poll::Ready(Ok(Some(data))) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Poll::Ready(Ok(None)) => self.phase = Phase::Trailers,
                    Poll::Ready(Err(e)) => {
                        self.phase = Phase::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                    Poll::Pending => return Poll::Pending,
                },
                Phase::Trailers => {
                    let polled = self.stream.poll_recv_trailers(cx);
                    self.reading = polled.is_pending();
                    if polled.is_ready() {
                        self.phase = Phase::Done;
                    }
                    return match polled {
                        Poll::Ready(Ok(Some(t))) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
                        Poll::Ready(Ok(None)) => Poll::Ready(None),
                        Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
                        Poll::Pending => Poll::Pending,
                    };
                }
                Phase::Done => return Poll::Ready(None),
            }
        }
    }
}

impl Drop for H3Body {
    /// A body not read to its end (a response sent early, a request that failed): the client
    /// is asked to stop sending without an error (RFC 9114 §4.1), not with quinn's code 0.
    /// Not while h3-quinn has a read under way: it cannot stop its stream then.
    fn drop(&mut self) {
        if !matches!(self.phase, Phase::Done) && !self.reading {
            self.stream.stop_sending(h3::error::Code::H3_NO_ERROR);
        }
    }
}

impl Body for H3Body {
    type Data = Bytes;
    type Error = h3::error::StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match this.ahead.take() {
            Some(frame) => Poll::Ready(Some(Ok(frame))),
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
