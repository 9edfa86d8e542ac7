//! What a route or listener does to the messages it carries: header rules, rewrites, the
//! HTTPS redirect, access logs and the forwarding headers (Gateway API's filter shapes, so a
//! platform team reads them without a manual).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Header changes on requests (before they go upstream) and responses (before the client).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderRules {
    /// Applied to the request sent upstream.
    #[serde(default, skip_serializing_if = "HeaderOps::is_empty")]
    pub request: HeaderOps,
    /// Applied to the response sent to the client.
    #[serde(default, skip_serializing_if = "HeaderOps::is_empty")]
    pub response: HeaderOps,
}

/// Header operations, in this order: remove, set (replaces every value), add (appends).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderOps {
    /// Header names to remove.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 128)))]
    pub remove: Vec<String>,
    /// Headers set to this value, replacing any the message had.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub set: Vec<HeaderValueRule>,
    /// Headers appended, keeping any the message had.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub add: Vec<HeaderValueRule>,
}

impl HeaderOps {
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.add.is_empty()
    }
}

/// A header name and value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderValueRule {
    /// Header name (case-insensitive).
    #[schemars(length(min = 1, max = 128))]
    pub name: String,
    /// Value (visible ASCII and spaces).
    #[schemars(length(max = 4096))]
    pub value: String,
}

/// What a route changes in the request before it goes upstream.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rewrite {
    /// Replaces the part of the path the route's `match.pathPrefix` matched
    /// (`/api` → `/v2`: `/api/users` goes upstream as `/v2/users`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), pattern(r"^/"))]
    pub path_prefix: Option<String>,
    /// The Host (HTTP/1.1) or `:authority` (HTTP/2) sent upstream; the client's stays in
    /// `X-Forwarded-Host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub host: Option<String>,
}

/// A plain-HTTP listener that answers every request with a redirect to HTTPS.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpsRedirect {
    /// Port in the `Location` (omitted when 443). Default 443.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
    /// 301 (moved permanently) or 308 (permanent, keeps the method). Default 308.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 301, max = 308))]
    pub status: Option<u16>,
}

/// One JSON line per request on standard output, written off the request path.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccessLog {
    /// Share of requests logged, 0-100 (errors, status ≥ 500, are always logged). Default 100.
    #[serde(default = "default_percent")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub sample_percent: f64,
    /// Log the query string too (it may carry tokens). Default false: the path only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub include_query: bool,
    /// File the lines are appended to. Default: standard output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub path: Option<String>,
}

fn default_percent() -> f64 {
    100.0
}

/// How the proxy identifies clients to upstreams.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Forwarding {
    /// Peers (CIDRs, e.g. a load balancer's `10.0.0.0/8`) whose `X-Forwarded-For` is kept and
    /// appended to; from any other peer it is replaced by the peer's address. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 49)))]
    pub trusted_proxies: Vec<String>,
    /// Add an `X-Request-Id` (random, 32 hex digits) to requests that have none, and return it
    /// on the response. Default true.
    #[serde(default = "default_true")]
    pub request_id: bool,
}

fn default_true() -> bool {
    true
}

impl Forwarding {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl Default for Forwarding {
    fn default() -> Self {
        Self {
            trusted_proxies: Vec::new(),
            request_id: true,
        }
    }
}

/// A network in CIDR notation (`10.0.0.0/8`, `fd00::/8`, or a bare address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: std::net::IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Self> {
        let (a, p) = s.split_once('/').unwrap_or((s, ""));
        let addr: std::net::IpAddr = a.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = if p.is_empty() { max } else { p.parse().ok()? };
        (prefix <= max).then_some(Self { addr, prefix })
    }

    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr;
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => mask_eq(&n.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(n), IpAddr::V6(a)) => mask_eq(&n.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }
}

fn mask_eq(net: &[u8], addr: &[u8], prefix: u8) -> bool {
    let full = usize::from(prefix / 8);
    if net[..full] != addr[..full] {
        return false;
    }
    let rest = prefix % 8;
    rest == 0 || (net[full] ^ addr[full]) >> (8 - rest) == 0
}

#[cfg(test)]
mod tests {
    use super::Cidr;

    #[test]
    fn cidrs() {
        let n = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(n.contains("10.1.200.3".parse().unwrap()));
        assert!(!n.contains("10.2.0.1".parse().unwrap()));
        assert!(n.contains("::ffff:10.1.0.9".parse().unwrap()));
        assert!(Cidr::parse("127.0.0.1").unwrap().contains("127.0.0.1".parse().unwrap()));
        assert!(Cidr::parse("fd00::/8").unwrap().contains("fd12::1".parse().unwrap()));
        assert!(Cidr::parse("10.0.0.0/12")
            .unwrap()
            .contains("10.15.255.255".parse().unwrap()));
        assert!(!Cidr::parse("10.0.0.0/12")
            .unwrap()
            .contains("10.16.0.0".parse().unwrap()));
        assert!(Cidr::parse("10.0.0.0/33").is_none());
        assert!(Cidr::parse("nope").is_none());
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains("8.8.8.8".parse().unwrap()));
    }
}

/// W3C trace context and span export.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TraceSettings {
    /// Share of new traces (requests without a `traceparent`) sampled, 0-100. A request that
    /// brings one keeps its sampled flag. Default 1.
    #[serde(default = "default_trace_percent")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub sample_percent: f64,
    /// OTLP/HTTP endpoint (`http://collector:4318`): sampled spans are sent to
    /// `<endpoint>/v1/traces` as OTLP JSON. No export when absent (context is still
    /// propagated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512), pattern(r"^http://"))]
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans. Default `proxyfleet-proxy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_name: Option<String>,
}

fn default_trace_percent() -> f64 {
    1.0
}
