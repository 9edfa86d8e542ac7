//! The admin listener: /metrics, /healthz, /readyz, /config.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
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
        config: redacted(&state.config),
        certificates,
        trust_bundle_sha256: state.trust_bundle_sha256.clone(),
        live_weights: crate::live_weights::report(shared),
        acme_tokens: shared.acme.tokens(),
    }
    .to_json()
}

/// The configuration with the values of header and cookie matches hidden (they can be what
/// lets a tester reach a canary), and of headers a route sets or adds (they can be an
/// upstream's credentials: `Authorization`, an API key): the admin port is reachable from the
/// cluster.
fn redacted(config: &proxyfleet_config::ProxyConfig) -> proxyfleet_config::ProxyConfig {
    const HIDDEN: &str = "<redacted>";
    let mut c = config.clone();
    for r in &mut c.routes {
        if let Some(h) = &mut r.headers {
            for ops in [&mut h.request, &mut h.response] {
                for v in ops.set.iter_mut().chain(ops.add.iter_mut()) {
                    v.value = HIDDEN.into();
                }
            }
        }
        if let Some(h) = &mut r.matches.header {
            h.value = HIDDEN.into();
        }
        for o in &mut r.overrides {
            if let Some(h) = &mut o.header {
                h.value = HIDDEN.into();
            }
            if let Some(k) = &mut o.cookie {
                k.value = HIDDEN.into();
            }
        }
    }
    c
}

async fn route(req: Request<Incoming>, shared: Arc<Shared>) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
        return Ok(write(req, &shared).await);
    }
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

/// Largest write body accepted (a weights document is a few hundred bytes).
const MAX_WRITE_BYTES: usize = 64 * 1024;

/// `PUT /weights` (live weights) and `PUT /acme-challenges`, for a bearer of the admin token only.
async fn write(req: Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if path != proxyfleet_config::LIVE_WEIGHTS_PATH && path != proxyfleet_config::ACME_CHALLENGES_PATH {
        return text(StatusCode::NOT_FOUND, "text/plain", "not found\n");
    }
    if req.method() != http::Method::PUT {
        return text(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "PUT only\n");
    }
    if let Err(refused) = authorize(&req, shared) {
        return refused;
    }
    let acme = path == proxyfleet_config::ACME_CHALLENGES_PATH;
    let body = match http_body_util::Limited::new(req.into_body(), MAX_WRITE_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => return text(StatusCode::PAYLOAD_TOO_LARGE, "text/plain", "body too large\n"),
    };
    let Ok(body) = std::str::from_utf8(&body) else {
        return text(StatusCode::BAD_REQUEST, "text/plain", "not UTF-8\n");
    };
    if acme {
        put_acme(shared, body)
    } else {
        put_weights(shared, body)
    }
}

/// A write needs the bearer token in the file `admin.tokenFile` names.
fn authorize(req: &Request<Incoming>, shared: &Shared) -> Result<(), Response<Full<Bytes>>> {
    let token_file = shared.state.load().config.admin.token_file.clone();
    let Some(token_file) = token_file else {
        return Err(text(
            StatusCode::FORBIDDEN,
            "text/plain",
            "writes are disabled: no admin.tokenFile\n",
        ));
    };
    let expected = match std::fs::read_to_string(&token_file) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
        _ => {
            return Err(text(
                StatusCode::FORBIDDEN,
                "text/plain",
                "writes are disabled: the admin token is unreadable\n",
            ))
        }
    };
    let given = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !constant_time_eq(given.trim().as_bytes(), expected.as_bytes()) {
        return Err(text(
            StatusCode::UNAUTHORIZED,
            "text/plain",
            "a valid bearer token is required\n",
        ));
    }
    Ok(())
}

fn put_acme(shared: &Shared, body: &str) -> Response<Full<Bytes>> {
    match proxyfleet_config::AcmeChallenges::from_json(body) {
        Ok(doc) => {
            let n = doc.tokens.len();
            shared.acme.replace(doc);
            text(StatusCode::OK, "text/plain", format!("{n} challenges\n"))
        }
        Err(e) => text(
            StatusCode::BAD_REQUEST,
            "text/plain",
            format!("not an ACME challenges document: {e}\n"),
        ),
    }
}

fn put_weights(shared: &Shared, body: &str) -> Response<Full<Bytes>> {
    let doc = match proxyfleet_config::LiveWeights::from_json(body) {
        Ok(d) => d,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                "text/plain",
                format!("not a weights document: {e}\n"),
            )
        }
    };
    match crate::live_weights::apply(shared, doc) {
        Ok(crate::live_weights::Outcome::Applied) => text(StatusCode::OK, "text/plain", "applied\n"),
        Ok(crate::live_weights::Outcome::Unchanged) => text(StatusCode::OK, "text/plain", "unchanged\n"),
        Err(e @ crate::live_weights::Refused::UnknownRoute(_)) => {
            text(StatusCode::NOT_FOUND, "text/plain", format!("{e}\n"))
        }
        Err(e @ (crate::live_weights::Refused::Stale { .. } | crate::live_weights::Refused::Conflict { .. })) => {
            text(StatusCode::CONFLICT, "text/plain", format!("{e}\n"))
        }
        Err(e) => text(StatusCode::UNPROCESSABLE_ENTITY, "text/plain", format!("{e}\n")),
    }
}

/// Compares without an early exit, so the time taken does not reveal how much of a guess matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Admin connections served at once; more are closed (a scraper needs one or two).
const MAX_ADMIN_CONNECTIONS: usize = 64;
/// Of those, from one address: one client holding connections open cannot take the slots the
/// kubelet's probes, the operator's pushes and the scraper need.
const MAX_ADMIN_CONNECTIONS_PER_IP: u32 = 8;
/// A request head must arrive within this, and a connection lives at most `ADMIN_LIFETIME`.
const ADMIN_HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
const ADMIN_LIFETIME: std::time::Duration = std::time::Duration::from_secs(120);

pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_ADMIN_CONNECTIONS));
    let per_ip = Arc::new(crate::client_slots::PerIpConnections::default());
    loop {
        let Ok((tcp, peer)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        // Dropping the stream closes it.
        let Some(ip_slot) = per_ip.try_take(peer.ip(), MAX_ADMIN_CONNECTIONS_PER_IP) else {
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| route(req, shared.clone()));
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(ADMIN_HEADER_TIMEOUT)
                .max_buf_size(16 * 1024)
                .serve_connection(TokioIo::new(tcp), svc);
            let _ = tokio::time::timeout(ADMIN_LIFETIME, conn).await;
            drop((slot, ip_slot));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn header_values_a_route_sends_are_not_reported() {
        let yaml = "listeners: []\nroutes:\n  - name: all\n    upstream: u\n    headers:\n      request:\n        set: [{name: authorization, value: Bearer s3cret}]\n        add: [{name: x-api-key, value: k3y}]\n      response:\n        set: [{name: x-served-by, value: edge-1}]\nupstreams: [{name: u, endpoints: [\"127.0.0.1:1\"]}]\n";
        let config: proxyfleet_config::ProxyConfig = serde_yaml::from_str(yaml).expect("config");
        let shown = serde_json::to_string(&redacted(&config)).expect("json");
        for secret in ["s3cret", "k3y", "edge-1"] {
            assert!(!shown.contains(secret), "{secret} shown: {shown}");
        }
        assert!(shown.contains("authorization"), "the names stay: {shown}");
    }
}
