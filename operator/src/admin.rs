//! The operator's HTTP endpoints: /metrics, /healthz, /readyz.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;

use crate::metrics::Metrics;

pub async fn serve(addr: std::net::SocketAddr, metrics: Arc<Metrics>, ready: Arc<AtomicBool>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    loop {
        let (tcp, _) = listener.accept().await?;
        let metrics = metrics.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let metrics = metrics.clone();
                let ready = ready.clone();
                async move {
                    let (status, body) = match req.uri().path() {
                        "/metrics" => (200, metrics.encode()),
                        "/healthz" => (200, "ok\n".to_string()),
                        "/readyz" if ready.load(Ordering::Relaxed) => (200, "ready\n".to_string()),
                        "/readyz" => (503, "starting\n".to_string()),
                        _ => (404, "not found\n".to_string()),
                    };
                    let mut resp = http::Response::new(Full::new(Bytes::from(body)));
                    *resp.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
                    Ok::<_, Infallible>(resp)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}
