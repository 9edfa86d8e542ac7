//! Checks of the message rules (headers, rewrites, redirects, access logs, forwarding) and of
//! the CONNECT and per-client limits; every error names its field.

use crate::field::{err, http_header_name_invalid, FieldError};
use crate::{Cidr, HeaderOps, ProxyConfig};

/// Headers a rule may not touch: framing and connection management belong to the proxy, and
/// the Host is changed with `rewrite.host` so routing and forwarding stay consistent.
const RESERVED: [&str; 9] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
];

pub(crate) fn check_http_rules(config: &ProxyConfig, errors: &mut Vec<FieldError>) {
    for (i, l) in config.listeners.iter().enumerate() {
        let f = format!("listeners[{i}]");
        if let Some(r) = &l.https_redirect {
            if l.tls.is_some() {
                errors.push(err(
                    format!("{f}.httpsRedirect"),
                    "only a plain-HTTP listener redirects to HTTPS",
                ));
            }
            if r.status.is_some_and(|s| ![301, 302, 303, 307, 308].contains(&s)) {
                errors.push(err(
                    format!("{f}.httpsRedirect.status"),
                    "must be 301, 302, 303, 307 or 308",
                ));
            }
            if r.port == Some(0) {
                errors.push(err(format!("{f}.httpsRedirect.port"), "must be 1-65535"));
            }
        }
        if let Some(a) = &l.access_log {
            if !(0.0..=100.0).contains(&a.sample_percent) {
                errors.push(err(format!("{f}.accessLog.samplePercent"), "must be 0-100"));
            }
        }
    }
    for (i, r) in config.routes.iter().enumerate() {
        let f = format!("routes[{i}]");
        if let Some(h) = &r.headers {
            check_ops(&format!("{f}.headers.request"), &h.request, errors);
            check_ops(&format!("{f}.headers.response"), &h.response, errors);
        }
        if let Some(rw) = &r.rewrite {
            if rw.path_prefix.as_ref().is_some_and(|p| !p.starts_with('/')) {
                errors.push(err(format!("{f}.rewrite.pathPrefix"), "must start with /"));
            }
            if let Some(h) = &rw.host {
                if h.parse::<http::uri::Authority>().is_err() || h.contains('@') {
                    errors.push(err(
                        format!("{f}.rewrite.host"),
                        format!("{h:?} is not host or host:port"),
                    ));
                }
            }
        }
    }
    check_networks("forwarding.trustedProxies", &config.forwarding.trusted_proxies, errors);
    if let Some(c) = &config.connect {
        check_networks("connect.allowedNetworks", &c.allowed_networks, errors);
        if c.connect_timeout.get().is_zero() {
            errors.push(err("connect.connectTimeout", "must be positive"));
        }
        if c.idle_timeout.get().is_zero() {
            errors.push(err("connect.idleTimeout", "must be positive"));
        }
    }
    if let Some(t) = &config.tracing {
        if !(0.0..=100.0).contains(&t.sample_percent) {
            errors.push(err("tracing.samplePercent", "must be 0-100"));
        }
        if let Some(e) = &t.otlp_endpoint {
            let ok = e
                .parse::<http::Uri>()
                .is_ok_and(|u| u.scheme_str() == Some("http") && u.authority().is_some());
            if !ok {
                errors.push(err("tracing.otlpEndpoint", format!("{e:?} is not http://host:port")));
            }
        }
    }
    if config.limits.max_connections_per_client_ip == Some(0) {
        errors.push(err("limits.maxConnectionsPerClientIp", "must be at least 1"));
    }
}

fn check_networks(field: &str, nets: &[String], errors: &mut Vec<FieldError>) {
    for (i, n) in nets.iter().enumerate() {
        if Cidr::parse(n).is_none() {
            errors.push(err(format!("{field}[{i}]"), format!("{n:?} is not an address or CIDR")));
        }
    }
}

fn check_ops(f: &str, ops: &HeaderOps, errors: &mut Vec<FieldError>) {
    let names = ops
        .remove
        .iter()
        .enumerate()
        .map(|(i, n)| (format!("{f}.remove[{i}]"), n.as_str()))
        .chain(
            ops.set
                .iter()
                .enumerate()
                .map(|(i, h)| (format!("{f}.set[{i}].name"), h.name.as_str())),
        )
        .chain(
            ops.add
                .iter()
                .enumerate()
                .map(|(i, h)| (format!("{f}.add[{i}].name"), h.name.as_str())),
        );
    for (field, name) in names {
        if http_header_name_invalid(name) {
            errors.push(err(field, format!("{name:?} is not a header name")));
        } else if RESERVED.iter().any(|r| r.eq_ignore_ascii_case(name)) {
            errors.push(err(
                field,
                format!("{name:?} is managed by the proxy (use rewrite.host for Host)"),
            ));
        }
    }
    let values = ops
        .set
        .iter()
        .enumerate()
        .map(|(i, h)| (format!("{f}.set[{i}].value"), h))
        .chain(
            ops.add
                .iter()
                .enumerate()
                .map(|(i, h)| (format!("{f}.add[{i}].value"), h)),
        );
    for (field, h) in values {
        if http::HeaderValue::from_str(&h.value).is_err() {
            errors.push(err(field, "must be visible ASCII (no control characters)"));
        }
    }
}
