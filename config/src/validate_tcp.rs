//! Checks of TCP listeners (TLS passthrough and plain TCP) that the schema cannot express.

use std::collections::HashSet;

use crate::field::{err, is_valid_server_name, FieldError};
use crate::{Listener, ProxyConfig, TcpMode, TcpProxy};

pub(crate) fn check_tcp_listeners(config: &ProxyConfig, errors: &mut Vec<FieldError>) {
    let upstreams: HashSet<&str> = config.upstreams.iter().map(|u| u.name.as_str()).collect();
    for (i, l) in config.listeners.iter().enumerate() {
        if let Some(t) = &l.tcp {
            check_tcp(&format!("listeners[{i}]"), l, t, &upstreams, errors);
        }
    }
}

fn check_tcp(f: &str, l: &Listener, t: &TcpProxy, upstreams: &HashSet<&str>, errors: &mut Vec<FieldError>) {
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
    if t.mode == TcpMode::Tcp {
        if t.default_upstream.is_none() {
            errors.push(err(format!("{f}.defaultUpstream"), "required in tcp mode"));
        }
        if !t.routes.is_empty() {
            errors.push(err(format!("{f}.routes"), "SNI routes need mode tlsPassthrough"));
        }
    } else if t.routes.is_empty() && t.default_upstream.is_none() {
        errors.push(err(f.clone(), "give routes, a defaultUpstream, or both"));
    }
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

#[cfg(test)]
mod tests {
    fn errors(listener: serde_json::Value) -> Vec<String> {
        let config: crate::ProxyConfig = serde_json::from_value(serde_json::json!({
            "listeners": [listener],
            "upstreams": [{"name": "db", "endpoints": ["127.0.0.1:5432"]}],
        }))
        .unwrap();
        match crate::validate(&config) {
            Ok(()) => Vec::new(),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        }
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
