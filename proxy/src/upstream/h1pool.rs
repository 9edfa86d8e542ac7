//! A pool of HTTP/1.1 upstream connections, for upstreams that speak HTTP/1.1 (configured
//! `http1`, plain TCP with `auto`, or a TLS `auto` endpoint whose ALPN agreed on http/1.1).
//!
//! Why our own (docs/performance.md): hyper-util's legacy client races a pool checkout
//! against a lazy connect and spawns a task per request to hand the connection back when it
//! turns idle. Here a checkout is a short, uncontended lock and a pop; a connection goes back
//! to the pool as soon as its response head arrives and is skipped until hyper reports it
//! ready again (its body read). No task per request. Each endpoint keeps its own idle list
//! (`IdleConnections`), so a checkout hashes nothing.
//!
//! Upstreams that recycle connections (nginx's `keepalive_requests`, 1000 by default) announce
//! it with `Connection: close` on a connection's last response. The pool then opens the
//! replacement in the background, so that no request waits for a TCP + TLS handshake because
//! the upstream retired a connection (Envoy calls this preconnecting).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use http::uri::Authority;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

use super::endpoint::Endpoint;
use super::pool::{ConnectError, UpstreamConnection, UpstreamConnector};
use crate::body::UpstreamBody;

type Sender = http1::SendRequest<UpstreamBody>;

struct Idle {
    sender: Sender,
    since: Instant,
}

/// An endpoint's idle HTTP/1.1 connections. It lives in the endpoint itself, so a request
/// finds its connections without a map lookup, and they close when the endpoint goes away.
#[derive(Default)]
pub struct IdleConnections(Mutex<Vec<Idle>>);

impl IdleConnections {
    fn len(&self) -> usize {
        self.0.lock().map(|l| l.len()).unwrap_or(0)
    }
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
        let mut list = endpoint.h1_idle.0.lock().ok()?;
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
    fn replace_in_background(self: &Arc<Self>, endpoint: &Arc<Endpoint>) {
        if endpoint.h1_idle.len() >= self.max_idle {
            return;
        }
        let pool = Arc::downgrade(self);
        let endpoint = Arc::downgrade(endpoint);
        tokio::spawn(async move {
            let (Some(pool), Some(endpoint)) = (pool.upgrade(), endpoint.upgrade()) else {
                return;
            };
            match pool.connect(&endpoint).await {
                Ok(sender) => pool.checkin(&endpoint, sender),
                Err(e) => {
                    tracing::debug!(endpoint = %endpoint.authority, error = %e, "replacing a recycled upstream connection")
                }
            }
        });
    }

    fn checkin(&self, endpoint: &Endpoint, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let Ok(mut list) = endpoint.h1_idle.0.lock() else {
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
        let io: TokioIo<UpstreamConnection> = self.connector.dial(&endpoint.authority).await?;
        if io.inner().negotiated_h2() {
            // Only an `auto` endpoint can agree on h2 here: it changed; learn it again.
            endpoint.learn_alpn(super::endpoint::Alpn::Unknown);
            return Err(H1Error::Connect(ConnectError::Renegotiated {
                endpoint: endpoint.authority.to_string(),
                now: "h2",
            }));
        }
        self.handshake(&endpoint.authority, io).await
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
        &self,
        endpoint: &Endpoint,
        io: TokioIo<UpstreamConnection>,
        req: http::Request<UpstreamBody>,
    ) -> Result<(http::Response<Incoming>, bool), H1Error> {
        let mut sender = self.handshake(&endpoint.authority, io).await?;
        let resp = sender.send_request(req).await.map_err(H1Error::Request)?;
        self.checkin(endpoint, sender);
        Ok((resp, false))
    }

    /// Sends `req` (origin-form target) to `endpoint` on a pooled connection (or a new one).
    /// Returns the response and whether the connection was reused. A request that a pooled
    /// connection could not even start (closed by the upstream meanwhile) is sent again on a
    /// new connection.
    pub async fn send(
        self: &Arc<Self>,
        endpoint: &Arc<Endpoint>,
        req: http::Request<UpstreamBody>,
    ) -> Result<(http::Response<Incoming>, bool), H1Error> {
        let mut req = req;
        if let Some(mut sender) = self.checkout(endpoint) {
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    self.checkin(endpoint, sender);
                    if closes_after(&resp) {
                        self.replace_in_background(endpoint);
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
        if closes_after(&resp) {
            self.replace_in_background(endpoint);
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
    fn reap(&self, endpoint: &Endpoint, now: Instant) {
        let Ok(mut list) = endpoint.h1_idle.0.lock() else {
            return;
        };
        list.retain(|c| !c.sender.is_closed() && now.duration_since(c.since) < self.idle_timeout);
    }
}

/// Whether the upstream closes the connection after this response (`Connection: close`).
fn closes_after<B>(resp: &http::Response<B>) -> bool {
    crate::forwarding::header_has_token(resp.headers(), &http::header::CONNECTION, "close")
}

/// Reaps the idle connections of `cluster`'s endpoints every half idle timeout until the
/// cluster is dropped.
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

    fn response(connection: &[&str]) -> http::Response<()> {
        let mut b = http::Response::builder();
        for v in connection {
            b = b.header(http::header::CONNECTION, *v);
        }
        b.body(()).expect("response")
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
