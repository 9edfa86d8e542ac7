//! A response body as it comes from an upstream: hyper's (HTTP/2, and HTTP/1.1 requests that
//! stream a body or upgrade), our own HTTP/1.1 exchange's (`h1relay`), or an HTTP/2 one read
//! ahead of an HTTP/2 client (`read_ahead`).
//!
//! Once an attempt has its answer, the body also carries what the request holds until the body
//! ends (`until_end`): its endpoint's connection permit and in-flight count, so
//! `maxConnectionsPerEndpoint` bounds the connections a streamed answer keeps busy and P2C sees
//! it as load; and the route's `responseIdleTimeout`, the longest wait for the upstream's next
//! part (nginx's `proxy_read_timeout` past the headers, Envoy's stream idle timeout).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use prometheus_client::metrics::counter::Counter;

use super::endpoint::EndpointSlot;
use super::h1relay::RelayBody;
use super::h2pool::StreamCount;
use super::read_ahead::{ReadAhead, StreamCut};

/// The upstream sent no part of its response body for the route's `responseIdleTimeout`.
#[derive(Debug, thiserror::Error)]
#[error("the upstream sent nothing for {0:?} (responseIdleTimeout); its response was cut off")]
pub struct UpstreamStalled(pub Duration);

pin_project_lite::pin_project! {
    #[project = SourceProj]
    enum Source {
        Hyper { #[pin] inner: Incoming },
        Relay { #[pin] inner: RelayBody },
        Ahead { #[pin] inner: ReadAhead },
    }
}

pin_project_lite::pin_project! {
    pub struct FromUpstream {
        #[pin]
        source: Source,
        // Given back when the body's last part is read, it fails, or it is dropped.
        held: Held,
        idle: Option<Idle>,
    }
}

/// `responseIdleTimeout`'s timer, and where a stall is counted.
struct Idle {
    limit: Duration,
    wait: crate::stall::Wait,
    stalls: Counter,
    /// The request body streaming beside the answer (a gRPC bidirectional call): its parts
    /// count as activity too, as in Envoy's stream idle timeout, so a server that waits on its
    /// client is not cut off.
    request: Option<crate::body_watch::BodyWatch>,
}

impl Idle {
    /// After the timer ran out: whether the stream was quiet both ways for the whole limit
    /// (else the timer now runs from the request body's last part).
    fn quiet(&mut self, cx: &mut Context<'_>) -> bool {
        match &self.request {
            Some(r) => !self.wait.moved_at(cx, r.last_progress(), self.limit),
            None => true,
        }
    }
}

/// What a response body holds of its upstream until its last part is read: the endpoint's
/// connection permit and in-flight count, and its stream's count on an HTTP/2 connection.
#[derive(Default)]
struct Held {
    slot: Option<EndpointSlot>,
    stream: Option<StreamCount>,
}

impl Held {
    fn release(&mut self) {
        self.slot = None;
        self.stream = None;
    }
}

impl FromUpstream {
    fn of(source: Source) -> Self {
        Self {
            source,
            held: Held::default(),
            idle: None,
        }
    }

    /// An HTTP/2 upstream's body holds its stream's count on the connection until it ends.
    pub(super) fn on_stream(mut self, stream: StreamCount) -> Self {
        if !self.is_end_stream() {
            self.held.stream = Some(stream);
        }
        self
    }

    /// The body holds `slot` until its last part is read, and fails once neither the upstream
    /// nor the client's streamed `request` body sends anything for `idle` (counted in
    /// `stalls`). A body that has ended (an empty one) gives the slot back at once.
    pub fn until_end(
        mut self,
        slot: EndpointSlot,
        (idle, request): (Duration, Option<crate::body_watch::BodyWatch>),
        stalls: &Counter,
    ) -> Self {
        if self.is_end_stream() {
            return self;
        }
        self.held.slot = Some(slot);
        self.idle = Some(Idle {
            limit: idle,
            wait: Default::default(),
            stalls: stalls.clone(),
            request,
        });
        self
    }

    /// For an HTTP/2 client: a body still open is read ahead by a task that drops it (an
    /// HTTP/2 upstream stream is reset, an HTTP/1.1 connection closed), and cancels `cut`, when
    /// the client falls behind and stays too slow for `limit` (`read_ahead`); a body that has
    /// ended is as it is. The task owns what the body holds, and its idle timer.
    pub fn read_ahead(self, limit: Duration, cut: Option<StreamCut>) -> Self {
        if matches!(self.source, Source::Ahead { .. }) || self.source.is_end_stream() {
            return self;
        }
        Self::of(Source::Ahead {
            inner: ReadAhead::start(self, limit, cut),
        })
    }
}

impl From<Incoming> for FromUpstream {
    fn from(inner: Incoming) -> Self {
        Self::of(Source::Hyper { inner })
    }
}

impl From<RelayBody> for FromUpstream {
    fn from(inner: RelayBody) -> Self {
        Self::of(Source::Relay { inner })
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Body for FromUpstream {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        let polled: Poll<Option<Result<Frame<Bytes>, BoxError>>> = match this.source.as_mut().project() {
            SourceProj::Hyper { inner } => inner.poll_frame(cx).map_err(Into::into),
            SourceProj::Relay { inner } => inner.poll_frame(cx).map_err(Into::into),
            SourceProj::Ahead { inner } => inner.poll_frame(cx),
        };
        match &polled {
            Poll::Ready(Some(Ok(_))) => {
                if let Some(idle) = this.idle.as_mut() {
                    idle.wait.progressed();
                }
                // The last part read: what it held is free, though the client may not have
                // taken the part yet.
                if this.source.is_end_stream() {
                    this.held.release();
                }
            }
            Poll::Ready(_) => {
                this.held.release();
            }
            Poll::Pending => {
                let stalled = this
                    .idle
                    .as_mut()
                    .is_some_and(|i| i.wait.expired(cx, i.limit) && i.quiet(cx));
                if let Some(idle) = this.idle.take_if(|_| stalled) {
                    idle.stalls.inc();
                    this.held.release();
                    return Poll::Ready(Some(Err(UpstreamStalled(idle.limit).into())));
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.source.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Hyper { inner } => inner.size_hint(),
            Source::Relay { inner } => inner.size_hint(),
            Source::Ahead { inner } => inner.size_hint(),
        }
    }
}

impl Source {
    fn is_end_stream(&self) -> bool {
        match self {
            Source::Hyper { inner } => inner.is_end_stream(),
            Source::Relay { inner } => inner.is_end_stream(),
            Source::Ahead { inner } => inner.is_end_stream(),
        }
    }
}

/// A response from an upstream.
pub type UpstreamResponse = http::Response<FromUpstream>;
