//! Body types of the request path. Enums rather than boxed trait objects: no allocation
//! per request.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// The client's request body exceeded `limits.maxRequestBodyBytes`.
#[derive(Debug, thiserror::Error)]
#[error("request body is larger than {limit} bytes")]
pub struct BodyTooLarge {
    pub limit: u64,
}

/// The client's request body failed (malformed chunking, connection cut): the client's fault.
#[derive(Debug, thiserror::Error)]
#[error("reading the client's request body: {0}")]
pub struct ClientBodyError(#[source] pub hyper::Error);

pin_project_lite::pin_project! {
    #[project = UpstreamBodyProj]
    /// What is sent upstream: nothing (so the request can be retried), or the client's body,
    /// counted against the body-size limit as it streams.
    pub enum UpstreamBody {
        Empty,
        Streaming { #[pin] inner: Incoming, remaining: u64, limit: u64 },
        /// A small body read whole first (a mirrored request's: both copies send it).
        Buffered { data: Option<Bytes> },
    }
}

impl UpstreamBody {
    pub fn streaming(inner: Incoming, limit: u64) -> Self {
        Self::Streaming {
            inner,
            remaining: limit,
            limit,
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project() {
            UpstreamBodyProj::Empty => Poll::Ready(None),
            UpstreamBodyProj::Buffered { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            UpstreamBodyProj::Streaming {
                inner,
                remaining,
                limit,
            } => match inner.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        let len = data.len() as u64;
                        if len > *remaining {
                            return Poll::Ready(Some(Err(Box::new(BodyTooLarge { limit: *limit }))));
                        }
                        *remaining -= len;
                    }
                    Poll::Ready(Some(Ok(frame)))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(ClientBodyError(e))))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Empty => true,
            Self::Streaming { inner, .. } => inner.is_end_stream(),
            Self::Buffered { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Empty => SizeHint::with_exact(0),
            Self::Streaming { inner, .. } => inner.size_hint(),
            Self::Buffered { data } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
        }
    }
}

/// What is sent to the client: the upstream's body, or a small body of our own.
pub type ClientBody = http_body_util::Either<Incoming, http_body_util::Full<Bytes>>;

pub fn full(text: &'static str) -> ClientBody {
    http_body_util::Either::Right(http_body_util::Full::new(Bytes::from_static(text.as_bytes())))
}

pub fn full_owned(text: String) -> ClientBody {
    http_body_util::Either::Right(http_body_util::Full::new(Bytes::from(text)))
}

/// Whether an error chain contains an error of type E.
pub fn chain_contains<E: std::error::Error + 'static>(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if e.is::<E>() {
            return true;
        }
        cur = e.source();
    }
    false
}
