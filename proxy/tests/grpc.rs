//! gRPC through the proxy with a real gRPC implementation on both ends (tonic and its
//! standard health service): unary and server-streaming calls pass with their trailers, and
//! the proxy's own failures reach the client as gRPC statuses.

mod support;

use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use support::*;

fn config(upstream: &str, extra_route: &str) -> String {
    format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes:\n{extra_route}  - {{name: grpc, upstream: g, timeout: 5s}}\nupstreams:\n  - {{name: g, endpoints: [\"{upstream}\"], protocol: h2}}\n  - {{name: down, endpoints: [\"127.0.0.1:1\"], protocol: h2}}\n"
    )
}

async fn client(proxy: &Proxy) -> HealthClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", proxy.addr("http")))
        .unwrap()
        .connect()
        .await
        .expect("h2c connection to the proxy");
    HealthClient::new(channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_and_streaming_grpc_calls_pass_with_trailers() {
    init();
    let up = grpc_upstream().await;
    let dir = tempdir("grpc");
    let proxy = start_proxy(&dir, &config(&up.to_string(), "")).await;
    let mut c = client(&proxy).await;
    for _ in 0..20 {
        let r = c
            .check(HealthCheckRequest { service: "app".into() })
            .await
            .expect("unary call");
        assert_eq!(r.into_inner().status(), ServingStatus::Serving);
    }
    // An unknown service is the server's own NOT_FOUND, carried in the trailers.
    let err = c
        .check(HealthCheckRequest { service: "nope".into() })
        .await
        .expect_err("unknown service");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err}");
    // Server streaming: Watch sends the current status, then stays open.
    let mut stream = c
        .watch(HealthCheckRequest { service: "app".into() })
        .await
        .expect("watch")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(2), stream.message())
        .await
        .expect("in time");
    assert_eq!(first.expect("ok").expect("a message").status(), ServingStatus::Serving);
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_own_failures_are_grpc_statuses() {
    init();
    let up = grpc_upstream().await;
    let dir = tempdir("grpc-fail");
    let routes = "  - {name: down, match: {pathPrefix: /grpc.health.v1.Health/Watch}, upstream: down, timeout: 2s}\n";
    let proxy = start_proxy(&dir, &config(&up.to_string(), routes)).await;
    let mut c = client(&proxy).await;
    // Upstream unreachable: UNAVAILABLE, not "Received http2 header with status: 502".
    let err = c
        .watch(HealthCheckRequest { service: "app".into() })
        .await
        .expect_err("upstream down");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
    assert_eq!(
        err.message(),
        "proxyfleet: 502 Bad Gateway",
        "the proxy's own trailers-only answer"
    );
    // A client deadline shorter than the route's is the deadline.
    let mut req = tonic::Request::new(HealthCheckRequest { service: "app".into() });
    req.set_timeout(Duration::from_millis(1500));
    assert!(c.check(req).await.is_ok(), "a generous deadline passes");
    proxy.running.drain();
}

/// An HTTP/2 upstream connection only resets the stream when the client's body fails: the
/// answer is still the client's 413 (as gRPC's RESOURCE_EXHAUSTED), and the upstream is not
/// blamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_to_an_h2_upstream_is_413_not_502() {
    init();
    let up = grpc_upstream().await;
    let dir = tempdir("grpc-body-limit");
    let yaml = format!(
        "listeners:\n  - {{name: http, address: \"127.0.0.1:0\"}}\nadmin: {{address: \"127.0.0.1:0\"}}\nlimits: {{maxRequestBodyBytes: 1024}}\nroutes:\n  - {{name: grpc, upstream: g, timeout: 5s}}\nupstreams:\n  - {{name: g, endpoints: [\"{up}\"], protocol: h2, outlierDetection: {{consecutiveFailures: 1, ejectionTime: 60s}}}}\n"
    );
    let proxy = start_proxy(&dir, &yaml).await;
    // One gRPC message of 1 995 bytes (its 5-byte frame header first), sent in two chunks of
    // 1 000: the upstream waits for the whole message, so the answer is the proxy's, not the
    // upstream's verdict on a message it could already parse.
    let mut request = b"POST /grpc.health.v1.Health/Check HTTP/1.1\r\nHost: x\r\ncontent-type: application/grpc\r\nte: trailers\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3e8\r\n".to_vec();
    request.push(0);
    request.extend_from_slice(&1995u32.to_be_bytes());
    request.extend_from_slice(&[b'x'; 995]);
    request.extend_from_slice(b"\r\n3e8\r\n");
    request.extend_from_slice(&[b'x'; 1000]);
    request.extend_from_slice(b"\r\n0\r\n\r\n");
    let answer = raw(proxy.addr("http"), &request).await;
    assert!(answer.contains("grpc-status: 8\r\n"), "{answer}");
    assert!(answer.contains("grpc-message: proxyfleet:%20413%20"), "{answer}");
    let m = metrics(&proxy).await;
    assert_eq!(metric_sum(&m, "proxyfleet_outlier_ejections_total", &[]), 0.0, "{m}");
    proxy.running.drain();
}
