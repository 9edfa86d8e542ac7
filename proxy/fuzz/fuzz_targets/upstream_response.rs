//! Arbitrary bytes as an upstream's answer to a proxied GET (an upstream that writes them and
//! closes) never crash the proxy's own HTTP/1.1 exchange; the client gets an answer or a cut
//! connection within the route's timeout, and the proxy keeps answering afterwards.
#![no_main]
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Harness {
    rt: tokio::runtime::Runtime,
    addr: SocketAddr,
    answer: Arc<Mutex<Vec<u8>>>,
}

const GOOD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// Answers `/good` well and anything else with the current input, then closes.
async fn upstream(answer: Arc<Mutex<Vec<u8>>>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let bytes = if req.starts_with(b"GET /good ") {
                    GOOD.to_vec()
                } else {
                    answer.lock().unwrap().clone()
                };
                let _ = conn.write_all(&bytes).await;
            });
        }
    });
    addr
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let answer = Arc::new(Mutex::new(Vec::new()));
        let up = rt.block_on(upstream(answer.clone()));
        let config = proxyfleet_config::ProxyConfig::from_yaml(&format!(
            "listeners: [{{name: http, address: \"127.0.0.1:0\"}}]\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: r, upstream: u, timeout: 2s}}]\nupstreams: [{{name: u, endpoints: [\"{up}\"], outlierDetection: {{consecutiveFailures: 0}}}}]\n",
        ))
        .unwrap();
        let running = rt.block_on(proxyfleet_proxy::start(config, None)).unwrap();
        let addr = running.listener_addrs["http"];
        std::mem::forget(running);
        Harness { rt, addr, answer }
    })
}

async fn get(addr: SocketAddr, path: &str, wait: Duration) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(wait, s.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "no answer or end within {wait:?}: {:?}", String::from_utf8_lossy(&out));
    out
}

fuzz_target!(|data: &[u8]| {
    let h = harness();
    *h.answer.lock().unwrap() = data.to_vec();
    h.rt.block_on(async {
        get(h.addr, "/fuzz", Duration::from_secs(5)).await;
        let ok = get(h.addr, "/good", Duration::from_secs(5)).await;
        assert!(
            ok.starts_with(b"HTTP/1.1 200") && ok.ends_with(b"\r\n\r\nok"),
            "proxy stopped answering: got {:?}",
            String::from_utf8_lossy(&ok)
        );
    });
});
