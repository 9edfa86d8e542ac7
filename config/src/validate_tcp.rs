//! Checks of TCP listeners (TLS passthrough and plain TCP) that the schema cannot express.

use std::collections::HashSet;

use crate::field::{err, is_valid_server_name, FieldError};
use crate::{Listener, ProxyConfig, TcpMode, TcpProxy};

pub(crate) fn check_tcp_listeners(config: &ProxyConfig, errors: &mut Vec<FieldError>) {
    let upstreams: HashSet<&str> = config.upstreams.iter().map(|u| u.name.as_str()).collect();
    for (i, l) in config.listeners.iter().enumerate() {
        if let Some(t) = &l.tcp {
            let context = (&upstreams, config.connect.is_some());
            check_tcp(&format!("listeners[{i}]"), l, t, context, errors);
        }
    }
}

fn check_tcp(
    f: &str,
    l: &Listener,
    t: &TcpProxy,
    (upstreams, has_connect): (&HashSet<&str>, bool),
    errors: &mut Vec<FieldError>,
) {
    for (set, field) in [
        (l.tls.is_some(), "tls"),
        (l.https_redirect.is_some(), "httpsRedirect"),
        (l.access_log.is_some(), "accessLog"),
    ] {
        if set {
            errors.push(err(
                format!("{f}.{field}"),
                "is for HTTP listeners; a tcp listener relays bytes",
            ));
        }
    }
    let f = format!("{f}.tcp");
    check_mode(&f, t, has_connect, errors);
    if let Some(u) = &t.default_upstream {
        if !upstreams.contains(u.as_str()) {
            errors.push(err(format!("{f}.defaultUpstream"), format!("unknown upstream {u:?}")));
        }
    }
    let mut names = HashSet::new();
    for (j, r) in t.routes.iter().enumerate() {
        let rf = format!("{f}.routes[{j}]");
        if !names.insert(&r.name) {
            errors.push(err(format!("{rf}.name"), format!("duplicate route name {:?}", r.name)));
        }
        if !upstreams.contains(r.upstream.as_str()) {
            errors.push(err(
                format!("{rf}.upstream"),
                format!("unknown upstream {:?}", r.upstream),
            ));
        }
        if r.server_names.is_empty() {
            errors.push(err(format!("{rf}.serverNames"), "at least one name is required"));
        }
        for (k, n) in r.server_names.iter().enumerate() {
            if !is_valid_server_name(n) {
                errors.push(err(
                    format!("{rf}.serverNames[{k}]"),
                    format!("{n:?} is not a DNS name or *.wildcard"),
                ));
            }
        }
    }
    for (v, field) in [
        (t.idle_timeout, "idleTimeout"),
        (t.client_hello_timeout, "clientHelloTimeout"),
    ] {
        if v.get().is_zero() {
            errors.push(err(format!("{f}.{field}"), "must be positive"));
        }
    }
}

/// What each mode needs and refuses.
fn check_mode(f: &str, t: &TcpProxy, has_connect: bool, errors: &mut Vec<FieldError>) {
    let not_here = |field: &str, why: &str, errors: &mut Vec<FieldError>| errors.push(err(format!("{f}.{field}"), why));
    if t.mode != TcpMode::Socks5 && t.socks5.is_some() {
        not_here("socks5", "needs mode socks5", errors);
    }
    match t.mode {
        TcpMode::Tcp => {
            if t.default_upstream.is_none() {
                not_here("defaultUpstream", "required in tcp mode", errors);
            }
            if !t.routes.is_empty() {
                not_here("routes", "SNI routes need mode tlsPassthrough", errors);
            }
        }
        TcpMode::TlsPassthrough => {
            if t.routes.is_empty() && t.default_upstream.is_none() {
                errors.push(err(f, "give routes, a defaultUpstream, or both"));
            }
        }
        TcpMode::Socks5 => check_socks5(f, t, has_connect, errors),
    }
}

fn check_socks5(f: &str, t: &TcpProxy, has_connect: bool, errors: &mut Vec<FieldError>) {
    if !has_connect {
        errors.push(err(
            format!("{f}.mode"),
            "socks5 needs connect: its allow-list and address checks decide where clients may go",
        ));
    }
    for (set, field) in [
        (!t.routes.is_empty(), "routes"),
        (t.default_upstream.is_some(), "defaultUpstream"),
        (t.proxy_protocol, "proxyProtocol"),
    ] {
        if set {
            errors.push(err(
                format!("{f}.{field}"),
                "not used in socks5 mode (clients name their target)",
            ));
        }
    }
    if let Some(a) = &t.socks5 {
        // The proxy reads only the directory: a Secret named in its own file would leave the
        // listener without authentication.
        if a.credentials_secret.is_some() {
            errors.push(err(
                format!("{f}.socks5.credentialsSecret"),
                "a reference is resolved by the operator; the proxy itself reads credentialsDir",
            ));
        } else if a.credentials_dir.is_none() {
            errors.push(err(
                format!("{f}.socks5.credentialsDir"),
                "required (username and password files)",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    fn errors(listener: serde_json::Value) -> Vec<String> {
        let config: crate::ProxyConfig = serde_json::from_value(serde_json::json!({
            "listeners": [listener],
            "upstreams": [{"name": "db", "endpoints": ["127.0.0.1:5432"]}],
        }))
        .unwrap();
        messages(&config)
    }

    fn messages(config: &crate::ProxyConfig) -> Vec<String> {
        match crate::validate(config) {
            Ok(()) => Vec::new(),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn socks5_needs_connect_and_no_upstream() {
        let e = errors(serde_json::json!({"name": "s", "address": "127.0.0.1:0",
            "tcp": {"mode": "socks5", "defaultUpstream": "db", "socks5": {}}}));
        for f in [
            "listeners[0].tcp.mode: socks5 needs connect",
            "listeners[0].tcp.defaultUpstream: not used",
            "listeners[0].tcp.socks5.credentialsDir: required",
        ] {
            assert!(e.iter().any(|m| m.starts_with(f)), "{f}: {e:?}");
        }
        let config: crate::ProxyConfig = serde_json::from_value(serde_json::json!({
            "listeners": [{"name": "s", "address": "127.0.0.1:0",
                "tcp": {"mode": "socks5", "socks5": {"credentialsDir": "/etc/socks"}}}],
            "upstreams": [],
            "connect": {"allow": ["*.example.com:443"]},
        }))
        .unwrap();
        assert_eq!(messages(&config), Vec::<String>::new());
        let e = errors(serde_json::json!({"name": "s", "address": "127.0.0.1:0",
            "tcp": {"mode": "socks5", "socks5": {"credentialsSecret": "socks-user"}}}));
        assert!(
            e.iter()
                .any(|m| m.starts_with("listeners[0].tcp.socks5.credentialsSecret: a reference")),
            "a Secret the proxy cannot read must not leave it open: {e:?}"
        );
        let e = errors(serde_json::json!({"name": "p", "address": "127.0.0.1:0",
            "tcp": {"defaultUpstream": "db", "socks5": {"credentialsDir": "/x"}}}));
        assert!(
            e.iter()
                .any(|m| m.starts_with("listeners[0].tcp.socks5: needs mode socks5")),
            "{e:?}"
        );
    }

    #[test]
    fn a_passthrough_listener_needs_no_http_route() {
        let e = errors(serde_json::json!({"name": "pass", "address": "127.0.0.1:0",
            "tcp": {"routes": [{"name": "db", "serverNames": ["db.example.com", "*.db.example.com"], "upstream": "db"}]}}));
        assert!(e.is_empty(), "{e:?}");
        let e = errors(
            serde_json::json!({"name": "raw", "address": "127.0.0.1:0", "tcp": {"mode": "tcp", "defaultUpstream": "db"}}),
        );
        assert!(e.is_empty(), "{e:?}");
    }

    #[test]
    fn mistakes_name_their_field() {
        let e = errors(serde_json::json!({"name": "pass", "address": "127.0.0.1:0",
            "tls": {"certificates": [{"certFile": "a", "keyFile": "b"}]},
            "tcp": {"defaultUpstream": "nope", "idleTimeout": "0s",
                    "routes": [{"name": "a", "serverNames": ["bad name"], "upstream": "x"}, {"name": "a", "serverNames": ["ok.example"], "upstream": "db"}]}}));
        for f in [
            "listeners[0].tls:",
            "listeners[0].tcp.defaultUpstream: unknown",
            "listeners[0].tcp.routes[0].upstream",
            "listeners[0].tcp.routes[0].serverNames[0]",
            "listeners[0].tcp.routes[1].name",
            "listeners[0].tcp.idleTimeout",
        ] {
            assert!(e.iter().any(|m| m.starts_with(f)), "{f}: {e:?}");
        }
        let e = errors(
            serde_json::json!({"name": "raw", "address": "127.0.0.1:0", "tcp": {"mode": "tcp",
            "routes": [{"name": "a", "serverNames": ["a.example"], "upstream": "db"}]}}),
        );
        assert!(
            e.iter()
                .any(|m| m.starts_with("listeners[0].tcp.defaultUpstream: required")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|m| m.starts_with("listeners[0].tcp.routes: SNI routes need")),
            "{e:?}"
        );
    }
}
