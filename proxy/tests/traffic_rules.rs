//! Integration tests of what the proxy does to the messages it carries and of the clients it
//! refuses: header rules, rewrites, request ids, X-Forwarded-For trust, the HTTPS redirect,
//! access logs, 421 for a host the certificate does not cover, per-client-IP caps, path
//! normalisation, and a request-smuggling set. Real sockets on loopback; no timing assertions.

mod support;

use std::time::Duration;

use support::*;

fn config(upstream: std::net::SocketAddr, listener_extra: &str, route_extra: &str, top_extra: &str) -> String {
    format!(
        r#"
listeners:
  - {{name: http, address: "127.0.0.1:0"{listener_extra}}}
admin: {{address: "127.0.0.1:0"}}
drain: {{gracePeriod: 100ms, deadline: 5s}}
limits: {{headerReadTimeout: 2s, maxRequestBodyBytes: 4096}}
routes:
  - {{name: api, match: {{pathPrefix: /api}}, upstream: u{route_extra}}}
  - {{name: all, upstream: u}}
upstreams:
  - name: u
    endpoints: ["{upstream}"]
{top_extra}"#
    )
}

fn seen(up: &Upstream) -> http::HeaderMap {
    up.stats.last_headers.lock().unwrap().clone().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_rules_rewrites_and_request_ids() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("rules");
    let route = r#", rewrite: {pathPrefix: /v2, host: backend.internal},
      headers: {request: {remove: [x-secret], set: [{name: x-env, value: prod}], add: [{name: x-added, value: "1"}]},
                response: {set: [{name: strict-transport-security, value: max-age=63072000}], remove: [server]}}"#;
    let proxy = start_proxy(&dir, &config(up.addr, "", route, "")).await;
    let raw_req = b"GET /api/users?id=7 HTTP/1.1\r\nHost: shop.example.com\r\nX-Secret: s\r\nX-Env: dev\r\nConnection: close\r\n\r\n";
    let resp = raw(proxy.addr("http"), raw_req).await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("up /v2/users 0"), "path rewritten: {resp}");
    let lower = resp.to_ascii_lowercase();
    assert!(lower.contains("strict-transport-security: max-age=63072000"), "{resp}");
    assert!(lower.contains("x-request-id: "), "the request id comes back: {resp}");
    let h = seen(&up);
    assert_eq!(h["host"], "backend.internal");
    assert_eq!(h["x-forwarded-host"], "shop.example.com");
    assert!(h.get("x-secret").is_none());
    assert_eq!(h.get_all("x-env").iter().collect::<Vec<_>>(), ["prod"]);
    assert_eq!(h["x-added"], "1");
    let id = h["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(id.len(), 32);
    assert!(lower.contains(&format!("x-request-id: {id}")), "the same id both ways");
    // A client's own id is kept, and returned.
    let resp = raw(
        proxy.addr("http"),
        b"GET /other HTTP/1.1\r\nHost: a\r\nX-Request-Id: abc-123\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(resp.to_ascii_lowercase().contains("x-request-id: abc-123"), "{resp}");
    assert_eq!(seen(&up)["x-request-id"], "abc-123");
    assert!(
        seen(&up).get("x-forwarded-host").is_none(),
        "only the rewritten route sets it"
    );
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_forwarded_for_is_replaced_unless_the_peer_is_trusted() {
    init();
    let up = upstream("up", None, false).await;
    let req = b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 6.6.6.6\r\nConnection: close\r\n\r\n";
    let dir = tempdir("xff-untrusted");
    let proxy = start_proxy(&dir, &config(up.addr, "", "", "")).await;
    assert!(raw(proxy.addr("http"), req).await.starts_with("HTTP/1.1 200"));
    assert_eq!(
        seen(&up)["x-forwarded-for"],
        "127.0.0.1",
        "a client cannot choose its address"
    );
    proxy.running.drain();
    let dir = tempdir("xff-trusted");
    let proxy = start_proxy(
        &dir,
        &config(
            up.addr,
            "",
            "",
            "forwarding: {trustedProxies: [127.0.0.0/8], requestId: false}\n",
        ),
    )
    .await;
    let resp = raw(proxy.addr("http"), req).await;
    assert_eq!(seen(&up)["x-forwarded-for"], "6.6.6.6, 127.0.0.1");
    assert!(seen(&up).get("x-request-id").is_none() && !resp.to_ascii_lowercase().contains("x-request-id"));
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_listener_sends_everyone_to_https() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("redirect");
    let proxy = start_proxy(&dir, &config(up.addr, ", httpsRedirect: {port: 8443}", "", "")).await;
    let resp = raw(
        proxy.addr("http"),
        b"POST /login?next=/home HTTP/1.1\r\nHost: shop.example.com:8080\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 308"), "{resp}");
    assert!(
        resp.contains("location: https://shop.example.com:8443/login?next=/home"),
        "{resp}"
    );
    assert_eq!(up.stats.requests.load(std::sync::atomic::Ordering::Relaxed), 0);
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_lines_carry_bytes_and_never_credentials() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("access-log");
    let log = dir.join("access.log");
    let listener = format!(", accessLog: {{path: {}}}", log.display());
    let proxy = start_proxy(&dir, &config(up.addr, &listener, "", "")).await;
    for i in 0..20 {
        let req = format!(
            "GET /api/item/{i}?token=secret HTTP/1.1\r\nHost: shop.example.com\r\nAuthorization: Bearer secret\r\nCookie: s=secret\r\nConnection: close\r\n\r\n"
        );
        assert!(raw(proxy.addr("http"), req.as_bytes())
            .await
            .starts_with("HTTP/1.1 200"));
    }
    let mut lines = Vec::new();
    for _ in 0..50 {
        lines = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        if lines.len() >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(lines.len(), 20, "one line per request");
    for l in &lines {
        assert!(!l.contains("secret"), "{l}");
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["status"], 200);
        assert_eq!(v["route"], "api");
        assert_eq!(v["upstream"], "u");
        assert_eq!(v["endpoint"], up.addr.to_string());
        assert_eq!(v["authority"], "shop.example.com");
        assert_eq!(v["client_ip"], "127.0.0.1");
        assert_eq!(v["request_id"].as_str().map(str::len), Some(32));
        assert!(v["path"].as_str().unwrap().starts_with("/api/item/"));
        // The upstream's body is "up /api/item/N 0".
        assert!(v["bytes_sent"].as_u64().unwrap() >= 16, "{l}");
    }
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_the_certificate_does_not_cover_is_421() {
    init();
    let ca = TestCa::new("misdirected ca");
    let dir = tempdir("misdirected");
    let (c1, k1) = ca.leaf(&["api.example.com", "*.api.example.com"]);
    let (c2, k2) = ca.leaf(&["admin.example.com"]);
    write(&dir, "c1", &c1);
    write(&dir, "k1", &k1);
    write(&dir, "c2", &c2);
    write(&dir, "k2", &k2);
    let up = upstream("up", None, false).await;
    let yaml = format!(
        "listeners:\n  - name: https\n    address: \"127.0.0.1:0\"\n    tls:\n      certificates:\n        - {{certFile: {0}/c1, keyFile: {0}/k1, default: true}}\n        - {{certFile: {0}/c2, keyFile: {0}/k2}}\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: all, upstream: u}}]\nupstreams:\n  - name: u\n    endpoints: [\"{1}\"]\n",
        dir.display(),
        up.addr
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let a = proxy.addr("https");
    for (host, want) in [
        ("api.example.com", 200),
        ("v1.api.example.com", 200),
        ("admin.example.com", 421),
        // Not any certificate's name: it falls to the default, the connection's own.
        ("elsewhere.example.org", 200),
    ] {
        for alpn in [&b"http/1.1"[..], &b"h2"[..]] {
            let tls = tls_connect(a, Some("api.example.com"), &ca, &[alpn]).await;
            let (status, _, _) = tls_get(tls, host, "/").await;
            assert_eq!(status, want, "{host} over {}", String::from_utf8_lossy(alpn));
        }
    }
    let m = metrics(&proxy).await;
    assert_eq!(metric_sum(&m, "proxyfleet_misdirected_requests_total", &[]), 2.0);
    // A connection to the non-default certificate: a host that falls to the default is
    // misdirected there.
    let tls = tls_connect(a, Some("admin.example.com"), &ca, &[b"http/1.1"]).await;
    assert_eq!(tls_get(tls, "elsewhere.example.org", "/").await.0, 421);
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_ip_cannot_take_every_connection_slot() {
    use tokio::io::AsyncWriteExt;
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("per-ip");
    let yaml = config(up.addr, "", "", "").replace(
        "limits: {headerReadTimeout: 2s,",
        "limits: {maxConnectionsPerClientIp: 5, headerReadTimeout: 10s,",
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let a = proxy.addr("http");
    // Five slow connections hold this IP's slots ...
    let mut held = Vec::new();
    for _ in 0..5 {
        let mut t = tokio::net::TcpStream::connect(a).await.unwrap();
        t.write_all(b"GET / HT").await.unwrap();
        held.push(t);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // ... so a sixth from the same IP is closed at once, without an answer.
    assert_eq!(
        raw(a, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await,
        ""
    );
    let m = metrics(&proxy).await;
    assert!(metric_sum(&m, "proxyfleet_refused_connections_total", &["per_client_ip"]) >= 1.0);
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = raw(a, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 200"), "slots come back: {resp}");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_are_routed_on_segments_after_normalization() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("paths");
    let yaml = config(up.addr, "", ", fault: {abort: {status: 418, percent: 100}}", "");
    let proxy = start_proxy(&dir, &yaml).await;
    let a = proxy.addr("http");
    let status_of = |path: &'static str| async move {
        let r = raw(
            a,
            format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        (r[9..12].to_string(), r)
    };
    // The api route answers 418 (fault), the catch-all 200.
    assert_eq!(status_of("/api/x").await.0, "418");
    assert_eq!(status_of("/api").await.0, "418");
    assert_eq!(status_of("/apix").await.0, "200", "not on a segment boundary");
    let (s, body) = status_of("/api/../admin").await;
    assert_eq!(s, "200");
    assert!(
        body.contains("up /admin 0"),
        "the upstream sees the normalised path: {body}"
    );
    let (s, body) = status_of("/api/%2e%2e/admin").await;
    assert_eq!(s, "200");
    assert!(body.contains("up /admin 0"), "{body}");
    assert_eq!(status_of("/x/../api/y").await.0, "418");
    // Spelt otherwise, as an upstream would read it: an escaped letter, a Tomcat path parameter.
    assert_eq!(status_of("/%61pi/y").await.0, "418", "/%61pi is /api");
    assert_eq!(status_of("/x/..;/api/y").await.0, "418", "..; is .. to Tomcat");
    let (s, body) = status_of("/api/..;jsessionid=1/admin").await;
    assert_eq!(s, "200");
    assert!(body.contains("up /admin 0"), "{body}");
    // An escaped slash is no segment boundary: left as sent.
    let (s, body) = status_of("/api%2F..%2Fadmin").await;
    assert_eq!(s, "200");
    assert!(body.contains("up /api%2F..%2Fadmin 0"), "{body}");
    // A % without two hex digits is refused: /%6%61 would be /%6a, then /j to an upstream.
    assert_eq!(status_of("/%6%61").await.0, "400");
    assert_eq!(status_of("/api/x").await.0, "418", "still serving");
    proxy.running.drain();
}

/// `limits.escapedSlashes` and `limits.mergeSlashes`: routing sees the segments an upstream that
/// decodes `%2F` or merges `//` will see, or such paths are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaped_and_doubled_slashes_are_decoded_merged_or_refused_as_configured() {
    init();
    let up = upstream("up", None, false).await;
    let fault = ", fault: {abort: {status: 418, percent: 100}}";
    let with = |extra: &str| {
        config(up.addr, "", fault, "").replace(
            "maxRequestBodyBytes: 4096}",
            &format!("maxRequestBodyBytes: 4096, {extra}}}"),
        )
    };
    let status_of = |a: std::net::SocketAddr, path: &'static str| async move {
        let r = raw(
            a,
            format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        (r[9..12].to_string(), r)
    };
    let dir = tempdir("paths-decode");
    let decoding = start_proxy(&dir, &with("escapedSlashes: decode, mergeSlashes: true")).await;
    let a = decoding.addr("http");
    let (s, body) = status_of(a, "/api%2F..%2Fadmin").await;
    assert_eq!(s, "200", "the api route is climbed out of: {body}");
    assert!(
        body.contains("up /admin 0"),
        "the upstream sees what was routed: {body}"
    );
    assert_eq!(status_of(a, "/x%2f..%2fapi/y").await.0, "418");
    assert_eq!(status_of(a, "//api//y").await.0, "418", "//api is /api");
    let (_, body) = status_of(a, "//x//y").await;
    assert!(body.contains("up /x/y 0"), "{body}");
    decoding.running.drain();

    let dir = tempdir("paths-reject");
    let refusing = start_proxy(&dir, &with("escapedSlashes: reject")).await;
    let a = refusing.addr("http");
    assert_eq!(status_of(a, "/api%2F..%2Fadmin").await.0, "400");
    assert_eq!(status_of(a, "/api%5c..%5cadmin").await.0, "400");
    assert_eq!(status_of(a, "/api\\..\\admin").await.0, "400", "a raw backslash too");
    let (s, body) = status_of(a, "//x").await;
    assert_eq!(s, "200");
    assert!(body.contains("up //x 0"), "not merged unless asked: {body}");
    assert_eq!(status_of(a, "/api/x").await.0, "418", "still serving");
    refusing.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_smuggling_attempts_are_refused_and_the_proxy_keeps_serving() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("smuggling");
    let proxy = start_proxy(&dir, &config(up.addr, "", "", "")).await;
    let a = proxy.addr("http");
    let cases: [(&str, &[u8]); 7] = [
        (
            "CL + TE",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
        ),
        (
            "two different Content-Lengths",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 40\r\n\r\nabcGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
        ),
        (
            "obs-fold",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n  folded\r\n\r\n",
        ),
        (
            "bad chunk size",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        ),
        (
            "TE not chunked last",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
        ),
        (
            "space before colon",
            b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length : 5\r\n\r\nhello",
        ),
        (
            "two Hosts",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        ),
    ];
    for (name, bytes) in cases {
        let resp = raw(a, bytes).await;
        assert!(
            !resp.contains("/smuggled"),
            "{name}: a second request was smuggled: {resp}"
        );
        let status: u16 = resp.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        // CL + TE may be served by its Transfer-Encoding alone (RFC 9112 §6.1), as hyper does,
        // provided the connection then closes: one response, nothing read after the body.
        let served_by_te = name == "CL + TE" && status == 200 && resp.matches("HTTP/1.1 ").count() == 1;
        assert!(
            served_by_te || status == 0 || (400..500).contains(&status),
            "{name}: answered {status}, not refused: {resp}"
        );
    }
    // No smuggled request reached the upstream, and the proxy still serves.
    let resp = raw(a, b"GET /after HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert!(resp.contains("up /after 0"), "{resp}");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_upstream_gets_the_requests_host_as_authority_and_no_host_header() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("h2-authority");
    let yaml = config(up.addr, "", ", rewrite: {host: api.internal}", "").replace(
        &format!("endpoints: [\"{}\"]", up.addr),
        &format!("endpoints: [\"{}\"]\n    protocol: h2", up.addr),
    );
    let proxy = start_proxy(&dir, &yaml).await;
    for (path, want) in [("/plain", "shop.example.com"), ("/api/x", "api.internal")] {
        let resp = raw(
            proxy.addr("http"),
            format!("GET {path} HTTP/1.1\r\nHost: shop.example.com\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        let uri = up.stats.last_uri.lock().unwrap().clone().unwrap();
        assert_eq!(uri.authority().map(|a| a.as_str()), Some(want), "{path}");
        assert!(seen(&up).get("host").is_none(), "no host header beside :authority");
    }
    assert_eq!(up.stats.h2_requests.load(std::sync::atomic::Ordering::Relaxed), 2);
    assert_eq!(
        up.stats.connections.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "one multiplexed connection"
    );
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_tls_upstream_speaks_what_alpn_agreed_with_the_requests_host() {
    init();
    let ca = TestCa::new("test ca");
    for (name, h2) in [("auto", true), ("auto-h1only", false)] {
        let up = upstream(name, Some(ca.leaf(&["localhost"])), false).await;
        let dir = tempdir(name);
        let ca_file = write(&dir, "ca.pem", &ca.cert_pem);
        let yaml = config(up.addr, "", "", "").replace(
            &format!("endpoints: [\"{}\"]", up.addr),
            &format!(
                "endpoints: [\"{}\"]\n    tls: {{serverName: localhost, caFile: {ca_file}}}",
                up.addr
            ),
        );
        let proxy = start_proxy(&dir, &yaml).await;
        for i in 0..3 {
            let resp = raw(
                proxy.addr("http"),
                format!("GET /n{i} HTTP/1.1\r\nHost: shop.example.com\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await;
            assert!(resp.starts_with("HTTP/1.1 200"), "{name}: {resp}");
            let uri = up.stats.last_uri.lock().unwrap().clone().unwrap();
            if h2 {
                assert_eq!(uri.authority().map(|a| a.as_str()), Some("shop.example.com"), "{name}");
                assert!(seen(&up).get("host").is_none(), "no host header beside :authority");
            } else {
                assert_eq!(
                    seen(&up).get("host").map(|h| h.as_bytes()),
                    Some(&b"shop.example.com"[..])
                );
            }
        }
        let h2_requests = up.stats.h2_requests.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(h2_requests, if h2 { 3 } else { 0 }, "{name}");
        assert_eq!(
            up.stats.connections.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "{name}: the learning connection is the one reused"
        );
        proxy.running.drain();
    }
}

/// Captures OTLP/HTTP JSON export bodies (the acceptance run uses a real Jaeger instead:
/// e2e/tests/13-standalone-conformance.sh).
async fn otlp_receiver() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
) {
    use http_body_util::BodyExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = got.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let sink = sink.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let sink = sink.clone();
                    async move {
                        assert_eq!(req.uri().path(), "/v1/traces");
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        sink.lock().unwrap().push(serde_json::from_slice(&body).unwrap());
                        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from_static(b"{}"),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_context_is_continued_and_sampled_spans_are_exported() {
    init();
    let up = upstream("up", None, false).await;
    let (collector, got) = otlp_receiver().await;
    let dir = tempdir("tracing");
    let top = format!("tracing: {{samplePercent: 100, otlpEndpoint: \"http://{collector}\", serviceName: edge}}\n");
    let proxy = start_proxy(&dir, &config(up.addr, "", "", &top)).await;
    let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let resp = raw(
        proxy.addr("http"),
        format!("GET /api/t HTTP/1.1\r\nHost: a\r\ntraceparent: {incoming}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let sent = seen(&up)["traceparent"].to_str().unwrap().to_string();
    assert!(
        sent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && sent.ends_with("-01"),
        "{sent}"
    );
    let proxy_span = sent.split('-').nth(2).unwrap().to_string();
    assert_ne!(proxy_span, "00f067aa0ba902b7");
    // A request without one starts a trace (sampled at 100 %).
    assert!(raw(
        proxy.addr("http"),
        b"GET /new HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    )
    .await
    .starts_with("HTTP/1.1 200"));
    let started = seen(&up)["traceparent"].to_str().unwrap().to_string();
    assert!(started.ends_with("-01") && !started.contains("4bf92f35"), "{started}");
    let mut spans = Vec::new();
    for _ in 0..50 {
        spans = got
            .lock()
            .unwrap()
            .iter()
            .flat_map(|doc| {
                doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        if spans.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(spans.len(), 2, "both requests exported");
    let first = spans
        .iter()
        .find(|s| s["traceId"] == "4bf92f3577b34da6a3ce929d0e0e4736")
        .unwrap();
    assert_eq!(first["spanId"], proxy_span.as_str());
    assert_eq!(first["parentSpanId"], "00f067aa0ba902b7");
    assert_eq!(first["name"], "GET api");
    let service = &got.lock().unwrap()[0]["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"];
    assert_eq!(service, "edge");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_beside_a_differing_authority_is_replaced_by_it() {
    use http_body_util::BodyExt;
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("authority-wins");
    let proxy = start_proxy(&dir, &config(up.addr, "", "", "")).await;
    let tcp = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri("http://real.example.com/x")
        .header("host", "other.example.com")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let _ = resp.into_body().collect().await;
    assert_eq!(
        seen(&up)["host"],
        "real.example.com",
        "routing and the upstream agree on :authority"
    );
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http10_request_without_host_reaches_the_upstream_with_one_on_a_kept_connection() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("http10-host");
    let proxy = start_proxy(&dir, &config(up.addr, "", "", "")).await;
    for _ in 0..3 {
        let resp = raw(proxy.addr("http"), b"GET /x HTTP/1.0\r\n\r\n").await;
        assert!(resp.starts_with("HTTP/1.0 200"), "{resp}");
        assert_eq!(
            seen(&up)["host"],
            up.addr.to_string().as_str(),
            "the endpoint's authority"
        );
    }
    // The upstream answered every one, so the pooled connection carried them all.
    assert_eq!(up.stats.connections.load(std::sync::atomic::Ordering::Relaxed), 1);
    proxy.running.drain();
}
