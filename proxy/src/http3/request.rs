//! One HTTP/3 request stream: headers in, through the request path, the response out.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use prometheus_client::metrics::counter::Counter;

use super::H3Body;
use crate::body::{ClientBody, RequestBody};
use crate::forwarding::{status_response, ClientInfo};
use crate::shared::Shared;

type Resolver = h3::server::RequestResolver<h3_quinn::Connection, Bytes>;
type SendStream = h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;

/// The longest wait for the end of a request that announces no body.
const SETTLE_AT_MOST: Duration = Duration::from_secs(1);

/// RFC 8470 §5.1: tells the upstream a request came in early data (it may answer 425).
const EARLY_DATA: HeaderName = HeaderName::from_static("early-data");

/// Resolves when a 0-RTT connection's handshake completes, the connection is lost, or the
/// handshake took too long (the connection is closed then).
pub type Handshake = futures_util::future::Shared<futures_util::future::BoxFuture<'static, bool>>;

/// What a connection's requests need to know about 0-RTT.
pub struct EarlyData {
    /// `None` when the connection completed its handshake before its first request.
    pub handshake: Option<Handshake>,
    pub connection: quinn::Connection,
    pub served: Counter,
    pub waited: Counter,
}

impl EarlyData {
    /// Whether the handshake is complete now: a request read before is early data. Read from
    /// the connection's own state (no task in between), so a request sent after the client's
    /// Finished is never taken for early data.
    fn handshake_done(&self) -> bool {
        match &self.handshake {
            None => true,
            Some(h) => h.clone().now_or_never().is_some() && self.connection.close_reason().is_none(),
        }
    }

    /// Waits for the handshake; false when the connection was lost first.
    async fn wait_for_handshake(&self) -> bool {
        if let Some(h) = &self.handshake {
            h.clone().await;
        }
        self.connection.close_reason().is_none()
    }
}

/// Reads one request, serves it, and writes the response.
pub async fn serve(resolver: Resolver, shared: Arc<Shared>, client: Arc<ClientInfo>, early: Arc<EarlyData>) {
    // The request's HEADERS within the header timeout, as on TCP: a stream opened and left
    // empty is dropped (reset), not kept for ever.
    let limit = shared.state.load().config.limits.header_read_timeout.get();
    let Ok(resolved) = tokio::time::timeout(limit, resolver.resolve_request()).await else {
        shared.metrics.malformed_requests.inc();
        return;
    };
    let Ok((req, stream)) = resolved else {
        // A malformed request stream: h3 has already answered it with a stream error.
        shared.metrics.malformed_requests.inc();
        return;
    };
    let (mut send, recv) = stream.split();
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(crate::forwarding::parse_content_length);
    let (send_timeout, body_timeout) = {
        let state = shared.state.load();
        (
            state.config.limits.send_timeout(),
            state.config.limits.client_body_timeout(),
        )
    };
    let mut body = H3Body::new(recv, length);
    if announces_no_body(req.method(), length) {
        // The FIN comes with the HEADERS or right after them; a client that keeps the stream
        // open longer gets its request forwarded as one with a streaming body.
        body.settle(body_timeout.min(SETTLE_AT_MOST)).await;
    }
    let malformed = body.failed();
    let mut req = req.map(|()| RequestBody::H3 { inner: body });
    let resp = if malformed {
        shared.metrics.malformed_requests.inc();
        status_response(StatusCode::BAD_REQUEST, "malformed request body\n")
    } else if req.method() == Method::CONNECT {
        // Neither CONNECT tunnels nor WebSocket over HTTP/3 (RFC 9220) are served here.
        status_response(StatusCode::NOT_IMPLEMENTED, "CONNECT is not served over HTTP/3\n")
    } else {
        if !early.handshake_done() {
            if replay_safe(&req) {
                early.served.inc();
                req.headers_mut().insert(EARLY_DATA, HeaderValue::from_static("1"));
            } else {
                early.waited.inc();
                if !early.wait_for_handshake().await {
                    return; // the handshake failed: nothing of this request is trusted
                }
            }
        }
        // Boxed, as the TCP listeners' service does (server.rs): this future is spawned per
        // request, and unboxed it would carry all ~14 KiB of the request path's.
        match Box::pin(crate::handler::handle(req, shared, client)).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        }
    };
    if let Err(e) = respond(&mut send, resp, send_timeout).await {
        tracing::debug!(error = %e, "HTTP/3 response not completed");
    }
}

/// A request that says it has no body: `content-length: 0`, or a method that takes none
/// without a `content-length`.
fn announces_no_body(method: &Method, length: Option<u64>) -> bool {
    match length {
        Some(n) => n == 0,
        None => matches!(
            *method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::DELETE | Method::TRACE
        ),
    }
}

/// Early data can be replayed: only requests that change nothing are served from it.
fn replay_safe(req: &Request<RequestBody>) -> bool {
    use http_body::Body as _;
    matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) && req.body().is_end_stream()
}

#[derive(Debug, thiserror::Error)]
enum RespondError {
    #[error("sending the response: {0}")]
    Stream(#[from] h3::error::StreamError),
    #[error("the client read nothing for {0:?}")]
    TimedOut(Duration),
    #[error("the response body failed: {0}")]
    Body(Box<dyn std::error::Error + Send + Sync>),
}

/// Writes the response head, body and trailers, each write bounded by `limits.sendTimeout`.
async fn respond(
    send: &mut SendStream,
    resp: Response<ClientBody>,
    send_timeout: Duration,
) -> Result<(), RespondError> {
    let (mut parts, body) = resp.into_parts();
    strip_connection_headers(&mut parts.headers);
    timed(send_timeout, send.send_response(Response::from_parts(parts, ()))).await?;
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
                return Err(RespondError::Body(e));
            }
        };
        match frame.into_data() {
            Ok(data) => timed(send_timeout, send.send_data(data)).await?,
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    timed(send_timeout, send.send_trailers(trailers)).await?;
                }
            }
        }
    }
    timed(send_timeout, send.finish()).await
}

async fn timed(
    limit: Duration,
    write: impl std::future::Future<Output = Result<(), h3::error::StreamError>>,
) -> Result<(), RespondError> {
    tokio::time::timeout(limit, write)
        .await
        .map_err(|_| RespondError::TimedOut(limit))?
        .map_err(RespondError::Stream)
}

/// RFC 9114 §4.2: connection-specific fields are malformed in HTTP/3.
fn strip_connection_headers(headers: &mut HeaderMap) {
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(name);
    }
}
