//! Checks of the per-route JWT and CORS settings that the schema cannot express.

use std::collections::HashSet;

use crate::field::{err, http_header_name_invalid, http_token, is_valid_server_name, FieldError};
use crate::{Cors, JwtAuth, ProxyConfig};

/// Request headers a claim may not be written into: framing, routing and the token itself.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "authorization",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
];

/// Every route's `jwt` and `cors`.
pub(crate) fn check_route_auth(config: &ProxyConfig, errors: &mut Vec<FieldError>) {
    for (i, r) in config.routes.iter().enumerate() {
        if let Some(j) = &r.jwt {
            check_jwt(&format!("routes[{i}].jwt"), j, errors);
        }
        if let Some(c) = &r.cors {
            check_cors(&format!("routes[{i}].cors"), c, errors);
        }
    }
}

fn check_jwt(f: &str, j: &JwtAuth, errors: &mut Vec<FieldError>) {
    let sources = [
        j.jwks_file.is_some(),
        j.jwks_secret.is_some(),
        j.jwks_config_map.is_some(),
    ];
    if sources.iter().filter(|s| **s).count() != 1 {
        errors.push(err(f, "give exactly one of jwksSecret, jwksConfigMap or jwksFile"));
    }
    for (field, set) in [("jwksSecret", &j.jwks_secret), ("jwksConfigMap", &j.jwks_config_map)] {
        if set.is_some() {
            errors.push(err(
                format!("{f}.{field}"),
                "a reference is resolved by the operator; the proxy itself reads jwksFile",
            ));
        }
    }
    if j.jwks_file.as_deref() == Some("") {
        errors.push(err(format!("{f}.jwksFile"), "must not be empty"));
    }
    if j.issuer.as_deref() == Some("") {
        errors.push(err(format!("{f}.issuer"), "must not be empty"));
    }
    for (k, a) in j.audiences.iter().enumerate() {
        if a.is_empty() {
            errors.push(err(format!("{f}.audiences[{k}]"), "must not be empty"));
        }
    }
    if j.clock_skew.get() > std::time::Duration::from_secs(3600) {
        errors.push(err(format!("{f}.clockSkew"), "at most 1h"));
    }
    let mut headers = HashSet::new();
    for (k, c) in j.claim_headers.iter().enumerate() {
        let h = c.header.to_ascii_lowercase();
        if http_header_name_invalid(&c.header) {
            errors.push(err(
                format!("{f}.claimHeaders[{k}].header"),
                format!("{:?} is not a header name", c.header),
            ));
        } else if RESERVED_HEADERS.contains(&h.as_str()) {
            errors.push(err(
                format!("{f}.claimHeaders[{k}].header"),
                format!("{:?} cannot carry a claim", c.header),
            ));
        } else if !headers.insert(h) {
            errors.push(err(
                format!("{f}.claimHeaders[{k}].header"),
                format!("{:?} is set by another claim", c.header),
            ));
        }
        if c.claim.is_empty() {
            errors.push(err(format!("{f}.claimHeaders[{k}].claim"), "must not be empty"));
        }
    }
}

/// `*`, or `scheme://host[:port]` where host may start with `*.`; no path, no trailing slash.
pub fn is_valid_cors_origin(origin: &str) -> bool {
    if origin == "*" {
        return true;
    }
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    let scheme_ok = scheme
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b))
        && scheme.starts_with(|c: char| c.is_ascii_lowercase());
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (rest, None),
    };
    let host_ok = is_valid_server_name(host) || host.parse::<std::net::Ipv4Addr>().is_ok();
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    scheme_ok && host_ok && port_ok && host == host.to_ascii_lowercase()
}

fn check_cors(f: &str, c: &Cors, errors: &mut Vec<FieldError>) {
    if c.allow_origins.is_empty() {
        errors.push(err(format!("{f}.allowOrigins"), "at least one origin is required"));
    }
    for (k, o) in c.allow_origins.iter().enumerate() {
        if !is_valid_cors_origin(o) {
            errors.push(err(
                format!("{f}.allowOrigins[{k}]"),
                format!("{o:?} is not an origin (scheme://host[:port], host may start with *.) or *"),
            ));
        }
    }
    if c.allow_credentials && c.allow_origins.iter().any(|o| o == "*") {
        errors.push(err(
            format!("{f}.allowCredentials"),
            "cannot be used with the * origin (browsers refuse it); list the origins",
        ));
    }
    for (k, m) in c.allow_methods.iter().enumerate() {
        if http_token(m).is_none() {
            errors.push(err(format!("{f}.allowMethods[{k}]"), format!("{m:?} is not a method")));
        }
    }
    for (field, list) in [("allowHeaders", &c.allow_headers), ("exposeHeaders", &c.expose_headers)] {
        for (k, h) in list.iter().enumerate() {
            if h != "*" && http_header_name_invalid(h) {
                errors.push(err(format!("{f}.{field}[{k}]"), format!("{h:?} is not a header name")));
            }
        }
    }
    if c.max_age
        .is_some_and(|m| m.get() > std::time::Duration::from_secs(86400))
    {
        errors.push(err(format!("{f}.maxAge"), "at most 24h"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors_of(route_extra: serde_json::Value) -> Vec<String> {
        let mut route = serde_json::json!({"name": "r", "upstream": "u"});
        route
            .as_object_mut()
            .unwrap()
            .extend(route_extra.as_object().unwrap().clone());
        let config: ProxyConfig = serde_json::from_value(serde_json::json!({
            "routes": [route],
            "upstreams": [{"name": "u", "endpoints": ["127.0.0.1:1"]}],
        }))
        .unwrap();
        let mut errors = Vec::new();
        check_route_auth(&config, &mut errors);
        errors.into_iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn a_good_jwt_and_cors_pass() {
        let e = errors_of(serde_json::json!({
            "jwt": {"issuer": "https://issuer", "audiences": ["api"], "jwksFile": "/k/jwks.json",
                    "claimHeaders": [{"claim": "sub", "header": "x-user"}]},
            "cors": {"allowOrigins": ["https://app.example.com", "https://*.example.org:8443"],
                     "allowMethods": ["GET", "PUT"], "allowHeaders": ["content-type"],
                     "allowCredentials": true, "maxAge": "10m"}
        }));
        assert!(e.is_empty(), "{e:?}");
    }

    #[test]
    fn jwt_errors_name_their_field() {
        let e = errors_of(serde_json::json!({
            "jwt": {"jwksFile": "/k", "jwksSecret": "s",
                    "claimHeaders": [{"claim": "sub", "header": "Authorization"},
                                     {"claim": "a", "header": "x-a"}, {"claim": "b", "header": "X-A"}]}
        }));
        assert!(
            e.iter().any(|m| m.starts_with("routes[0].jwt: give exactly one")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|m| m.starts_with("routes[0].jwt.jwksSecret: a reference")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|m| m.starts_with("routes[0].jwt.claimHeaders[0].header")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|m| m.starts_with("routes[0].jwt.claimHeaders[2].header")),
            "{e:?}"
        );
        let e = errors_of(serde_json::json!({"jwt": {"issuer": "i"}}));
        assert!(
            e.iter().any(|m| m.starts_with("routes[0].jwt: give exactly one")),
            "{e:?}"
        );
    }

    #[test]
    fn cors_errors_name_their_field() {
        let e = errors_of(serde_json::json!({
            "cors": {"allowOrigins": ["*", "https://app.example.com/", "app.example.com"],
                     "allowCredentials": true, "allowMethods": ["GE T"], "exposeHeaders": ["a b"],
                     "maxAge": "48h"}
        }));
        for f in [
            "allowOrigins[1]",
            "allowOrigins[2]",
            "allowCredentials",
            "allowMethods[0]",
            "exposeHeaders[0]",
            "maxAge",
        ] {
            assert!(
                e.iter().any(|m| m.starts_with(&format!("routes[0].cors.{f}"))),
                "{f}: {e:?}"
            );
        }
    }

    #[test]
    fn origins() {
        for ok in [
            "*",
            "https://a.example",
            "http://localhost:8080",
            "https://*.example.com",
            "http://127.0.0.1:3000",
        ] {
            assert!(is_valid_cors_origin(ok), "{ok}");
        }
        for bad in [
            "",
            "https://",
            "https://a.example/",
            "https://A.example",
            "a.example",
            "https://a.example:0",
            "https://a b",
        ] {
            assert!(!is_valid_cors_origin(bad), "{bad}");
        }
    }
}
