//! Integration tests of how client connections end on their own: after
//! `limits.maxRequestsPerConnection` requests and at `limits.maxConnectionAge`, for HTTP/1.1
//! (closed after the response in flight) and HTTP/2 (GOAWAY, the open stream finishes); an
//! HTTP/2 connection that answers PINGs but sends nothing at `limits.idleTimeout`; a request
//! body that trickles (`limits.clientBodyTimeout`, 408) and a client that stops reading its
//! response (`limits.sendTimeout`), over HTTP/1.1 and over HTTP/2 toward a shared HTTP/2
//! upstream connection and toward HTTP/1.1 upstream connections. Real
//! sockets on loopback; bounds are generous (no timing assertions beyond "it ended").

mod support;

use std::time::Duration;

use http_body_util::BodyExt;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn config(upstream: std::net::SocketAddr, limits: &str) -> String {
    format!(
        r#"
listeners:
  - {{name: http, address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
drain: {{gracePeriod: 100ms, deadline: 5s}}
limits: {{{limits}}}
routes:
  - {{name: all, upstream: u}}
upstreams:
  - name: u
    endpoints: ["{upstream}"]
"#
    )
}

/// Reads one HTTP/1.1 response (head and a Content-Length body) from a kept-alive stream.
async fn read_response(stream: &mut tokio::net::TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("a response within 5 s")
            .expect("read");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some(head_end) = text.find("\r\n\r\n") {
            let length = text[..head_end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            if got.len() >= head_end + 4 + length {
                return text;
            }
        }
    }
    String::from_utf8_lossy(&got).to_string()
}

/// True when the peer closes the stream within `within`.
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, stream.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_connection_ends_after_its_last_allowed_request() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("max-requests");
    let proxy = start_proxy(&dir, &config(up.addr, "maxRequestsPerConnection: 2")).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    let request = b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n";
    stream.write_all(request).await.unwrap();
    let first = read_response(&mut stream).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(!first.to_ascii_lowercase().contains("connection: close"), "{first}");
    stream.write_all(request).await.unwrap();
    let second = read_response(&mut stream).await;
    assert!(
        second.starts_with("HTTP/1.1 200"),
        "the last allowed request is answered: {second}"
    );
    assert!(
        second.to_ascii_lowercase().contains("connection: close"),
        "and says so: {second}"
    );
    assert!(
        closed_within(&mut stream, Duration::from_secs(5)).await,
        "then the connection is closed"
    );
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_connection_ends_at_its_age() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("max-age");
    let proxy = start_proxy(&dir, &config(up.addr, "maxConnectionAge: 1s")).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n")
        .await
        .unwrap();
    assert!(read_response(&mut stream).await.starts_with("HTTP/1.1 200"));
    assert!(
        closed_within(&mut stream, Duration::from_secs(10)).await,
        "closed once a second old"
    );
    // A new connection is served as usual.
    let (status, _) = get(proxy.addr("http"), "a.example", "/").await;
    assert_eq!(status, 200);
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connection_gets_goaway_at_its_age() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("max-age-h2");
    let proxy = start_proxy(&dir, &config(up.addr, "maxConnectionAge: 1s")).await;
    let (mut sender, driver) = h2_client(proxy.addr("http")).await;
    let request = || {
        http::Request::get("http://a.example/")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    let response = sender.send_request(request()).await.expect("served");
    assert_eq!(response.status(), 200);
    // After GOAWAY the connection ends: the client's connection task completes.
    let ended = tokio::time::timeout(Duration::from_secs(10), driver).await;
    assert!(ended.is_ok(), "the HTTP/2 connection ended after its age");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_that_answers_pings_ends_at_the_idle_timeout() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("idle-h2");
    let proxy = start_proxy(&dir, &config(up.addr, "idleTimeout: 1s")).await;
    let (mut sender, driver) = h2_client(proxy.addr("http")).await;
    // A request that lasts longer than the idle timeout keeps the connection.
    let slow = http::Request::get("http://a.example/delay/2500")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = sender.send_request(slow).await.expect("served across the idle timeout");
    assert_eq!(response.status(), 200);
    // Then nothing: GOAWAY within a few seconds (hyper's client answers every PING).
    let ended = tokio::time::timeout(Duration::from_secs(10), driver).await;
    assert!(ended.is_ok(), "the idle HTTP/2 connection ended");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_request_body_is_answered_408() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("body-timeout");
    let proxy = start_proxy(&dir, &config(up.addr, "clientBodyTimeout: 1s")).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    stream
        .write_all(b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 100\r\n\r\n0123456789")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let answer = read_response(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "within the body timeout, not the route's"
    );
    // A body that arrives whole is served as before.
    assert!(post(&proxy, b"Content-Length: 3\r\n\r\nabc")
        .await
        .starts_with("HTTP/1.1 200"));
    proxy.running.drain();
}

/// POSTs `rest` (headers after Host, and the body) on a new connection; the answer.
async fn post(proxy: &Proxy, rest: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    let mut request = b"POST / HTTP/1.1\r\nHost: a.example\r\n".to_vec();
    request.extend_from_slice(rest);
    stream.write_all(&request).await.unwrap();
    read_response(&mut stream).await
}

/// A mirrored request's body is read whole before either copy is sent: a client that stalls in
/// it is cut off at the body timeout too, not held until the connection's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_body_of_a_mirrored_request_is_answered_408() {
    init();
    let up = upstream("up", None, false).await;
    let shadow = upstream("shadow", None, false).await;
    let dir = tempdir("mirror-body-timeout");
    let config = format!(
        r#"
listeners:
  - {{name: http, address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
drain: {{gracePeriod: 100ms, deadline: 5s}}
limits: {{clientBodyTimeout: 1s}}
routes:
  - {{name: all, upstream: u, mirror: {{upstream: s, percent: 100}}, timeout: 60s}}
upstreams:
  - {{name: u, endpoints: ["{}"]}}
  - {{name: s, endpoints: ["{}"]}}
"#,
        up.addr, shadow.addr
    );
    let proxy = start_proxy(&dir, &config).await;
    let answer = post(&proxy, b"Content-Length: 100\r\n\r\n0123456789").await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(post(&proxy, b"Content-Length: 3\r\n\r\nabc")
        .await
        .starts_with("HTTP/1.1 200"));
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_disconnected_at_the_send_timeout() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("send-timeout");
    let proxy = start_proxy(&dir, &config(up.addr, "sendTimeout: 1s")).await;
    let size = 64 << 20;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    stream
        .write_all(format!("GET /bytes/{size} HTTP/1.1\r\nHost: a.example\r\n\r\n").as_bytes())
        .await
        .unwrap();
    // Read nothing for a while: the proxy's writes block, then it gives up on us.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got += n,
            Err(_) => panic!("the connection was not closed (read {got} bytes)"),
        }
    }
    assert!(got < size, "closed before the whole {size}-byte body: {got}");
    // The proxy keeps serving.
    let (status, _) = get(proxy.addr("http"), "a.example", "/").await;
    assert_eq!(status, 200);
    proxy.running.drain();
}

/// Sends `n` requests for a large response on one HTTP/2 connection and reads none of them.
async fn stalled_responses(proxy: &Proxy, n: usize, size: usize) -> Vec<http::Response<hyper::body::Incoming>> {
    let (mut sender, _driver) = h2_client(proxy.addr("http")).await;
    let mut held = Vec::new();
    for _ in 0..n {
        let req = http::Request::get(format!("http://a.example/bytes/{size}"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let resp = within("a large response's head", sender.send_request(req))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        held.push(resp);
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_that_never_open_their_windows_cannot_freeze_a_shared_http2_upstream() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("stalled-h2-windows");
    // sendTimeout at its default (60 s): no stream is reset within this test.
    let yaml = format!("{}    protocol: h2\n", config(up.addr, ""));
    let proxy = start_proxy(&dir, &yaml).await;
    // Sixteen large responses to a client that reads none of them. With hyper's default windows
    // (2 MiB a stream, 5 MiB in all) three would fill the proxy's one HTTP/2 connection to the
    // upstream; with ours each leaves at most 256 KiB unread of 32 MiB.
    let _held = stalled_responses(&proxy, 16, 8 << 20).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Another client's request on the same upstream connection is answered, long before any
    // stalled stream could be reset.
    let (status, body) = within(
        "another client's answer",
        get(proxy.addr("http"), "a.example", "/bytes/100000"),
    )
    .await;
    assert_eq!((status, body.len()), (200, 100000));
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_http2_stream_is_cut_at_the_send_timeout_not_ended_cleanly() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("stalled-h2-cut");
    let yaml = format!("{}    protocol: h2\n", config(up.addr, "sendTimeout: 1s"));
    let proxy = start_proxy(&dir, &yaml).await;
    let size = 8 << 20;
    let mut held = stalled_responses(&proxy, 4, size).await;
    // Well past the send timeout: the streams were given up (a client still taking data when
    // it fell behind is judged at the end of its second period at the latest).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut body = held.remove(0).into_body();
    let mut got = 0usize;
    let failed = loop {
        match within("the cut stream's end", body.frame()).await {
            Some(Ok(frame)) => got += frame.data_ref().map_or(0, |d| d.len()),
            Some(Err(_)) => break true,
            None => break false,
        }
    };
    assert!(
        failed && got < size,
        "the stalled stream ended with an error after {got} bytes"
    );
    proxy.running.drain();
}

/// An h2c upstream that answers every request at once with `size` bytes, without waiting for
/// its body, and records how each request body ended (true: reset).
async fn answering_h2_upstream(size: usize) -> (std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<bool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ended, ends) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let ended = ended.clone();
            let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let ended = ended.clone();
                tokio::spawn(async move {
                    let reset = req.into_body().collect().await.is_err();
                    let _ = ended.send(reset);
                });
                let body = http_body_util::Full::new(bytes::Bytes::from(vec![b'x'; size]));
                async move { Ok::<_, std::convert::Infallible>(http::Response::new(body)) }
            });
            let io = hyper_util::rt::TokioIo::new(tcp);
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(io, svc),
            );
        }
    });
    (addr, ends)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_whose_request_body_still_streams_is_reset_upstream() {
    init();
    let (up, mut ends) = answering_h2_upstream(8 << 20).await;
    let dir = tempdir("stalled-h2-bidi");
    let yaml = format!("{}    protocol: h2\n", config(up, "sendTimeout: 1s"));
    let proxy = start_proxy(&dir, &yaml).await;
    // A bidirectional call's shape: the request body stays open, the response is not read.
    let tcp = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let open = http_body_util::StreamBody::new(futures_util::stream::pending::<
        Result<http_body::Frame<bytes::Bytes>, std::convert::Infallible>,
    >());
    let req = http::Request::post("http://a.example/call").body(open).unwrap();
    let _held = within("the response's head", sender.send_request(req)).await.unwrap();
    // Given up at the send timeout: the upstream sees its request body reset, not left open.
    let reset = within("the upstream's request body to end", ends.recv()).await;
    assert_eq!(reset, Some(true));
    proxy.running.drain();
}

/// What the HTTP/1.1 upstream below saw.
#[derive(Debug, PartialEq)]
enum Seen {
    Connection,
    Closed,
}

/// A raw HTTP/1.1 upstream that answers `GET /bytes/N` with N bytes, keeps connections alive
/// and has no timeouts of its own: a connection whose answer is never read stays open as long
/// as the proxy holds it.
async fn h1_upstream_without_timeouts() -> (std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Seen>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, events) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let _ = seen.send(Seen::Connection);
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match tcp.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&got[..end]).to_string();
                    got.drain(..end + 4);
                    let size: usize = head
                        .split(' ')
                        .nth(1)
                        .and_then(|p| p.strip_prefix("/bytes/"))
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                    let mut answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n").into_bytes();
                    answer.resize(answer.len() + size, b'x');
                    if tcp.write_all(&answer).await.is_err() {
                        break;
                    }
                }
                let _ = seen.send(Seen::Closed);
            });
        }
    });
    (addr, events)
}

/// Sends one request for `size` bytes on an HTTP/2 connection that grants its streams no
/// window, so none of the answer can be sent; returns the response and the connection's driver.
async fn never_given_a_window(
    proxy: &Proxy,
    size: usize,
) -> (
    http::Response<hyper::body::Incoming>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let req = http::Request::get(format!("http://a.example/bytes/{size}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = within("the response's head", sender.send_request(req)).await.unwrap();
    assert_eq!(resp.status(), 200);
    (resp, driver)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_answer_to_a_stalled_http2_stream_frees_its_http11_upstream_connection_at_once() {
    init();
    let (up, mut seen) = h1_upstream_without_timeouts().await;
    let dir = tempdir("stalled-h2-to-h1-small");
    // One worker: its idle connections are the ones the next request can take.
    let yaml = format!("workerThreads: 1\n{}", config(up, ""));
    let proxy = start_proxy(&dir, &yaml).await;
    let _held = never_given_a_window(&proxy, 20_000).await;
    assert_eq!(
        within("the first connection", seen.recv()).await,
        Some(Seen::Connection)
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The answer was read whole although the client can take none of it: the connection went
    // back to the pool, and the next request reuses it.
    let (status, body) = within("the next answer", get(proxy.addr("http"), "a.example", "/bytes/10")).await;
    assert_eq!((status, body.len()), (200, 10));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(seen.try_recv().is_err(), "the upstream saw a second connection");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_answer_to_a_stalled_http2_stream_closes_its_http11_upstream_connection_at_the_send_timeout() {
    init();
    let (up, mut seen) = h1_upstream_without_timeouts().await;
    let dir = tempdir("stalled-h2-to-h1-large");
    let proxy = start_proxy(&dir, &config(up, "sendTimeout: 1s")).await;
    let size = 8 << 20;
    let (resp, _driver) = never_given_a_window(&proxy, size).await;
    assert_eq!(within("the connection", seen.recv()).await, Some(Seen::Connection));
    // The upstream's write blocks on the unread answer; the proxy gives up on the client and
    // closes the connection, which the upstream, with no timeout of its own, would never do.
    assert_eq!(
        within("the upstream connection to close", seen.recv()).await,
        Some(Seen::Closed)
    );
    drop(resp);
    proxy.running.drain();
}

/// One address holding admin connections open gets at most eight; the ninth is closed at once,
/// and a slot freed is served again (the kubelet's probes and the operator come from others).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_take_every_admin_connection() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("admin-per-ip");
    let proxy = start_proxy(&dir, &config(up.addr, "")).await;
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(tokio::net::TcpStream::connect(proxy.admin()).await.unwrap());
    }
    let mut ninth = tokio::net::TcpStream::connect(proxy.admin()).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(10), ninth.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the ninth was not closed: {read:?}"
    );
    held.pop();
    let served = within("a freed slot serves again", async {
        loop {
            let tcp = tokio::net::TcpStream::connect(proxy.admin()).await.unwrap();
            if let Ok((status, _)) = h1_get(tcp, "admin", "/healthz").await {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(served, 200);
    drop(held);
    proxy.running.drain();
}
