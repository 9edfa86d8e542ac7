//! Issue 17's data plane: weighted backends exact per request (HTTP/1.1 and one long-lived
//! HTTP/2 connection), sticky users, forced routing, live weights through the admin listener
//! and a watched directory, and mirroring that never touches the client's response.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;

fn split_config(stable: SocketAddr, canary: SocketAddr, w_canary: u8, dir: &std::path::Path) -> String {
    let token = write(dir, "token", "s3cret\n");
    let weights = dir.join("weights");
    std::fs::create_dir_all(&weights).unwrap();
    format!(
        r#"
listeners:
  - {{name: http, address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0", tokenFile: "{token}", liveWeightsDir: "{}"}}
drain: {{gracePeriod: 200ms, deadline: 5s}}
routes:
  - name: app
    backends: [{{upstream: canary, weight: {w_canary}}}, {{upstream: stable, weight: {}}}]
    sticky: {{header: x-user}}
    overrides: [{{header: {{name: x-canary, value: always}}, upstream: canary}}, {{cookie: {{name: version, value: stable}}, upstream: stable}}]
    timeout: 5s
upstreams:
  - {{name: stable, endpoints: ["{stable}"]}}
  - {{name: canary, endpoints: ["{canary}"]}}
"#,
        weights.display(),
        100 - w_canary
    )
}

type H1 = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn h1_client(addr: SocketAddr) -> H1 {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(conn);
    send
}

async fn h1_req(c: &mut H1, headers: &[(&str, &str)]) -> (u16, String) {
    let mut b = http::Request::builder().uri("/x").header("host", "app");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    c.ready().await.unwrap();
    let resp = c.send_request(b.body(Empty::new()).unwrap()).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn served_by_canary(body: &str) -> bool {
    body.starts_with("canary ")
}

async fn put_weights(proxy: &Proxy, token: &str, body: &str) -> (u16, String) {
    admin_put(proxy, "/weights", token, body).await
}

fn doc(generation: u64, canary: u8) -> String {
    format!(
        r#"{{"route":"app","generation":{generation},"weights":{{"canary":{canary},"stable":{}}}}}"#,
        100 - canary
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_are_exact_per_request_over_h1_and_one_h2_connection() {
    init();
    let (stable, canary) = (
        upstream("stable", None, false).await,
        upstream("canary", None, false).await,
    );
    let dir = tempdir("split-exact");
    let proxy = start_proxy(&dir, &split_config(stable.addr, canary.addr, 30, &dir)).await;
    let a = proxy.addr("http");
    let mut c = h1_client(a).await;
    let mut on_canary = 0;
    for _ in 0..10_000 {
        let (status, body) = h1_req(&mut c, &[]).await;
        assert_eq!(status, 200);
        on_canary += usize::from(served_by_canary(&body));
    }
    assert!(
        (2900..=3100).contains(&on_canary),
        "h1: {on_canary} of 10000 on the canary at weight 30"
    );

    // One long-lived HTTP/2 connection follows the weights per request, not per connection.
    let tcp = tokio::net::TcpStream::connect(a).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let on_canary = Arc::new(AtomicUsize::new(0));
    let tasks = (0..10).map(|_| {
        let mut send = send.clone();
        let on_canary = on_canary.clone();
        tokio::spawn(async move {
            for _ in 0..1000 {
                let req = http::Request::get(format!("http://app{}", "/x"))
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                let resp = send.send_request(req).await.unwrap();
                assert_eq!(resp.status(), 200);
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                if served_by_canary(&String::from_utf8_lossy(&body)) {
                    on_canary.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    });
    for t in tasks {
        t.await.unwrap();
    }
    let n = on_canary.load(Ordering::Relaxed);
    assert!(
        (2900..=3100).contains(&n),
        "h2: {n} of 10000 on the canary at weight 30"
    );
    let m = metrics(&proxy).await;
    let by = |u: &str| {
        metric_sum(
            &m,
            "proxyfleet_responses_total",
            &["route=\"app\"", &format!("upstream=\"{u}\"")],
        )
    };
    assert_eq!(
        by("canary") + by("stable"),
        20_000.0,
        "every response is counted under its backend"
    );
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_users_and_forced_routing() {
    init();
    let (stable, canary) = (
        upstream("stable", None, false).await,
        upstream("canary", None, false).await,
    );
    let dir = tempdir("split-sticky");
    let proxy = start_proxy(&dir, &split_config(stable.addr, canary.addr, 10, &dir)).await;
    let mut c = h1_client(proxy.addr("http")).await;
    let mut before = Vec::new();
    for u in 0..300 {
        let user = format!("user-{u}");
        let (_, first) = h1_req(&mut c, &[("x-user", &user)]).await;
        let (_, again) = h1_req(&mut c, &[("x-user", &user)]).await;
        assert_eq!(
            served_by_canary(&first),
            served_by_canary(&again),
            "{user} switched backends"
        );
        before.push(served_by_canary(&first));
    }
    let (status, _) = put_weights(&proxy, "s3cret", &doc(1, 40)).await;
    assert_eq!(status, 200);
    let mut after = Vec::new();
    for u in 0..300 {
        let (_, body) = h1_req(&mut c, &[("x-user", &format!("user-{u}"))]).await;
        after.push(served_by_canary(&body));
    }
    for (u, (b, a)) in before.iter().zip(&after).enumerate() {
        assert!(
            !*b || *a,
            "user-{u} moved from the canary back to stable as the weight grew"
        );
    }
    let share = after.iter().filter(|x| **x).count();
    assert!(
        (80..=160).contains(&share),
        "{share} of 300 users on the canary at 40 %"
    );
    // Forced routing beats weights and stickiness.
    put_weights(&proxy, "s3cret", &doc(2, 0)).await;
    for _ in 0..20 {
        let (_, body) = h1_req(&mut c, &[("x-canary", "always"), ("x-user", "user-1")]).await;
        assert!(served_by_canary(&body), "{body}");
    }
    put_weights(&proxy, "s3cret", &doc(3, 100)).await;
    let (_, body) = h1_req(&mut c, &[("cookie", "a=b; version=stable")]).await;
    assert!(!served_by_canary(&body), "{body}");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_weights_are_authenticated_ordered_reported_and_drop_nothing_under_load() {
    init();
    let (stable, canary) = (
        upstream("stable", None, false).await,
        upstream("canary", None, false).await,
    );
    let dir = tempdir("split-live");
    let proxy = start_proxy(&dir, &split_config(stable.addr, canary.addr, 0, &dir)).await;
    assert_eq!(put_weights(&proxy, "wrong", &doc(1, 50)).await.0, 401);
    assert_eq!(put_weights(&proxy, "s3cret", "{not json").await.0, 400);
    let (status, why) = put_weights(
        &proxy,
        "s3cret",
        r#"{"route":"app","generation":1,"weights":{"canary":60,"stable":60}}"#,
    )
    .await;
    assert_eq!(status, 422, "{why}");
    assert!(why.contains("sum to 120"), "{why}");
    assert_eq!(
        put_weights(&proxy, "s3cret", &doc(1, 0).replace("\"app\"", "\"nope\""))
            .await
            .0,
        404
    );

    // Load on four keep-alive connections while the weights move 5 → 30 → 100 → 0.
    let a = proxy.addr("http");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failed = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (stop, failed, done) = (stop.clone(), failed.clone(), done.clone());
            tokio::spawn(async move {
                let mut c = h1_client(a).await;
                while !stop.load(Ordering::Relaxed) {
                    if h1_req(&mut c, &[]).await.0 != 200 {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for (generation, w) in [(1, 5), (2, 30), (3, 100), (4, 0)] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            put_weights(&proxy, "s3cret", &doc(generation, w)).await,
            (200, "applied\n".into())
        );
    }
    assert_eq!(
        put_weights(&proxy, "s3cret", &doc(4, 0)).await,
        (200, "unchanged\n".into())
    );
    assert_eq!(
        put_weights(&proxy, "s3cret", &doc(2, 30)).await.0,
        409,
        "a stale generation is refused"
    );
    assert_eq!(
        put_weights(&proxy, "s3cret", &doc(4, 50)).await.0,
        409,
        "other weights under the applied generation are refused, not taken for unchanged"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.unwrap();
    }
    assert!(done.load(Ordering::Relaxed) > 100);
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "no request failed across four weight changes"
    );
    let mut c = h1_client(a).await;
    for _ in 0..50 {
        assert!(!served_by_canary(&h1_req(&mut c, &[]).await.1));
    }
    let report = proxyfleet_config::AdminReport::from_json(&admin_get(&proxy, "/config").await).unwrap();
    assert_eq!(report.live_weights.len(), 1);
    assert_eq!(report.live_weights[0].generation, 4);

    // A newer document in the watched directory applies too; a config reload keeps it.
    write(&dir.join("weights"), "app.json", &doc(7, 100));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !served_by_canary(&h1_req(&mut c, &[]).await.1) {
        assert!(Instant::now() < deadline, "the weights file was not applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(proxyfleet_proxy::reload::reload(&proxy.running.shared));
    for _ in 0..20 {
        assert!(
            served_by_canary(&h1_req(&mut c, &[]).await.1),
            "a reload reset the live weights"
        );
    }
    proxy.running.drain();
}

/// A push that races a reload lands in the state that serves: the reload publishes its state
/// under the weights' lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_pushed_during_reloads_are_the_ones_served() {
    init();
    let (stable, canary) = (
        upstream("stable", None, false).await,
        upstream("canary", None, false).await,
    );
    let dir = tempdir("split-reload-race");
    let proxy = start_proxy(&dir, &split_config(stable.addr, canary.addr, 0, &dir)).await;
    let shared = proxy.running.shared.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reloads = {
        let (shared, stop) = (shared.clone(), stop.clone());
        tokio::task::spawn_blocking(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                assert!(proxyfleet_proxy::reload::reload(&shared));
                n += 1;
            }
            n
        })
    };
    for generation in 1..=150u64 {
        let w = [0, 30, 100][generation as usize % 3];
        assert_eq!(put_weights(&proxy, "s3cret", &doc(generation, w)).await.0, 200);
        let served = proxyfleet_proxy::live_weights::report(&shared);
        assert_eq!(served.len(), 1);
        assert_eq!(served[0].generation, generation, "a push racing a reload was lost");
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reloads.await.unwrap() > 10, "too few reloads to race with");
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_proxy_starts_with_the_weights_in_its_directory() {
    init();
    let (stable, canary) = (
        upstream("stable", None, false).await,
        upstream("canary", None, false).await,
    );
    let dir = tempdir("split-restart");
    let yaml = split_config(stable.addr, canary.addr, 0, &dir);
    write(&dir.join("weights"), "app.json", &doc(9, 100));
    let proxy = start_proxy(&dir, &yaml).await;
    let mut c = h1_client(proxy.addr("http")).await;
    // The very first request already follows the file.
    assert!(served_by_canary(&h1_req(&mut c, &[]).await.1));
    proxy.running.drain();
}

async fn admin_get(proxy: &Proxy, path: &str) -> String {
    let tcp = tokio::net::TcpStream::connect(proxy.admin()).await.unwrap();
    h1_get(tcp, "admin", path).await.unwrap().1
}

/// An upstream that answers every request after `delay`, counting them.
async fn slow_upstream(delay: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let s = s.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| {
                    let s = s.clone();
                    async move {
                        s.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(delay).await;
                        let mut r = http::Response::new(Full::new(Bytes::from("mirror")));
                        *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                        Ok::<_, Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirroring_copies_requests_without_touching_the_client_response() {
    init();
    let up = upstream("real", None, false).await;
    let (mirror, seen) = slow_upstream(Duration::from_secs(2)).await;
    let dir = tempdir("mirror");
    let yaml = format!(
        r#"
listeners:
  - {{name: http, address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
drain: {{gracePeriod: 200ms, deadline: 5s}}
routes:
  - {{name: shadowed, upstream: real, mirror: {{upstream: shadow, percent: 100}}, timeout: 5s}}
upstreams:
  - {{name: real, endpoints: ["{}"]}}
  - {{name: shadow, endpoints: ["{mirror}"]}}
"#,
        up.addr
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let mut c = h1_client(proxy.addr("http")).await;
    let started = Instant::now();
    for _ in 0..20 {
        let (status, body) = h1_req(&mut c, &[]).await;
        assert_eq!((status, body.starts_with("real ")), (200, true), "{body}");
    }
    // Twenty requests, each mirrored to an upstream that takes 2 s and answers 500: none of
    // them waited for it (the bound is the mirror's delay, not a latency target).
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    // Bodies: a small one is copied too, a large one streams to the real upstream only.
    for (len, copied) in [(5usize, true), (100 * 1024, false)] {
        let tcp = tokio::net::TcpStream::connect(proxy.addr("http")).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = http::Request::post("/upload")
            .header("host", "app")
            .body(Full::new(Bytes::from(vec![b'x'; len])))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            String::from_utf8_lossy(&body),
            format!("real /upload {len}"),
            "copied: {copied}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.load(Ordering::Relaxed) < 21 {
        assert!(
            Instant::now() < deadline,
            "the mirror saw {}",
            seen.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mirrored = |m: &str, result: &str| {
        metric_sum(
            m,
            "proxyfleet_mirror_requests_total",
            &["route=\"shadowed\"", &format!("result=\"{result}\"")],
        )
    };
    let m = metrics_when(&proxy, |m| mirrored(m, "5xx") == 21.0 && mirrored(m, "skipped") == 1.0).await;
    let (n, skipped) = (mirrored(&m, "5xx"), mirrored(&m, "skipped"));
    assert!(
        n == 21.0 && skipped == 1.0,
        "mirror results counted: {n}, skipped {skipped}"
    );
    proxy.running.drain();
}
