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
use crate::upstream::response::FromUpstream;
use crate::upstream::{EndpointSlot, UpstreamCluster};

/// Forwards a WebSocket handshake and, on 101, joins the client and the upstream. An HTTP/2
/// client's `read_ahead` (`limits.sendTimeout`) bounds how long it may leave a refusal's body
/// unread, as for any answer.
pub async fn tunnel(
    target: Target<'_>,
    mut req: Request<RequestBody>,
    (client, trusted): (Arc<ClientInfo>, &[proxyfleet_config::Cidr]),
    started: Instant,
    read_ahead: Option<std::time::Duration>,
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
    let key = upstream_req.headers().get(header::SEC_WEBSOCKET_KEY).cloned();
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
        // An answer that is no upgrade holds the endpoint's permit until its body is read, as
        // any other answer does, and an HTTP/2 client that opens no window for it cannot hold
        // it longer than its `read_ahead`.
        let stalls = &cluster.metrics.response_stalls;
        let idle = (route.response_idle_timeout, None);
        let resp = client_response(resp.map(|b| FromUpstream::from(b).until_end(endpoint_slot, idle, stalls)));
        return crate::body::ahead_of_client(resp, read_ahead, None);
    }
    // Only a WebSocket handshake the upstream completed opens a tunnel: a 101 from anything
    // else (an endpoint that echoes a status) would hand the client a raw connection to the
    // upstream's HTTP port, past the route's rules and forwarding headers.
    if !accepts_websocket(resp.headers(), key.as_ref()) {
        tracing::debug!(upstream = %cluster.name, "101 without a valid WebSocket handshake");
        return status_response(StatusCode::BAD_GATEWAY, "upstream upgrade failed\n");
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

/// Whether a 101's headers complete the WebSocket handshake for `key` (RFC 6455 §4.1): an
/// `Upgrade: websocket` and the `Sec-WebSocket-Accept` derived from the key sent.
fn accepts_websocket(headers: &http::HeaderMap, key: Option<&HeaderValue>) -> bool {
    use base64::Engine;
    use sha1::Digest;
    const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    let Some(key) = key else { return false };
    let mut hash = sha1::Sha1::new();
    hash.update(key.as_bytes());
    hash.update(GUID);
    let expected = base64::engine::general_purpose::STANDARD.encode(hash.finalize());
    crate::forwarding::header_has_token(headers, &header::UPGRADE, "websocket")
        && headers
            .get(header::SEC_WEBSOCKET_ACCEPT)
            .is_some_and(|a| a.as_bytes() == expected.as_bytes())
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
        crate::forwarding::join_cookies(&mut parts.headers);
    }
    strip_hop_by_hop(&mut parts.headers);
    // The handshake goes without a body: a length the client gave would make the upstream
    // wait for one, or read the first tunnel bytes as it.
    parts.headers.remove(header::CONTENT_LENGTH);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_completed_websocket_handshake_opens_a_tunnel() {
        // RFC 6455 §1.3's example.
        let key = HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ==");
        let answer = |upgrade: &'static str, accept: &'static str| {
            let mut h = http::HeaderMap::new();
            h.insert(header::UPGRADE, HeaderValue::from_static(upgrade));
            h.insert(header::SEC_WEBSOCKET_ACCEPT, HeaderValue::from_static(accept));
            h
        };
        let good = answer("websocket", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert!(accepts_websocket(&good, Some(&key)));
        assert!(accepts_websocket(
            &answer("WebSocket", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
            Some(&key)
        ));
        assert!(!accepts_websocket(&good, None), "no key was sent");
        assert!(!accepts_websocket(&answer("websocket", "wrong"), Some(&key)));
        assert!(!accepts_websocket(
            &answer("h2c", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
            Some(&key)
        ));
        assert!(!accepts_websocket(&http::HeaderMap::new(), Some(&key)), "a bare 101");
    }
}
