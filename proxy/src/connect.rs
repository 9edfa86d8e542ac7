//! HTTP CONNECT forward proxying to an allow-list of `host:port` targets.

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::body::{self, ClientBody};
use crate::shared::Shared;

/// Whether `target` (host:port) is allowed by a pattern list (`*.` prefix, `*` port).
pub fn allowed(patterns: &[String], target: &str) -> bool {
    let Some((host, port)) = target.rsplit_once(':') else {
        return false;
    };
    patterns.iter().any(|p| {
        let Some((ph, pp)) = p.rsplit_once(':') else {
            return false;
        };
        let port_ok = pp == "*" || pp == port;
        let host_ok = match ph.strip_prefix("*.") {
            Some(suffix) => {
                host.len() > suffix.len()
                    && host.ends_with(suffix)
                    && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
            }
            None => ph.eq_ignore_ascii_case(host),
        };
        port_ok && host_ok
    })
}

fn status(code: StatusCode, text: &'static str) -> Response<ClientBody> {
    let mut r = Response::new(body::full(text));
    *r.status_mut() = code;
    r
}

pub fn handle_connect(req: Request<Incoming>, shared: &Shared) -> Response<ClientBody> {
    let state = shared.state.load();
    let Some(connect) = &state.config.connect else {
        return status(StatusCode::METHOD_NOT_ALLOWED, "CONNECT is not enabled\n");
    };
    let Some(target) = req.uri().authority().map(|a| a.to_string()) else {
        return status(StatusCode::BAD_REQUEST, "CONNECT needs host:port\n");
    };
    if !allowed(&connect.allow, &target) {
        tracing::debug!(%target, "CONNECT refused by allow-list");
        return status(StatusCode::FORBIDDEN, "CONNECT target not allowed\n");
    }
    tokio::spawn(async move {
        let upgraded = match hyper::upgrade::on(req).await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "CONNECT upgrade failed");
                return;
            }
        };
        match tokio::net::TcpStream::connect(target.as_str()).await {
            Ok(mut upstream) => {
                let mut client = TokioIo::new(upgraded);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            }
            Err(e) => tracing::debug!(%target, error = %e, "CONNECT target unreachable"),
        }
    });
    Response::new(body::full(""))
}

#[cfg(test)]
mod tests {
    use super::allowed;

    #[test]
    fn allow_list_patterns() {
        let p = vec!["api.example.com:443".to_string(), "*.internal:*".to_string()];
        assert!(allowed(&p, "api.example.com:443"));
        assert!(!allowed(&p, "api.example.com:80"));
        assert!(allowed(&p, "db.internal:5432"));
        assert!(!allowed(&p, "internal:5432"));
        assert!(!allowed(&p, "evil.com:443"));
    }
}
