//! HTTP CONNECT forward proxying to an allow-list of `host:port` targets.

use std::sync::Arc;

use crate::body::RequestBody;
use http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use crate::body::{self, ClientBody};
use crate::forwarding::ClientInfo;
use crate::shared::Shared;
use crate::tunnel_target::{allowed, dial, DialError};

fn status(code: StatusCode, text: &'static str) -> Response<ClientBody> {
    let mut r = Response::new(body::full(text));
    *r.status_mut() = code;
    r
}

/// The answer a CONNECT request gets when its target cannot be reached.
fn dial_response(e: DialError) -> Response<ClientBody> {
    match e {
        DialError::DoesNotResolve => status(StatusCode::BAD_GATEWAY, "CONNECT target does not resolve\n"),
        DialError::AddressNotAllowed => status(StatusCode::FORBIDDEN, "CONNECT target address not allowed\n"),
        DialError::TimedOut => status(StatusCode::GATEWAY_TIMEOUT, "CONNECT target timed out\n"),
        DialError::Refused | DialError::Unreachable => status(StatusCode::BAD_GATEWAY, "CONNECT target unreachable\n"),
    }
}

/// CONNECT: allowed by name, resolved and connected before the client gets its 200; the
/// tunnel then holds the client's connection slot and closes after the idle timeout.
pub async fn handle_connect(
    req: Request<RequestBody>,
    shared: &Shared,
    client: Arc<ClientInfo>,
) -> Response<ClientBody> {
    let state = shared.state.load_full();
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
    let Ok(tunnel_slot) = client.tunnel_slot(req.version()) else {
        shared.metrics.refused_connections.get_or_create(&TUNNEL_LIMIT).inc();
        return status(StatusCode::SERVICE_UNAVAILABLE, "too many connections\n");
    };
    let upstream = match dial(connect, &target).await {
        Ok(s) => s,
        Err(e) => {
            if e == DialError::AddressNotAllowed {
                shared.metrics.refused_connections.get_or_create(&CONNECT_TARGET).inc();
            }
            return dial_response(e);
        }
    };
    let idle = connect.idle_timeout.get();
    tokio::spawn(async move {
        let _slot_holder = (client, tunnel_slot);
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                crate::relay::relay_streams(TokioIo::new(upgraded), upstream, idle).await;
            }
            Err(e) => tracing::debug!(error = %e, "CONNECT upgrade failed"),
        }
    });
    Response::new(body::full(""))
}

const TUNNEL_LIMIT: crate::metrics::RefusalLabels = crate::metrics::RefusalLabels { reason: "tunnel_limit" };

const CONNECT_TARGET: crate::metrics::RefusalLabels = crate::metrics::RefusalLabels {
    reason: "connect_target",
};
