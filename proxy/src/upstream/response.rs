//! A response body as it comes from an upstream: hyper's (HTTP/2, and HTTP/1.1 requests that
//! stream a body or upgrade), our own HTTP/1.1 exchange's (`h1relay`), or an HTTP/2 one read
//! ahead of an HTTP/2 client (`read_ahead`).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::h1relay::RelayBody;
use super::read_ahead::{ReadAhead, StreamCut};

pin_project_lite::pin_project! {
    #[project = FromUpstreamProj]
    pub enum FromUpstream {
        Hyper { #[pin] inner: Incoming },
        Relay { #[pin] inner: RelayBody },
        Ahead { #[pin] inner: ReadAhead },
    }
}

impl FromUpstream {
    /// For an HTTP/2 client: a body still open is read ahead by a task that drops it (an
    /// HTTP/2 upstream stream is reset, an HTTP/1.1 connection closed), and cancels `cut`, when
    /// the client falls behind and stays too slow for `limit` (`read_ahead`); a body that has
    /// ended is as it is.
    pub fn read_ahead(self, limit: std::time::Duration, cut: Option<StreamCut>) -> Self {
        match self {
            Self::Hyper { inner } if !inner.is_end_stream() => Self::Ahead {
                inner: ReadAhead::start(inner, limit, cut),
            },
            Self::Relay { inner } if !inner.is_end_stream() => Self::Ahead {
                inner: ReadAhead::start(inner, limit, cut),
            },
            other => other,
        }
    }
}

impl From<Incoming> for FromUpstream {
    fn from(inner: Incoming) -> Self {
        Self::Hyper { inner }
    }
}

impl From<RelayBody> for FromUpstream {
    fn from(inner: RelayBody) -> Self {
        Self::Relay { inner }
    }
}

impl Body for FromUpstream {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project() {
            FromUpstreamProj::Hyper { inner } => inner.poll_frame(cx).map_err(Into::into),
            FromUpstreamProj::Relay { inner } => inner.poll_frame(cx).map_err(Into::into),
            FromUpstreamProj::Ahead { inner } => inner.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Hyper { inner } => inner.is_end_stream(),
            Self::Relay { inner } => inner.is_end_stream(),
            Self::Ahead { inner } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Hyper { inner } => inner.size_hint(),
            Self::Relay { inner } => inner.size_hint(),
            Self::Ahead { inner } => inner.size_hint(),
        }
    }
}

/// A response from an upstream.
pub type UpstreamResponse = http::Response<FromUpstream>;
