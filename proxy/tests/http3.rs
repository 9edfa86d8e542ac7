//! HTTP/3 with real peers: a quinn + h3 client in the test process against the proxy's QUIC
//! listener, to an HTTP/1.1 upstream and to an HTTP/2 (TLS, ALPN) upstream; Alt-Svc on the
//! TCP listener; 0-RTT only for replay-safe requests; a client that changes its address
//! keeps its connection; certificates reloaded reach the QUIC listener.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use proxyfleet_proxy::http3::client::{client_config, endpoint, Client};
use support::*;

/// A proxy with an HTTPS listener serving HTTP/3 too; route `/h2/` goes to the h2 upstream.
fn config(dir: &std::path::Path, h3: &str, h1: &Upstream, h2: &Upstream, ca_file: &str) -> String {
    format!(
        "listeners:\n  - name: https\n    address: \"127.0.0.1:0\"\n    tls:\n      certificates:\n        - {{certFile: {c}, keyFile: {k}, default: true}}\n      http3: {h3}\n\
admin: {{address: \"127.0.0.1:0\"}}\ndrain: {{gracePeriod: 100ms, deadline: 5s}}\n\
routes:\n  - {{name: h2, upstream: up2, match: {{pathPrefix: /h2/}}}}\n  - {{name: all, upstream: up1}}\n\
upstreams:\n  - {{name: up1, endpoints: [\"{a1}\"]}}\n  - name: up2\n    endpoints: [\"{a2}\"]\n    tls: {{serverName: localhost, caFile: {ca_file}}}\n    protocol: auto\n",
        c = dir.join("c").display(),
        k = dir.join("k").display(),
        a1 = h1.addr,
        a2 = h2.addr,
    )
}

struct Setup {
    ca: TestCa,
    h1: Upstream,
    h2: Upstream,
    proxy: Proxy,
    dir: std::path::PathBuf,
}

async fn setup(tag: &str, h3: &str) -> Setup {
    setup_with(tag, h3, "").await
}

/// `setup` with `extra` top-level configuration (e.g. `limits: {…}`).
async fn setup_with(tag: &str, h3: &str, extra: &str) -> Setup {
    init();
    let ca = TestCa::new("test ca");
    let dir = tempdir(tag);
    let (c, k) = ca.leaf(&["localhost"]);
    write(&dir, "c", &c);
    write(&dir, "k", &k);
    let ca_file = write(&dir, "ca.pem", &ca.cert_pem);
    let h1 = upstream("h1", None, false).await;
    let h2 = upstream("h2", Some(ca.leaf(&["localhost"])), false).await;
    let yaml = format!("{}{extra}\n", config(&dir, h3, &h1, &h2, &ca_file));
    let proxy = start_proxy(&dir, &yaml).await;
    Setup { ca, h1, h2, proxy, dir }
}

fn get(path: &str) -> http::Request<Bytes> {
    http::Request::get(format!("https://localhost{path}"))
        .body(Bytes::new())
        .unwrap()
}

fn post(path: &str, body: &'static str) -> http::Request<Bytes> {
    http::Request::post(format!("https://localhost{path}"))
        .header("content-length", body.len())
        .body(Bytes::from_static(body.as_bytes()))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h3_requests_reach_h1_and_h2_upstreams_and_alt_svc_advertises_them() {
    let s = setup("h3-basic", "{}").await;
    let addr = s.proxy.addr("https");
    let ep = endpoint(
        "127.0.0.1:0".parse().unwrap(),
        client_config(s.ca.roots(), false).unwrap(),
    )
    .unwrap();
    let mut c = Client::connect(&ep, addr, "localhost", false)
        .await
        .expect("h3 connection");
    for _ in 0..5 {
        let r = c.request(get("/a")).await.unwrap();
        assert_eq!(r.head.status(), 200);
        assert_eq!(r.body, "h1 /a 0");
    }
    let r = c.request(post("/a", "twelve bytes")).await.unwrap();
    assert_eq!(r.body, "h1 /a 12");
    let r = c.request(post("/h2/x", "hello")).await.unwrap();
    assert_eq!((r.head.status().as_u16(), &r.body[..]), (200, &b"h2 /h2/x 5"[..]));
    assert_eq!(
        s.h2.stats.h2_requests.load(Ordering::Relaxed),
        1,
        "the h2 upstream saw HTTP/2"
    );
    let seen = s.h1.stats.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(seen["x-forwarded-proto"], "https");
    assert_eq!(seen["host"], "localhost");
    assert!(seen.get("early-data").is_none());
    c.close();

    // The TCP listener advertises HTTP/3 on the same port.
    let tls = tls_connect(addr, Some("localhost"), &s.ca, &[b"http/1.1"]).await;
    let alt = alt_svc(tls).await;
    assert_eq!(
        alt.as_deref(),
        Some(format!("h3=\":{}\"; ma=86400", addr.port())).as_deref()
    );

    let m = metrics(&s.proxy).await;
    assert_eq!(
        metric_sum(&m, "proxyfleet_quic_connections_total", &["kind=\"accepted\""]),
        1.0
    );
    s.proxy.running.drain();
}

/// The Alt-Svc header of a GET over a TLS connection, if any.
async fn alt_svc(stream: tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> Option<String> {
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("/a")
        .header("host", "localhost")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    resp.headers().get("alt-svc").map(|v| v.to_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_rtt_serves_only_replay_safe_requests_early() {
    let s = setup("h3-0rtt", "{zeroRtt: true}").await;
    let addr = s.proxy.addr("https");
    let ep = endpoint(
        "127.0.0.1:0".parse().unwrap(),
        client_config(s.ca.roots(), true).unwrap(),
    )
    .unwrap();
    // The first connection gets a session ticket.
    let mut c = Client::connect(&ep, addr, "localhost", true).await.unwrap();
    assert!(c.zero_rtt.is_none(), "no ticket yet");
    assert_eq!(c.request(get("/first")).await.unwrap().head.status(), 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.close();

    let mut early_gets = 0;
    for i in 0..5 {
        let mut c = Client::connect(&ep, addr, "localhost", true).await.unwrap();
        let accepted = c.zero_rtt.take().expect("a resumed connection tries 0-RTT");
        // Sent before the handshake completes: in 0-RTT packets.
        let g = c.request(get(&format!("/get{i}"))).await.unwrap();
        assert_eq!(g.head.status(), 200);
        let headers = s.h1.stats.last_headers.lock().unwrap().clone().unwrap();
        early_gets += usize::from(headers.get("early-data").is_some_and(|v| v == "1"));
        assert!(accepted.await, "the proxy takes 0-RTT data");
        let r = c.request(post(&format!("/post{i}"), "data")).await.unwrap();
        assert_eq!(r.body, format!("h1 /post{i} 4"));
        let headers = s.h1.stats.last_headers.lock().unwrap().clone().unwrap();
        assert!(
            headers.get("early-data").is_none(),
            "a POST is never served from early data"
        );
        c.close();
    }
    let m = metrics(&s.proxy).await;
    let served = metric_sum(&m, "proxyfleet_quic_early_requests_total", &["kind=\"served\""]);
    assert_eq!(served as usize, early_gets, "every early GET is counted");
    eprintln!("GETs served from 0-RTT early data: {early_gets} of 5");
    s.proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_changes_its_address_keeps_its_connection() {
    let s = setup("h3-migrate", "{idleTimeout: 5s, maxConcurrentStreams: 10}").await;
    let addr = s.proxy.addr("https");
    let ep = endpoint(
        "127.0.0.1:0".parse().unwrap(),
        client_config(s.ca.roots(), false).unwrap(),
    )
    .unwrap();
    let mut c = Client::connect(&ep, addr, "localhost", false).await.unwrap();
    assert_eq!(c.request(get("/before")).await.unwrap().head.status(), 200);
    let before = ep.local_addr().unwrap();
    ep.rebind(std::net::UdpSocket::bind("127.0.0.1:0").unwrap()).unwrap();
    assert_ne!(ep.local_addr().unwrap(), before, "a new source port");
    for i in 0..3 {
        let r = c
            .request(get(&format!("/after{i}")))
            .await
            .expect("the connection survives");
        assert_eq!(r.body, format!("h1 /after{i} 0"));
    }
    let m = metrics(&s.proxy).await;
    assert_eq!(
        metric_sum(&m, "proxyfleet_quic_connections_total", &["kind=\"accepted\""]),
        1.0,
        "still one connection"
    );
    c.close();
    s.proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_reaches_the_quic_listener() {
    let s = setup("h3-reload", "{advertise: false}").await;
    let addr = s.proxy.addr("https");
    let serial = |c: &Client| {
        let certs = c.connection.peer_identity().unwrap();
        let certs = certs
            .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .unwrap();
        certs[0].to_vec()
    };
    let ep = endpoint(
        "127.0.0.1:0".parse().unwrap(),
        client_config(s.ca.roots(), false).unwrap(),
    )
    .unwrap();
    let c = Client::connect(&ep, addr, "localhost", false).await.unwrap();
    let first = serial(&c);
    c.close();
    let (cert, key) = s.ca.leaf(&["localhost"]);
    write(&s.dir, "k", &key);
    write(&s.dir, "c", &cert);
    let mut renewed = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A client of its own each time: one that resumes a session from before the renewal
        // (its ticket can arrive before the first connection closes) is sent no certificate
        // and reports the one it resumed with. Failed 1 in 12 with both CPUs busy.
        let ep = endpoint(
            "127.0.0.1:0".parse().unwrap(),
            client_config(s.ca.roots(), false).unwrap(),
        )
        .unwrap();
        let c = Client::connect(&ep, addr, "localhost", false).await.unwrap();
        renewed = serial(&c) != first;
        c.close();
        if renewed {
            break;
        }
    }
    assert!(renewed, "new QUIC connections get the renewed certificate");
    // advertise: false: no Alt-Svc.
    let tls = tls_connect(addr, Some("localhost"), &s.ca, &[b"http/1.1"]).await;
    assert_eq!(alt_svc(tls).await, None);
    s.proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_longer_or_shorter_than_its_content_length_is_refused() {
    let s = setup("h3-length", "{}").await;
    let ep = endpoint(
        "127.0.0.1:0".parse().unwrap(),
        client_config(s.ca.roots(), false).unwrap(),
    )
    .unwrap();
    let mut c = Client::connect(&ep, s.proxy.addr("https"), "localhost", false)
        .await
        .expect("h3 connection");
    let lying = |declared: usize, body: &'static str| {
        http::Request::post("https://localhost/a")
            .header("content-length", declared)
            .body(Bytes::from_static(body.as_bytes()))
            .unwrap()
    };
    for (declared, body) in [(5, "helloEXTRA"), (10, "hello"), (0, "x")] {
        let answer = c.request(lying(declared, body)).await;
        let status = answer.as_ref().map(|r| r.head.status().as_u16());
        assert!(
            matches!(status, Ok(400)),
            "{declared} announced, {} sent: {:?}",
            body.len(),
            answer.map(|r| r.body)
        );
    }
    // The connection and the proxy keep serving.
    let r = c.request(post("/a", "hello")).await.unwrap();
    assert_eq!(r.body, "h1 /a 5");
    s.proxy.running.drain();
}

/// A connection with no request in flight for `limits.idleTimeout` is ended, as an HTTP/2 one
/// is, however often the client PINGs (QUIC's own idle timer counts PINGs as traffic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_requests_is_ended_even_while_it_pings() {
    let s = setup_with("h3-idle", "{idleTimeout: 60s}", "limits: {idleTimeout: 1s}").await;
    let (ca, proxy) = (&s.ca, &s.proxy);
    let mut pinging = client_config(ca.roots(), false).unwrap();
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(Duration::from_millis(200)));
    pinging.transport_config(std::sync::Arc::new(transport));
    let ep = endpoint("127.0.0.1:0".parse().unwrap(), pinging).unwrap();
    let mut c = Client::connect(&ep, proxy.addr("https"), "localhost", false)
        .await
        .unwrap();
    assert_eq!(c.request(get("/one")).await.unwrap().head.status(), 200);
    let closed = tokio::time::timeout(Duration::from_secs(20), c.connection.closed()).await;
    assert!(closed.is_ok(), "the idle connection is still open after 20 s of PINGs");
    proxy.running.drain();
}
