//! A pool of HTTP/1.1 upstream connections, for upstreams that speak HTTP/1.1 (configured
//! `http1`, plain TCP with `auto`, or a TLS `auto` endpoint whose ALPN agreed on http/1.1).
//!
//! A request whose body is known whole (none, or buffered) goes by our own exchange
//! (`h1relay`): the request's task writes it and reads the response itself, and the
//! connection returns to the endpoint's idle list when the response body's last byte is read.
//! A request that streams its body, or asks to upgrade, goes by hyper's client, which writes
//! the body while it reads the response; its connections are pooled apart (docs/decisions.md).
//!
//! Why not hyper-util's legacy client (docs/performance.md): it races a pool checkout against
//! a lazy connect and spawns a task per request to hand the connection back when it turns
//! idle. Here a checkout is a short, uncontended lock and a pop, and each endpoint keeps its
//! own idle lists (`IdleConnections`), so a checkout hashes nothing.
//!
//! Upstreams that recycle connections (nginx's `keepalive_requests`, 1000 by default) announce
//! it with `Connection: close` on a connection's last response. The pool then opens the
//! replacement in the background, so that no request waits for a TCP + TLS handshake because
//! the upstream retired a connection (Envoy calls this preconnecting).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::Authority;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

use super::endpoint::Endpoint;
use super::h1relay::{self, Home, RelayConn, RelayError};
use super::h1wire::Head;
use super::pool::{ConnectError, UpstreamConnection, UpstreamConnector};
use super::response::UpstreamResponse;
use crate::body::UpstreamBody;

type Sender = http1::SendRequest<UpstreamBody>;

struct Idle {
    sender: Sender,
    since: Instant,
}

/// An endpoint's idle hyper connections (for requests that stream a body); our own are in
/// `Endpoint::h1_relays`. They live in the endpoint itself, so a request finds its
/// connections without a map lookup, and they close when the endpoint goes away. One list per
/// worker, as `h1relay::IdleRelays`: a connection's task runs on the worker that opened it.
#[derive(Default)]
pub struct IdleConnections(crate::workers::PerWorker<Mutex<Vec<Idle>>>);

impl IdleConnections {
    /// The calling worker's list.
    fn mine(&self) -> &Mutex<Vec<Idle>> {
        self.0.mine()
    }
}

/// Which kind of connection a background replacement opens.
#[derive(Clone, Copy)]
enum Spare {
    Hyper,
    Relay,
}

pub struct H1Pool {
    connector: UpstreamConnector,
    max_idle: usize,
    idle_timeout: Duration,
}

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum H1Error {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("HTTP/1.1 handshake with {endpoint}: {source}")]
    Handshake { endpoint: String, source: hyper::Error },
    #[error("upstream request: {0}")]
    Request(#[source] hyper::Error),
    #[error(transparent)]
    Relay(#[from] RelayError),
}

impl H1Pool {
    pub fn new(connector: UpstreamConnector, max_idle: usize, idle_timeout: Duration) -> Self {
        Self {
            connector,
            max_idle,
            idle_timeout,
        }
    }

    /// A ready connection to `endpoint` from the pool, dropping any that closed or idled out.
    fn checkout(&self, endpoint: &Endpoint) -> Option<Sender> {
        let mut list = endpoint.h1_idle.mine().lock().ok()?;
        let now = Instant::now();
        let mut i = list.len();
        while i > 0 {
            i -= 1;
            let c = &list[i];
            if c.sender.is_closed() || now.duration_since(c.since) >= self.idle_timeout {
                list.swap_remove(i);
            } else if c.sender.is_ready() {
                return Some(list.swap_remove(i).sender);
            }
        }
        None
    }

    /// Opens a connection to `endpoint` in the background and pools it, unless the pool is full.
    fn replace_in_background(self: &Arc<Self>, endpoint: &Arc<Endpoint>, spare: Spare) {
        let idle = match spare {
            Spare::Hyper => endpoint.h1_idle.mine().lock().map(|l| l.len()).unwrap_or(0),
            Spare::Relay => endpoint.h1_relays.len(),
        };
        if idle >= self.max_idle {
            return;
        }
        let pool = Arc::downgrade(self);
        let endpoint = Arc::downgrade(endpoint);
        tokio::spawn(async move {
            let (Some(pool), Some(endpoint)) = (pool.upgrade(), endpoint.upgrade()) else {
                return;
            };
            let opened = match spare {
                Spare::Hyper => pool
                    .connect(&endpoint)
                    .await
                    .map(|sender| pool.checkin(&endpoint, sender)),
                Spare::Relay => pool
                    .dial_relay(&endpoint)
                    .await
                    .map(|conn| endpoint.h1_relays.keep(conn, pool.max_idle)),
            };
            if let Err(e) = opened {
                tracing::debug!(endpoint = %endpoint.authority, error = %e, "replacing a recycled upstream connection")
            }
        });
    }

    fn checkin(&self, endpoint: &Endpoint, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let Ok(mut list) = endpoint.h1_idle.mine().lock() else {
            return;
        };
        if list.len() < self.max_idle {
            list.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    async fn connect(&self, endpoint: &Endpoint) -> Result<Sender, H1Error> {
        let io = self.dial(endpoint).await?;
        self.handshake(&endpoint.authority, io).await
    }

    /// A new connection to `endpoint` that speaks HTTP/1.1.
    async fn dial(&self, endpoint: &Endpoint) -> Result<TokioIo<UpstreamConnection>, H1Error> {
        let io: TokioIo<UpstreamConnection> = self.connector.dial(&endpoint.authority).await?;
        if io.inner().negotiated_h2() {
            // Only an `auto` endpoint can agree on h2 here: it changed; learn it again.
            endpoint.learn_alpn(super::endpoint::Alpn::Unknown);
            return Err(H1Error::Connect(ConnectError::Renegotiated {
                endpoint: endpoint.authority.to_string(),
                now: "h2",
            }));
        }
        Ok(io)
    }

    async fn dial_relay(&self, endpoint: &Endpoint) -> Result<RelayConn, H1Error> {
        Ok(RelayConn::new(self.dial(endpoint).await?.into_inner()))
    }

    async fn handshake(&self, endpoint: &Authority, io: TokioIo<UpstreamConnection>) -> Result<Sender, H1Error> {
        let (sender, conn) = http1::handshake(io).await.map_err(|source| H1Error::Handshake {
            endpoint: endpoint.to_string(),
            source,
        })?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended");
            }
        });
        Ok(sender)
    }

    /// Sends `req` on `io`, a new connection that agreed on HTTP/1.1, and pools it after.
    pub async fn send_on(
        self: &Arc<Self>,
        endpoint: &Arc<Endpoint>,
        io: TokioIo<UpstreamConnection>,
        req: http::Request<UpstreamBody>,
    ) -> Result<(UpstreamResponse, bool), H1Error> {
        match whole_body(req) {
            Ok((parts, body)) => {
                let mut conn = RelayConn::new(io.into_inner());
                let head = conn.exchange(&parts, body.as_ref(), &endpoint.authority).await?;
                Ok((self.respond(endpoint, conn, head), false))
            }
            Err(req) => {
                let mut sender = self.handshake(&endpoint.authority, io).await?;
                let resp = sender.send_request(req).await.map_err(H1Error::Request)?;
                self.checkin(endpoint, sender);
                Ok((resp.map(Into::into), false))
            }
        }
    }

    /// Sends `req` (origin-form target) to `endpoint` on a pooled connection (or a new one).
    /// Returns the response and whether the connection was reused.
    pub async fn send(
        self: &Arc<Self>,
        endpoint: &Arc<Endpoint>,
        req: http::Request<UpstreamBody>,
    ) -> Result<(UpstreamResponse, bool), H1Error> {
        match whole_body(req) {
            Ok((parts, body)) => self.relay(endpoint, &parts, body.as_ref()).await,
            Err(req) => {
                let (resp, reused) = self.send_streaming(endpoint, req).await?;
                Ok((resp.map(Into::into), reused))
            }
        }
    }

    /// Our own exchange, on an idle connection or a new one. A request that a reused
    /// connection left unanswered (the upstream closed it meanwhile) goes again on a new one
    /// when its method is safe.
    async fn relay(
        self: &Arc<Self>,
        endpoint: &Arc<Endpoint>,
        parts: &http::request::Parts,
        body: Option<&Bytes>,
    ) -> Result<(UpstreamResponse, bool), H1Error> {
        if let Some(mut conn) = endpoint.h1_relays.take(self.idle_timeout) {
            match conn.exchange(parts, body, &endpoint.authority).await {
                Ok(head) => return Ok((self.respond(endpoint, conn, head), true)),
                Err(e) if e.unanswered() && h1relay::resendable(&parts.method) => {
                    tracing::debug!(error = %e, "reused upstream connection was closed; sending again")
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut conn = self.dial_relay(endpoint).await?;
        let head = conn.exchange(parts, body, &endpoint.authority).await?;
        Ok((self.respond(endpoint, conn, head), false))
    }

    /// The response to hand on; its body brings the connection home.
    fn respond(self: &Arc<Self>, endpoint: &Arc<Endpoint>, conn: RelayConn, head: Head) -> UpstreamResponse {
        if closes_after(&head.headers) {
            self.replace_in_background(endpoint, Spare::Relay);
        }
        let home = Home {
            idle: endpoint.h1_relays.clone(),
            max_idle: self.max_idle,
            endpoint: endpoint.authority.clone(),
        };
        h1relay::response(head, conn, home).map(Into::into)
    }

    /// Sends a request that streams its body on one of hyper's connections. A request that a
    /// pooled connection could not even start (closed by the upstream meanwhile) is sent again
    /// on a new connection.
    async fn send_streaming(
        self: &Arc<Self>,
        endpoint: &Arc<Endpoint>,
        req: http::Request<UpstreamBody>,
    ) -> Result<(http::Response<Incoming>, bool), H1Error> {
        let mut req = req;
        if let Some(mut sender) = self.checkout(endpoint) {
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    self.checkin(endpoint, sender);
                    if closes_after(resp.headers()) {
                        self.replace_in_background(endpoint, Spare::Hyper);
                    }
                    return Ok((resp, true));
                }
                Err(mut e) => match e.take_message() {
                    // Never written: safe to send on a fresh connection.
                    Some(unsent) => req = unsent,
                    None => return Err(H1Error::Request(e.into_error())),
                },
            }
        }
        let mut sender = self.connect(endpoint).await?;
        let resp = sender.send_request(req).await.map_err(H1Error::Request)?;
        self.checkin(endpoint, sender);
        if closes_after(resp.headers()) {
            self.replace_in_background(endpoint, Spare::Hyper);
        }
        Ok((resp, false))
    }

    /// Sends an upgrade request (WebSocket) on a connection of its own that may switch
    /// protocols; it never returns to the pool.
    pub async fn send_upgrade(
        &self,
        endpoint: &Endpoint,
        req: http::Request<UpstreamBody>,
    ) -> Result<http::Response<Incoming>, H1Error> {
        let io: TokioIo<UpstreamConnection> = self.connector.dial(&endpoint.authority).await?;
        if io.inner().negotiated_h2() {
            endpoint.learn_alpn(super::endpoint::Alpn::H2);
            return Err(H1Error::Connect(ConnectError::Renegotiated {
                endpoint: endpoint.authority.to_string(),
                now: "h2",
            }));
        }
        let (mut sender, conn) = http1::handshake(io).await.map_err(|source| H1Error::Handshake {
            endpoint: endpoint.authority.to_string(),
            source,
        })?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upgraded upstream connection ended");
            }
        });
        sender.send_request(req).await.map_err(H1Error::Request)
    }

    /// Closes `endpoint`'s connections idle longer than the idle timeout (by dropping them).
    /// Closes too the kept connections the upstream has closed meanwhile.
    fn reap(&self, endpoint: &Endpoint, now: Instant) {
        for list in endpoint.h1_idle.0.all() {
            if let Ok(mut list) = list.lock() {
                list.retain(|c| !c.sender.is_closed() && now.duration_since(c.since) < self.idle_timeout);
            }
        }
        endpoint.h1_relays.reap(now, self.idle_timeout);
    }
}

/// Whether the upstream closes the connection after this response (`Connection: close`).
fn closes_after(headers: &http::HeaderMap) -> bool {
    crate::forwarding::header_has_token(headers, &http::header::CONNECTION, "close")
}

/// The request's head and its whole body when it has no body or a buffered one; the request
/// back when it streams one.
#[allow(clippy::result_large_err)]
fn whole_body(
    req: http::Request<UpstreamBody>,
) -> Result<(http::request::Parts, Option<Bytes>), http::Request<UpstreamBody>> {
    let (parts, body) = req.into_parts();
    match body {
        UpstreamBody::Empty => Ok((parts, None)),
        UpstreamBody::Buffered { data } => Ok((parts, data)),
        streaming => Err(http::Request::from_parts(parts, streaming)),
    }
}

/// Reaps the idle connections of `cluster`'s endpoints every half idle timeout until the
/// cluster is dropped. A retired cluster that something still holds (a TCP pass-through) is
/// reaped too: its endpoints' idle connections would stay open otherwise, and reaping an
/// endpoint its successor adopted twice closes nothing more.
pub async fn reap_until_dropped(cluster: Weak<super::UpstreamCluster>) {
    loop {
        let period = match cluster.upgrade() {
            Some(c) => {
                let Some(pool) = &c.h1 else { return };
                let now = Instant::now();
                for e in c.endpoints.load().iter() {
                    pool.reap(e, now);
                }
                (pool.idle_timeout / 2).max(Duration::from_millis(50))
            }
            None => return,
        };
        tokio::time::sleep(period).await;
    }
}

#[cfg(test)]
mod tests {
    use super::closes_after;

    fn response(connection: &[&str]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for v in connection {
            h.append(http::header::CONNECTION, http::HeaderValue::from_str(v).expect("value"));
        }
        h
    }

    #[test]
    fn a_connection_close_token_means_the_upstream_retires_the_connection() {
        assert!(closes_after(&response(&["close"])));
        assert!(closes_after(&response(&["Keep-Alive, Close"])));
        assert!(closes_after(&response(&["upgrade", "close"])));
        assert!(!closes_after(&response(&[])));
        assert!(!closes_after(&response(&["keep-alive"])));
        assert!(!closes_after(&response(&["closed"])));
    }
}
