//! The HTTPS redirect a plain listener can answer every request with.

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::body::ClientBody;
use crate::forwarding::status_response;

/// A plain listener's answer to everything: the same URL over HTTPS.
pub fn https_redirect<B>(req: &http::Request<B>, r: &proxyfleet_config::HttpsRedirect) -> Response<ClientBody> {
    let host =
        crate::router::request_host(req.uri(), req.headers()).filter(|h| h.parse::<http::uri::Authority>().is_ok());
    let Some(host) = host else {
        return status_response(StatusCode::BAD_REQUEST, "a redirect needs a valid Host\n");
    };
    let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let bracketed = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let location = match r.port.unwrap_or(443) {
        443 => format!("https://{bracketed}{pq}"),
        port => format!("https://{bracketed}:{port}{pq}"),
    };
    let Ok(location) = HeaderValue::from_str(&location) else {
        return status_response(StatusCode::BAD_REQUEST, "bad request target\n");
    };
    let status = r
        .status
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::PERMANENT_REDIRECT);
    let mut resp = status_response(status, "redirecting to HTTPS\n");
    resp.headers_mut().insert(header::LOCATION, location);
    resp
}
