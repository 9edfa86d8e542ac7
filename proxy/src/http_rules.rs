//! Route rules applied to messages: header operations, the path-prefix and host rewrites,
//! dot-segment normalisation and segment-boundary prefix matching, request ids. Compiled once
//! per configuration; applying them touches only the message.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;

use proxyfleet_config::{HeaderOps, Rewrite};

/// `HeaderOps` with names and values parsed.
#[derive(Debug, Default)]
pub struct CompiledHeaderOps {
    remove: Vec<HeaderName>,
    set: Vec<(HeaderName, HeaderValue)>,
    add: Vec<(HeaderName, HeaderValue)>,
}

fn pairs(rules: &[proxyfleet_config::HeaderValueRule]) -> Vec<(HeaderName, HeaderValue)> {
    rules
        .iter()
        .filter_map(|h| {
            Some((
                HeaderName::from_bytes(h.name.as_bytes()).ok()?,
                HeaderValue::from_str(&h.value).ok()?,
            ))
        })
        .collect()
}

impl CompiledHeaderOps {
    /// None when there is nothing to do (the request path then skips it).
    pub fn new(ops: &HeaderOps) -> Option<Self> {
        (!ops.is_empty()).then(|| Self {
            remove: ops
                .remove
                .iter()
                .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
                .collect(),
            set: pairs(&ops.set),
            add: pairs(&ops.add),
        })
    }

    pub fn apply(&self, headers: &mut HeaderMap) {
        for n in &self.remove {
            headers.remove(n);
        }
        for (n, v) in &self.set {
            headers.insert(n.clone(), v.clone());
        }
        for (n, v) in &self.add {
            headers.append(n.clone(), v.clone());
        }
    }
}

/// A route's rewrite: the matched prefix replaced, the host replaced.
#[derive(Debug)]
pub struct CompiledRewrite {
    matched_prefix: String,
    path_prefix: Option<String>,
    pub host: Option<HeaderValue>,
}

impl CompiledRewrite {
    pub fn new(matched_prefix: &str, rw: &Rewrite) -> Option<Self> {
        let host = rw.host.as_deref().and_then(|h| HeaderValue::from_str(h).ok());
        (rw.path_prefix.is_some() || host.is_some()).then(|| Self {
            matched_prefix: matched_prefix.to_string(),
            path_prefix: rw.path_prefix.clone(),
            host,
        })
    }

    /// The path and query sent upstream.
    pub fn path(&self, pq: &PathAndQuery) -> Option<PathAndQuery> {
        let to = self.path_prefix.as_deref()?;
        let rest = pq.path().strip_prefix(self.matched_prefix.trim_end_matches('/'))?;
        let mut out = String::with_capacity(to.len() + rest.len() + pq.query().map_or(0, |q| q.len() + 1));
        out.push_str(to.trim_end_matches('/'));
        if rest.is_empty() {
            if out.is_empty() {
                out.push('/');
            }
        } else {
            if !rest.starts_with('/') {
                out.push('/');
            }
            out.push_str(rest);
        }
        if let Some(q) = pq.query() {
            out.push('?');
            out.push_str(q);
        }
        out.parse().ok()
    }
}

/// Whether `path` lies under `prefix` on a segment boundary: `/api` matches `/api`, `/api/`
/// and `/api/x`, not `/apix` (Gateway API's PathPrefix). A prefix ending in `/` matches as is.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        None => false,
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/') || rest.starts_with('?'),
    }
}

const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// A rewritten Host: the client's goes into `X-Forwarded-Host`.
pub fn rewrite_host(headers: &mut HeaderMap, host: &HeaderValue) {
    if let Some(old) = headers.insert(http::header::HOST, host.clone()) {
        headers.insert(X_FORWARDED_HOST, old);
    }
}

/// A fresh request id: 32 hex digits from the thread's fast generator (unique, not secret).
pub fn new_request_id() -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut n = fastrand::u128(..);
    let mut buf = [0u8; 32];
    for b in buf.iter_mut() {
        *b = HEX[(n & 0xf) as usize];
        n >>= 4;
    }
    // 32 ASCII hex digits are always a valid header value.
    HeaderValue::from_bytes(&buf).unwrap_or(HeaderValue::from_static("0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_on_segment_boundaries() {
        assert!(prefix_matches("/api", "/api"));
        assert!(prefix_matches("/api", "/api/x"));
        assert!(!prefix_matches("/api", "/apix"));
        assert!(prefix_matches("/api/", "/api/x"));
        assert!(prefix_matches("/", "/anything"));
        assert!(!prefix_matches("/api", "/ap"));
    }

    #[test]
    fn header_ops_remove_then_set_then_add() {
        let ops = HeaderOps {
            remove: vec!["x-internal".into()],
            set: vec![proxyfleet_config::HeaderValueRule {
                name: "x-env".into(),
                value: "prod".into(),
            }],
            add: vec![proxyfleet_config::HeaderValueRule {
                name: "via".into(),
                value: "proxyfleet".into(),
            }],
        };
        let c = CompiledHeaderOps::new(&ops).unwrap();
        let mut h = HeaderMap::new();
        h.insert("x-internal", HeaderValue::from_static("1"));
        h.append("x-env", HeaderValue::from_static("a"));
        h.append("x-env", HeaderValue::from_static("b"));
        h.insert("via", HeaderValue::from_static("1.1 lb"));
        c.apply(&mut h);
        assert!(h.get("x-internal").is_none());
        assert_eq!(h.get_all("x-env").iter().collect::<Vec<_>>(), ["prod"]);
        assert_eq!(h.get_all("via").iter().count(), 2);
        assert!(CompiledHeaderOps::new(&HeaderOps::default()).is_none());
    }

    #[test]
    fn the_matched_prefix_is_rewritten() {
        let rw = |from: &str, to: &str| {
            CompiledRewrite::new(
                from,
                &Rewrite {
                    path_prefix: Some(to.into()),
                    host: None,
                },
            )
            .unwrap()
        };
        let pq = |s: &str| s.parse::<PathAndQuery>().unwrap();
        assert_eq!(rw("/api", "/v2").path(&pq("/api/users?x=1")).unwrap(), "/v2/users?x=1");
        assert_eq!(rw("/api", "/v2").path(&pq("/api")).unwrap(), "/v2");
        assert_eq!(rw("/api/", "/").path(&pq("/api/users")).unwrap(), "/users");
        assert_eq!(rw("/", "/app").path(&pq("/x")).unwrap(), "/app/x");
        assert_eq!(rw("/api", "/").path(&pq("/api")).unwrap(), "/");
    }

    #[test]
    fn request_ids_are_32_hex_digits() {
        let a = new_request_id();
        assert_eq!(a.len(), 32);
        assert_ne!(a, new_request_id());
    }
}
