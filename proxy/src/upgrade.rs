//! WebSocket pass-through: the handshake goes to the upstream on a connection of its own;
//! once both sides have switched protocols (101), the two upgraded streams are copied to each
//! other (`relay`: each direction half-closes on its own) until both end or the tunnel idles
//! out. A WebSocket over HTTP/2 (RFC 8441: an extended CONNECT with `:protocol: websocket`)
//! becomes an HTTP/1.1 upgrade towards the upstream, and its 101 a 200 towards the client.

use std::sync::Arc;
use std::time::Instant;

use crate::body::RequestBody;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use hyper_util::rt::TokioIo;

use crate::body::{ClientBody, UpstreamBody};
use crate::forwarding::{append_forwarded, client_response, status_response, strip_hop_by_hop, ClientInfo};
use crate::router::Target;
use crate::upstream;
use crate::upstream::{EndpointSlot, UpstreamCluster};

/// Forwards a WebSocket handshake and, on 101, joins the client and the upstream.
pub async fn tunnel(
    target: Target<'_>,
    mut req: Request<RequestBody>,
    client: Arc<ClientInfo>,
    trusted: &[proxyfleet_config::Cidr],
    started: Instant,
) -> Response<ClientBody> {
    let client_side = hyper::upgrade::on(&mut req);
    let client_is_h2 = req.version() == Version::HTTP_2;
    let Ok(tunnel_slot) = client.tunnel_slot(req.version()) else {
        return status_response(StatusCode::SERVICE_UNAVAILABLE, "too many connections\n");
    };
    let (route, cluster) = (target.route, &target.backend.upstream);
    let Some(endpoint) = upstream::pick_avoiding(&cluster.endpoints.load(), None).cloned() else {
        return status_response(StatusCode::SERVICE_UNAVAILABLE, "no upstream endpoints\n");
    };
    let Some(upstream_req) = upstream_request(target, req, &client, trusted, &endpoint.authority) else {
        return status_response(StatusCode::BAD_REQUEST, "bad request target\n");
    };
    let deadline = (started + route.timeout).into();
    // The tunnel holds one of the endpoint's connections for its whole life: it counts against
    // `maxConnectionsPerEndpoint` like any request in flight, and waits as they do.
    let Ok(Some(endpoint_slot)) = tokio::time::timeout_at(deadline, EndpointSlot::take(endpoint.clone())).await else {
        return status_response(StatusCode::GATEWAY_TIMEOUT, "upstream timeout\n");
    };
    let sent = tokio::time::timeout_at(deadline, cluster.send_upgrade(&endpoint, upstream_req));
    let mut resp = match sent.await {
        Err(_) => return status_response(StatusCode::GATEWAY_TIMEOUT, "upstream timeout\n"),
        Ok(Err(e)) => {
            tracing::debug!(upstream = %cluster.name, error = %e, "upgrade failed");
            return status_response(StatusCode::BAD_GATEWAY, "upstream upgrade failed\n");
        }
        Ok(Ok(resp)) => resp,
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return client_response(resp);
    }
    let upstream_side = hyper::upgrade::on(&mut resp);
    target.backend.metrics.upgrades.inc();
    let idle = route.upgrade_idle_timeout;
    tokio::spawn(async move {
        // The tunnel keeps the client's connection slot (`client.slot`), over HTTP/2 a slot
        // of its own, and the upstream endpoint's, until it ends.
        let _slots = (client, tunnel_slot, endpoint_slot);
        match tokio::join!(client_side, upstream_side) {
            (Ok(c), Ok(u)) => {
                crate::relay::relay_streams(TokioIo::new(c), TokioIo::new(u), idle).await;
            }
            (c, u) => tracing::debug!(client = ?c.err(), upstream = ?u.err(), "upgrade not completed"),
        }
    });
    let (mut parts, _) = resp.into_parts();
    if client_is_h2 {
        // RFC 8441 §5: a 2xx, with no Connection/Upgrade or Sec-WebSocket-Accept.
        parts.status = StatusCode::OK;
        parts.version = Version::HTTP_2;
        for h in [header::CONNECTION, header::UPGRADE, header::SEC_WEBSOCKET_ACCEPT] {
            parts.headers.remove(h);
        }
    }
    // Otherwise the upstream's 101 as it is: Connection/Upgrade and Sec-WebSocket-* are end to
    // end here.
    Response::from_parts(parts, crate::body::full(""))
}

/// An HTTP/2 extended CONNECT for a WebSocket (RFC 8441).
pub fn is_extended_websocket<B>(req: &Request<B>) -> bool {
    req.method() == http::Method::CONNECT
        && req
            .extensions()
            .get::<hyper::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
}

/// A fresh `Sec-WebSocket-Key` (16 random bytes, base64) for a handshake the proxy starts.
fn websocket_key() -> HeaderValue {
    use base64::Engine;
    let bytes: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
    let key = base64::engine::general_purpose::STANDARD.encode(bytes);
    HeaderValue::from_str(&key).unwrap_or_else(|_| HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="))
}

/// The handshake as the upstream gets it: hop-by-hop headers removed, forwarding headers
/// added, then the upgrade asked for again.
fn upstream_request(
    target: Target<'_>,
    req: Request<RequestBody>,
    client: &ClientInfo,
    trusted: &[proxyfleet_config::Cidr],
    endpoint: &http::uri::Authority,
) -> Option<Request<UpstreamBody>> {
    let cluster: &UpstreamCluster = &target.backend.upstream;
    let (mut parts, _) = req.into_parts();
    if parts.version == Version::HTTP_2 {
        // RFC 8441 → RFC 6455: GET with the authority as Host and a key of our own.
        parts.method = http::Method::GET;
        if let Some(host) = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            parts.headers.insert(header::HOST, host);
        }
        parts.headers.insert(header::SEC_WEBSOCKET_KEY, websocket_key());
    }
    strip_hop_by_hop(&mut parts.headers);
    append_forwarded(&mut parts.headers, client, trusted);
    target.route.apply_request_rules(&mut parts);
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    parts
        .headers
        .insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    let pq = parts.uri.path_and_query().cloned()?;
    let uri = cluster.request_uri(endpoint, pq).ok()?;
    let mut out = Request::new(UpstreamBody::Empty);
    *out.method_mut() = parts.method;
    *out.uri_mut() = uri;
    *out.version_mut() = Version::HTTP_11;
    *out.headers_mut() = parts.headers;
    Some(out)
}
