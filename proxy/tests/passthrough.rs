//! Integration tests of TCP listeners: TLS passthrough routed by SNI to backends that keep
//! their own certificates (and their client-certificate checks: end-to-end mTLS), plain TCP
//! with a PROXY protocol v2 header, refusals counted. Real sockets on loopback.

mod support;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::*;

fn config(listener_tcp: &str, upstreams: &str) -> String {
    format!(
        r#"
listeners:
  - {{name: pass, address: "127.0.0.1:0", tcp: {listener_tcp}}}
admin: {{address: "127.0.0.1:0"}}
drain: {{gracePeriod: 100ms, deadline: 2s}}
upstreams:
{upstreams}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_passthrough_routes_by_sni_and_keeps_the_backends_certificates() {
    init();
    let ca = TestCa::new("backends");
    let a = upstream("backend-a", Some(ca.leaf(&["a.example.com"])), false).await;
    let b = upstream(
        "backend-b",
        Some(ca.leaf(&["b.example.com", "x.wild.example.com"])),
        false,
    )
    .await;
    let dir = tempdir("passthrough");
    let tcp = r#"{routes: [{name: a, serverNames: [a.example.com], upstream: a},
                         {name: b, serverNames: [b.example.com, "*.wild.example.com"], upstream: b}]}"#;
    let ups = format!(
        "  - {{name: a, endpoints: [\"{}\"]}}\n  - {{name: b, endpoints: [\"{}\"]}}\n",
        a.addr, b.addr
    );
    let proxy = start_proxy(&dir, &config(tcp, &ups)).await;
    let addr = proxy.addr("pass");

    for (sni, backend) in [
        ("a.example.com", "backend-a"),
        ("b.example.com", "backend-b"),
        ("x.wild.example.com", "backend-b"),
    ] {
        let tls = tls_connect(addr, Some(sni), &ca, &[b"http/1.1"]).await;
        assert!(
            served_dns_names(&tls).contains(&sni.to_string()),
            "the backend's own certificate"
        );
        let (status, body, _) = tls_get(tls, sni, "/hello").await;
        assert_eq!((status, body.as_str()), (200, format!("{backend} /hello 0").as_str()));
    }
    // h2 end to end: ALPN is the backend's business.
    let tls = tls_connect(addr, Some("a.example.com"), &ca, &[b"h2"]).await;
    assert_eq!(tls_get(tls, "a.example.com", "/").await.2, http::Version::HTTP_2);

    // No route for the name, no default: closed. Not TLS: closed.
    assert!(tls_connect_as(addr, Some("other.example.com"), &ca, &[], None)
        .await
        .is_err());
    assert_eq!(raw(addr, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await, "");
    // A relay's bytes are counted when it ends, which can be after the client saw its end.
    let m = metrics_when(&proxy, |m| {
        let relayed = metric_sum(m, "proxyfleet_tcp_connections_total", &["result=\"relayed\""]);
        let to_a = metric_sum(
            m,
            "proxyfleet_tcp_bytes_total",
            &["route=\"a\"", "direction=\"to_client\""],
        );
        relayed >= 4.0 && to_a > 1000.0
    })
    .await;
    let count = |route: &str, result: &str| {
        metric_sum(
            &m,
            "proxyfleet_tcp_connections_total",
            &[&format!("route=\"{route}\""), &format!("result=\"{result}\"")],
        )
    };
    assert_eq!(count("a", "relayed"), 2.0);
    assert_eq!(count("b", "relayed"), 2.0);
    assert_eq!(count("", "no_route"), 1.0);
    assert_eq!(count("", "not_tls"), 1.0);
    assert!(
        metric_sum(
            &m,
            "proxyfleet_tcp_bytes_total",
            &["route=\"a\"", "direction=\"to_client\""]
        ) > 1000.0
    );
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_mtls_and_a_default_upstream() {
    init();
    let ca = TestCa::new("backends");
    let client_ca = TestCa::new("clients");
    let strict =
        upstream_verifying_clients("strict", Some(ca.leaf(&["db.example.com"])), Some(&client_ca), false).await;
    let dir = tempdir("passthrough-mtls");
    let tcp = "{defaultUpstream: db}";
    let proxy = start_proxy(
        &dir,
        &config(tcp, &format!("  - {{name: db, endpoints: [\"{}\"]}}\n", strict.addr)),
    )
    .await;
    let addr = proxy.addr("pass");
    let cert = client_ca.leaf(&["client.example.com"]);
    let tls = tls_connect_as(addr, Some("db.example.com"), &ca, &[b"http/1.1"], Some(&cert))
        .await
        .unwrap();
    assert_eq!(
        tls_get(tls, "db.example.com", "/").await.0,
        200,
        "the backend verified the client itself"
    );
    let without = match tls_connect_as(addr, Some("db.example.com"), &ca, &[b"http/1.1"], None).await {
        Ok(tls) => {
            let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .unwrap();
            tokio::spawn(conn);
            let req = http::Request::builder()
                .uri("/")
                .header("host", "db")
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap();
            send.send_request(req).await.is_err()
        }
        Err(_) => true,
    };
    assert!(without, "the backend refused a client without a certificate");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_tcp_with_a_proxy_protocol_header() {
    init();
    let backend = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_addr = backend.local_addr().unwrap();
    let seen = tokio::spawn(async move {
        let (mut s, _) = backend.accept().await.unwrap();
        let mut header = [0u8; 28];
        s.read_exact(&mut header).await.unwrap();
        let mut payload = [0u8; 4];
        s.read_exact(&mut payload).await.unwrap();
        s.write_all(b"pong").await.unwrap();
        (header, payload)
    });
    let dir = tempdir("tcp-pp");
    let tcp = "{mode: tcp, defaultUpstream: raw, proxyProtocol: true, idleTimeout: 5s}";
    let proxy = start_proxy(
        &dir,
        &config(tcp, &format!("  - {{name: raw, endpoints: [\"{backend_addr}\"]}}\n")),
    )
    .await;
    let addr = proxy.addr("pass");
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let client_port = c.local_addr().unwrap().port();
    c.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&back, b"pong");
    let (header, payload) = seen.await.unwrap();
    assert_eq!(&header[..12], b"\r\n\r\n\0\r\nQUIT\n");
    assert_eq!(&header[12..16], &[0x21, 0x11, 0, 12]);
    assert_eq!(&header[16..20], &[127, 0, 0, 1], "the client's address");
    assert_eq!(u16::from_be_bytes([header[24], header[25]]), client_port);
    assert_eq!(u16::from_be_bytes([header[26], header[27]]), addr.port());
    assert_eq!(&payload, b"ping");
    proxy.running.drain();
}
