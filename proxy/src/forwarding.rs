//! What passes between client and upstream, and how: the client's identity, hop-by-hop
//! headers (RFC 9110 §7.6.1) removed, forwarding headers added, the proxy's own responses.
//! Shared by the request path (`handler`) and the WebSocket tunnel (`upgrade`).

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};

use crate::body::{self, ClientBody};

/// Where a request came from: one per connection, shared by its requests.
pub struct ClientInfo {
    pub remote: SocketAddr,
    pub tls: Option<TlsFacts>,
    /// The client's IP as a header value, made once per connection, not per request.
    pub remote_ip: HeaderValue,
    /// The listener's access log, when it has one.
    pub access_log: Option<Arc<crate::access_log::ListenerLog>>,
    /// Held until the connection and every tunnel it started are gone.
    pub slot: Option<crate::client_slots::ConnectionSlot>,
    /// Held likewise: a drain waits for it, so an HTTP/1.1 WebSocket or CONNECT tunnel (which
    /// outlives the HTTP connection it came from) is given the drain's deadline too.
    pub drain: Option<tokio::sync::watch::Receiver<bool>>,
}

/// What the TLS handshake agreed on.
pub struct TlsFacts {
    /// The SNI name the client asked for, lower case.
    pub sni: Option<String>,
    pub version: &'static str,
    pub resumed: bool,
    /// The listener's certificates at handshake time (to tell whether a Host is covered).
    pub certs: Arc<crate::tls::SniCertificates>,
}

/// A tunnel could not get a slot: the connection limits are reached.
#[derive(Debug)]
pub struct AtConnectionLimit;

impl ClientInfo {
    /// What a tunnel opened by a request of `version` holds besides this connection's slot:
    /// nothing over HTTP/1.1, where the connection itself becomes the tunnel; a slot of its
    /// own over HTTP/2 and HTTP/3, whose one connection carries many.
    pub fn tunnel_slot(
        &self,
        version: http::Version,
    ) -> Result<Option<crate::client_slots::ConnectionSlot>, AtConnectionLimit> {
        if version < http::Version::HTTP_2 {
            return Ok(None);
        }
        match &self.slot {
            None => Ok(None),
            Some(slot) => slot.for_tunnel().map(Some).ok_or(AtConnectionLimit),
        }
    }

    pub fn new(remote: SocketAddr, tls: Option<TlsFacts>) -> Self {
        let remote_ip = HeaderValue::from_str(&remote.ip().to_string()).unwrap_or(HeaderValue::from_static("unknown"));
        Self {
            remote,
            tls,
            remote_ip,
            access_log: None,
            slot: None,
            drain: None,
        }
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// For the access log: TLS version and whether the session was resumed.
    pub fn tls_summary(&self) -> Option<(&'static str, bool)> {
        self.tls.as_ref().map(|t| (t.version, t.resumed))
    }
}

pub fn status_response(status: StatusCode, text: &'static str) -> Response<ClientBody> {
    let mut r = Response::new(body::full(text));
    *r.status_mut() = status;
    r.extensions_mut().insert(crate::grpc::Generated);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Headers that tell an upstream about the client or the original request, dropped when an
/// untrusted client sends them (as Traefik does): an upstream that believes `X-Real-IP` or
/// `X-Forwarded-Host` could be led to a wrong allow-list decision or a poisoned absolute URL.
/// X-Forwarded-For and -Proto are rewritten instead.
const CLIENT_CLAIMS: [HeaderName; 8] = [
    header::FORWARDED,
    HeaderName::from_static("x-real-ip"),
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-prefix"),
    HeaderName::from_static("x-forwarded-server"),
    HeaderName::from_static("x-forwarded-uri"),
    HeaderName::from_static("x-forwarded-method"),
];

const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    KEEP_ALIVE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    PROXY_CONNECTION,
];

pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the message's few names finds which hop-by-hop headers it has (usually
    // none, or a `Connection: keep-alive`); only those are removed.
    let mut present = 0u8;
    let mut connection_names_others = false;
    for (name, value) in headers.iter() {
        if let Some(i) = HOP_BY_HOP.iter().position(|h| h == name) {
            present |= 1 << i;
            if i == 0 {
                connection_names_others |= names_other_headers(value);
            }
        }
    }
    if present == 0 {
        return;
    }
    // Headers named in Connection are hop-by-hop too.
    if connection_names_others {
        let listed: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
            .collect();
        for n in listed {
            headers.remove(n);
        }
    }
    // `TE: trailers` is the one TE value passed on: gRPC servers refuse requests without it.
    let te_trailers = present & TE_BIT != 0 && header_has_token(headers, &header::TE, "trailers");
    for (i, h) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(h);
        }
    }
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// RFC 9110 §7.6.1: the headers a client's `Connection` names belong to its hop and go as the
/// request is received, before the proxy adds its own (request id, trace context, verified
/// claims), which a removal by name at forwarding time would take away too. `Host` is never
/// one of them (every request needs it). `Connection` keeps only its standard options, which
/// the upgrade check reads and `strip_hop_by_hop` removes when forwarding.
pub fn strip_connection_options(headers: &mut HeaderMap) {
    if !headers.get_all(header::CONNECTION).iter().any(names_other_headers) {
        return;
    }
    let mut listed = Vec::new();
    let mut standard = Vec::new();
    for value in headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
    {
        for token in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let hop = token.eq_ignore_ascii_case("close")
                || HOP_BY_HOP.iter().any(|h| token.eq_ignore_ascii_case(h.as_str()));
            match HeaderName::from_bytes(token.as_bytes()) {
                _ if hop => standard.push(token.to_ascii_lowercase()),
                Ok(name) if name != header::HOST => listed.push(name),
                _ => {}
            }
        }
    }
    for name in listed {
        headers.remove(name);
    }
    headers.remove(header::CONNECTION);
    if let Ok(v) = HeaderValue::from_str(&standard.join(", ")) {
        if !standard.is_empty() {
            headers.insert(header::CONNECTION, v);
        }
    }
}

/// Bit of `TE` in `strip_hop_by_hop`'s presence mask (its index in HOP_BY_HOP).
const TE_BIT: u8 = 1 << 4;

/// Whether a comma-separated header (`Connection`, `Upgrade`, `TE` …) lists `token`, ignoring
/// case and any `;parameters`.
pub fn header_has_token(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .any(|t| {
            let t = t.split(|&b| b == b';').next().unwrap_or(t).trim_ascii();
            t.eq_ignore_ascii_case(token.as_bytes())
        })
}

/// Whether a Connection value names a header other than the hop-by-hop ones removed anyway.
fn names_other_headers(value: &HeaderValue) -> bool {
    value.as_bytes().split(|&b| b == b',').any(|token| {
        let token = token.trim_ascii();
        !token.is_empty()
            && !token.eq_ignore_ascii_case(b"close")
            && !HOP_BY_HOP
                .iter()
                .any(|h| token.eq_ignore_ascii_case(h.as_str().as_bytes()))
    })
}

/// `X-Forwarded-For`: appended to when the peer is a trusted proxy, otherwise replaced by the
/// peer's address (a client cannot make up the address upstreams see); `X-Forwarded-Proto`.
/// A `content-length` value: digits only (`+5`, ` 5` or `5,5` are not lengths; RFC 9110 §8.6).
pub fn parse_content_length(value: &HeaderValue) -> Option<u64> {
    let b = value.as_bytes();
    if b.is_empty() || b.len() > 19 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    b.iter()
        .try_fold(0u64, |n, d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

/// Several `cookie` fields (HTTP/2 and HTTP/3 clients split them) joined into one with "; ",
/// as an HTTP/1.1 upstream needs them (RFC 9113 §8.2.3); an HTTP/2 upstream takes either.
pub fn join_cookies(headers: &mut HeaderMap) {
    if headers.get_all(header::COOKIE).iter().nth(1).is_none() {
        return;
    }
    let mut joined = Vec::new();
    for v in headers.get_all(header::COOKIE) {
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(v.as_bytes());
    }
    // Made of valid values and "; ": valid too.
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, v);
    }
}

pub fn append_forwarded(headers: &mut HeaderMap, client: &ClientInfo, trusted: &[proxyfleet_config::Cidr]) {
    let peer_trusted = !trusted.is_empty() && trusted.iter().any(|c| c.contains(client.remote.ip()));
    // A trusted proxy's list may come as several field lines (RFC 9110 §5.3): all of them,
    // in order, then this peer.
    let value = if peer_trusted && headers.contains_key(&X_FORWARDED_FOR) {
        let mut list = String::new();
        for prev in headers.get_all(&X_FORWARDED_FOR).iter().filter_map(|v| v.to_str().ok()) {
            list.push_str(prev);
            list.push_str(", ");
        }
        list.push_str(&client.remote.ip().to_string());
        HeaderValue::from_str(&list).ok()
    } else {
        Some(client.remote_ip.clone())
    };
    if let Some(v) = value {
        headers.insert(X_FORWARDED_FOR, v);
    }
    if !peer_trusted {
        for name in &CLIENT_CLAIMS {
            headers.remove(name);
        }
    }
    headers.insert(
        X_FORWARDED_PROTO,
        HeaderValue::from_static(if client.is_tls() { "https" } else { "http" }),
    );
}

pub fn client_response<B: Into<crate::upstream::response::FromUpstream>>(resp: Response<B>) -> Response<ClientBody> {
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Response::from_parts(parts, ClientBody::upstream(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn names(h: &HeaderMap) -> Vec<&str> {
        let mut n: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        n.sort_unstable();
        n
    }

    /// The headers a client's Connection names go before the proxy adds its own of those
    /// names; the standard options stay for the upgrade check; Host always stays.
    #[test]
    fn connection_options_go_as_received_and_host_stays() {
        let mut h = headers(&[
            ("host", "a"),
            ("connection", "Upgrade, x-user-id, host"),
            ("connection", "traceparent"),
            ("x-user-id", "spoofed"),
            ("traceparent", "00-spoofed"),
            ("upgrade", "websocket"),
        ]);
        strip_connection_options(&mut h);
        assert_eq!(names(&h), ["connection", "host", "upgrade"]);
        assert_eq!(h.get("connection").unwrap(), "upgrade");
        // What the proxy adds afterwards survives forwarding.
        h.insert("x-user-id", HeaderValue::from_static("verified"));
        strip_hop_by_hop(&mut h);
        assert_eq!(names(&h), ["host", "x-user-id"]);
        let mut plain = headers(&[("connection", "keep-alive"), ("x-a", "1")]);
        strip_connection_options(&mut plain);
        assert_eq!(names(&plain), ["connection", "x-a"], "nothing named: untouched");
    }

    /// A trusted peer's X-Forwarded-For in several field lines is kept whole, in order.
    #[test]
    fn a_trusted_peers_forwarded_for_lines_are_all_kept() {
        let client = ClientInfo::new("10.0.0.9:4000".parse().unwrap(), None);
        let trusted = vec![proxyfleet_config::Cidr::parse("10.0.0.0/8").unwrap()];
        let mut h = headers(&[("x-forwarded-for", "203.0.113.7"), ("x-forwarded-for", "198.51.100.2")]);
        append_forwarded(&mut h, &client, &trusted);
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h.get("x-forwarded-for").unwrap(), "203.0.113.7, 198.51.100.2, 10.0.0.9");
        let mut untrusted = headers(&[("x-forwarded-for", "203.0.113.7")]);
        append_forwarded(&mut untrusted, &client, &[]);
        assert_eq!(untrusted.get("x-forwarded-for").unwrap(), "10.0.0.9");
    }

    /// What only a trusted proxy may say about the client goes when anyone else says it.
    #[test]
    fn an_untrusted_clients_claims_about_itself_are_dropped() {
        let client = ClientInfo::new("10.0.0.9:4000".parse().unwrap(), None);
        let claims = [
            ("forwarded", "for=127.0.0.1"),
            ("x-real-ip", "127.0.0.1"),
            ("x-forwarded-host", "evil.example"),
            ("x-forwarded-port", "443"),
            ("x-forwarded-prefix", "/admin"),
            ("x-custom", "kept"),
        ];
        let mut untrusted = headers(&claims);
        append_forwarded(&mut untrusted, &client, &[]);
        assert_eq!(names(&untrusted), ["x-custom", "x-forwarded-for", "x-forwarded-proto"]);
        let trusted = vec![proxyfleet_config::Cidr::parse("10.0.0.0/8").unwrap()];
        let mut from_a_proxy = headers(&claims);
        append_forwarded(&mut from_a_proxy, &client, &trusted);
        assert_eq!(from_a_proxy.get("x-forwarded-host").unwrap(), "evil.example");
        assert_eq!(from_a_proxy.get("x-real-ip").unwrap(), "127.0.0.1");
    }

    #[test]
    fn end_to_end_headers_pass_untouched() {
        let mut h = headers(&[("host", "a"), ("content-length", "3"), ("x-custom", "1")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(names(&h), ["content-length", "host", "x-custom"]);
    }

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut h = headers(&[
            ("host", "a"),
            ("connection", "keep-alive"),
            ("keep-alive", "timeout=5"),
            ("te", "gzip"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("proxy-connection", "close"),
            ("proxy-authorization", "Basic x"),
            ("proxy-authenticate", "Basic"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(names(&h), ["host"]);
    }

    #[test]
    fn te_trailers_is_kept_other_te_values_are_not() {
        let mut h = headers(&[("te", "trailers"), ("grpc-timeout", "1S")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.get("te").unwrap(), "trailers");
        let mut h = headers(&[("te", "gzip, trailers;q=0.5")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.get("te").unwrap(), "trailers");
        let mut h = headers(&[("te", "gzip")]);
        strip_hop_by_hop(&mut h);
        assert!(h.get("te").is_none());
    }

    #[test]
    fn headers_named_in_connection_are_removed() {
        let mut h = headers(&[
            ("connection", "close, X-Secret"),
            ("connection", "x-other"),
            ("x-secret", "1"),
            ("x-other", "2"),
            ("x-kept", "3"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(names(&h), ["x-kept"]);
    }

    #[test]
    fn a_connection_value_of_only_hop_by_hop_tokens_names_nothing_else() {
        assert!(!names_other_headers(&HeaderValue::from_static("keep-alive")));
        assert!(!names_other_headers(&HeaderValue::from_static("Close , Upgrade")));
        assert!(names_other_headers(&HeaderValue::from_static("keep-alive, x-a")));
    }

    #[test]
    fn split_cookies_are_joined_for_an_http11_upstream() {
        let mut h = headers(&[("cookie", "a=1"), ("cookie", "b=2"), ("cookie", "c=3")]);
        join_cookies(&mut h);
        let all: Vec<_> = h.get_all(header::COOKIE).iter().collect();
        assert_eq!(all, ["a=1; b=2; c=3"]);
        let mut one = headers(&[("cookie", "a=1")]);
        join_cookies(&mut one);
        assert_eq!(one.get_all(header::COOKIE).iter().collect::<Vec<_>>(), ["a=1"]);
    }

    #[test]
    fn a_content_length_is_digits_only() {
        let parse = |v: &'static str| parse_content_length(&HeaderValue::from_static(v));
        assert_eq!(parse("0"), Some(0));
        assert_eq!(parse("1234"), Some(1234));
        assert_eq!(parse("+5"), None);
        assert_eq!(parse("5,5"), None);
        assert_eq!(parse(""), None);
        assert_eq!(parse("-1"), None);
        assert_eq!(parse("99999999999999999999"), None);
    }
}
