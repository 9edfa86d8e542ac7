use super::*;

const MINIMAL: &str = r#"
listeners:
  - name: https
    address: 0.0.0.0:8443
    tls:
      certificates:
        - certFile: /tls/tls.crt
          keyFile: /tls/tls.key
          default: true
routes:
  - name: all
    upstream: echo
upstreams:
  - name: echo
    endpoints: ["127.0.0.1:8080"]
"#;

#[test]
fn minimal_config_parses_with_defaults() {
    let c = ProxyConfig::from_yaml(MINIMAL).unwrap();
    assert_eq!(c.routes[0].matches.path_prefix, "/");
    assert_eq!(c.routes[0].timeout.get().as_secs(), 15);
    assert_eq!(c.admin.address, "0.0.0.0:9901");
    assert!(c.listeners[0].tls.as_ref().unwrap().session_resumption);
    assert_eq!(c.upstreams[0].pool.max_idle_per_endpoint, 1024);
}

#[test]
fn round_trips_through_yaml() {
    let c = ProxyConfig::from_yaml(MINIMAL).unwrap();
    let again = ProxyConfig::from_yaml(&c.to_yaml()).unwrap();
    assert_eq!(c, again);
}

fn refused(yaml: &str) -> String {
    ProxyConfig::from_yaml(yaml).unwrap_err().to_string()
}

#[test]
fn unknown_field_is_named() {
    let e = refused(&MINIMAL.replace("default: true", "default: true\n          colour: red"));
    assert!(e.contains("colour"), "{e}");
    assert!(e.contains("listeners[0]"), "{e}");
}

#[test]
fn unknown_upstream_is_named() {
    let e = refused(&MINIMAL.replace("upstream: echo", "upstream: nope"));
    assert!(e.contains("routes[0].upstream"), "{e}");
}

#[test]
fn duplicate_ports_and_defaults_are_refused() {
    let yaml = r#"
listeners:
  - {name: a, address: "0.0.0.0:80"}
  - {name: b, address: "127.0.0.1:80"}
routes: [{name: r, upstream: u}]
upstreams: [{name: u, endpoints: ["127.0.0.1:1"]}]
"#;
    assert!(refused(yaml).contains("listeners[1].address"));
    let two_defaults = MINIMAL.replace(
        "default: true",
        "default: true\n        - {certFile: a, keyFile: b, default: true}",
    );
    assert!(refused(&two_defaults).contains("at most one"));
}

#[test]
fn bad_values_are_named() {
    let cases = [
        (MINIMAL.replace("0.0.0.0:8443", "nowhere"), "listeners[0].address"),
        (
            MINIMAL.replace("127.0.0.1:8080", "no port"),
            "upstreams[0].endpoints[0]",
        ),
        (
            MINIMAL.replace("upstream: echo", "upstream: echo\n    timeout: 0s"),
            "routes[0].timeout",
        ),
        (
            MINIMAL.replace("upstream: echo", "upstream: echo\n    responseIdleTimeout: 0s"),
            "routes[0].responseIdleTimeout",
        ),
        (
            MINIMAL.replace(
                "endpoints: [\"127.0.0.1:8080\"]",
                "endpoints: [\"127.0.0.1:8080\"]\n    outlierDetection: {maxEjectionPercent: 101}",
            ),
            "upstreams[0].outlierDetection.maxEjectionPercent",
        ),
        (
            MINIMAL.replace(
                "endpoints: [\"127.0.0.1:8080\"]",
                "endpoints: [\"127.0.0.1:8080\"]\n    healthCheck: {unhealthyThreshold: 0}",
            ),
            "upstreams[0].healthCheck.unhealthyThreshold",
        ),
        (
            MINIMAL.replace(
                "endpoints: [\"127.0.0.1:8080\"]",
                "endpoints: [\"127.0.0.1:8080\"]\n    healthCheck: {panicThreshold: 101}",
            ),
            "upstreams[0].healthCheck.panicThreshold",
        ),
        (
            MINIMAL.replace("upstream: echo", "upstream: echo\n    upgradeIdleTimeout: 0ms"),
            "routes[0].upgradeIdleTimeout",
        ),
        (
            MINIMAL.replace("upstream: echo", "upstream: echo\n    timeout: soon"),
            "invalid duration",
        ),
        (
            MINIMAL.replace(
                "upstream: echo",
                "upstream: echo\n    fault: {abort: {status: 503, percent: 150}}",
            ),
            "routes[0].fault.abort.percent",
        ),
        (
            MINIMAL.replace("upstream: echo", "upstream: echo\n    match: {pathPrefix: api}"),
            "routes[0].match.pathPrefix",
        ),
        (
            MINIMAL.replace("default: true", "serverNames: [\"bad name\"]"),
            "serverNames[0]",
        ),
        (format!("{MINIMAL}limits: {{idleTimeout: 0s}}\n"), "limits.idleTimeout"),
        (
            format!("{MINIMAL}limits: {{clientBodyTimeout: 500ms}}\n"),
            "limits.clientBodyTimeout",
        ),
        (format!("{MINIMAL}limits: {{sendTimeout: 0s}}\n"), "limits.sendTimeout"),
        (
            format!("{MINIMAL}limits: {{http2: {{streamWindowBytes: 0}}}}\n"),
            "limits.http2.streamWindowBytes",
        ),
        (
            format!("{MINIMAL}    http2: {{connectionWindowBytes: 4294967295}}\n"),
            "upstreams[0].http2.connectionWindowBytes",
        ),
    ];
    for (yaml, field) in cases {
        let e = refused(&yaml);
        assert!(e.contains(field), "expected {field} in {e}");
    }
}

#[test]
fn split_routes_are_checked_with_the_field_named() {
    let split = |route: &str| {
        MINIMAL.replace("    upstream: echo\n", route).replace(
            "upstreams:\n",
            "upstreams:\n  - {name: v2, endpoints: [\"127.0.0.1:8081\"]}\n",
        )
    };
    let ok = split("    backends: [{upstream: v2, weight: 10}, {upstream: echo, weight: 90}]\n    sticky: {cookie: uid}\n    overrides: [{header: {name: x-canary, value: always}, upstream: v2}]\n    mirror: {upstream: v2, percent: 5}\n");
    let c = ProxyConfig::from_yaml(&ok).unwrap();
    assert_eq!(c.routes[0].backends.len(), 2);
    let cases = [
        (split("    backends: [{upstream: v2, weight: 10}, {upstream: echo, weight: 80}]\n"), "routes[0].backends: weights sum to 90"),
        (split("    upstream: echo\n    backends: [{upstream: v2, weight: 100}]\n"), "routes[0].backends: give upstream or backends, not both"),
        (split("    timeout: 1s\n"), "routes[0].upstream: give upstream or backends"),
        (split("    backends: [{upstream: nope, weight: 100}]\n"), "routes[0].backends[0].upstream"),
        (split("    backends: [{upstream: v2, weight: 50}, {upstream: v2, weight: 50}]\n"), "listed twice"),
        (split("    backends: [{upstream: v2, weight: 100}]\n    sticky: {header: a, cookie: b}\n"), "routes[0].sticky: give exactly one"),
        (split("    backends: [{upstream: v2, weight: 100}]\n    overrides: [{header: {name: x, value: y}, upstream: echo}]\n"), "routes[0].overrides[0].upstream"),
        (split("    upstream: echo\n    mirror: {upstream: v2, percent: 101}\n"), "routes[0].mirror.percent"),
        (split("    upstream: echo\n    sticky: {header: x-user}\n"), "routes[0].sticky: needs backends"),
    ];
    for (yaml, field) in cases {
        let e = refused(&yaml);
        assert!(e.contains(field), "expected {field} in {e}");
    }
}
