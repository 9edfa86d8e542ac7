//! Body types of the request path. Enums rather than boxed trait objects: no allocation
//! per request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio_util::sync::WaitForCancellationFutureOwned;

/// The client's request body exceeded `limits.maxRequestBodyBytes`.
#[derive(Debug, thiserror::Error)]
#[error("request body is larger than {limit} bytes")]
pub struct BodyTooLarge {
    pub limit: u64,
}

/// The client's request body failed (malformed chunking, connection cut, a reset QUIC
/// stream): the client's fault.
#[derive(Debug, thiserror::Error)]
#[error("reading the client's request body: {0}")]
pub struct ClientBodyError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

pin_project_lite::pin_project! {
    #[project = RequestBodyProj]
    /// A client's request body: from hyper (HTTP/1.1, HTTP/2) or from an HTTP/3 stream.
    pub enum RequestBody {
        Hyper { #[pin] inner: Incoming },
        H3 { #[pin] inner: crate::http3::H3Body },
        /// A body the proxy made (a transcoded gRPC request).
        Full { data: Option<Bytes> },
    }
}

impl From<Incoming> for RequestBody {
    fn from(inner: Incoming) -> Self {
        Self::Hyper { inner }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project() {
            RequestBodyProj::Hyper { inner } => inner.poll_frame(cx).map_err(Into::into),
            RequestBodyProj::H3 { inner } => inner.poll_frame(cx).map_err(Into::into),
            RequestBodyProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Hyper { inner } => inner.is_end_stream(),
            Self::H3 { inner } => inner.is_end_stream(),
            Self::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Hyper { inner } => inner.size_hint(),
            Self::H3 { inner } => inner.size_hint(),
            Self::Full { data } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
        }
    }
}

/// The client's request body sent nothing for `limits.clientBodyTimeout`.
#[derive(Debug, thiserror::Error)]
#[error("the client's request body sent nothing for {0:?}")]
pub struct BodyTimedOut(pub Duration);

/// What bounds a client's request body as it streams.
#[derive(Clone, Copy, Debug)]
pub struct BodyRules {
    /// `limits.maxRequestBodyBytes`.
    pub max_bytes: u64,
    /// `limits.clientBodyTimeout`: the longest wait for the next part of it.
    pub read_timeout: Duration,
}

use crate::body_watch::{mark, progressed, Watched};
pub use crate::body_watch::{BodyState, BodyWatch};

pin_project_lite::pin_project! {
    #[project = UpstreamBodyProj]
    /// What is sent upstream: nothing (so the request can be retried), or the client's body,
    /// counted against the body-size limit and timed between reads as it streams.
    pub enum UpstreamBody {
        Empty,
        Streaming {
            #[pin] inner: RequestBody,
            remaining: u64,
            rules: BodyRules,
            wait: crate::stall::Wait,
            // Cancelled when the response beside it is given up (`crate::upstream::read_ahead::StreamCut`).
            cut: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
            // Where the client's body is (`BodyWatch`).
            watch: Option<Arc<Watched>>,
        },
        /// A small body read whole first (a mirrored request's: both copies send it).
        Buffered { data: Option<Bytes> },
    }
}

impl UpstreamBody {
    pub fn streaming(inner: RequestBody, rules: BodyRules) -> Self {
        Self::Streaming {
            inner,
            remaining: rules.max_bytes,
            rules,
            wait: crate::stall::Wait::default(),
            cut: None,
            watch: None,
        }
    }

    /// A streaming body that tells where it is (`watch`): an upstream timeout while the client
    /// is still sending is the client's, not the upstream's, and so is a body that failed.
    pub fn watched(mut self) -> Self {
        if let Self::Streaming { watch, .. } = &mut self {
            *watch = Some(Watched::new());
        }
        self
    }

    /// `None` for a body that never waits on the client (empty or read whole first), or one
    /// not `watched`.
    pub fn watch(&self) -> Option<BodyWatch> {
        match self {
            Self::Streaming { watch: Some(w), .. } => Some(BodyWatch::of(w)),
            _ => None,
        }
    }

    /// A streaming body that fails once `cut` is cancelled: the response read ahead beside it
    /// was given up, and an HTTP/2 upstream ends the stream only when both halves are done.
    pub fn cut_by(mut self, cut: Option<&crate::upstream::read_ahead::StreamCut>) -> Self {
        if let (Self::Streaming { cut: slot, .. }, Some(c)) = (&mut self, cut) {
            *slot = Some(Box::pin(c.0.clone().cancelled_owned()));
        }
        self
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
                rules,
                wait,
                cut,
                watch,
            } => {
                if cut.as_mut().is_some_and(|c| c.as_mut().poll(cx).is_ready()) {
                    return Poll::Ready(Some(Err(Box::new(crate::upstream::read_ahead::ClientStalled))));
                }
                let mut inner = inner;
                match inner.as_mut().poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        wait.progressed();
                        if let Some(data) = frame.data_ref() {
                            let len = data.len() as u64;
                            if len > *remaining {
                                mark(watch, BodyState::TooLarge);
                                return Poll::Ready(Some(Err(Box::new(BodyTooLarge { limit: rules.max_bytes }))));
                            }
                            *remaining -= len;
                        }
                        // A sender may stop polling once the body says it has ended.
                        let now = if inner.is_end_stream() {
                            BodyState::Ended
                        } else {
                            BodyState::Held
                        };
                        progressed(watch, now);
                        Poll::Ready(Some(Ok(frame)))
                    }
                    Poll::Ready(Some(Err(e))) => {
                        mark(watch, BodyState::Broken);
                        Poll::Ready(Some(Err(Box::new(ClientBodyError(e)))))
                    }
                    Poll::Ready(None) => {
                        progressed(watch, BodyState::Ended);
                        Poll::Ready(None)
                    }
                    Poll::Pending if wait.expired(cx, rules.read_timeout) => {
                        mark(watch, BodyState::TimedOut);
                        Poll::Ready(Some(Err(Box::new(BodyTimedOut(rules.read_timeout)))))
                    }
                    Poll::Pending => {
                        mark(watch, BodyState::Sending);
                        Poll::Pending
                    }
                }
            }
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

pin_project_lite::pin_project! {
    #[project = ClientBodyProj]
    /// What is sent to the client: the upstream's body, a small body of our own, or either of
    /// them counted for the access log (written when the body is done or dropped).
    pub enum ClientBody {
        Upstream { #[pin] inner: crate::upstream::response::FromUpstream },
        Own { #[pin] inner: http_body_util::Full<Bytes> },
        Logged { inner: Pin<Box<ClientBody>>, log: crate::access_log::PendingLog },
        /// Parts made as they go (a transcoded server stream's JSON lines).
        /// An error ends it as one (a stream given up), not as a clean end.
        Channel { rx: tokio::sync::mpsc::Receiver<Result<Bytes, Box<dyn std::error::Error + Send + Sync>>> },
    }
}

impl ClientBody {
    pub fn upstream(inner: impl Into<crate::upstream::response::FromUpstream>) -> Self {
        Self::Upstream { inner: inner.into() }
    }

    /// An upstream's body read ahead of an HTTP/2 client when it needs to be
    /// (`FromUpstream::read_ahead`); any other body as it is.
    fn read_ahead(self, limit: Duration, cut: Option<crate::upstream::read_ahead::StreamCut>) -> Self {
        match self {
            Self::Upstream { inner } => Self::Upstream {
                inner: inner.read_ahead(limit, cut),
            },
            other => other,
        }
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project() {
            ClientBodyProj::Upstream { inner } => inner.poll_frame(cx),
            ClientBodyProj::Own { inner } => inner.poll_frame(cx).map_err(|never| match never {}),
            ClientBodyProj::Channel { rx } => rx.poll_recv(cx).map(|d| d.map(|d| d.map(Frame::data))),
            ClientBodyProj::Logged { inner, log } => {
                let polled = inner.as_mut().poll_frame(cx);
                if let Poll::Ready(Some(Ok(frame))) = &polled {
                    if let Some(d) = frame.data_ref() {
                        log.bytes += d.len() as u64;
                    }
                }
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Upstream { inner } => inner.is_end_stream(),
            Self::Own { inner } => inner.is_end_stream(),
            Self::Logged { inner, .. } => inner.is_end_stream(),
            Self::Channel { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Upstream { inner } => inner.size_hint(),
            Self::Own { inner } => inner.size_hint(),
            Self::Logged { inner, .. } => inner.size_hint(),
            Self::Channel { .. } => SizeHint::default(),
        }
    }
}

/// The response read ahead of an HTTP/2 client (`read_ahead` is its `limits.sendTimeout`), so
/// a client that stops taking it cannot hold a shared HTTP/2 upstream connection's window or
/// an HTTP/1.1 upstream connection (`crate::upstream::read_ahead`); `cut` ends the request body
/// beside it if it is given up.
pub fn ahead_of_client(
    resp: http::Response<ClientBody>,
    read_ahead: Option<Duration>,
    cut: Option<crate::upstream::read_ahead::StreamCut>,
) -> http::Response<ClientBody> {
    match read_ahead {
        Some(limit) => resp.map(|b| b.read_ahead(limit, cut)),
        None => resp,
    }
}

pub fn full(text: &'static str) -> ClientBody {
    ClientBody::Own {
        inner: http_body_util::Full::new(Bytes::from_static(text.as_bytes())),
    }
}

pub fn full_owned(text: String) -> ClientBody {
    ClientBody::Own {
        inner: http_body_util::Full::new(Bytes::from(text)),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_streaming_body_fails_once_its_response_is_given_up() {
        let rules = BodyRules {
            max_bytes: 1024,
            read_timeout: Duration::from_secs(60),
        };
        let cut = crate::upstream::read_ahead::StreamCut::default();
        let inner = RequestBody::Full {
            data: Some(Bytes::from_static(b"first")),
        };
        let mut body = UpstreamBody::streaming(inner, rules).cut_by(Some(&cut));
        assert!(body.frame().await.unwrap().is_ok(), "passes while the response is read");
        cut.0.cancel();
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(err.is::<crate::upstream::read_ahead::ClientStalled>(), "{err}");
    }
}
