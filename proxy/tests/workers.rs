//! Integration test of the worker model: three workers, each accepting on its own
//! `SO_REUSEPORT` socket, answer every connection (a worker that did not accept would leave
//! about a third of them unanswered) over HTTP/1.1 and over each worker's own HTTP/2 upstream
//! connection, and a drain lets requests in flight on every worker
//! finish before the workers stop. Real sockets on loopback.

mod support;

use std::time::Duration;

use proxyfleet_proxy::workers::Workers;
use support::*;

fn config(upstream: std::net::SocketAddr, h2: std::net::SocketAddr) -> String {
    format!(
        r#"
listeners:
  - {{name: http, address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
drain: {{gracePeriod: 50ms, deadline: 10s}}
routes:
  - {{name: h2, upstream: g, match: {{pathPrefix: /h2/}}}}
  - {{name: all, upstream: u}}
upstreams:
  - name: u
    endpoints: ["{upstream}"]
  - name: g
    endpoints: ["{h2}"]
    protocol: h2
"#
    )
}

#[tokio::test(flavor = "current_thread")]
async fn every_worker_accepts_and_a_drain_waits_for_each_workers_requests() {
    init();
    let up = upstream("up", None, false).await;
    let g = upstream("g", None, false).await;
    let dir = tempdir("workers");
    let path = dir.join("proxy.yaml");
    std::fs::write(&path, config(up.addr, g.addr)).unwrap();
    let config = proxyfleet_proxy::read_config(&path).unwrap();
    let workers = Workers::start(3, Duration::ZERO).unwrap();
    let running = proxyfleet_proxy::server::start_with_workers(config, Some(path), workers)
        .await
        .unwrap();
    let addr = running.listener_addrs["http"];

    let answers = (0..60).map(|i| tokio::spawn(async move { get(addr, "x", &format!("/n{i}")).await }));
    for (i, a) in answers.enumerate() {
        let (status, body) = within("a request on a fresh connection", a).await.unwrap();
        assert_eq!((status, body), (200, format!("up /n{i} 0")));
    }
    let answers = (0..30).map(|i| tokio::spawn(async move { get(addr, "x", &format!("/h2/{i}")).await }));
    for (i, a) in answers.enumerate() {
        let (status, body) = within("a request to the HTTP/2 upstream", a).await.unwrap();
        assert_eq!((status, body), (200, format!("g /h2/{i} 0")));
    }
    assert_eq!(g.stats.h2_requests.load(std::sync::atomic::Ordering::Relaxed), 30);
    // One HTTP/2 connection per worker that served some of them (30 fresh client connections
    // over three workers' sockets): not one shared by all.
    let h2_connections = g.stats.connections.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        (2..=3).contains(&h2_connections),
        "{h2_connections} HTTP/2 upstream connections"
    );

    let slow: Vec<_> = (0..12)
        .map(|_| tokio::spawn(async move { get(addr, "x", "/delay/400").await }))
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    running.drain();
    for s in slow {
        let (status, _) = within("a request in flight during the drain", s).await.unwrap();
        assert_eq!(status, 200);
    }
    within("the drain", running.done).await.unwrap();
}
