//! Arbitrary bytes sent to a running proxy (one started once per process, its upstream a closed
//! port) never crash it, and it keeps answering a well-formed request afterwards.
#![no_main]
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Harness {
    rt: tokio::runtime::Runtime,
    addr: SocketAddr,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let config = proxyfleet_config::ProxyConfig::from_yaml(
            "listeners: [{name: http, address: \"127.0.0.1:0\"}]\nadmin: {address: \"127.0.0.1:0\"}\nlimits: {headerReadTimeout: 200ms, escapedSlashes: decode, mergeSlashes: true}\nroutes: [{name: r, upstream: u, match: {pathPrefix: /a}}]\nupstreams: [{name: u, endpoints: [\"127.0.0.1:1\"]}]\n",
        )
        .unwrap();
        let running = rt.block_on(proxyfleet_proxy::start(config, None)).unwrap();
        let addr = running.listener_addrs["http"];
        std::mem::forget(running);
        Harness { rt, addr }
    })
}

async fn exchange(addr: SocketAddr, bytes: &[u8], wait: Duration) -> Vec<u8> {
    let mut s = match tokio::net::TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => return format!("<connect: {e}>").into_bytes(),
    };
    let _ = s.write_all(bytes).await;
    let _ = s.shutdown().await;
    let mut out = Vec::new();
    if let Err(e) = tokio::time::timeout(wait, s.read_to_end(&mut out)).await {
        out.extend_from_slice(format!("<read: {e}>").as_bytes());
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let h = harness();
    h.rt.block_on(async {
        exchange(h.addr, data, Duration::from_millis(500)).await;
        let ok = exchange(
            h.addr,
            b"GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            Duration::from_secs(5),
        )
        .await;
        assert!(ok.starts_with(b"HTTP/1.1 404"), "proxy stopped answering: got {:?}", String::from_utf8_lossy(&ok));
    });
});
