//! The admin listener: /metrics, /healthz, /readyz, /config.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::shared::Shared;

fn text(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    r
}

/// The running configuration as served on /config (the shared `AdminReport` contract, JSON).
/// It holds file paths, never key material; loaded certificates are described by serial and
/// expiry only.
pub fn config_report(shared: &Shared) -> String {
    let state = shared.state.load();
    let certificates = state
        .certificates
        .iter()
        .map(|(listener, c)| proxyfleet_config::LoadedCertificate {
            listener: listener.clone(),
            serial: c.serial.clone(),
            subject: c.subject.clone(),
            not_after: c.not_after_unix,
        })
        .collect();
    proxyfleet_config::AdminReport {
        config: state.config.clone(),
        certificates,
        trust_bundle_sha256: state.trust_bundle_sha256.clone(),
    }
    .to_json()
}

async fn route(req: Request<Incoming>, shared: Arc<Shared>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(match req.uri().path() {
        "/metrics" => text(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            shared.metrics.encode(),
        ),
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" => {
            if shared.ready.load(Ordering::Relaxed) {
                text(StatusCode::OK, "text/plain", "ready\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n")
            }
        }
        proxyfleet_config::ADMIN_REPORT_PATH => text(StatusCode::OK, "application/json", config_report(&shared)),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    })
}

pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| route(req, shared.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}
