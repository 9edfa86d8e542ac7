//! Integration tests of SOCKS5 listeners with a real SOCKS5 client (tokio-socks): CONNECT to
//! allowed targets by address and by name, the CONNECT allow-list and address checks, username
//! and password authentication hot-reloaded from files, BIND and UDP ASSOCIATE refused with
//! "command not supported", every outcome counted.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_socks::tcp::Socks5Stream;
use tokio_socks::Error as SocksError;

use support::*;

/// A TCP server that answers each line with `echo: <line>`.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(b"echo: ").await.is_err() || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

fn config(socks5: &str, allow: &str) -> String {
    format!(
        r#"
listeners:
  - {{name: socks, address: "127.0.0.1:0", tcp: {{mode: socks5{socks5}}}}}
connect: {{allow: [{allow}], allowedNetworks: ["127.0.0.0/8"], connectTimeout: 2s}}
admin: {{address: "127.0.0.1:0"}}
drain: {{gracePeriod: 100ms, deadline: 2s}}
upstreams: []
"#
    )
}

async fn round_trip(mut s: Socks5Stream<tokio::net::TcpStream>, line: &str) -> String {
    s.write_all(line.as_bytes()).await.unwrap();
    // The answer may come in more than one segment ("echo: " and the line are two writes):
    // read until all of it is here or the connection ends.
    let want = "echo: ".len() + line.len();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64];
    while got.len() < want {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

fn count(m: &str, result: &str) -> f64 {
    metric_sum(
        m,
        "proxyfleet_tcp_connections_total",
        &[&format!("result=\"{result}\"")],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_connects_to_allowed_targets_only() {
    init();
    let echo = echo_server().await;
    let port = echo.port();
    let dir = tempdir("socks5");
    let allow = format!("\"127.0.0.1:{port}\", \"localhost:{port}\", \"127.0.0.2:*\", \"10.255.255.1:9\"");
    let proxy = start_proxy(&dir, &config("", &allow)).await;
    let socks = proxy.addr("socks");

    let by_address = Socks5Stream::connect(socks, echo).await.unwrap();
    assert_eq!(round_trip(by_address, "one").await, "echo: one");
    let by_name = Socks5Stream::connect(socks, ("localhost", port)).await.unwrap();
    assert_eq!(round_trip(by_name, "two").await, "echo: two");

    let refused = |r: Result<Socks5Stream<_>, SocksError>| r.err().map(|e| e.to_string()).unwrap_or_default();
    // Not in the allow-list (by port, then by name).
    let e = refused(Socks5Stream::connect(socks, ("127.0.0.1", port + 1)).await);
    assert!(e.contains("not allowed"), "{e}");
    let e = refused(Socks5Stream::connect(socks, ("example.com", 443)).await);
    assert!(e.contains("not allowed"), "{e}");
    // Allowed by name and port, but nothing listens there: connection refused.
    let e = refused(Socks5Stream::connect(socks, ("127.0.0.2", 1)).await);
    assert!(e.to_lowercase().contains("refused"), "{e}");

    // Each outcome is counted by the connection's task, and a relay's bytes when it ends: both
    // can come after the client has seen its end.
    let to_client = |m: &str| {
        metric_sum(
            m,
            "proxyfleet_tcp_bytes_total",
            &["route=\"socks5\"", "direction=\"to_client\""],
        )
    };
    let m = metrics_when(&proxy, |m| {
        count(m, "relayed") >= 2.0
            && count(m, "not_allowed") >= 2.0
            && count(m, "target_failed") >= 1.0
            && to_client(m) >= 18.0
    })
    .await;
    assert_eq!(count(&m, "relayed"), 2.0);
    assert_eq!(count(&m, "not_allowed"), 2.0);
    assert_eq!(count(&m, "target_failed"), 1.0);
    assert!(to_client(&m) == 18.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_addresses_need_allowed_networks() {
    init();
    let echo = echo_server().await;
    let dir = tempdir("socks5-networks");
    let yaml = config("", &format!("\"{echo}\"")).replace("allowedNetworks: [\"127.0.0.0/8\"], ", "");
    let proxy = start_proxy(&dir, &yaml).await;
    let e = Socks5Stream::connect(proxy.addr("socks"), echo).await.err().unwrap();
    assert!(e.to_string().contains("not allowed"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_are_required_and_hot_reloaded() {
    init();
    let echo = echo_server().await;
    let dir = tempdir("socks5-auth");
    let creds = dir.join("creds");
    std::fs::create_dir_all(&creds).unwrap();
    write(&creds, "username", "alice");
    write(&creds, "password", "s3cret\n");
    let auth = format!(", socks5: {{credentialsDir: \"{}\"}}", creds.display());
    let proxy = start_proxy(&dir, &config(&auth, &format!("\"{echo}\""))).await;
    let socks = proxy.addr("socks");

    let ok = Socks5Stream::connect_with_password(socks, echo, "alice", "s3cret")
        .await
        .unwrap();
    assert_eq!(round_trip(ok, "hi").await, "echo: hi");
    let e = Socks5Stream::connect_with_password(socks, echo, "alice", "wrong")
        .await
        .err()
        .unwrap();
    assert!(matches!(e, SocksError::PasswordAuthFailure(_)), "{e:?}");
    let e = Socks5Stream::connect(socks, echo).await.err().unwrap();
    assert!(matches!(e, SocksError::NoAcceptableAuthMethods), "{e:?}");

    // A new password is picked up without a restart; the old one stops working.
    write(&creds, "password", "rotated");
    let mut rotated = false;
    for _ in 0..100 {
        if Socks5Stream::connect_with_password(socks, echo, "alice", "rotated")
            .await
            .is_ok()
        {
            rotated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(rotated, "the new password was not reloaded");
    assert!(Socks5Stream::connect_with_password(socks, echo, "alice", "s3cret")
        .await
        .is_err());

    let m = metrics_when(&proxy, |m| count(m, "auth_failed") >= 3.0).await;
    assert!(count(&m, "auth_failed") >= 3.0, "{m}");
}

/// Sends a no-auth greeting and one request; the reply code.
async fn reply_code(socks: SocketAddr, request: &[u8]) -> u8 {
    let mut s = tokio::net::TcpStream::connect(socks).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    let mut method = [0u8; 2];
    s.read_exact(&mut method).await.unwrap();
    assert_eq!(method, [5, 0]);
    s.write_all(request).await.unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).await.unwrap();
    reply[1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_udp_associate_and_bad_bytes_are_refused_with_their_codes() {
    init();
    let echo = echo_server().await;
    let dir = tempdir("socks5-commands");
    let proxy = start_proxy(&dir, &config("", &format!("\"{echo}\""))).await;
    let socks = proxy.addr("socks");
    let [a, b, c, d] = [127u8, 0, 0, 1];
    let [hi, lo] = echo.port().to_be_bytes();
    assert_eq!(reply_code(socks, &[5, 2, 0, 1, a, b, c, d, hi, lo]).await, 7, "BIND");
    assert_eq!(
        reply_code(socks, &[5, 3, 0, 1, a, b, c, d, hi, lo]).await,
        7,
        "UDP ASSOCIATE"
    );
    assert_eq!(reply_code(socks, &[5, 1, 0, 9, 0, 0]).await, 8, "address type");
    // Not SOCKS at all: closed without an answer, and the listener keeps serving.
    assert_eq!(raw(socks, b"GET / HTTP/1.1\r\n\r\n").await, "");
    let ok = Socks5Stream::connect(socks, echo).await.unwrap();
    assert_eq!(round_trip(ok, "still").await, "echo: still");
    let m = metrics_when(&proxy, |m| {
        count(m, "command_not_supported") >= 2.0 && count(m, "bad_handshake") >= 2.0
    })
    .await;
    assert_eq!(count(&m, "command_not_supported"), 2.0);
    assert_eq!(count(&m, "bad_handshake"), 2.0);
}
