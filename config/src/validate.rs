//! Semantic checks that a schema cannot express. Every error names the field it is about,
//! in the same path syntax the CRD uses (`routes[1].upstream`).

use std::collections::HashSet;
use std::net::SocketAddr;

pub use crate::field::is_valid_server_name;
use crate::field::{err, http_header_name_invalid, http_token, FieldError};
use crate::ProxyConfig;

/// Whether `host:port` is plausible (a name or IP, and a port 1-65535).
fn is_host_port(s: &str) -> bool {
    if s.parse::<SocketAddr>().is_ok() {
        return true;
    }
    match s.rsplit_once(':') {
        Some((host, port)) => is_valid_server_name(host) && port.parse::<u16>().is_ok_and(|p| p > 0),
        None => false,
    }
}

/// Checks everything serde cannot: references, uniqueness, value ranges, addresses.
pub fn validate(config: &ProxyConfig) -> Result<(), Vec<FieldError>> {
    let mut errors = Vec::new();
    check_listeners(config, &mut errors);
    let upstream_names = check_upstreams(config, &mut errors);
    check_routes(config, &upstream_names, &mut errors);
    check_the_rest(config, &mut errors);
    crate::validate_http::check_http_rules(config, &mut errors);
    crate::validate_auth::check_route_auth(config, &mut errors);
    crate::validate_tcp::check_tcp_listeners(config, &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Listeners: unique names and addresses, TLS files and names; the admin address.
fn check_listeners(config: &ProxyConfig, errors: &mut Vec<FieldError>) {
    let mut listener_names = HashSet::new();
    let mut addresses = HashSet::new();
    for (i, l) in config.listeners.iter().enumerate() {
        let f = format!("listeners[{i}]");
        if !listener_names.insert(&l.name) {
            errors.push(err(
                format!("{f}.name"),
                format!("duplicate listener name {:?}", l.name),
            ));
        }
        match l.address.parse::<SocketAddr>() {
            Ok(addr) => {
                // Port 0 (pick any) is for tests and may repeat.
                if addr.port() != 0 && !addresses.insert(addr.port()) {
                    errors.push(err(
                        format!("{f}.address"),
                        format!("port {} is used by another listener", addr.port()),
                    ));
                }
            }
            Err(_) => errors.push(err(
                format!("{f}.address"),
                format!("{:?} is not an IP:port address", l.address),
            )),
        }
        if let Some(tls) = &l.tls {
            if tls.certificates.is_empty() {
                errors.push(err(
                    format!("{f}.tls.certificates"),
                    "at least one certificate is required",
                ));
            }
            let defaults = tls.certificates.iter().filter(|c| c.default).count();
            if defaults > 1 {
                errors.push(err(
                    format!("{f}.tls.certificates"),
                    format!("{defaults} certificates are marked default; at most one may be"),
                ));
            }
            for (j, c) in tls.certificates.iter().enumerate() {
                for (k, n) in c.server_names.iter().enumerate() {
                    if !is_valid_server_name(n) {
                        errors.push(err(
                            format!("{f}.tls.certificates[{j}].serverNames[{k}]"),
                            format!("{n:?} is not a DNS name or *.wildcard"),
                        ));
                    }
                }
                if c.cert_file.is_empty() {
                    errors.push(err(format!("{f}.tls.certificates[{j}].certFile"), "must not be empty"));
                }
                if c.key_file.is_empty() {
                    errors.push(err(format!("{f}.tls.certificates[{j}].keyFile"), "must not be empty"));
                }
            }
            if let Some(h) = &tls.http3 {
                crate::http3::check_http3(&format!("{f}.tls.http3"), h, errors);
                if h.zero_rtt && !tls.session_resumption {
                    errors.push(err(
                        format!("{f}.tls.http3.zeroRtt"),
                        "0-RTT resumes a session: it needs sessionResumption",
                    ));
                }
            }
        }
    }
    if config.admin.address.parse::<SocketAddr>().is_err() {
        errors.push(err(
            "admin.address",
            format!("{:?} is not an IP:port address", config.admin.address),
        ));
    } else if let Ok(a) = config.admin.address.parse::<SocketAddr>() {
        if a.port() != 0 && addresses.contains(&a.port()) {
            errors.push(err("admin.address", format!("port {} is used by a listener", a.port())));
        }
    }
}

/// Upstreams: unique names, endpoints, TLS, pool and health check values. Returns the names.
/// How an upstream's endpoints are shared and judged: streams per connection, connection
/// limit, ejection cap, health checks.
fn check_endpoint_care(u: &crate::Upstream, f: &str, errors: &mut Vec<FieldError>) {
    if u.http2
        .max_concurrent_streams
        .is_some_and(|n| !(1..=100_000).contains(&n))
    {
        errors.push(err(format!("{f}.http2.maxConcurrentStreams"), "must be 1 to 100000"));
    }
    if u.outlier_detection.max_ejection_percent() > 100 {
        errors.push(err(
            format!("{f}.outlierDetection.maxEjectionPercent"),
            "must be within 0-100",
        ));
    }
    if u.pool.max_connections_per_endpoint == 0 {
        errors.push(err(format!("{f}.pool.maxConnectionsPerEndpoint"), "must be at least 1"));
    }
    let Some(hc) = &u.health_check else { return };
    if !hc.path.starts_with('/') {
        errors.push(err(format!("{f}.healthCheck.path"), "must start with /"));
    }
    if hc.interval.get().is_zero() || hc.timeout.get().is_zero() {
        errors.push(err(format!("{f}.healthCheck"), "interval and timeout must be positive"));
    }
    let (fall, rise) = hc.thresholds();
    for (field, n) in [("unhealthyThreshold", fall), ("healthyThreshold", rise)] {
        if !(1..=100).contains(&n) {
            errors.push(err(format!("{f}.healthCheck.{field}"), "must be within 1-100"));
        }
    }
    if hc.panic_threshold() > 100 {
        errors.push(err(format!("{f}.healthCheck.panicThreshold"), "must be within 0-100"));
    }
}

fn check_route_timeouts(r: &crate::Route, f: &str, errors: &mut Vec<FieldError>) {
    let timeouts = [
        ("timeout", Some(r.timeout)),
        ("upgradeIdleTimeout", r.upgrade_idle_timeout),
        ("responseIdleTimeout", r.response_idle_timeout),
    ];
    for (field, t) in timeouts {
        if t.is_some_and(|t| t.get().is_zero()) {
            errors.push(err(format!("{f}.{field}"), "must be positive"));
        }
    }
}

fn check_upstreams<'a>(config: &'a ProxyConfig, errors: &mut Vec<FieldError>) -> HashSet<&'a str> {
    let mut upstream_names = HashSet::new();
    for (i, u) in config.upstreams.iter().enumerate() {
        let f = format!("upstreams[{i}]");
        if !upstream_names.insert(u.name.as_str()) {
            errors.push(err(
                format!("{f}.name"),
                format!("duplicate upstream name {:?}", u.name),
            ));
        }
        match (u.endpoints.is_empty(), &u.dns) {
            (true, None) => errors.push(err(format!("{f}.endpoints"), "give endpoints or dns")),
            (false, Some(_)) => errors.push(err(format!("{f}.dns"), "give either endpoints or dns, not both")),
            _ => {}
        }
        for (j, e) in u.endpoints.iter().enumerate() {
            if !is_host_port(e) {
                errors.push(err(format!("{f}.endpoints[{j}]"), format!("{e:?} is not host:port")));
            }
        }
        if let Some(dns) = &u.dns {
            if !is_valid_server_name(&dns.name) || dns.name.starts_with("*.") {
                errors.push(err(
                    format!("{f}.dns.name"),
                    format!("{:?} is not a DNS name", dns.name),
                ));
            }
            if dns.refresh_interval.get().is_zero() {
                errors.push(err(format!("{f}.dns.refreshInterval"), "must be positive"));
            }
        }
        if u.pool.connect_timeout.get().is_zero() {
            errors.push(err(format!("{f}.pool.connectTimeout"), "must be positive"));
        }
        if u.pool.idle_timeout.get().is_zero() {
            errors.push(err(format!("{f}.pool.idleTimeout"), "must be positive"));
        }
        check_windows(
            &format!("{f}.http2"),
            (u.http2.stream_window_bytes, u.http2.connection_window_bytes),
            256 << 20,
            errors,
        );
        check_endpoint_care(u, &f, errors);
        if let Some(tls) = &u.tls {
            if tls.ca_secret.is_some() {
                errors.push(err(
                    format!("{f}.tls.caSecret"),
                    "a Secret reference is resolved by the operator; the proxy itself reads caFile",
                ));
            }
            if tls.client_certificate_secret.is_some() {
                errors.push(err(
                    format!("{f}.tls.clientCertificateSecret"),
                    "a Secret reference is resolved by the operator; the proxy itself reads clientCertificate",
                ));
            }
            if let Some(sn) = &tls.server_name {
                if !is_valid_server_name(sn) && sn.parse::<std::net::IpAddr>().is_err() {
                    errors.push(err(
                        format!("{f}.tls.serverName"),
                        format!("{sn:?} is not a DNS name or IP"),
                    ));
                }
            }
        }
    }

    upstream_names
}

/// Routes: unique names, their targets, matches, timeouts, faults, retries, rate limits.
fn check_routes(config: &ProxyConfig, upstream_names: &HashSet<&str>, errors: &mut Vec<FieldError>) {
    let mut route_names = HashSet::new();
    for (i, r) in config.routes.iter().enumerate() {
        let f = format!("routes[{i}]");
        if !route_names.insert(&r.name) {
            errors.push(err(format!("{f}.name"), format!("duplicate route name {:?}", r.name)));
        }
        crate::validate_split::check_route_backends(&f, r, upstream_names, errors);
        crate::grpc_transcoding::check_route(&f, r, config, errors);
        if !r.matches.path_prefix.starts_with('/') {
            errors.push(err(format!("{f}.match.pathPrefix"), "must start with /"));
        }
        if let Some(rl) = &r.rate_limit {
            // The CRD's bounds: a rate below one request in 1 000 s is a mistake, not a limit.
            if !(0.001..=1_000_000.0).contains(&rl.requests_per_second) {
                errors.push(err(
                    format!("{f}.rateLimit.requestsPerSecond"),
                    "must be between 0.001 and 1000000",
                ));
            }
            if rl.burst == Some(0) {
                errors.push(err(format!("{f}.rateLimit.burst"), "must be at least 1"));
            }
            if rl.per_client_ip && rl.per_header.is_some() {
                errors.push(err(format!("{f}.rateLimit"), "give perClientIp or perHeader, not both"));
            }
            if let Some(h) = &rl.per_header {
                if http_header_name_invalid(h) {
                    errors.push(err(
                        format!("{f}.rateLimit.perHeader"),
                        format!("{h:?} is not a header name"),
                    ));
                }
            }
        }
        if let Some(h) = &r.matches.host {
            if !is_valid_server_name(h) {
                errors.push(err(
                    format!("{f}.match.host"),
                    format!("{h:?} is not a host name or *.wildcard"),
                ));
            }
        }
        if let Some(h) = &r.matches.header {
            if http_token(&h.name).is_none() {
                errors.push(err(
                    format!("{f}.match.header.name"),
                    format!("{:?} is not a header name", h.name),
                ));
            }
        }
        check_route_timeouts(r, &f, errors);
        if let Some(fault) = &r.fault {
            if let Some(a) = &fault.abort {
                if !(0.0..=100.0).contains(&a.percent) {
                    errors.push(err(format!("{f}.fault.abort.percent"), "must be within 0-100"));
                }
                if !(200..=599).contains(&a.status) {
                    errors.push(err(format!("{f}.fault.abort.status"), "must be within 200-599"));
                }
            }
            if let Some(d) = &fault.delay {
                if !(0.0..=100.0).contains(&d.percent) {
                    errors.push(err(format!("{f}.fault.delay.percent"), "must be within 0-100"));
                }
            }
        }
        if let Some(rt) = &r.retries {
            if rt.attempts > 5 {
                errors.push(err(format!("{f}.retries.attempts"), "at most 5"));
            }
        }
    }
}

/// HTTP/2 receive windows at `f`: HTTP/2's least (65 535), a stream's at most 16 MiB, a
/// connection's at most `max_connection` (h2 refuses more than 2^31 - 1).
fn check_windows(
    f: &str,
    (stream, connection): (Option<u32>, Option<u32>),
    max_connection: u32,
    errors: &mut Vec<FieldError>,
) {
    for (v, name, max) in [
        (stream, "streamWindowBytes", 16 << 20),
        (connection, "connectionWindowBytes", max_connection),
    ] {
        if v.is_some_and(|v| !(65535..=max).contains(&v)) {
            errors.push(err(format!("{f}.{name}"), format!("must be 65535 to {max}")));
        }
    }
}

/// Everything else: a listener needs a route, CONNECT, limits, workers.
fn check_the_rest(config: &ProxyConfig, errors: &mut Vec<FieldError>) {
    if config.listeners.iter().any(|l| l.tcp.is_none()) && config.routes.is_empty() {
        errors.push(err(
            "routes",
            "listeners are defined but no route; every request would get 404",
        ));
    }
    if let Some(c) = &config.connect {
        for (i, a) in c.allow.iter().enumerate() {
            let ok = a
                .rsplit_once(':')
                .is_some_and(|(h, p)| is_valid_server_name(h) && (p == "*" || p.parse::<u16>().is_ok()));
            if !ok {
                errors.push(err(
                    format!("connect.allow[{i}]"),
                    format!("{a:?} is not host:port (port may be *)"),
                ));
            }
        }
    }
    if config
        .limits
        .max_connection_age
        .is_some_and(|d| d.get() < std::time::Duration::from_secs(1))
    {
        errors.push(err("limits.maxConnectionAge", "must be at least 1s"));
    }
    if config.limits.max_requests_per_connection == Some(0) {
        errors.push(err("limits.maxRequestsPerConnection", "must be at least 1"));
    }
    for (field, d) in [
        ("limits.idleTimeout", config.limits.idle_timeout),
        ("limits.clientBodyTimeout", config.limits.client_body_timeout),
        ("limits.sendTimeout", config.limits.send_timeout),
    ] {
        if d.is_some_and(|d| d.get() < std::time::Duration::from_secs(1)) {
            errors.push(err(field, "must be at least 1s"));
        }
    }
    if let Some(h2) = &config.limits.http2 {
        check_windows(
            "limits.http2",
            (h2.stream_window_bytes, h2.connection_window_bytes),
            64 << 20,
            errors,
        );
        if h2.max_concurrent_streams == Some(0) {
            errors.push(err("limits.http2.maxConcurrentStreams", "must be at least 1"));
        }
    }
    if config.limits.header_read_timeout.get().is_zero() {
        errors.push(err("limits.headerReadTimeout", "must be positive"));
    }
    if config.worker_threads == Some(0) {
        errors.push(err("workerThreads", "must be at least 1"));
    }
    if config.idle_spin_micros.is_some_and(|us| us > 1000) {
        errors.push(err("idleSpinMicros", "must be at most 1000"));
    }
}
