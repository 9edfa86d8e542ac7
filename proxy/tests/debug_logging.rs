//! Debug logging switched on under concurrent load must never take the proxy down (issue 18).
//! The request span used to be held entered across awaits; with a subscriber recording debug
//! spans and tasks moving between worker threads, tracing-subscriber's registry panicked
//! ("tried to clone a span … that already closed") and `panic = "abort"` ended the process.
//! Its own test binary: it installs a global subscriber.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debug_logging_under_concurrent_load_keeps_serving() {
    init();
    // As the proxy's main sets it up (JSON), with the request spans recorded.
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter("info,proxyfleet_proxy=debug")
        .with_writer(std::io::sink)
        .try_init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("debuglog");
    let yaml = format!(
        r#"
listeners:
  - {{name: http, address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
routes:
  - {{name: slow, match: {{pathPrefix: /slow}}, upstream: u, timeout: 2s, fault: {{delay: {{duration: 20ms, percent: 50}}}}}}
  - {{name: all, upstream: u, timeout: 2s}}
upstreams:
  - {{name: u, endpoints: ["{}"]}}
"#,
        up.addr
    );
    let proxy = start_proxy(&dir, &yaml).await;
    let addr = proxy.addr("http");
    let clients: Vec<_> = (0..32)
        .map(|c| {
            tokio::spawn(async move {
                let mut ok = 0;
                for i in 0..60 {
                    let path = if (c + i) % 2 == 0 { "/slow/x" } else { "/y" };
                    if get(addr, "x", path).await.0 == 200 {
                        ok += 1;
                    }
                }
                ok
            })
        })
        .collect();
    // Clients that give up mid-request: the request future is dropped while it waits.
    let quitters: Vec<_> = (0..16)
        .map(|_| {
            tokio::spawn(async move {
                for _ in 0..60 {
                    use tokio::io::AsyncWriteExt;
                    let Ok(mut tcp) = tokio::net::TcpStream::connect(addr).await else {
                        continue;
                    };
                    let _ = tcp.write_all(b"GET /slow/q HTTP/1.1\r\nhost: x\r\n\r\n").await;
                    tokio::time::sleep(std::time::Duration::from_millis(fastrand_ms())).await;
                }
            })
        })
        .collect();
    for q in quitters {
        q.await.expect("quitter task");
    }
    let mut ok = 0;
    for c in clients {
        ok += c.await.expect("client task");
    }
    assert_eq!(ok, 32 * 60, "every request answered 200 with debug logging on");
    proxy.running.drain();
}

fn fastrand_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos() % 15))
        .unwrap_or(5)
}
