//! gRPC awareness on the request path: a request the proxy itself fails is answered the way a
//! gRPC client understands (a trailers-only response with `grpc-status`), not with an HTML or
//! text 5xx it reports as "Received http2 header with status: 502"; and a `grpc-timeout`
//! shorter than the route's timeout becomes the deadline.

use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};

use crate::body::ClientBody;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// Marks a response the proxy generated itself (as opposed to one an upstream sent).
#[derive(Clone, Copy, Debug)]
pub struct Generated;

pub fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The gRPC status code for an HTTP status the proxy answered with (gRPC's own mapping of
/// HTTP to gRPC codes, with 504 as DEADLINE_EXCEEDED: the proxy knows it was a timeout).
pub fn status_code(http: StatusCode) -> u8 {
    match http.as_u16() {
        504 => 4,              // DEADLINE_EXCEEDED
        404 => 12,             // UNIMPLEMENTED (no route)
        413 => 8,              // RESOURCE_EXHAUSTED
        400 => 13,             // INTERNAL
        401 => 16,             // UNAUTHENTICATED
        403 => 7,              // PERMISSION_DENIED
        429 | 502 | 503 => 14, // UNAVAILABLE
        _ => 2,                // UNKNOWN
    }
}

/// A proxy-generated error as a trailers-only gRPC response; anything else unchanged.
pub fn answer(resp: Response<ClientBody>) -> Response<ClientBody> {
    if resp.extensions().get::<Generated>().is_none() || resp.status() == StatusCode::OK {
        return resp;
    }
    let code = status_code(resp.status());
    let reason = resp.status().canonical_reason().unwrap_or("error");
    let message = format!("proxyfleet: {} {reason}", resp.status().as_u16());
    let mut out = Response::new(crate::body::full(""));
    let h = out.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert(GRPC_STATUS, HeaderValue::from(u16::from(code)));
    if let Ok(v) = HeaderValue::from_str(&message.replace(' ', "%20")) {
        h.insert(GRPC_MESSAGE, v);
    }
    out
}

/// The client's deadline from `grpc-timeout` (`<digits><H|M|S|m|u|n>`), if it sent one.
pub fn timeout(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(GRPC_TIMEOUT)?.to_str().ok()?;
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        let t = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(GRPC_TIMEOUT, HeaderValue::from_str(v).unwrap());
            timeout(&h)
        };
        assert_eq!(t("1S"), Some(Duration::from_secs(1)));
        assert_eq!(t("250m"), Some(Duration::from_millis(250)));
        assert_eq!(t("2M"), Some(Duration::from_secs(120)));
        assert_eq!(t("99999999n"), Some(Duration::from_nanos(99_999_999)));
        assert_eq!(t("1x"), None);
        assert_eq!(t("S"), None);
        assert_eq!(t("1234567890S"), None, "at most 8 digits");
    }

    #[test]
    fn proxy_errors_become_grpc_statuses() {
        let mut r = Response::new(crate::body::full("upstream connect failed\n"));
        *r.status_mut() = StatusCode::BAD_GATEWAY;
        r.extensions_mut().insert(Generated);
        let g = answer(r);
        assert_eq!(g.status(), StatusCode::OK);
        assert_eq!(g.headers()["grpc-status"], "14");
        assert_eq!(g.headers()["content-type"], "application/grpc");
        assert_eq!(status_code(StatusCode::GATEWAY_TIMEOUT), 4);
        assert_eq!(status_code(StatusCode::NOT_FOUND), 12);
        // An upstream's own response is left alone.
        let mut up = Response::new(crate::body::full(""));
        *up.status_mut() = StatusCode::BAD_GATEWAY;
        assert_eq!(answer(up).status(), StatusCode::BAD_GATEWAY);
    }
}
