//! Integration tests: real TLS upstreams and clients in the test process, the proxy started
//! in-process on loopback. No timing assertions: bounds are counts and outcomes.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::*;

fn plain_config(upstream: std::net::SocketAddr, extra_route: &str) -> String {
    format!(
        r#"
listeners:
  - {{name: http, address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
drain: {{gracePeriod: 200ms, deadline: 5s}}
limits: {{maxHeaderBytes: 8192, maxRequestBodyBytes: 1024, headerReadTimeout: 2s}}
routes:
{extra_route}
  - {{name: all, upstream: u, timeout: 2s}}
upstreams:
  - name: u
    endpoints: ["{upstream}"]
    pool: {{idleTimeout: 30s}}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_pool_and_error_mapping() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("routes");
    let extra = r#"  - {name: slow, upstream: u, timeout: 300ms, match: {pathPrefix: /delay}}
  - {name: dead, upstream: dead, match: {pathPrefix: /dead}}
  - {name: hosted, upstream: u, match: {host: "*.example.com", pathPrefix: /only-host}}"#;
    let yaml = plain_config(up.addr, extra).replace(
        "upstreams:\n",
        "upstreams:\n  - {name: dead, endpoints: [\"127.0.0.1:1\"], outlierDetection: {consecutiveFailures: 0}}\n",
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let a = proxy.addr("http");

    // Routing and pooling: 50 requests over fresh client connections share few upstream ones.
    for i in 0..50 {
        let (s, b) = get(a, "x", &format!("/r{i}")).await;
        assert_eq!(s, 200);
        assert!(b.contains(&format!("/r{i}")));
    }
    let conns = up.stats.connections.load(Ordering::Relaxed);
    assert!(conns <= 3, "50 requests used {conns} upstream connections");
    let m = metrics(&proxy).await;
    assert!(
        metric_sum(&m, "proxyfleet_upstream_requests_total", &["connection=\"reused\""]) >= 47.0,
        "{m}"
    );

    // Forwarded headers, hop-by-hop removed.
    let h = up.stats.last_headers.lock().unwrap().clone().unwrap();
    assert!(h.get("x-forwarded-for").is_some());
    assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");

    // Error mapping.
    assert_eq!(get(a, "x", "/dead/x").await.0, 502, "connect failure");
    assert_eq!(get(a, "x", "/delay/2000").await.0, 504, "upstream timeout");
    assert_eq!(get(a, "a.example.com", "/only-host").await.1, "up /only-host 0");
    let m = metrics(&proxy).await;
    assert!(
        metric_sum(
            &m,
            "proxyfleet_responses_total",
            &["route=\"dead\"", "code_class=\"5xx\""]
        ) >= 1.0
    );
    assert!(metric_sum(&m, "proxyfleet_request_duration_seconds_count", &["route=\"all\""]) >= 50.0);
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_route_is_404_and_limits_are_enforced() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("limits");
    let yaml = plain_config(up.addr, "").replace(
        "  - {name: all, upstream: u, timeout: 2s}",
        "  - {name: all, upstream: u, timeout: 2s, match: {pathPrefix: /api}}",
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let a = proxy.addr("http");
    assert_eq!(get(a, "x", "/nothing").await.0, 404);
    let big_header = format!("GET /api HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(20_000));
    assert!(
        raw(a, big_header.as_bytes()).await.starts_with("HTTP/1.1 431"),
        "header too large"
    );
    let big_body = format!(
        "POST /api HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{}",
        "b".repeat(5000)
    );
    assert!(
        raw(a, big_body.as_bytes()).await.starts_with("HTTP/1.1 413"),
        "body too large"
    );
    assert_eq!(get(a, "x", "/api/ok").await.0, 200);
    // A client that connects and never sends a byte is closed (after the 2 s header-read
    // timeout; hyper's own timer would only start at the first byte). The 20 s bound only
    // keeps a regression from hanging the test.
    let mut silent = tokio::net::TcpStream::connect(a).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::io::AsyncReadExt::read(&mut silent, &mut buf),
    )
    .await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "a silent connection was not closed: {read:?}"
    );
    // Nor does part of the HTTP/2 preface hold a slot (issue 18: 5 bytes, then silence).
    let mut partial = tokio::net::TcpStream::connect(a).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut partial, b"PRI *")
        .await
        .unwrap();
    let read = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::io::AsyncReadExt::read(&mut partial, &mut buf),
    )
    .await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "a connection with half a preface was not closed: {read:?}"
    );
    proxy.running.drain();
}

/// At least 20 distinct malformed requests, each answered with a 4xx (or closed), and the
/// proxy keeps serving after every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_4xx_and_the_proxy_keeps_serving() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("malformed");
    let proxy = start_proxy(&dir, &plain_config(up.addr, "")).await;
    let a = proxy.addr("http");
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "u".repeat(70_000));
    let many_headers = format!("GET / HTTP/1.1\r\nHost: x\r\n{}\r\n", "X-A: b\r\n".repeat(500));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage line", b"HELLO\r\n\r\n".to_vec()),
        ("no version", b"GET /\r\n\r\n".to_vec()),
        ("bad version", b"GET / HTTP/9.9\r\nHost: x\r\n\r\n".to_vec()),
        ("space in header name", b"GET / HTTP/1.1\r\nHo st: x\r\n\r\n".to_vec()),
        ("header without colon", b"GET / HTTP/1.1\r\nHost x\r\n\r\n".to_vec()),
        (
            "nul in header value",
            b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n".to_vec(),
        ),
        (
            "bad content-length",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n".to_vec(),
        ),
        (
            "negative content-length",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n".to_vec(),
        ),
        (
            "conflicting content-lengths",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd".to_vec(),
        ),
        (
            "bad chunk size",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n".to_vec(),
        ),
        (
            "unknown transfer-encoding",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(),
        ),
        ("asterisk target for GET", b"GET * HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("relative target", b"GET foo HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        (
            "control char in target",
            b"GET /a\x01b HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ),
        ("uri too long", long_uri.into_bytes()),
        ("too many headers", many_headers.into_bytes()),
        (
            "obs-fold header",
            b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n".to_vec(),
        ),
        ("bare LF method line", b"GET / HTTP/1.1\nHost: x\n\rX\n\n".to_vec()),
        ("method with slash", b"G/T / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        (
            "CONNECT without allow-list",
            b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n".to_vec(),
        ),
        (
            "body larger than limit",
            format!(
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2048\r\n\r\n{}",
                "z".repeat(2048)
            )
            .into_bytes(),
        ),
        (
            "h2 preface garbage",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x01\x09\x00\x00\x00\x00\x00".to_vec(),
        ),
    ];
    assert!(cases.len() >= 20);
    for (name, bytes) in &cases {
        let answer = raw(a, bytes).await;
        let status_ok = answer.is_empty()
            || answer.starts_with("HTTP/1.1 4")
            || answer.starts_with("HTTP/1.0 4")
            || !answer.starts_with("HTTP/1.1 2") && !answer.starts_with("HTTP/1.1 5");
        assert!(status_ok, "{name}: {}", answer.lines().next().unwrap_or(""));
        let (s, _) = get(a, "x", "/still-alive").await;
        assert_eq!(s, 200, "proxy stopped serving after {name}");
    }
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_injection_ratios() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("faults");
    let yaml = plain_config(up.addr, "").replace(
        "  - {name: all, upstream: u, timeout: 2s}",
        "  - {name: all, upstream: u, timeout: 2s, fault: {abort: {status: 503, percent: 20}}}",
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let a = proxy.addr("http");
    let mut aborted = 0;
    for _ in 0..1000 {
        if get(a, "x", "/f").await.0 == 503 {
            aborted += 1;
        }
    }
    // 20 % of 1000; ±5 percentage points is over 7 standard deviations.
    assert!((150..=250).contains(&aborted), "aborted {aborted} of 1000");
    let m = metrics(&proxy).await;
    assert_eq!(
        metric_sum(&m, "proxyfleet_fault_injections_total", &["kind=\"abort\""]),
        aborted as f64
    );
    // The contract the canary analysis relies on: these names, with this label.
    use proxyfleet_config::metric_names as names;
    let code_5xx = format!("{}=\"5xx\"", names::CODE_CLASS);
    assert_eq!(metric_sum(&m, names::RESPONSES_TOTAL, &[&code_5xx]), aborted as f64);
    assert!(metric_sum(&m, names::REQUEST_DURATION_BUCKET, &["le=\"+Inf\""]) >= 1000.0);
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_idempotent_requests_to_another_endpoint() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("retries");
    let yaml = format!(
        r#"
listeners: [{{name: http, address: "127.0.0.1:0"}}]
admin: {{address: "127.0.0.1:0"}}
routes: [{{name: all, upstream: u, retries: {{attempts: 2, budgetPercent: 100}}}}]
upstreams:
  - {{name: u, endpoints: ["127.0.0.1:1", "{}"], outlierDetection: {{consecutiveFailures: 0}}}}
"#,
        up.addr
    );
    let proxy = start_proxy(&dir, &yaml).await;
    for _ in 0..20 {
        assert_eq!(get(proxy.addr("http"), "x", "/r").await.0, 200);
    }
    proxy.running.drain();
}

/// An upstream that takes connections and closes each after reading a request, unanswered;
/// counts the requests it dropped.
async fn a_closing_upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let dropped = Arc::new(AtomicUsize::new(0));
    let count = dropped.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            if matches!(c.read(&mut buf).await, Ok(n) if n > 0) {
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    (addr, dropped)
}

/// An HTTP/2 (h2c) upstream that refuses every stream with REFUSED_STREAM; counts them.
async fn a_refusing_h2_upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let refused = Arc::new(AtomicUsize::new(0));
    let count = refused.clone();
    tokio::spawn(async move {
        while let Ok((c, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(c).await else {
                    return;
                };
                while let Some(Ok((_req, mut respond))) = conn.accept().await {
                    count.fetch_add(1, Ordering::SeqCst);
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                }
            });
        }
    });
    (addr, refused)
}

/// A request an endpoint left unanswered (an HTTP/1.1 connection closed before a byte of
/// answer, an HTTP/2 stream refused) goes to another endpoint when it is idempotent and the
/// route retries, as one whose connection failed does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_idempotent_requests_go_to_another_endpoint() {
    init();
    let good = upstream("good", None, false).await;
    let (closer, dropped) = a_closing_upstream().await;
    let (refuser, refused) = a_refusing_h2_upstream().await;
    let grpc = grpc_upstream().await;
    let yaml = format!(
        r#"
listeners: [{{name: http, address: "127.0.0.1:0"}}]
admin: {{address: "127.0.0.1:0"}}
routes:
  - {{name: h2, match: {{pathPrefix: /h2}}, upstream: h2, retries: {{attempts: 1, budgetPercent: 100}}}}
  - {{name: all, upstream: u, retries: {{attempts: 1, budgetPercent: 100}}}}
upstreams:
  - {{name: u, endpoints: ["{closer}", "{}"], outlierDetection: {{consecutiveFailures: 0}}}}
  - {{name: h2, protocol: h2, endpoints: ["{refuser}", "{grpc}"], outlierDetection: {{consecutiveFailures: 0}}}}
"#,
        good.addr
    );
    let proxy = start_proxy(&tempdir("unanswered"), &yaml).await;
    for _ in 0..10 {
        assert_eq!(get(proxy.addr("http"), "x", "/r").await.0, 200);
        assert_eq!(get(proxy.addr("http"), "x", "/h2").await.0, 200);
    }
    assert!(dropped.load(Ordering::SeqCst) >= 1, "the closing endpoint was drawn");
    assert!(refused.load(Ordering::SeqCst) >= 1, "the refusing endpoint was drawn");
    let m = metrics(&proxy).await;
    let retries = metric_sum(&m, "proxyfleet_upstream_retries_total", &[]);
    let expected = (dropped.load(Ordering::SeqCst) + refused.load(Ordering::SeqCst)) as f64;
    assert_eq!(retries, expected, "{m}");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outlier_ejection_skips_a_failing_endpoint() {
    init();
    let good = upstream("good", None, false).await;
    let dir = tempdir("outlier");
    let yaml = format!(
        r#"
listeners: [{{name: http, address: "127.0.0.1:0"}}]
admin: {{address: "127.0.0.1:0"}}
routes: [{{name: all, upstream: u}}]
upstreams:
  - {{name: u, endpoints: ["127.0.0.1:1", "{}"], outlierDetection: {{consecutiveFailures: 1, ejectionTime: 60s}}}}
"#,
        good.addr
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let mut failures = 0;
    for _ in 0..100 {
        if get(proxy.addr("http"), "x", "/r").await.0 != 200 {
            failures += 1;
        }
    }
    // Only the failure that ejects it fails; after that the dead endpoint is skipped. (With
    // more failures needed, the first one already makes P2C avoid it: `Endpoint::penalize`.)
    assert!(failures <= 1, "{failures} failures");
    let m = metrics(&proxy).await;
    assert_eq!(metric_sum(&m, "proxyfleet_outlier_ejections_total", &[]), 1.0);
    proxy.running.drain();
}

/// Three dead endpoints of four: by default (`maxEjectionPercent` 10) one is ejected and the
/// other two stay in use, shunned by P2C after each failure; at 75 % all three are ejected, and
/// only the live one answers after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ejections_stop_at_max_ejection_percent() {
    init();
    let good = upstream("good", None, false).await;
    for (cap, ejected) in [("", 1.0), (", maxEjectionPercent: 75", 3.0)] {
        let yaml = format!(
            r#"
listeners: [{{name: http, address: "127.0.0.1:0"}}]
admin: {{address: "127.0.0.1:0"}}
routes: [{{name: all, upstream: u}}]
upstreams:
  - {{name: u, endpoints: ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "{}"], outlierDetection: {{consecutiveFailures: 1, ejectionTime: 60s{cap}}}}}
"#,
            good.addr
        );
        let proxy = start_proxy(&tempdir("max-ejection"), &yaml).await;
        let mut late_failures = 0;
        for i in 0..60 {
            if get(proxy.addr("http"), "x", "/r").await.0 != 200 && i >= 10 {
                late_failures += 1;
            }
        }
        let m = metrics(&proxy).await;
        assert_eq!(
            metric_sum(&m, "proxyfleet_outlier_ejections_total", &[]),
            ejected,
            "{cap}: {m}"
        );
        if ejected == 3.0 {
            assert_eq!(late_failures, 0, "every dead endpoint skipped");
        } else {
            // A dead one kept in use is shunned after each failure, for a second more each
            // time: tried again now and then, never drawn beside the live one (unweighed by
            // failures, it drew all 50: a refused connection is the fastest answer).
            assert!(late_failures <= 10, "{late_failures} of 50 failed");
        }
        proxy.running.drain();
    }
}

/// Sends a request's head, then its body in `parts` spaced `gap` apart; returns the response
/// and the time from the last part to the response's end.
async fn upload_slowly(addr: std::net::SocketAddr, path: &str, parts: usize, gap: Duration) -> (String, Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        parts * 10
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    for _ in 0..parts {
        tokio::time::sleep(gap).await;
        tcp.write_all(b"0123456789").await.unwrap();
    }
    let sent = std::time::Instant::now();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut out)).await;
    (String::from_utf8_lossy(&out).into_owned(), sent.elapsed())
}

/// The route's timeout counts from the end of the client's body, as Envoy's does: an upload
/// longer than the timeout succeeds, and the upstream then has the whole timeout to answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_timeout_starts_when_the_upload_ends() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("slow-upload");
    let yaml = format!(
        r#"
listeners: [{{name: http, address: "127.0.0.1:0"}}]
admin: {{address: "127.0.0.1:0"}}
routes:
  - {{name: mirrored, match: {{pathPrefix: /m/}}, upstream: u, mirror: {{upstream: u, percent: 100}}, timeout: 400ms}}
  - {{name: all, upstream: u, timeout: 400ms}}
upstreams: [{{name: u, endpoints: ["{}"]}}]
"#,
        up.addr
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let a = proxy.addr("http");
    // Five parts 200 ms apart: a second of upload against a 400 ms timeout; streamed, and
    // read whole first for a mirror.
    let (resp, _) = upload_slowly(a, "/r", 5, Duration::from_millis(200)).await;
    assert!(resp.starts_with("HTTP/1.1 200") && resp.ends_with("up /r 50"), "{resp}");
    let (resp, _) = upload_slowly(a, "/m/r", 5, Duration::from_millis(200)).await;
    assert!(
        resp.starts_with("HTTP/1.1 200") && resp.ends_with("up /m/r 50"),
        "{resp}"
    );
    // The upstream answers 250 ms after the upload's end (it waits before reading the body,
    // which the kernel holds meanwhile): within the timeout counted from the end.
    let (resp, _) = upload_slowly(a, "/delay/850", 3, Duration::from_millis(200)).await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    // One that answers long after: 504, never sooner than the timeout after the upload's end.
    let (resp, waited) = upload_slowly(a, "/delay/3000", 3, Duration::from_millis(200)).await;
    assert!(resp.starts_with("HTTP/1.1 504"), "{resp}");
    assert!(
        waited >= Duration::from_millis(380),
        "504 {waited:?} after the upload's end"
    );
    proxy.running.drain();
}

/// A proxy (route timeout 300 ms, `limits` as given) before an upstream that takes
/// connections and never reads or answers; `failures` in a row eject it.
async fn before_a_silent_upstream(tag: &str, failures: u32, limits: &str) -> Proxy {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = silent.accept().await {
            held.push(c);
        }
    });
    let yaml = format!(
        r#"
listeners: [{{name: http, address: "127.0.0.1:0"}}]
admin: {{address: "127.0.0.1:0"}}
routes: [{{name: all, upstream: u, timeout: 300ms}}]
upstreams:
  - {{name: u, endpoints: ["{addr}"], outlierDetection: {{consecutiveFailures: {failures}, ejectionTime: 60s}}}}
limits: {{{limits}}}
"#
    );
    start_proxy(&tempdir(tag), &yaml).await
}

/// An upstream that takes a connection but never reads the body it is sent: the proxy's reads
/// stop once the socket buffers fill, with the client ready to send more. The route's timeout
/// runs from the last part taken, and the upstream is blamed (504, ejection), not the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_never_takes_the_body_times_out_and_is_blamed() {
    use tokio::io::AsyncWriteExt;
    init();
    let proxy = before_a_silent_upstream("never-read", 1, "maxRequestBodyBytes: 67108864").await;
    let len = 64usize << 20;
    let mut tcp = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    let head = format!("POST /r HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n");
    tcp.write_all(head.as_bytes()).await.unwrap();
    let (mut rd, mut wr) = tcp.into_split();
    tokio::spawn(async move {
        let chunk = vec![b'x'; 1 << 16];
        for _ in 0..len / chunk.len() {
            if wr.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    // The head is enough: the client is still sending, so the connection stays open.
    let mut out = vec![0u8; 12];
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_exact(&mut rd, &mut out),
    )
    .await
    .expect("an answer within 10 s")
    .unwrap();
    let resp = String::from_utf8_lossy(&out);
    assert_eq!(resp, "HTTP/1.1 504");
    let m = metrics(&proxy).await;
    assert_eq!(metric_sum(&m, "proxyfleet_outlier_ejections_total", &[]), 1.0, "{m}");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stalls_its_body_or_sets_a_short_deadline_ejects_no_endpoint() {
    init();
    let proxy = before_a_silent_upstream("client-late", 2, "clientBodyTimeout: 1s").await;
    let a = proxy.addr("http");
    for _ in 0..3 {
        // Ten bytes of a hundred, then nothing: the client's body timeout passes (the route's
        // does not run while the proxy waits on the client).
        let stalled = raw(
            a,
            b"POST /r HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789",
        )
        .await;
        assert!(stalled.starts_with("HTTP/1.1 408"), "{stalled}");
        // A gRPC client's own deadline, shorter than the route's, passes.
        let expired = raw(
            a,
            b"GET /r HTTP/1.1\r\nHost: x\r\ngrpc-timeout: 50m\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(expired.starts_with("HTTP/1.1 504"), "{expired}");
    }
    let m = metrics(&proxy).await;
    assert_eq!(metric_sum(&m, "proxyfleet_outlier_ejections_total", &[]), 0.0, "{m}");
    // The upstream's own silence still counts against it.
    for _ in 0..2 {
        assert_eq!(get(a, "x", "/r").await.0, 504);
    }
    let m = metrics(&proxy).await;
    assert_eq!(metric_sum(&m, "proxyfleet_outlier_ejections_total", &[]), 1.0, "{m}");
    proxy.running.drain();
}

fn tls_config(dir: &std::path::Path, certs: &[(&str, &str, &str, bool)], upstream: &str, upstream_tls: &str) -> String {
    let mut c =
        String::from("listeners:\n  - name: https\n    address: \"127.0.0.1:0\"\n    tls:\n      certificates:\n");
    for (cert, key, names, default) in certs {
        c.push_str(&format!(
            "        - {{certFile: {}, keyFile: {}, serverNames: [{names}], default: {default}}}\n",
            dir.join(cert).display(),
            dir.join(key).display()
        ));
    }
    c.push_str(&format!(
        "admin: {{address: \"127.0.0.1:0\"}}\ndrain: {{gracePeriod: 100ms, deadline: 5s}}\nroutes: [{{name: all, upstream: u}}]\nupstreams:\n  - name: u\n    endpoints: [\"{upstream}\"]\n{upstream_tls}"
    ));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_selection_h2_both_sides_and_upstream_resumption() {
    init();
    let ca = TestCa::new("test ca");
    let dir = tempdir("sni");
    let (c1, k1) = ca.leaf(&["api.example.com"]);
    let (c2, k2) = ca.leaf(&["*.apps.example.com"]);
    // The default certificate also covers the unknown name, so the client can verify it; it is
    // still chosen only as the default (serverNames lists default.example.com alone).
    let (c3, k3) = ca.leaf(&["default.example.com", "unknown.example.org"]);
    for (n, t) in [
        ("c1", &c1),
        ("k1", &k1),
        ("c2", &c2),
        ("k2", &k2),
        ("c3", &c3),
        ("k3", &k3),
    ] {
        write(&dir, n, t);
    }
    let ca_file = write(&dir, "ca.pem", &ca.cert_pem);
    // The upstream closes its connection after every response: each reconnect should resume.
    let up = upstream("tls-up", Some(ca.leaf(&["localhost"])), true).await;
    let upstream_tls = format!("    tls: {{serverName: localhost, caFile: {ca_file}}}\n    protocol: http1\n");
    let yaml = tls_config(
        &dir,
        &[
            ("c1", "k1", "api.example.com", false),
            ("c2", "k2", "\"*.apps.example.com\"", false),
            ("c3", "k3", "default.example.com", true),
        ],
        &up.addr.to_string(),
        &upstream_tls,
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let a = proxy.addr("https");

    let s = tls_connect(a, Some("api.example.com"), &ca, &[b"http/1.1"]).await;
    assert_eq!(served_dns_names(&s), vec!["api.example.com"]);
    let s = tls_connect(a, Some("x.apps.example.com"), &ca, &[b"http/1.1"]).await;
    assert_eq!(served_dns_names(&s), vec!["*.apps.example.com"]);
    let s = tls_connect(a, Some("unknown.example.org"), &ca, &[b"http/1.1"]).await;
    assert_eq!(served_dns_names(&s), vec!["default.example.com", "unknown.example.org"]);
    let s = tls_connect(a, None, &ca, &[b"http/1.1"]).await;
    assert_eq!(served_dns_names(&s), vec!["default.example.com", "unknown.example.org"]);

    // h2 from the client, TLS http/1.1 upstream that closes every time.
    for i in 0..20 {
        let s = tls_connect(a, Some("api.example.com"), &ca, &[b"h2"]).await;
        let (status, body, version) = tls_get(s, "api.example.com", &format!("/n{i}")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(version, http::Version::HTTP_2);
    }
    let m = metrics(&proxy).await;
    let full = metric_sum(&m, "proxyfleet_upstream_tls_handshakes_total", &["kind=\"full\""]);
    let resumed = metric_sum(&m, "proxyfleet_upstream_tls_handshakes_total", &["kind=\"resumed\""]);
    assert!(full + resumed >= 20.0, "full {full} resumed {resumed}");
    assert!(resumed >= 0.9 * (full + resumed) - 1.0, "full {full} resumed {resumed}");
    assert!(up.stats.resumed_handshakes.load(Ordering::Relaxed) >= 18);
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls12_sessions_to_the_upstream_are_resumed_when_capped_at_tls12() {
    init();
    let ca = TestCa::new("test ca");
    let dir = tempdir("tls12");
    let (c, k) = ca.leaf(&["front.example.com"]);
    write(&dir, "c", &c);
    write(&dir, "k", &k);
    let ca_file = write(&dir, "ca.pem", &ca.cert_pem);
    // Closes after every response: each request needs a new connection, which should resume.
    let up = upstream("tls12-up", Some(ca.leaf(&["localhost"])), true).await;
    let upstream_tls =
        format!("    tls: {{serverName: localhost, caFile: {ca_file}, maxVersion: \"1.2\"}}\n    protocol: http1\n");
    let yaml = tls_config(
        &dir,
        &[("c", "k", "front.example.com", true)],
        &up.addr.to_string(),
        &upstream_tls,
    );
    let proxy = start_proxy(&dir, &yaml).await;
    for i in 0..20 {
        let s = tls_connect(proxy.addr("https"), Some("front.example.com"), &ca, &[b"http/1.1"]).await;
        let (status, body, _) = tls_get(s, "front.example.com", &format!("/n{i}")).await;
        assert_eq!(status, 200, "{body}");
    }
    assert!(up.stats.tls12_connections.load(Ordering::Relaxed) >= 20);
    assert_eq!(
        up.stats.tls13_connections.load(Ordering::Relaxed),
        0,
        "only TLS 1.2 is offered"
    );
    assert!(
        up.stats.resumed_handshakes.load(Ordering::Relaxed) >= 18,
        "TLS 1.2 sessions resumed"
    );
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_to_the_upstream_by_alpn() {
    init();
    let ca = TestCa::new("test ca");
    let dir = tempdir("h2up");
    let (c, k) = ca.leaf(&["localhost"]);
    write(&dir, "c", &c);
    write(&dir, "k", &k);
    let ca_file = write(&dir, "ca.pem", &ca.cert_pem);
    let up = upstream("h2-up", Some(ca.leaf(&["localhost"])), false).await;
    let upstream_tls = format!("    tls: {{serverName: localhost, caFile: {ca_file}}}\n    protocol: auto\n");
    let yaml = tls_config(
        &dir,
        &[("c", "k", "localhost", true)],
        &up.addr.to_string(),
        &upstream_tls,
    );
    let proxy = start_proxy(&dir, &yaml).await;
    for _ in 0..10 {
        let s = tls_connect(proxy.addr("https"), Some("localhost"), &ca, &[b"http/1.1"]).await;
        let (status, _, version) = tls_get(s, "localhost", "/x").await;
        assert_eq!(status, 200);
        assert_eq!(version, http::Version::HTTP_11);
    }
    assert_eq!(
        up.stats.h2_requests.load(Ordering::Relaxed),
        10,
        "upstream should see HTTP/2"
    );
    assert_eq!(
        up.stats.connections.load(Ordering::Relaxed),
        1,
        "one multiplexed h2 connection"
    );
    proxy.running.drain();
}

/// Certificates are rotated under continuous load (new connections all the time): zero failed
/// requests, and new connections see the new serial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_rotation_under_load_drops_nothing() {
    init();
    let ca = TestCa::new("test ca");
    let dir = tempdir("rotate");
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let (c, k) = ca.leaf(&["localhost"]);
    write(&certs, "tls.crt", &c);
    write(&certs, "tls.key", &k);
    let up = upstream("up", None, false).await;
    let yaml = format!(
        "listeners:\n  - name: https\n    address: \"127.0.0.1:0\"\n    tls:\n      certificates: [{{certFile: {0}/tls.crt, keyFile: {0}/tls.key, default: true}}]\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: all, upstream: u}}]\nupstreams: [{{name: u, endpoints: [\"{1}\"]}}]\n",
        certs.display(),
        up.addr
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let addr = proxy.addr("https");
    let first = served_serial(&tls_connect(addr, Some("localhost"), &ca, &[b"http/1.1"]).await);

    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let ca = Arc::new(ca);
    let mut load = Vec::new();
    for _ in 0..2 {
        let (stop, ok, failed, ca) = (stop.clone(), ok.clone(), failed.clone(), ca.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let s = tls_connect(addr, Some("localhost"), &ca, &[b"http/1.1"]).await;
                let (status, _, _) = tls_get(s, "localhost", "/load").await;
                if status == 200 {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Rotate twice the way the kubelet does: new files in a new directory, then a rename.
    let mut serial = first.clone();
    for round in 0..2 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (c, k) = ca.leaf(&["localhost"]);
        let staging = dir.join(format!("staging-{round}"));
        std::fs::create_dir_all(&staging).unwrap();
        write(&staging, "tls.crt", &c);
        write(&staging, "tls.key", &k);
        std::fs::rename(staging.join("tls.crt"), certs.join("tls.crt")).unwrap();
        std::fs::rename(staging.join("tls.key"), certs.join("tls.key")).unwrap();
        let mut seen = serial.clone();
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            seen = served_serial(&tls_connect(addr, Some("localhost"), &ca, &[b"http/1.1"]).await);
            if seen != serial {
                break;
            }
        }
        assert_ne!(
            seen, serial,
            "round {round}: new connections still see the old certificate"
        );
        serial = seen;
    }
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    assert!(ok.load(Ordering::Relaxed) > 20);
    let m = metrics(&proxy).await;
    assert!(metric_sum(&m, "proxyfleet_config_reloads_total", &["result=\"success\""]) >= 2.0);
    // The contract the operator relies on during a CA rotation: /config parses as the shared
    // AdminReport and names the certificate now served.
    let (status, body) = get(proxy.admin(), "admin", proxyfleet_config::ADMIN_REPORT_PATH).await;
    assert_eq!(status, 200);
    let report = proxyfleet_config::AdminReport::from_json(&body).expect("an AdminReport");
    assert_eq!(report.certificates.len(), 1);
    assert_eq!(report.certificates[0].serial.to_lowercase(), serial.to_lowercase());
    proxy.running.drain();
}

/// A standalone proxy whose file gains a change only a restart applies (here maxConnections)
/// still takes the rest of it: a new certificate is served at once, and
/// `config_restart_pending` says what waits. The certificate's directory is named before it
/// exists, so that first reload fails; it is watched for all the same (through its parent),
/// and the certificate is taken when it arrives, with no SIGHUP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_needs_a_restart_holds_back_no_certificate() {
    init();
    let ca = TestCa::new("test ca");
    let dir = tempdir("restart-pending");
    let (old, new) = (dir.join("old"), dir.join("new"));
    std::fs::create_dir_all(&old).unwrap();
    let (c, k) = ca.leaf(&["localhost"]);
    write(&old, "tls.crt", &c);
    write(&old, "tls.key", &k);
    let up = upstream("up", None, false).await;
    let yaml = |certs: &std::path::Path, max_connections: u32| {
        format!(
            "listeners:\n  - name: https\n    address: \"127.0.0.1:0\"\n    tls:\n      certificates: [{{certFile: {0}/tls.crt, keyFile: {0}/tls.key, default: true}}]\nadmin: {{address: \"127.0.0.1:0\"}}\nlimits: {{maxConnections: {2}}}\nroutes: [{{name: all, upstream: u}}]\nupstreams: [{{name: u, endpoints: [\"{1}\"]}}]\n",
            certs.display(),
            up.addr,
            max_connections
        )
    };
    let proxy = start_proxy(&dir, &yaml(&old, 1000)).await;
    let addr = proxy.addr("https");
    let first = served_serial(&tls_connect(addr, Some("localhost"), &ca, &[b"http/1.1"]).await);
    std::fs::write(&proxy.config_path, yaml(&new, 2000)).unwrap();
    let failures = |m: &str| metric_sum(m, "proxyfleet_config_reloads_total", &["result=\"failure\""]);
    let mut m = String::new();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        m = metrics(&proxy).await;
        if failures(&m) >= 1.0 {
            break;
        }
    }
    assert!(
        failures(&m) >= 1.0,
        "the reload naming a missing certificate was not refused"
    );
    let (c, k) = ca.leaf(&["localhost"]);
    std::fs::create_dir_all(&new).unwrap();
    write(&new, "tls.key", &k);
    write(&new, "tls.crt", &c);
    let mut seen = first.clone();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = served_serial(&tls_connect(addr, Some("localhost"), &ca, &[b"http/1.1"]).await);
        if seen != first {
            break;
        }
    }
    assert_ne!(
        seen, first,
        "the certificate in the newly named directory was never served"
    );
    let m = metrics(&proxy).await;
    assert_eq!(metric_sum(&m, "proxyfleet_config_restart_pending", &[]), 1.0);
    assert_eq!(metric_sum(&m, "proxyfleet_config_last_reload_successful", &[]), 1.0);
    let s = tls_connect(addr, Some("localhost"), &ca, &[b"http/1.1"]).await;
    assert_eq!(
        tls_get(s, "localhost", "/").await.0,
        200,
        "the running listener still serves"
    );
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_reload_applies_and_a_bad_reload_keeps_the_running_config() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("reload");
    let proxy = start_proxy(&dir, &plain_config(up.addr, "")).await;
    let a = proxy.addr("http");
    assert_eq!(get(a, "x", "/").await.0, 200);
    // Add a fault to the route: every request now gets 418.
    let faulty = plain_config(up.addr, "").replace(
        "  - {name: all, upstream: u, timeout: 2s}",
        "  - {name: all, upstream: u, timeout: 2s, fault: {abort: {status: 418, percent: 100}}}",
    );
    std::fs::write(&proxy.config_path, faulty).unwrap();
    let mut status = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        status = get(a, "x", "/").await.0;
        if status == 418 {
            break;
        }
    }
    assert_eq!(status, 418, "reload not applied");
    // An invalid file is refused; the proxy keeps the last good config.
    std::fs::write(
        &proxy.config_path,
        "routes: [{name: broken, upstream: nowhere}]\nbogus: 1\n",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(get(a, "x", "/").await.0, 418);
    let m = metrics(&proxy).await;
    assert!(metric_sum(&m, "proxyfleet_config_reloads_total", &["result=\"failure\""]) >= 1.0);
    assert_eq!(metric_sum(&m, "proxyfleet_config_last_reload_successful", &[]), 0.0);
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_finishes_in_flight_requests_and_turns_readiness_off() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("drain");
    let proxy = start_proxy(&dir, &plain_config(up.addr, "")).await;
    let a = proxy.addr("http");
    let mut in_flight = Vec::new();
    for i in 0..10 {
        in_flight.push(tokio::spawn(async move {
            get(a, "x", &format!("/delay/{}", 500 + i * 20)).await.0
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.running.drain();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(get(proxy.admin(), "x", "/readyz").await.0, 503);
    for r in in_flight {
        assert_eq!(r.await.unwrap(), 200);
    }
    let Proxy { running, .. } = proxy;
    tokio::time::timeout(Duration::from_secs(10), running.done)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_upstream_retires_is_replaced_in_the_background() {
    init();
    // Closes after every response, announcing it with `Connection: close`.
    let up = upstream("up", None, true).await;
    let dir = tempdir("replace");
    let proxy = start_proxy(&dir, &plain_config(up.addr, "")).await;
    let a = proxy.addr("http");
    for i in 0..20 {
        assert_eq!(get(a, "x", &format!("/r{i}")).await.0, 200);
        // A client's think time, ample for a connect on loopback.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = metrics(&proxy).await;
    let pooled = metric_sum(&m, "proxyfleet_upstream_requests_total", &["connection=\"reused\""]);
    assert!(
        pooled >= 17.0,
        "only {pooled} of 20 requests found a connection waiting: {m}"
    );
    // One connection per request and the one waiting for the next: none opened twice.
    let conns = up.stats.connections.load(Ordering::Relaxed);
    assert!(conns <= 22, "{conns} upstream connections for 20 requests");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_upstream_connections_are_closed_after_the_idle_timeout() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("idle");
    let yaml = plain_config(up.addr, "").replace("idleTimeout: 30s", "idleTimeout: 300ms");
    let proxy = start_proxy(&dir, &yaml).await;
    let a = proxy.addr("http");
    assert_eq!(get(a, "x", "/1").await.0, 200);
    assert_eq!(get(a, "x", "/2").await.0, 200);
    assert_eq!(up.stats.connections.load(Ordering::Relaxed), 1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(get(a, "x", "/3").await.0, 200);
    assert_eq!(
        up.stats.connections.load(Ordering::Relaxed),
        2,
        "the idle connection should have been closed"
    );
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_tunnels_only_to_allowed_targets() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    init();
    let up = upstream("up", None, false).await;
    // Allowed by name, but loopback: refused on the resolved address unless a network says so.
    let dir = tempdir("connect-internal");
    let yaml = format!(
        "{}connect: {{allow: [\"127.0.0.1:{}\"]}}\n",
        plain_config(up.addr, ""),
        up.addr.port()
    );
    let closed = start_proxy(&dir, &yaml).await;
    let connect = format!("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\n", up.addr);
    assert!(raw(closed.addr("http"), connect.as_bytes())
        .await
        .starts_with("HTTP/1.1 403"));
    let m = metrics(&closed).await;
    assert_eq!(
        metric_sum(&m, "proxyfleet_refused_connections_total", &["connect_target"]),
        1.0
    );
    closed.running.drain();

    let dir = tempdir("connect");
    let yaml = format!(
        "{}connect: {{allow: [\"127.0.0.1:{}\"], allowedNetworks: [127.0.0.0/8], idleTimeout: 30s}}\n",
        plain_config(up.addr, ""),
        up.addr.port()
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let a = proxy.addr("http");
    assert!(raw(a, b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n")
        .await
        .starts_with("HTTP/1.1 403"));
    let mut tcp = tokio::net::TcpStream::connect(a).await.unwrap();
    tcp.write_all(connect.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tcp.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    tcp.write_all(b"GET /tunnelled HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tcp.read_to_end(&mut out).await.unwrap();
    assert!(String::from_utf8_lossy(&out).contains("up /tunnelled"));
    proxy.running.drain();
}

/// A proxy whose `https` listener serves `api.example.com` from `ca` and asks clients for a
/// certificate from `client_ca` (file `client-ca.pem` in the returned directory).
/// Sends a GET over `s` and reads the answer's first bytes; `None` when the connection fails
/// or ends first.
async fn answer_to_raw_get(mut s: tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(b"GET /x HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
        .await
        .ok()?;
    let mut buf = [0u8; 64];
    match s.read(&mut buf).await {
        Ok(n) if n > 0 => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        _ => None,
    }
}

async fn mtls_proxy(name: &str, ca: &TestCa, client_ca: &TestCa) -> (std::path::PathBuf, Upstream, Proxy) {
    let dir = tempdir(name);
    let (c, k) = ca.leaf(&["api.example.com"]);
    write(&dir, "c", &c);
    write(&dir, "k", &k);
    let client_ca_file = write(&dir, "client-ca.pem", &client_ca.cert_pem);
    let up = within("upstream", upstream("up", None, false)).await;
    let yaml = format!(
        "listeners:\n  - name: https\n    address: \"127.0.0.1:0\"\n    tls:\n      clientCaFile: {client_ca_file}\n      certificates:\n        - {{certFile: {}, keyFile: {}, default: true}}\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: all, upstream: u}}]\nupstreams:\n  - name: u\n    endpoints: [\"{}\"]\n",
        dir.join("c").display(),
        dir.join("k").display(),
        up.addr
    );
    let proxy = within("start", start_proxy(&dir, &yaml)).await;
    (dir, up, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_listener_serves_only_clients_with_a_trusted_certificate() {
    init();
    let (ca, client_ca) = (TestCa::new("server ca"), TestCa::new("client ca"));
    let stranger_ca = TestCa::new("stranger ca");
    let (_dir, up, proxy) = mtls_proxy("mtls", &ca, &client_ca).await;
    let a = proxy.addr("https");

    // A certificate from the client CA: served. `step` names the wait if one hangs.
    let trusted = client_ca.leaf(&["client.example.com"]);
    let trusted_get = |step: &'static str, path: &'static str| {
        let (ca, trusted) = (&ca, &trusted);
        async move {
            let handshake = tls_connect_as(a, Some("api.example.com"), ca, &[b"http/1.1"], Some(trusted));
            let s = within(&format!("{step}: handshake"), handshake).await.unwrap();
            let got = within(&format!("{step}: request"), h1_get(s, "api.example.com", path)).await;
            got.unwrap().0
        }
    };
    assert_eq!(trusted_get("trusted", "/ok").await, 200);

    // No certificate, or one from another CA: refused (in TLS 1.3 the refusal arrives after
    // the client's side of the handshake, so it shows on the first request).
    let untrusted = stranger_ca.leaf(&["client.example.com"]);
    for cert in [None, Some(&untrusted)] {
        let handshake = tls_connect_as(a, Some("api.example.com"), &ca, &[b"http/1.1"], cert);
        let refused = match within("refused handshake", handshake).await {
            Err(_) => true,
            // Raw bytes, not a client library: what is tested is that the proxy ends the
            // connection unanswered (an alert, a reset or an end), not how a client reports it.
            Ok(s) => within("refused request", answer_to_raw_get(s)).await.is_none(),
        };
        assert!(refused, "a client presenting {cert:?} was served");
    }
    // Still serving trusted clients afterwards.
    assert_eq!(trusted_get("trusted after", "/again").await, 200);
    assert_eq!(up.stats.requests.load(Ordering::Relaxed), 2);
    proxy.running.drain();
}

/// A DNS upstream rebuilt by a reload (its CA file changed) keeps serving from the endpoints
/// already resolved, not from none until its first lookup answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_upstream_rebuilt_by_a_reload_keeps_its_resolved_endpoints() {
    init();
    let ca = TestCa::new("dns upstream ca");
    let dir = tempdir("dns-reload");
    let ca_file = write(&dir, "ca.pem", &ca.cert_pem);
    let up = upstream("dns-up", Some(ca.leaf(&["localhost"])), false).await;
    let yaml = format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: all, upstream: u}}]\nupstreams:\n  - name: u\n    dns: {{name: localhost, port: {}, refreshInterval: 60s}}\n    tls: {{serverName: localhost, caFile: {ca_file}}}\n    protocol: http1\n",
        up.addr.port()
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let shared = proxy.running.shared.clone();
    let resolved =
        |shared: &proxyfleet_proxy::shared::Shared| shared.state.load().upstreams["u"].endpoints.load().len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while resolved(&shared) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "localhost never resolved");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = Arc::as_ptr(&shared.state.load().upstreams["u"]);
    write(&dir, "ca.pem", &format!("{}\n", ca.cert_pem));
    assert!(proxyfleet_proxy::reload::reload(&shared));
    assert_ne!(Arc::as_ptr(&shared.state.load().upstreams["u"]), before, "rebuilt");
    assert!(resolved(&shared) > 0, "the rebuilt upstream starts with no endpoints");
    let (status, body) = get(proxy.addr("http"), "x", "/after").await;
    assert_eq!(status, 200, "{body}");
    proxy.running.drain();
}

/// A resumed TLS session is not verified again, so a session from before the client CA changed
/// must not resume after it; a reload that keeps the CA keeps sessions resumable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_from_before_a_client_ca_change_do_not_resume() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    init();
    let (ca, client_ca) = (TestCa::new("server ca"), TestCa::new("client ca"));
    let (dir, _up, proxy) = mtls_proxy("mtls-resume", &ca, &client_ca).await;
    let a = proxy.addr("https");
    // One client config, so one session store, for every connection.
    let (cert, key) = client_ca.leaf(&["client.example.com"]);
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .map(|c| c.unwrap())
        .collect();
    let mut cfg = rustls::ClientConfig::builder()
        .with_root_certificates(ca.roots())
        .with_client_auth_cert(chain, PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap())
        .unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let visit = |step: &'static str| {
        let connector = connector.clone();
        async move {
            let name = ServerName::try_from("api.example.com").unwrap();
            let tcp = tokio::net::TcpStream::connect(a).await.unwrap();
            let s = within(step, connector.connect(name, tcp)).await.unwrap();
            let kind = s.get_ref().1.handshake_kind();
            // The response is read after the tickets, so the store holds them afterwards.
            let status = within(step, h1_get(s, "api.example.com", "/")).await.map(|r| r.0).ok();
            (kind, status)
        }
    };
    assert_eq!(visit("first").await.1, Some(200));
    assert_eq!(
        visit("resumed").await,
        (Some(rustls::HandshakeKind::Resumed), Some(200))
    );

    let reloads = |m: &str| metric_sum(m, "proxyfleet_config_reloads_total", &["result=\"success\""]);
    let reloaded_past = |n: f64| move |m: &str| reloads(m) > n;
    // The same CA written again: a reload, and sessions still resume.
    let before = reloads(&metrics(&proxy).await);
    write(&dir, "client-ca.pem", &format!("{}\n", client_ca.cert_pem));
    let before = reloads(&metrics_when(&proxy, reloaded_past(before)).await);
    assert!(before >= 1.0, "the rewritten client CA was not reloaded");
    assert_eq!(
        visit("same CA").await,
        (Some(rustls::HandshakeKind::Resumed), Some(200))
    );

    // Another CA: the client's certificate is no longer trusted, and its session is forgotten.
    let stranger_ca = TestCa::new("stranger ca");
    write(&dir, "client-ca.pem", &stranger_ca.cert_pem);
    let after = reloads(&metrics_when(&proxy, reloaded_past(before)).await);
    assert!(after > before, "the new client CA was not reloaded");
    let (kind, status) = visit("new CA").await;
    assert_ne!(
        kind,
        Some(rustls::HandshakeKind::Resumed),
        "a session from before the CA change resumed"
    );
    assert_eq!(status, None, "a client the new CA does not trust was served");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_client_certificate_is_presented_to_an_upstream_that_requires_one() {
    init();
    let ca = TestCa::new("upstream ca");
    let client_ca = TestCa::new("proxy client ca");
    let dir = tempdir("upmtls");
    let ca_file = write(&dir, "ca.pem", &ca.cert_pem);
    let (cc, ck) = client_ca.leaf(&["proxy.example.com"]);
    let cert_file = write(&dir, "client.crt", &cc);
    let key_file = write(&dir, "client.key", &ck);
    let up = upstream_verifying_clients("mtls-up", Some(ca.leaf(&["localhost"])), Some(&client_ca), false).await;
    let config = |client_cert: &str| {
        format!(
            "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: all, upstream: u}}]\nupstreams:\n  - name: u\n    endpoints: [\"{}\"]\n    tls: {{serverName: localhost, caFile: {ca_file}{client_cert}}}\n",
            up.addr
        )
    };
    // With the client certificate configured: served.
    let with_cert = start_proxy(
        &dir,
        &config(&format!(
            ", clientCertificate: {{certFile: {cert_file}, keyFile: {key_file}}}"
        )),
    )
    .await;
    for i in 0..5 {
        let (status, body) = get(with_cert.addr("http"), "x", &format!("/m{i}")).await;
        assert_eq!(status, 200, "{body}");
        assert!(body.starts_with("mtls-up"), "{body}");
    }
    with_cert.running.drain();
    // Without it the upstream refuses the connection: a 502, never a hang or a 200.
    let dir2 = tempdir("upmtls2");
    let without = start_proxy(&dir2, &config("")).await;
    let (status, _) = get(without.addr("http"), "x", "/no-cert").await;
    assert_eq!(status, 502);
    assert_eq!(up.stats.requests.load(Ordering::Relaxed), 5);
    without.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_health_check_takes_an_endpoint_out_and_brings_it_back() {
    init();
    let a = upstream("a", None, false).await;
    let b = upstream("b", None, false).await;
    let dir = tempdir("health");
    let yaml = format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: all, upstream: u}}]\nupstreams:\n  - name: u\n    endpoints: [\"{}\", \"{}\"]\n    healthCheck: {{path: /healthz, interval: 50ms, timeout: 1s, unhealthyThreshold: 2, healthyThreshold: 2}}\n",
        a.addr, b.addr
    );
    b.stats.unhealthy.store(true, Ordering::Relaxed);
    let proxy = start_proxy(&dir, &yaml).await;
    let http = proxy.addr("http");
    // Wait (by outcome, bounded) until b has failed two checks (its third has come: the
    // second's answer was judged) and been marked down.
    let mut checked = false;
    for _ in 0..200 {
        if b.stats.requests.load(Ordering::Relaxed) >= 3 {
            checked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(checked, "b was never health-checked");
    let mut served_by_b = 0;
    for i in 0..40 {
        let (status, body) = get(http, "x", &format!("/r{i}")).await;
        assert_eq!(status, 200, "{body}");
        served_by_b += usize::from(body.starts_with("b "));
    }
    assert_eq!(served_by_b, 0, "an endpoint failing its health check got traffic");

    // Healthy again: it gets traffic again.
    b.stats.unhealthy.store(false, Ordering::Relaxed);
    let mut back = false;
    for i in 0..400 {
        let (_, body) = get(http, "x", &format!("/back{i}")).await;
        if body.starts_with("b /back") {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(back, "a recovered endpoint never got traffic again");
    proxy.running.drain();
}

/// Envoy's healthy panic threshold: with fewer than half the endpoints passing, the checks are
/// more likely wrong than most endpoints down, so all of them are used (and the gauge says so);
/// once enough pass again, those failing get nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_panic_threshold_every_endpoint_is_used() {
    init();
    let a = upstream("a", None, false).await;
    let b = upstream("b", None, false).await;
    let c = upstream("c", None, false).await;
    let dir = tempdir("health-panic");
    let yaml = format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: all, upstream: u}}]\nupstreams:\n  - name: u\n    endpoints: [\"{}\", \"{}\", \"{}\"]\n    healthCheck: {{path: /healthz, interval: 50ms, timeout: 1s, unhealthyThreshold: 1, healthyThreshold: 1}}\n",
        a.addr, b.addr, c.addr
    );
    b.stats.unhealthy.store(true, Ordering::Relaxed);
    c.stats.unhealthy.store(true, Ordering::Relaxed);
    let proxy = start_proxy(&dir, &yaml).await;
    let http = proxy.addr("http");
    let panic = |v: f64| move |m: &str| metric_sum(m, "proxyfleet_upstream_healthy_panic", &["upstream=\"u\""]) == v;
    let m = metrics_when(&proxy, panic(1.0)).await;
    assert!(panic(1.0)(&m), "one of three passing is not a panic: {m}");
    let mut served = [0usize; 3];
    for i in 0..60 {
        let (status, body) = get(http, "x", &format!("/p{i}")).await;
        assert_eq!(status, 200, "{body}");
        served[usize::from(body.as_bytes()[0] - b'a')] += 1;
    }
    assert!(
        served.iter().all(|n| *n > 0),
        "in panic every endpoint serves: {served:?}"
    );

    // Two of three pass: the checks steer again, and b gets nothing.
    c.stats.unhealthy.store(false, Ordering::Relaxed);
    let m = metrics_when(&proxy, panic(0.0)).await;
    assert!(panic(0.0)(&m), "two of three passing is not a panic: {m}");
    for i in 0..40 {
        let (_, body) = get(http, "x", &format!("/q{i}")).await;
        assert!(
            !body.starts_with("b "),
            "a failing endpoint got traffic out of panic: {body}"
        );
    }
    proxy.running.drain();
}

/// RFC 7301: the protocol ALPN agreed on is the one served: HTTP/1.1 on a connection that
/// agreed on h2 is not answered as HTTP/1.1 (issue 18). (An h2 preface on an http/1.1
/// connection is still detected and served as h2: hyper-util's auto builder keeps upgrades
/// only with detection; see docs/decisions.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_protocol_alpn_agreed_on_is_the_one_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    init();
    let ca = TestCa::new("alpn ca");
    let dir = tempdir("alpn");
    let (c, k) = ca.leaf(&["localhost"]);
    write(&dir, "tls.crt", &c);
    write(&dir, "tls.key", &k);
    let up = upstream("up", None, false).await;
    let yaml = format!(
        "listeners:\n  - name: https\n    address: \"127.0.0.1:0\"\n    tls:\n      certificates: [{{certFile: {0}/tls.crt, keyFile: {0}/tls.key, default: true}}]\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: all, upstream: u}}]\nupstreams: [{{name: u, endpoints: [\"{1}\"]}}]\n",
        dir.display(),
        up.addr
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let addr = proxy.addr("https");
    let answer = |mut s: tokio_rustls::client::TlsStream<tokio::net::TcpStream>, bytes: &'static [u8]| async move {
        s.write_all(bytes).await.unwrap();
        let mut buf = vec![0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .map(|r| r.unwrap_or(0))
            .unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let h1_request: &'static [u8] = b"GET / HTTP/1.1\r\nhost: localhost\r\n\r\n";
    let on_h2 = answer(tls_connect(addr, Some("localhost"), &ca, &[b"h2"]).await, h1_request).await;
    assert!(
        !on_h2.starts_with("HTTP/1.1"),
        "HTTP/1.1 served on an h2 connection: {on_h2:?}"
    );
    let on_h1 = answer(
        tls_connect(addr, Some("localhost"), &ca, &[b"http/1.1"]).await,
        h1_request,
    )
    .await;
    assert!(on_h1.starts_with("HTTP/1.1 200"), "{on_h1:?}");
    // A client offering only http/1.0 (curl --http1.0) is served, not refused with
    // no_application_protocol; without a Host, too.
    let only_10 = tls_connect(addr, Some("localhost"), &ca, &[b"http/1.0"]).await;
    assert_eq!(only_10.get_ref().1.alpn_protocol(), Some(&b"http/1.0"[..]));
    let on_10 = answer(only_10, b"GET / HTTP/1.0\r\n\r\n").await;
    assert!(on_10.starts_with("HTTP/1.0 200"), "{on_10:?}");
    proxy.running.drain();
}

/// A route's rate limit: the burst passes, the rest get 429 with Retry-After, counted; another
/// route is not limited (issue 18).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_route_answers_429_with_retry_after() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("ratelimit");
    let yaml = plain_config(
        up.addr,
        "  - {name: limited, match: {pathPrefix: /api}, upstream: u, timeout: 2s, rateLimit: {requestsPerSecond: 0.5, burst: 3}}",
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let a = proxy.addr("http");
    let statuses: Vec<u16> = futures_util::future::join_all((0..10).map(|_| get(a, "x", "/api/x")))
        .await
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 3, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 7, "{statuses:?}");
    let reply = raw(a, b"GET /api/y HTTP/1.1\r\nhost: x\r\n\r\n").await.to_lowercase();
    assert!(
        reply.starts_with("http/1.1 429") && reply.contains("retry-after: 2"),
        "{reply}"
    );
    assert_eq!(get(a, "x", "/other").await.0, 200, "other routes are not limited");
    let m = metrics(&proxy).await;
    assert_eq!(
        metric_sum(&m, "proxyfleet_rate_limited_requests_total", &["route=\"limited\""]),
        8.0
    );
    // The proxy's own refusals are the route's, not its upstream's (a canary backend is never
    // judged on them).
    let responses = |upstream: &str| {
        let upstream = format!("upstream=\"{upstream}\"");
        metric_sum(
            &m,
            "proxyfleet_responses_total",
            &["route=\"limited\"", &upstream, "4xx"],
        )
    };
    assert_eq!((responses(""), responses("u")), (8.0, 0.0));
    // A reload (a certificate renewed, say) gives nobody a fresh burst.
    // (A fresh bucket would pass all three; the kept one refills one every 2 s.)
    assert!(proxyfleet_proxy::reload::reload(&proxy.running.shared));
    let mut after = Vec::new();
    for _ in 0..3 {
        after.push(get(a, "x", "/api/after-reload").await.0);
    }
    assert!(after.contains(&429), "a reload refilled the bucket: {after:?}");
    proxy.running.drain();
}

/// An upstream that answers the head and one chunk of a chunked body, then goes silent with
/// the connection open; it records the most connections it ever had open at once.
async fn a_stalling_upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let open = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let seen = most.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            let (open, most) = (open.clone(), most.clone());
            most.fetch_max(open.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf).await;
                let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n";
                let _ = c.write_all(head).await;
                // Until the proxy closes it.
                while matches!(c.read(&mut buf).await, Ok(n) if n > 0) {}
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (addr, seen)
}

/// The endpoint's connection permit is held until the response body ends, not given back at
/// its head: with `maxConnectionsPerEndpoint: 1`, a second request waits while the first one's
/// answer streams. An upstream silent mid-body for `responseIdleTimeout` has its answer cut
/// off (no last chunk), over HTTP/1.1 and HTTP/2, and the permit comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_holds_its_permit_and_a_silent_one_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    init();
    let (addr, most_open) = a_stalling_upstream().await;
    let yaml = format!(
        r#"
listeners: [{{name: http, address: "127.0.0.1:0"}}]
admin: {{address: "127.0.0.1:0"}}
routes: [{{name: all, upstream: u, timeout: 10s, responseIdleTimeout: 500ms}}]
upstreams:
  - {{name: u, endpoints: ["{addr}"], pool: {{maxConnectionsPerEndpoint: 1}}}}
"#
    );
    let proxy = start_proxy(&tempdir("stall"), &yaml).await;
    let a = proxy.addr("http");
    let mut first = tokio::net::TcpStream::connect(a).await.unwrap();
    first.write_all(b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("hello") {
        let n = within("the first chunk", first.read(&mut buf)).await.unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    // The first answer is open: the second request waits for its permit.
    let second = tokio::spawn(async move {
        let mut c = tokio::net::TcpStream::connect(a).await.unwrap();
        c.write_all(b"GET /2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        within("the second answer", c.read_to_end(&mut out)).await.unwrap();
        String::from_utf8_lossy(&out).into_owned()
    });
    within("the first answer cut off", first.read_to_end(&mut got))
        .await
        .unwrap();
    let first = String::from_utf8_lossy(&got);
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(!first.contains("\r\n0\r\n"), "cut off, not ended: {first}");
    let second = second.await.unwrap();
    assert!(
        second.starts_with("HTTP/1.1 200") && second.contains("hello"),
        "{second}"
    );
    assert!(!second.contains("\r\n0\r\n"), "{second}");
    // Over HTTP/2 (the answer read ahead of the client by a task): the stream is reset.
    let (mut h2, _conn) = h2_client(a).await;
    let req = http::Request::get(format!("http://{a}/3"))
        .body(Default::default())
        .unwrap();
    let resp = within("the h2 head", h2.send_request(req)).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = within("the h2 body", http_body_util::BodyExt::collect(resp.into_body())).await;
    assert!(body.is_err(), "an h2 answer cut off ends in a reset");
    assert_eq!(most_open.load(Ordering::SeqCst), 1, "one upstream connection at a time");
    let m = metrics(&proxy).await;
    assert_eq!(
        metric_sum(&m, "proxyfleet_upstream_response_stalls_total", &[]),
        3.0,
        "{m}"
    );
    proxy.running.drain();
}

/// Reads from `c` into `seen` until it holds `marker`; false if the connection ended first.
async fn read_until(c: &mut tokio::net::TcpStream, seen: &mut Vec<u8>, marker: &str) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(seen).contains(marker) {
        match c.read(&mut buf).await {
            Ok(n) if n > 0 => seen.extend_from_slice(&buf[..n]),
            _ => return false,
        }
    }
    true
}

/// A call whose upstream answers at once, then waits for the client's whole streamed body
/// before its last part (a gRPC client-streaming or bidirectional call): the client's parts
/// count as activity, so `responseIdleTimeout` does not cut the quiet upstream off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_streaming_beside_a_quiet_answer_keeps_it_alive() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    init();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut seen = Vec::new();
                if !read_until(&mut c, &mut seen, "\r\n\r\n").await {
                    return;
                }
                let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n";
                if c.write_all(head).await.is_err() {
                    return;
                }
                if !read_until(&mut c, &mut seen, "\r\n0\r\n\r\n").await {
                    return;
                }
                let _ = c.write_all(b"3\r\nbye\r\n0\r\n\r\n").await;
            });
        }
    });
    let yaml = format!(
        r#"
listeners: [{{name: http, address: "127.0.0.1:0"}}]
admin: {{address: "127.0.0.1:0"}}
routes: [{{name: all, upstream: u, timeout: 10s, responseIdleTimeout: 400ms}}]
upstreams: [{{name: u, endpoints: ["{addr}"]}}]
"#
    );
    let proxy = start_proxy(&tempdir("duplex"), &yaml).await;
    let mut c = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    c.write_all(b"POST /call HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    for _ in 0..8 {
        c.write_all(b"1\r\na\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    c.write_all(b"0\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    within("the answer", c.read_to_end(&mut out)).await.unwrap();
    let out = String::from_utf8_lossy(&out);
    assert!(
        out.contains("hello") && out.contains("bye") && out.ends_with("0\r\n\r\n"),
        "{out}"
    );
    let m = metrics(&proxy).await;
    assert_eq!(
        metric_sum(&m, "proxyfleet_upstream_response_stalls_total", &[]),
        0.0,
        "{m}"
    );
    proxy.running.drain();
}

/// A reload that changes an upstream's endpoint list (a scale-in) keeps the endpoints that
/// remain as they were: the kept endpoint's pooled connection carries on, no new handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_of_the_endpoint_list_keeps_the_remaining_endpoints_connections() {
    init();
    let a = upstream("a", None, false).await;
    let b = upstream("b", None, false).await;
    let with = |endpoints: String| {
        format!(
            "listeners: [{{name: http, address: \"127.0.0.1:0\"}}]\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: all, upstream: u}}]\nupstreams: [{{name: u, endpoints: [{endpoints}], pool: {{idleTimeout: 60s}}}}]\n"
        )
    };
    let proxy = start_proxy(
        &tempdir("keep-endpoints"),
        &with(format!("\"{}\", \"{}\"", a.addr, b.addr)),
    )
    .await;
    let http = proxy.addr("http");
    for i in 0..200 {
        if a.stats.connections.load(Ordering::SeqCst) >= 1 {
            break;
        }
        assert_eq!(get(http, "x", &format!("/before{i}")).await.0, 200);
    }
    let before = a.stats.connections.load(Ordering::SeqCst);
    assert!(before >= 1, "a was never drawn");
    let reloads = |m: &str| metric_sum(m, "proxyfleet_config_reloads_total", &["result=\"success\""]);
    let done = reloads(&metrics(&proxy).await);
    std::fs::write(&proxy.config_path, with(format!("\"{}\"", a.addr))).unwrap();
    let m = metrics_when(&proxy, |m| reloads(m) > done).await;
    assert!(reloads(&m) > done, "reloaded: {m}");
    for i in 0..10 {
        let (status, body) = get(http, "x", &format!("/after{i}")).await;
        assert_eq!(status, 200);
        assert!(body.starts_with("a "), "{body}");
    }
    assert_eq!(
        a.stats.connections.load(Ordering::SeqCst),
        before,
        "a's pooled connection carried on"
    );
    proxy.running.drain();
}

/// An HTTP/2 upstream allowing `max_streams` per connection, whose every answer takes a second:
/// its address, the connections it accepted and saw end, and the requests it has in flight and
/// the most it had at once.
struct SlowH2 {
    addr: std::net::SocketAddr,
    connections: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
}

async fn slow_h2_upstream(max_streams: u32) -> SlowH2 {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = SlowH2 {
        addr: listener.local_addr().unwrap(),
        connections: Arc::default(),
        closed: Arc::default(),
        peak: Arc::default(),
        in_flight: Arc::default(),
    };
    let (counted, ended, peak) = (up.connections.clone(), up.closed.clone(), up.peak.clone());
    let in_flight = up.in_flight.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let (ended, peak, in_flight) = (ended.clone(), peak.clone(), in_flight.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| {
                    let (peak, in_flight) = (peak.clone(), in_flight.clone());
                    async move {
                        peak.fetch_max(in_flight.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                        // Long enough that all six are in flight before the first ends.
                        tokio::time::sleep(Duration::from_millis(1000)).await;
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from_static(b"slow"),
                        )))
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(max_streams)
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
                ended.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    up
}

/// An HTTP/2 upstream's connection carries at most `http2.maxConcurrentStreams` streams: past
/// it the proxy opens another, instead of queueing the requests behind the ones in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_upstream_gets_another_connection_when_one_is_full() {
    init();
    let SlowH2 {
        addr,
        connections,
        closed,
        ..
    } = slow_h2_upstream(2).await;
    let yaml = format!(
        r#"
listeners: [{{name: http, address: "127.0.0.1:0"}}]
admin: {{address: "127.0.0.1:0"}}
routes: [{{name: all, upstream: u, timeout: 10s}}]
upstreams: [{{name: u, protocol: h2, endpoints: ["{addr}"], http2: {{maxConcurrentStreams: 2}}, pool: {{idleTimeout: 300ms}}}}]
"#
    );
    let proxy = start_proxy(&tempdir("h2-streams"), &yaml).await;
    let http = proxy.addr("http");
    let calls: Vec<_> = (0..6)
        .map(|i| tokio::spawn(async move { get(http, "x", &format!("/{i}")).await }))
        .collect();
    for call in calls {
        let (status, body) = within("a slow answer", call).await.unwrap();
        assert_eq!((status, body.as_str()), (200, "slow"));
    }
    assert_eq!(connections.load(Ordering::SeqCst), 3, "six streams, two per connection");
    // The streams ended: the connections take new ones.
    assert_eq!(get(http, "x", "/again").await.0, 200);
    assert_eq!(connections.load(Ordering::SeqCst), 3);
    // The burst's two extra connections, idle past `pool.idleTimeout`, are closed; the first
    // one carries on.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(get(http, "x", "/later").await.0, 200);
    for _ in 0..250 {
        if closed.load(Ordering::SeqCst) >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(closed.load(Ordering::SeqCst), 2, "the idle extras closed");
    assert_eq!(connections.load(Ordering::SeqCst), 3, "no new dial");
    proxy.running.drain();
}

/// The same when the limit is the upstream's own (its SETTINGS_MAX_CONCURRENT_STREAMS, below
/// ours): once the proxy has read it, a full connection gets no more streams. (It is read when
/// a request is handed to the connection, so a new connection's first burst may queue past
/// it: here two requests go one after the other first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_upstreams_own_stream_limit_is_kept() {
    init();
    let up = slow_h2_upstream(2).await;
    let yaml = format!(
        r#"
listeners: [{{name: http, address: "127.0.0.1:0"}}]
admin: {{address: "127.0.0.1:0"}}
routes: [{{name: all, upstream: u, timeout: 10s}}]
upstreams: [{{name: u, protocol: h2, endpoints: ["{}"]}}]
"#,
        up.addr
    );
    let proxy = start_proxy(&tempdir("h2-peer-streams"), &yaml).await;
    let http = proxy.addr("http");
    let mut calls = Vec::new();
    for (name, in_flight) in [("/first", 1), ("/second", 2)] {
        calls.push(tokio::spawn(async move { get(http, "x", name).await }));
        within("the request at the upstream", async {
            while up.in_flight.load(Ordering::SeqCst) < in_flight {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }
    calls.extend((0..4).map(|i| tokio::spawn(async move { get(http, "x", &format!("/{i}")).await })));
    for call in calls {
        let (status, body) = within("a slow answer", call).await.unwrap();
        assert_eq!((status, body.as_str()), (200, "slow"));
    }
    assert!(up.connections.load(Ordering::SeqCst) >= 2, "more than one connection");
    assert!(
        up.peak.load(Ordering::SeqCst) >= 3,
        "more than one connection's worth in flight at once: {}",
        up.peak.load(Ordering::SeqCst)
    );
    proxy.running.drain();
}
