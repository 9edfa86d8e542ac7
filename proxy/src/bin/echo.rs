//! proxyfleet-echo: a tiny upstream for tests, demos and benchmarks. Answers every request
//! with who answered (pod name, version) and what was asked. `/status/NNN` answers NNN,
//! `/delay/MS` waits first. A bad version for gray-release tests: `ECHO_ERROR_PERCENT` answers
//! that share of requests 500, `ECHO_DELAY_MS` delays every request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// Faults this instance injects into every request (from the environment).
#[derive(Clone, Copy)]
struct Faults {
    error_percent: f64,
    delay: Duration,
}

async fn answer(
    req: Request<Incoming>,
    who: &'static str,
    faults: Faults,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let mut status = StatusCode::OK;
    // Readiness stays honest: only traffic gets the faults.
    let faults = if path == "/ready" {
        Faults {
            error_percent: 0.0,
            delay: Duration::ZERO,
        }
    } else {
        faults
    };
    if !faults.delay.is_zero() {
        tokio::time::sleep(faults.delay).await;
    }
    if faults.error_percent > 0.0 && fastrand::f64() * 100.0 < faults.error_percent {
        status = StatusCode::INTERNAL_SERVER_ERROR;
    }
    if let Some(code) = path.strip_prefix("/status/").and_then(|c| c.parse::<u16>().ok()) {
        status = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST);
    }
    if let Some(ms) = path.strip_prefix("/delay/").and_then(|c| c.parse::<u64>().ok()) {
        tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
    }
    let method = req.method().clone();
    let body_len = req.into_body().collect().await.map(|b| b.to_bytes().len()).unwrap_or(0);
    let text = format!("{who} {method} {path} body={body_len}\n");
    let mut r = Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = status;
    Ok(r)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr: SocketAddr = std::env::var("ECHO_ADDR")
        .unwrap_or_else(|_| "0.0.0.0:8080".into())
        .parse()
        .map_err(std::io::Error::other)?;
    let who: &'static str = Box::leak(
        format!(
            "{}@{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "echo".into()),
            std::env::var("ECHO_VERSION").unwrap_or_else(|_| "v1".into())
        )
        .into_boxed_str(),
    );
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let faults = Faults {
        error_percent: env("ECHO_ERROR_PERCENT"),
        delay: Duration::from_millis(env("ECHO_DELAY_MS") as u64),
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    eprintln!("proxyfleet-echo {who} listening on {addr}");
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| answer(req, who, faults));
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}
