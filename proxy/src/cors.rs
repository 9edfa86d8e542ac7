//! Per-route CORS, answered by the proxy: a preflight for an allowed origin gets 204 with the
//! allowed methods and headers, a refused one 403 with the reason; an actual request from an
//! allowed origin gets `Access-Control-Allow-Origin` (and the rest) on its response. On a route
//! with CORS the proxy owns these headers: the upstream's own are replaced or removed.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::Method;

use prometheus_client::metrics::counter::Counter;

use proxyfleet_config::Cors;

use crate::metrics::{Metrics, RouteResultLabels};

/// One entry of `allowOrigins`.
#[derive(Debug, PartialEq)]
enum OriginMatch {
    Any,
    Exact(String),
    /// `scheme://*.suffix[:port]`: `prefix` is `scheme://`, `suffix` is `.suffix[:port]`.
    Subdomain {
        prefix: String,
        suffix: String,
    },
}

impl OriginMatch {
    fn parse(o: &str) -> Self {
        if o == "*" {
            return Self::Any;
        }
        match o.split_once("://*.") {
            Some((scheme, rest)) => Self::Subdomain {
                prefix: format!("{scheme}://"),
                suffix: format!(".{rest}"),
            },
            None => Self::Exact(o.to_string()),
        }
    }

    fn matches(&self, origin: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(o) => o.eq_ignore_ascii_case(origin),
            Self::Subdomain { prefix, suffix } => origin.strip_prefix(prefix.as_str()).is_some_and(|host| {
                host.len() > suffix.len()
                    && host.ends_with(suffix.as_str())
                    && !host[..host.len() - suffix.len()].contains([':', '/'])
            }),
        }
    }
}

const ALLOW_ORIGIN: HeaderName = header::ACCESS_CONTROL_ALLOW_ORIGIN;
/// Request headers a browser may send without asking (the Fetch standard's safelist).
const SAFELISTED_HEADERS: &[&str] = &["accept", "accept-language", "content-language", "content-type"];

/// A route's compiled `cors`.
pub struct CompiledCors {
    origins: Vec<OriginMatch>,
    credentials: bool,
    methods: Vec<String>,
    methods_value: HeaderValue,
    headers: Vec<String>,
    any_header: bool,
    expose: Option<HeaderValue>,
    max_age: Option<HeaderValue>,
    /// Preflights answered: allowed, refused.
    preflights: [Counter; 2],
}

/// Why a preflight was refused (the 403's body; nothing secret in it).
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    Origin,
    Method,
    Header,
}

impl Refusal {
    pub fn body(&self) -> &'static str {
        match self {
            Refusal::Origin => "CORS preflight refused: origin not allowed\n",
            Refusal::Method => "CORS preflight refused: method not allowed\n",
            Refusal::Header => "CORS preflight refused: request header not allowed\n",
        }
    }
}

fn list_value(items: &[String]) -> Option<HeaderValue> {
    (!items.is_empty())
        .then(|| HeaderValue::from_str(&items.join(", ")).ok())
        .flatten()
}

impl CompiledCors {
    pub fn new(c: &Cors, route: &str, metrics: &Metrics) -> Self {
        let counter = |result| {
            metrics
                .cors_preflights
                .get_or_create(&RouteResultLabels {
                    route: route.to_string(),
                    result,
                })
                .clone()
        };
        let methods: Vec<String> = if c.allow_methods.is_empty() {
            ["GET", "HEAD", "POST"].map(String::from).to_vec()
        } else {
            c.allow_methods.clone()
        };
        Self {
            origins: c.allow_origins.iter().map(|o| OriginMatch::parse(o)).collect(),
            credentials: c.allow_credentials,
            methods_value: list_value(&methods).unwrap_or(HeaderValue::from_static("GET, HEAD, POST")),
            methods,
            headers: c.allow_headers.iter().map(|h| h.to_ascii_lowercase()).collect(),
            any_header: c.allow_headers.iter().any(|h| h == "*"),
            expose: list_value(&c.expose_headers),
            max_age: c.max_age.map(|m| HeaderValue::from(m.get().as_secs())),
            preflights: [counter("allowed"), counter("refused")],
        }
    }

    /// `OPTIONS` with `Origin` and `Access-Control-Request-Method`.
    pub fn is_preflight(method: &Method, headers: &HeaderMap) -> bool {
        method == Method::OPTIONS
            && headers.contains_key(header::ORIGIN)
            && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
    }

    /// The value of `Access-Control-Allow-Origin` for this request, if its origin is allowed.
    pub fn allowed_origin(&self, headers: &HeaderMap) -> Option<HeaderValue> {
        let origin = headers.get(header::ORIGIN)?;
        let text = origin.to_str().ok()?;
        let m = self.origins.iter().find(|m| m.matches(text))?;
        Some(if *m == OriginMatch::Any && !self.credentials {
            HeaderValue::from_static("*")
        } else {
            origin.clone()
        })
    }

    /// The headers of a preflight's 204, or why it is refused; counted either way.
    pub fn preflight(&self, req: &HeaderMap) -> Result<HeaderMap, Refusal> {
        let answer = self.judge_preflight(req);
        self.preflights[usize::from(answer.is_err())].inc();
        answer
    }

    fn judge_preflight(&self, req: &HeaderMap) -> Result<HeaderMap, Refusal> {
        let origin = self.allowed_origin(req).ok_or(Refusal::Origin)?;
        let method = req
            .get(header::ACCESS_CONTROL_REQUEST_METHOD)
            .and_then(|m| m.to_str().ok())
            .unwrap_or_default();
        let simple = matches!(method, "GET" | "HEAD" | "POST");
        if !simple && !self.methods.iter().any(|m| m == method) {
            return Err(Refusal::Method);
        }
        let requested = req.get(header::ACCESS_CONTROL_REQUEST_HEADERS);
        let names = requested.and_then(|v| v.to_str().ok()).unwrap_or_default();
        let all_allowed = names
            .split(',')
            .map(|n| n.trim().to_ascii_lowercase())
            .filter(|n| !n.is_empty())
            .all(|n| {
                (self.any_header && !self.credentials)
                    || self.headers.contains(&n)
                    || SAFELISTED_HEADERS.contains(&n.as_str())
            });
        if !all_allowed {
            return Err(Refusal::Header);
        }
        let mut out = HeaderMap::new();
        self.common(origin, &mut out);
        out.insert(header::ACCESS_CONTROL_ALLOW_METHODS, self.methods_value.clone());
        if let Some(h) = requested {
            out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, h.clone());
        }
        if let Some(m) = &self.max_age {
            out.insert(header::ACCESS_CONTROL_MAX_AGE, m.clone());
        }
        for v in [
            "origin",
            "access-control-request-method",
            "access-control-request-headers",
        ] {
            out.append(header::VARY, HeaderValue::from_static(v));
        }
        Ok(out)
    }

    /// The response to an actual request: the upstream's CORS headers replaced by ours for an
    /// allowed origin (`origin`, from `allowed_origin`), removed otherwise.
    pub fn decorate(&self, origin: Option<HeaderValue>, resp: &mut HeaderMap) {
        for h in [
            ALLOW_ORIGIN,
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
        ] {
            resp.remove(h);
        }
        let Some(origin) = origin else { return };
        if origin != "*" {
            resp.append(header::VARY, HeaderValue::from_static("origin"));
        }
        self.common(origin, resp);
        if let Some(e) = &self.expose {
            resp.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, e.clone());
        }
    }

    fn common(&self, origin: HeaderValue, out: &mut HeaderMap) {
        out.insert(ALLOW_ORIGIN, origin);
        if self.credentials {
            out.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(v: serde_json::Value) -> CompiledCors {
        CompiledCors::new(&serde_json::from_value(v).unwrap(), "r", &Metrics::new())
    }

    fn req(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn origins_match_exactly_or_by_subdomain() {
        let c = cors(serde_json::json!({"allowOrigins": ["https://app.example.com", "https://*.example.org"]}));
        let allowed = |o: &str| c.allowed_origin(&req(&[("origin", o)])).is_some();
        assert!(allowed("https://app.example.com"));
        assert!(allowed("https://a.example.org") && allowed("https://a.b.example.org"));
        assert!(!allowed("https://example.org"), "the wildcard needs a subdomain");
        assert!(!allowed("http://app.example.com"), "scheme matters");
        assert!(!allowed("https://a.example.org:8443"), "port matters");
        assert!(!allowed("https://evil.com/.example.org"));
        assert!(!allowed("https://app.example.com.evil.com"));
        assert!(c.allowed_origin(&HeaderMap::new()).is_none());
    }

    #[test]
    fn preflight_allows_what_is_configured_and_says_why_not() {
        let c = cors(
            serde_json::json!({"allowOrigins": ["https://app.example.com"], "allowMethods": ["PUT", "DELETE"],
                                        "allowHeaders": ["X-Token"], "allowCredentials": true, "maxAge": "10m"}),
        );
        let ok = c
            .preflight(&req(&[
                ("origin", "https://app.example.com"),
                ("access-control-request-method", "PUT"),
                ("access-control-request-headers", "x-token, content-type"),
            ]))
            .unwrap();
        assert_eq!(ok[header::ACCESS_CONTROL_ALLOW_ORIGIN], "https://app.example.com");
        assert_eq!(ok[header::ACCESS_CONTROL_ALLOW_METHODS], "PUT, DELETE");
        assert_eq!(ok[header::ACCESS_CONTROL_ALLOW_HEADERS], "x-token, content-type");
        assert_eq!(ok[header::ACCESS_CONTROL_ALLOW_CREDENTIALS], "true");
        assert_eq!(ok[header::ACCESS_CONTROL_MAX_AGE], "600");
        let pre = |o: &str, m: &str, h: &str| {
            c.preflight(&req(&[
                ("origin", o),
                ("access-control-request-method", m),
                ("access-control-request-headers", h),
            ]))
        };
        assert_eq!(pre("https://evil.com", "PUT", "x-token").unwrap_err(), Refusal::Origin);
        assert_eq!(
            pre("https://app.example.com", "PATCH", "x-token").unwrap_err(),
            Refusal::Method
        );
        assert_eq!(
            pre("https://app.example.com", "PUT", "x-other").unwrap_err(),
            Refusal::Header
        );
        assert!(
            pre("https://app.example.com", "GET", "").is_ok(),
            "simple methods always pass"
        );
    }

    #[test]
    fn actual_responses_carry_our_headers_only() {
        let any = cors(serde_json::json!({"allowOrigins": ["*"], "exposeHeaders": ["x-request-id"]}));
        let mut resp = req(&[("access-control-allow-origin", "https://upstream-set.example")]);
        let o = any.allowed_origin(&req(&[("origin", "https://x.example")]));
        any.decorate(o, &mut resp);
        assert_eq!(resp[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        assert_eq!(resp[header::ACCESS_CONTROL_EXPOSE_HEADERS], "x-request-id");
        assert!(resp.get(header::VARY).is_none());

        let strict = cors(serde_json::json!({"allowOrigins": ["https://app.example.com"]}));
        let mut resp = req(&[("access-control-allow-origin", "*")]);
        strict.decorate(
            strict.allowed_origin(&req(&[("origin", "https://evil.com")])),
            &mut resp,
        );
        assert!(
            resp.get(header::ACCESS_CONTROL_ALLOW_ORIGIN).is_none(),
            "the upstream's * is removed"
        );
        assert!(CompiledCors::is_preflight(
            &Method::OPTIONS,
            &req(&[("origin", "a"), ("access-control-request-method", "PUT")])
        ));
    }
}
