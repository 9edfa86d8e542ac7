//! Route selection: a pure function of host, path and headers over the compiled routes.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;

use proxyfleet_config::{Fault, Route};

use crate::http_rules::{prefix_matches, CompiledHeaderOps, CompiledRewrite};
use crate::mirror::CompiledMirror;
use crate::split::{CompiledBackend, Split};

/// A host match: exact, or any subdomain of a suffix (`*.example.com`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    Exact(String),
    Subdomain(String),
}

impl HostMatch {
    pub fn parse(pattern: &str) -> Self {
        let p = pattern.to_ascii_lowercase();
        match p.strip_prefix("*.") {
            Some(suffix) => Self::Subdomain(suffix.to_string()),
            None => Self::Exact(p),
        }
    }

    pub fn matches(&self, host: &str) -> bool {
        match self {
            Self::Exact(h) => h.eq_ignore_ascii_case(host),
            Self::Subdomain(suffix) => {
                host.len() > suffix.len() + 1
                    && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                    && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
            }
        }
    }
}

/// Retries may add at most `budget_percent` % on top of the route's requests: each request
/// deposits `budget_percent` tokens, a retry costs 100, the balance is capped.
pub struct RetryBudget {
    tokens: AtomicI64,
    deposit: i64,
}

impl RetryBudget {
    const CAP: i64 = 100 * 100;

    pub fn new(budget_percent: u8) -> Self {
        // Start with room for a few retries so a quiet route can still retry.
        Self {
            tokens: AtomicI64::new(300),
            deposit: budget_percent as i64,
        }
    }

    pub fn on_request(&self) {
        let t = self.tokens.load(Ordering::Relaxed);
        if t < Self::CAP {
            self.tokens.fetch_add(self.deposit, Ordering::Relaxed);
        }
    }

    pub fn try_withdraw(&self) -> bool {
        if self.tokens.fetch_sub(100, Ordering::Relaxed) >= 100 {
            true
        } else {
            self.tokens.fetch_add(100, Ordering::Relaxed);
            false
        }
    }
}

/// An upgraded (WebSocket) connection idle this long is closed, unless the route says.
pub const UPGRADE_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

pub struct CompiledRoute {
    pub name: std::sync::Arc<str>,
    pub host: Option<HostMatch>,
    pub path_prefix: String,
    pub header: Option<(HeaderName, HeaderValue)>,
    /// The route's upstream, or its weighted backends in order.
    pub backends: Vec<CompiledBackend>,
    /// Chooses among several backends; None with a single upstream.
    pub split: Option<Split>,
    pub mirror: Option<CompiledMirror>,
    pub timeout: Duration,
    pub retry_attempts: u8,
    pub retry_budget: Arc<RetryBudget>,
    pub fault: Option<Fault>,
    pub rate_limit: Option<Arc<crate::rate_limit::RateLimiter>>,
    /// Where the answers the proxy gives for the route itself (401 of its JWT check, 429 of its
    /// rate limit) are counted: under the route with no upstream, since no backend served them
    /// (a canary backend judged on them would be judged on bots' refusals). Set by the state.
    pub refused: Option<crate::metrics::RouteMetrics>,
    pub request_headers: Option<CompiledHeaderOps>,
    pub response_headers: Option<CompiledHeaderOps>,
    pub rewrite: Option<CompiledRewrite>,
    pub upgrade_idle_timeout: Duration,
    pub response_idle_timeout: Duration,
    /// JWT validation and CORS, compiled by the state (with the key set and the route's
    /// counters); None when the route has none.
    pub jwt: Option<crate::jwt::CompiledJwt>,
    /// `grpcTranscoding`: HTTP/JSON requests become gRPC calls.
    pub transcoder: Option<crate::transcode::Transcoder>,
    pub cors: Option<crate::cors::CompiledCors>,
}

impl CompiledRoute {
    /// `backends` in the order of `route.backends` (or the one `route.upstream`).
    pub fn new(route: &Route, backends: Vec<CompiledBackend>, mirror: Option<CompiledMirror>) -> Self {
        let header = route.matches.header.as_ref().and_then(|h| {
            Some((
                HeaderName::from_bytes(h.name.as_bytes()).ok()?,
                HeaderValue::from_str(&h.value).ok()?,
            ))
        });
        Self {
            name: route.name.as_str().into(),
            host: route.matches.host.as_deref().map(HostMatch::parse),
            path_prefix: route.matches.path_prefix.clone(),
            header,
            split: (!route.backends.is_empty()).then(|| Split::new(route)),
            backends,
            mirror,
            timeout: route.timeout.get(),
            retry_attempts: route.retries.as_ref().map_or(0, |r| r.attempts),
            retry_budget: Arc::new(RetryBudget::new(route.retries.as_ref().map_or(0, |r| r.budget_percent))),
            fault: route.fault.clone(),
            rate_limit: route
                .rate_limit
                .as_ref()
                .map(|r| Arc::new(crate::rate_limit::RateLimiter::new(r))),
            refused: None,
            request_headers: route.headers.as_ref().and_then(|h| CompiledHeaderOps::new(&h.request)),
            response_headers: route.headers.as_ref().and_then(|h| CompiledHeaderOps::new(&h.response)),
            rewrite: route
                .rewrite
                .as_ref()
                .and_then(|rw| CompiledRewrite::new(&route.matches.path_prefix, rw)),
            upgrade_idle_timeout: route.upgrade_idle_timeout.map_or(UPGRADE_IDLE_TIMEOUT, |d| d.get()),
            response_idle_timeout: route.response_idle_timeout(),
            jwt: None,
            cors: None,
            transcoder: None,
        }
    }

    /// The route's request rules: header operations, then the host and path rewrites.
    pub fn apply_request_rules(&self, parts: &mut http::request::Parts) {
        if let Some(ops) = &self.request_headers {
            ops.apply(&mut parts.headers);
        }
        if let Some(rw) = &self.rewrite {
            if let Some(h) = &rw.host {
                crate::http_rules::rewrite_host(&mut parts.headers, h);
            }
            if let Some(pq) = parts.uri.path_and_query().and_then(|pq| rw.path(pq)) {
                parts.uri = http::Uri::from(pq);
            }
        }
    }

    /// The backend a request goes to.
    pub fn backend(&self, headers: &HeaderMap) -> &CompiledBackend {
        let i = self.split.as_ref().map_or(0, |s| s.choose(headers));
        // `backends` is never empty (state.rs builds one per configured backend or upstream).
        &self.backends[i.min(self.backends.len() - 1)]
    }

    fn matches(&self, host: Option<&str>, path: &str, headers: &HeaderMap) -> bool {
        if let Some(hm) = &self.host {
            match host {
                Some(h) if hm.matches(h) => {}
                _ => return false,
            }
        }
        if !prefix_matches(&self.path_prefix, path) {
            return false;
        }
        if let Some((name, value)) = &self.header {
            if headers.get(name) != Some(value) {
                return false;
            }
        }
        true
    }
}

/// Where a routed request goes: the route's settings and the backend chosen for it.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub route: &'a CompiledRoute,
    pub backend: &'a CompiledBackend,
}

/// The first route that matches, in configuration order.
pub fn select<'a>(
    routes: &'a [CompiledRoute],
    host: Option<&str>,
    path: &str,
    headers: &HeaderMap,
) -> Option<&'a CompiledRoute> {
    routes.iter().find(|r| r.matches(host, path, headers))
}

/// The request's host without port, from the URI (h2 :authority) or the Host header.
pub fn request_host<'a>(uri: &'a http::Uri, headers: &'a HeaderMap) -> Option<&'a str> {
    if let Some(h) = uri.host() {
        return Some(h);
    }
    let raw = headers.get(http::header::HOST)?.to_str().ok()?;
    // Strip a port; keep IPv6 literals intact.
    if raw.starts_with('[') {
        return raw.split_once(']').map(|(h, _)| &h[1..]);
    }
    Some(raw.split_once(':').map_or(raw, |(h, _)| h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_patterns() {
        assert!(HostMatch::parse("api.example.com").matches("API.example.com"));
        assert!(!HostMatch::parse("api.example.com").matches("x.api.example.com"));
        let w = HostMatch::parse("*.example.com");
        assert!(w.matches("a.example.com"));
        assert!(w.matches("a.b.example.com"));
        assert!(!w.matches("example.com"));
        assert!(!w.matches("badexample.com"));
    }

    #[test]
    fn host_from_header_strips_port() {
        let mut h = HeaderMap::new();
        h.insert(http::header::HOST, HeaderValue::from_static("a.example.com:8443"));
        assert_eq!(request_host(&"/x".parse().unwrap(), &h), Some("a.example.com"));
        h.insert(http::header::HOST, HeaderValue::from_static("[::1]:80"));
        assert_eq!(request_host(&"/x".parse().unwrap(), &h), Some("::1"));
    }

    #[test]
    fn retry_budget_limits_retries() {
        let b = RetryBudget::new(20);
        let mut allowed = 0;
        for _ in 0..1000 {
            b.on_request();
            if b.try_withdraw() {
                allowed += 1;
            }
        }
        // 20% of 1000 plus the initial allowance of 3.
        assert!((200..=203).contains(&allowed), "{allowed}");
    }
}
