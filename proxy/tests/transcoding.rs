//! REST/JSON ↔ gRPC transcoding with a real gRPC server (tonic's standard health service) behind
//! the proxy: a GET with a path variable, a query parameter and a POST body become Check calls
//! answered in canonical JSON; a gRPC error becomes its HTTP status and a google.rpc.Status
//! body; a server stream arrives as JSON lines; bad requests get 400 naming the field; plain
//! gRPC still passes on the same route; calls are counted per method; an upstream message over
//! 4 MiB is refused, and a stalled JSON body is answered 408.

mod support;

use support::*;

/// The test data, found where `cargo test` says the package is now (a binary built from a
/// tree that has since moved would otherwise look in the old place).
fn data_dir() -> String {
    let package = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    format!("{package}/tests/data")
}

fn config(upstream: std::net::SocketAddr, extra: &str) -> String {
    let pb = format!("{}/health_http.pb", data_dir());
    format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\n\
routes:\n  - name: api\n    upstream: g\n    timeout: 5s\n    grpcTranscoding: {{descriptorSetFile: {pb}{extra}}}\n\
upstreams:\n  - {{name: g, endpoints: [\"{upstream}\"], protocol: h2}}\n"
    )
}

async fn call(proxy: &Proxy, method: &str, path: &str, body: &str) -> (u16, String, String) {
    let tcp = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "api.test")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body.to_string())))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    use http_body_util::BodyExt;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, ct, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_requests_become_grpc_calls_and_answers_become_json() {
    init();
    let up = grpc_upstream().await;
    let dir = tempdir("transcode");
    let proxy = start_proxy(&dir, &config(up, "")).await;

    let (status, ct, body) = call(&proxy, "GET", "/v1/health/app", "").await;
    assert_eq!((status, ct.as_str()), (200, "application/json"), "{body}");
    assert_eq!(body.trim(), r#"{"status":"SERVING"}"#);
    let (status, _, body) = call(&proxy, "GET", "/v1/health?service=app", "").await;
    assert_eq!((status, body.trim()), (200, r#"{"status":"SERVING"}"#));
    let (status, _, body) = call(&proxy, "POST", "/v1/health:check", r#"{"service": "app"}"#).await;
    assert_eq!((status, body.trim()), (200, r#"{"status":"SERVING"}"#));

    // The server's NOT_FOUND becomes 404 with a google.rpc.Status body.
    let (status, _, body) = call(&proxy, "GET", "/v1/health/nope", "").await;
    assert_eq!(status, 404, "{body}");
    let err: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(err["code"], 5, "{body}");

    // Bad requests: unknown field, wrong type, no binding.
    let (status, _, body) = call(&proxy, "POST", "/v1/health:check", r#"{"servce": "app"}"#).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("servce"), "{body}");
    let (status, _, body) = call(&proxy, "POST", "/v1/health:check", r#"{"service": 7}"#).await;
    assert_eq!(status, 400, "{body}");
    let (status, _, body) = call(&proxy, "GET", "/v1/health?nosuch=1", "").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("nosuch"), "{body}");
    let (status, _, body) = call(&proxy, "DELETE", "/v1/health/app", "").await;
    assert_eq!(status, 404, "{body}");

    let m = metrics(&proxy).await;
    let ok = metric_sum(
        &m,
        "proxyfleet_grpc_transcoded_requests_total",
        &["method=\"grpc.health.v1.Health.Check\"", "code=\"OK\""],
    );
    assert_eq!(ok, 3.0, "{m}");
    assert_eq!(
        metric_sum(&m, "proxyfleet_grpc_transcoded_requests_total", &["code=\"NOT_FOUND\""]),
        1.0
    );
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stream_arrives_as_json_lines() {
    init();
    let up = grpc_upstream().await;
    let dir = tempdir("transcode-stream");
    let proxy = start_proxy(&dir, &config(up, ", emitDefaults: true")).await;
    let tcp = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("/v1/health/app:watch")
        .header("host", "api.test")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    // Watch sends the current status at once and then stays open: the first line arrives
    // while the stream goes on.
    use http_body_util::BodyExt;
    let mut body = resp.into_body();
    let frame = tokio::time::timeout(std::time::Duration::from_secs(5), body.frame())
        .await
        .expect("a line while the stream is open")
        .unwrap()
        .unwrap();
    let line = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
    assert_eq!(line, "{\"result\":{\"status\":\"SERVING\"}}\n");
    drop((body, send));
    // An HTTP/2 client cancels the stream while the upstream has nothing more to say: the call
    // ends now (as cancelled), not at the upstream's next message.
    let (mut h2, _conn) = h2_client(proxy.addr("http")).await;
    let req = http::Request::get("http://api.test/v1/health/app:watch")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let mut body = h2.send_request(req).await.unwrap().into_body();
    let first = tokio::time::timeout(std::time::Duration::from_secs(5), body.frame()).await;
    assert!(matches!(first, Ok(Some(Ok(_)))), "a first line over HTTP/2");
    drop(body);
    let cancelled = |m: &str| metric_sum(m, "proxyfleet_grpc_transcoded_requests_total", &["code=\"CANCELLED\""]);
    let m = metrics_when(&proxy, |m| cancelled(m) >= 1.0).await;
    assert!(cancelled(&m) >= 1.0, "{m}");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_body_over_the_transcoding_limit_is_413() {
    init();
    let up = grpc_upstream().await;
    let dir = tempdir("transcode-limit");
    let proxy = start_proxy(&dir, &config(up, ", maxRequestBodyBytes: 1024")).await;
    let big = format!(r#"{{"service": "{}"}}"#, "a".repeat(2000));
    let (status, _, body) = call(&proxy, "POST", "/v1/health:check", &big).await;
    assert_eq!(status, 413, "{body}");
    let (status, _, body) = call(&proxy, "POST", "/v1/health:check", r#"{"service": "app"}"#).await;
    assert_eq!(status, 200, "{body}");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_grpc_still_passes_on_a_transcoding_route() {
    init();
    let up = grpc_upstream().await;
    let dir = tempdir("transcode-grpc");
    let proxy = start_proxy(&dir, &config(up, "")).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", proxy.addr("http")))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = tonic_health::pb::health_client::HealthClient::new(channel);
    let r = c
        .check(tonic_health::pb::HealthCheckRequest { service: "app".into() })
        .await
        .expect("a gRPC call");
    assert_eq!(r.into_inner().status, 1);
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_descriptor_set_is_picked_up_without_a_restart() {
    init();
    let up = grpc_upstream().await;
    let dir = tempdir("transcode-reload");
    let data = data_dir();
    let pb = dir.join("api.pb");
    std::fs::copy(format!("{data}/health_http.pb"), &pb).unwrap();
    let yaml = format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\n\
routes:\n  - {{name: api, upstream: g, grpcTranscoding: {{descriptorSetFile: {}}}}}\n\
upstreams:\n  - {{name: g, endpoints: [\"{up}\"], protocol: h2}}\n",
        pb.display()
    );
    let proxy = start_proxy(&dir, &yaml).await;
    assert_eq!(call(&proxy, "GET", "/v1/health/app", "").await.0, 200);
    // Replaced whole, as a ConfigMap volume update does (a rename).
    let tmp = dir.join("api.pb.new");
    std::fs::copy(format!("{data}/health_http_v2.pb"), &tmp).unwrap();
    std::fs::rename(&tmp, &pb).unwrap();
    let mut switched = false;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if call(&proxy, "GET", "/v2/health/app", "").await.0 == 200 {
            switched = true;
            break;
        }
    }
    assert!(switched, "the new descriptor set's bindings are served");
    assert_eq!(
        call(&proxy, "GET", "/v1/health/app", "").await.0,
        404,
        "the old bindings are gone"
    );
    proxy.running.drain();
}

/// An h2c gRPC upstream whose every answer is one message saying it is `declared` bytes long,
/// followed by `sent` bytes of it, then grpc-status 0.
async fn oversized_upstream(declared: u32, sent: usize) -> std::net::SocketAddr {
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let service = hyper::service::service_fn(move |_req: http::Request<hyper::body::Incoming>| async move {
                let mut message = vec![0u8; 5 + sent];
                message[1..5].copy_from_slice(&declared.to_be_bytes());
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                let frames: Vec<Result<Frame<bytes::Bytes>, std::convert::Infallible>> =
                    vec![Ok(Frame::data(message.into())), Ok(Frame::trailers(trailers))];
                let body = StreamBody::new(futures_util::stream::iter(frames));
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(body)
                        .unwrap(),
                )
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service),
            );
        }
    });
    addr
}

/// The proxy holds an upstream message whole before turning it into JSON, so it holds at most
/// gRPC's default 4 MiB: a larger unary answer is a 502 saying so, and a stream whose next
/// message says it is larger ends with an error line, before any of it is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_message_over_4_mib_is_refused_not_held() {
    init();
    let dir = tempdir("transcode-large");
    let unary = oversized_upstream((4 << 20) + 100, (4 << 20) + 100).await;
    let proxy = start_proxy(&dir, &config(unary, "")).await;
    let (status, _, body) = call(&proxy, "GET", "/v1/health/app", "").await;
    assert_eq!(status, 502, "{body}");
    let err: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(err["code"], 8, "{body}");
    assert!(body.contains("larger than 4 MiB"), "{body}");
    proxy.running.drain();

    let dir = tempdir("transcode-large-stream");
    let stream = oversized_upstream(u32::MAX, 10).await;
    let proxy = start_proxy(&dir, &config(stream, "")).await;
    let (status, _, body) = call(&proxy, "GET", "/v1/health/app:watch", "").await;
    assert_eq!(status, 200, "{body}");
    let line: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(line["error"]["code"], 8, "{body}");
    let m = metrics(&proxy).await;
    assert_eq!(
        metric_sum(
            &m,
            "proxyfleet_grpc_transcoded_requests_total",
            &["code=\"RESOURCE_EXHAUSTED\""]
        ),
        1.0,
        "{m}"
    );
    proxy.running.drain();
}

/// A transcoded request's JSON body is read under `limits.clientBodyTimeout` as any body is: a
/// client that stops sending in it is answered 408 with a google.rpc.Status body
/// (DEADLINE_EXCEEDED), not held until the route's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_json_body_is_answered_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    init();
    let up = grpc_upstream().await;
    let dir = tempdir("transcode-stall");
    let yaml = format!(
        "{}limits: {{clientBodyTimeout: 1s}}\n",
        config(up, "").replace("timeout: 5s", "timeout: 30s")
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let mut tcp = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    tcp.write_all(b"POST /v1/health:check HTTP/1.1\r\nHost: api.test\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"service\"")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&answer).contains('}') {
        match tokio::time::timeout(std::time::Duration::from_secs(10), tcp.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => answer.extend_from_slice(&chunk[..n]),
            other => panic!("no answer: {other:?}"),
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":4"), "{answer}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "within the body timeout, not the route's"
    );
    proxy.running.drain();
}

/// A JSON body is read whole before the gRPC call is made: the route's timeout counts from
/// then, so an upload slower than the timeout is answered, and no endpoint is charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_body_slower_than_the_route_timeout_is_answered() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    init();
    let up = grpc_upstream().await;
    let dir = tempdir("transcode-slow");
    let proxy = start_proxy(&dir, &config(up, "").replace("timeout: 5s", "timeout: 400ms")).await;
    let body = br#"{"service": "app"}"#;
    let mut tcp = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
    let head = format!(
        "POST /v1/health:check HTTP/1.1\r\nHost: api.test\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    for part in body.chunks(6) {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        tcp.write_all(part).await.unwrap();
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.ends_with("{\"status\":\"SERVING\"}\n") || answer.contains("SERVING"),
        "{answer}"
    );
    let m = metrics(&proxy).await;
    assert_eq!(metric_sum(&m, "proxyfleet_outlier_ejections_total", &[]), 0.0, "{m}");
    proxy.running.drain();
}
