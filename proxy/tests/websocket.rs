//! WebSocket through the proxy with a real WebSocket implementation on both ends
//! (tokio-tungstenite): the handshake is passed on, both directions stream, and the upgrade
//! is counted; a WebSocket over HTTP/2 (RFC 8441 extended CONNECT) reaches an HTTP/1.1
//! WebSocket upstream. Other upgrades (h2c) are not passed on, and a 101 that does not complete
//! the WebSocket handshake opens no tunnel.

mod support;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use support::*;

/// A WebSocket echo server: every text or binary message comes back, prefixed.
async fn ws_echo() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    let reply = match m {
                        Message::Text(t) => Message::text(format!("echo: {t}")),
                        Message::Binary(b) => Message::binary(b),
                        // tungstenite has queued the Close reply; the next read sends it
                        // and then ends the stream.
                        _ => continue,
                    };
                    if ws.send(reply).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_messages_flow_both_ways_through_the_proxy() {
    init();
    let upstream = ws_echo().await;
    let dir = tempdir("websocket");
    let yaml = format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: ws, upstream: u, timeout: 2s}}]\nupstreams: [{{name: u, endpoints: [\"{upstream}\"]}}]\n"
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let tcp = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async("ws://chat.example/socket", tcp)
        .await
        .expect("WebSocket handshake through the proxy");
    assert_eq!(resp.status(), 101);
    for i in 0..50 {
        ws.send(Message::text(format!("hello {i}"))).await.unwrap();
        let back = ws.next().await.expect("a reply").expect("a message");
        assert_eq!(back, Message::text(format!("echo: hello {i}")));
    }
    let big = vec![7u8; 1 << 20];
    ws.send(Message::binary(big.clone())).await.unwrap();
    let back = ws.next().await.expect("a reply").expect("a message");
    assert_eq!(back.into_data().len(), big.len(), "1 MiB binary message streamed back");
    ws.send(Message::Close(None)).await.unwrap();
    match ws.next().await {
        Some(Ok(Message::Close(_))) => {}
        other => panic!("h1: the upstream's Close reply, got {other:?}"),
    }
    let m = metrics(&proxy).await;
    assert_eq!(
        metric_sum(&m, "proxyfleet_upgraded_connections_total", &["route=\"ws\""]),
        1.0
    );
    proxy.running.drain();
}

/// An HTTP/1.1 WebSocket outlives the HTTP connection it came from; a drain still waits for it
/// (up to its deadline), as nginx's worker_shutdown_timeout and Envoy's drain do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_waits_for_an_open_websocket() {
    init();
    let upstream = ws_echo().await;
    let dir = tempdir("websocket-drain");
    let yaml = format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\ndrain: {{gracePeriod: 100ms, deadline: 5s}}\nroutes: [{{name: ws, upstream: u, timeout: 2s}}]\nupstreams: [{{name: u, endpoints: [\"{upstream}\"]}}]\n"
    );
    let mut proxy = start_proxy(&dir, &yaml).await;
    let tcp = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async("ws://chat.example/socket", tcp)
        .await
        .expect("WebSocket handshake through the proxy");
    let mut echo = async |text: &str| {
        ws.send(Message::text(text)).await.unwrap();
        ws.next().await.expect("a reply").expect("a message")
    };
    assert_eq!(echo("before").await, Message::text("echo: before"));
    proxy.running.drain();
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    assert!(
        !proxy.running.done.is_finished(),
        "the drain ended with a WebSocket open"
    );
    assert_eq!(echo("during").await, Message::text("echo: during"));
    ws.send(Message::Close(None)).await.unwrap();
    while let Some(Ok(m)) = ws.next().await {
        if matches!(m, Message::Close(_)) {
            break;
        }
    }
    drop(ws);
    tokio::time::timeout(std::time::Duration::from_secs(3), &mut proxy.running.done)
        .await
        .expect("the drain ends once the WebSocket has")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_upgrade_is_not_passed_on() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("h2c");
    let yaml = format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: all, upstream: u, timeout: 2s}}]\nupstreams: [{{name: u, endpoints: [\"{}\"]}}]\n",
        up.addr
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let reply = raw(
        proxy.addr("http"),
        b"GET / HTTP/1.1\r\nhost: x\r\nconnection: upgrade, http2-settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAAQAAP__\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200"), "served as plain HTTP/1.1: {reply}");
    proxy.running.drain();
}

/// One ordinary request first, so the server's SETTINGS (ENABLE_CONNECT_PROTOCOL) are in.
async fn warm_up(sender: &mut hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>) {
    let warm = http::Request::get("http://chat.example/")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let _ = sender.send_request(warm).await;
}

/// A WebSocket over HTTP/2: RFC 8441's extended CONNECT.
fn extended_connect() -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    let mut connect = http::Request::connect("http://chat.example/socket")
        .header("sec-websocket-version", "13")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    connect
        .extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    connect
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_over_http2_reaches_an_http1_websocket_upstream() {
    init();
    let upstream = ws_echo().await;
    let dir = tempdir("websocket-h2");
    let yaml = format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: ws, upstream: u, timeout: 2s}}]\nupstreams: [{{name: u, endpoints: [\"{upstream}\"]}}]\n"
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let (mut sender, _conn) = h2_client(proxy.addr("http")).await;
    warm_up(&mut sender).await;
    let mut resp = sender
        .send_request(extended_connect())
        .await
        .expect("extended CONNECT answered");
    assert_eq!(resp.status(), 200, "RFC 8441: a 2xx, not a 101");
    assert!(resp.headers().get("sec-websocket-accept").is_none());
    let io = hyper::upgrade::on(&mut resp).await.expect("the stream is the tunnel");
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        hyper_util::rt::TokioIo::new(io),
        tokio_tungstenite::tungstenite::protocol::Role::Client,
        None,
    )
    .await;
    for i in 0..20 {
        ws.send(Message::text(format!("over h2 {i}"))).await.unwrap();
        let back = ws.next().await.expect("a reply").expect("a message");
        assert_eq!(back, Message::text(format!("echo: over h2 {i}")));
    }
    // The upstream answers our Close with its own and then closes the tunnel: its last frame
    // must still reach us (the proxy half-closes the stream after it, it does not reset it).
    ws.send(Message::Close(None)).await.unwrap();
    match ws.next().await {
        Some(Ok(Message::Close(_))) => {}
        other => panic!("the upstream's Close reply, got {other:?}"),
    }
    assert!(ws.next().await.is_none(), "the tunnel ends after the close handshake");
    let m = metrics(&proxy).await;
    assert_eq!(
        metric_sum(&m, "proxyfleet_upgraded_connections_total", &["route=\"ws\""]),
        1.0
    );
    proxy.running.drain();
}

/// Each WebSocket over HTTP/2 holds an upstream socket as a connection would, so it takes a
/// slot under `limits.maxConnections` of its own: one client connection cannot open more
/// tunnels than the limit allows (the connection holds one slot, its first tunnel the other).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_over_one_http2_connection_count_against_the_connection_limit() {
    init();
    let upstream = ws_echo().await;
    let dir = tempdir("websocket-h2-limit");
    let yaml = format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\nlimits: {{maxConnections: 2}}\nroutes: [{{name: ws, upstream: u, timeout: 2s}}]\nupstreams: [{{name: u, endpoints: [\"{upstream}\"]}}]\n"
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let (mut sender, _conn) = h2_client(proxy.addr("http")).await;
    warm_up(&mut sender).await;
    let connect = extended_connect;
    let mut first = sender.send_request(connect()).await.expect("answered");
    assert_eq!(first.status(), 200);
    let _tunnel = hyper::upgrade::on(&mut first).await.expect("the first tunnel");
    let second = sender.send_request(connect()).await.expect("answered");
    assert_eq!(second.status(), 503, "no slot left for a second tunnel");
    proxy.running.drain();
}

/// A WebSocket tunnel holds one of its upstream endpoint's connections for its whole life: with
/// `maxConnectionsPerEndpoint: 1`, a second handshake waits for it and gets 504 at the route's
/// timeout; once the first tunnel ends, a new one is let through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_counts_against_the_endpoints_connection_limit() {
    init();
    let upstream = ws_echo().await;
    let dir = tempdir("websocket-limit");
    let yaml = format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: ws, upstream: u, timeout: 1s}}]\nupstreams: [{{name: u, endpoints: [\"{upstream}\"], pool: {{maxConnectionsPerEndpoint: 1}}}}]\n"
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let open = || async {
        let tcp = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
        tokio_tungstenite::client_async("ws://chat.example/socket", tcp).await
    };
    let (mut first, _) = open().await.expect("the first tunnel");
    match open().await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 504),
        other => panic!("a second tunnel past the limit: {:?}", other.map(|(_, r)| r.status())),
    }
    first.send(Message::Close(None)).await.unwrap();
    while first.next().await.is_some() {}
    drop(first);
    within("a tunnel once the first has ended", async {
        loop {
            if let Ok((mut ws, _)) = open().await {
                ws.send(Message::text("again")).await.unwrap();
                let back = ws.next().await.expect("a reply").expect("a message");
                assert_eq!(back, Message::text("echo: again"));
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    proxy.running.drain();
}

/// An upstream that answers every request with a bare `101`, then reads whatever comes and
/// answers any request it finds with `smuggled` — what a raw tunnel to an HTTP port would give.
async fn bare_101_upstream() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = tcp.read(&mut buf).await;
                let _ = tcp
                    .write_all(b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n")
                    .await;
                while let Ok(n) = tcp.read(&mut buf).await {
                    if n == 0 || tcp.write_all(b"smuggled").await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_101_without_the_websocket_accept_opens_no_tunnel() {
    init();
    let upstream = bare_101_upstream().await;
    let dir = tempdir("ws-bare-101");
    let yaml = format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: ws, upstream: u, timeout: 2s}}]\nupstreams: [{{name: u, endpoints: [\"{upstream}\"]}}]\n"
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let reply = raw(
        proxy.addr("http"),
        b"GET /socket HTTP/1.1\r\nhost: chat.example\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\nGET /admin HTTP/1.1\r\nhost: x\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 502"), "refused: {reply}");
    assert!(
        !reply.contains("smuggled"),
        "no bytes reached the upstream's port: {reply}"
    );
    proxy.running.drain();
}

/// An upstream that refuses every upgrade with a 403 whose body it sends half of, then holds.
async fn half_a_refusal_upstream() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = tcp.read(&mut buf).await;
                let _ = tcp
                    .write_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 10\r\n\r\nhalf-")
                    .await;
                while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

/// A handshake the upstream refuses is an answer like any other: it holds the endpoint's
/// connection, counted against `maxConnectionsPerEndpoint`, until its body has been read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_handshake_holds_its_connection_until_the_refusal_is_read() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    init();
    let upstream = half_a_refusal_upstream().await;
    let dir = tempdir("ws-refused");
    let yaml = format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: ws, upstream: u, timeout: 1s}}]\nupstreams: [{{name: u, endpoints: [\"{upstream}\"], pool: {{maxConnectionsPerEndpoint: 1}}}}]\n"
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let handshake: &[u8] = b"GET /socket HTTP/1.1\r\nhost: chat.example\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    let mut first = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    first.write_all(handshake).await.unwrap();
    let mut seen = Vec::new();
    within("the first refusal's head and half its body", async {
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&seen).contains("half-") {
            let n = first.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 403"));
    let second = raw(proxy.addr("http"), handshake).await;
    assert!(
        second.starts_with("HTTP/1.1 504"),
        "the first refusal still holds the connection: {second}"
    );
    drop(first);
    proxy.running.drain();
}
