//! One multiplexed HTTP/2 connection per endpoint and worker for upstreams configured `protocol: h2` and
//! TLS `auto` endpoints whose ALPN agreed on h2. Our own rather than hyper-util's client so the
//! request's own host travels as `:authority` (RFC 9113 §8.3.1): that client keys its pool by
//! the URI, which must then name the endpoint, and a `host` header would contradict it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use super::endpoint::Endpoint;
use super::pool::{ConnectError, UpstreamConnection, UpstreamConnector};
use crate::body::UpstreamBody;

type Sender = http2::SendRequest<UpstreamBody>;

/// An endpoint's HTTP/2 connections, one per worker (`crate::workers`), as Envoy keeps one
/// pool per worker: a connection's task runs on the worker that opened it, so one shared
/// connection would put every worker's upstream I/O, TLS and body forwarding on one thread.
#[derive(Default)]
pub struct H2Connection(crate::workers::PerWorker<WorkerConnection>);

/// One worker's connection: the sender to clone, and a lock that lets one request connect while
/// the others wait for it instead of dialling too.
#[derive(Default)]
struct WorkerConnection {
    sender: Mutex<Option<Sender>>,
    connecting: tokio::sync::Mutex<()>,
}

impl H2Connection {
    /// The calling worker's connection.
    fn mine(&self) -> &WorkerConnection {
        self.0.mine()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum H2Error {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("HTTP/2 handshake with {endpoint}: {source}")]
    Handshake { endpoint: String, source: hyper::Error },
    #[error("upstream request: {0}")]
    Request(#[source] hyper::Error),
    #[error("request target: {0}")]
    Target(#[from] http::Error),
}

pub struct H2Pool {
    connector: UpstreamConnector,
    scheme: http::uri::Scheme,
    /// `upstreams[].http2`: the receive windows.
    windows: proxyfleet_config::UpstreamHttp2,
    /// `auto` over TLS: a new connection must still agree on h2 (else the endpoint is learnt
    /// again).
    learns_alpn: bool,
}

impl H2Pool {
    pub fn new(
        connector: UpstreamConnector,
        scheme: http::uri::Scheme,
        windows: proxyfleet_config::UpstreamHttp2,
        learns_alpn: bool,
    ) -> Self {
        Self {
            connector,
            scheme,
            windows,
            learns_alpn,
        }
    }

    /// Sends `req` (origin-form target, the client's Host in its headers) on the endpoint's
    /// connection; the Host becomes `:authority`. Returns the response and whether the
    /// connection was already open.
    pub async fn send(
        &self,
        endpoint: &Arc<Endpoint>,
        mut req: http::Request<UpstreamBody>,
    ) -> Result<(http::Response<Incoming>, bool), H2Error> {
        let host = req.headers_mut().remove(http::header::HOST);
        let authority = host
            .as_ref()
            .and_then(|h| http::uri::Authority::try_from(h.as_bytes()).ok())
            .unwrap_or_else(|| endpoint.authority.clone());
        let pq = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
        *req.uri_mut() = http::Uri::builder()
            .scheme(self.scheme.clone())
            .authority(authority)
            .path_and_query(pq)
            .build()?;
        *req.version_mut() = http::Version::HTTP_2;
        let (mut sender, reused) = self.sender(endpoint).await?;
        let resp = sender.send_request(req).await.map_err(H2Error::Request)?;
        Ok((resp, reused))
    }

    async fn sender(&self, endpoint: &Endpoint) -> Result<(Sender, bool), H2Error> {
        let mine = endpoint.h2.mine();
        if let Some(s) = open(mine) {
            return Ok((s, true));
        }
        let _connecting = mine.connecting.lock().await;
        if let Some(s) = open(mine) {
            return Ok((s, true));
        }
        let io = self.connector.dial(&endpoint.authority).await?;
        if self.learns_alpn && !io.inner().negotiated_h2() {
            endpoint.learn_alpn(super::endpoint::Alpn::Unknown);
            return Err(H2Error::Connect(ConnectError::Renegotiated {
                endpoint: endpoint.authority.to_string(),
                now: "http/1.1",
            }));
        }
        Ok((self.handshake(endpoint, mine, io).await?, false))
    }

    /// Makes `io`, a new connection that agreed on h2, the calling worker's connection to
    /// `endpoint`.
    pub async fn adopt(&self, endpoint: &Endpoint, io: TokioIo<UpstreamConnection>) -> Result<(), H2Error> {
        let mine = endpoint.h2.mine();
        let _connecting = mine.connecting.lock().await;
        if open(mine).is_none() {
            self.handshake(endpoint, mine, io).await?;
        }
        Ok(())
    }

    async fn handshake(
        &self,
        endpoint: &Endpoint,
        slot: &WorkerConnection,
        io: TokioIo<UpstreamConnection>,
    ) -> Result<Sender, H2Error> {
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(Duration::from_secs(30)))
            .keep_alive_timeout(Duration::from_secs(10))
            .initial_stream_window_size(self.windows.stream_window())
            .initial_connection_window_size(self.windows.connection_window())
            .handshake(io)
            .await
            .map_err(|source| H2Error::Handshake {
                endpoint: endpoint.authority.to_string(),
                source,
            })?;
        let name = endpoint.authority.to_string();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(endpoint = %name, error = %e, "upstream HTTP/2 connection ended");
            }
        });
        *slot.sender.lock().unwrap_or_else(|p| p.into_inner()) = Some(sender.clone());
        Ok(sender)
    }
}

/// The worker's connection, when it is open and takes requests.
fn open(c: &WorkerConnection) -> Option<Sender> {
    let guard = c.sender.lock().unwrap_or_else(|p| p.into_inner());
    guard.as_ref().filter(|s| !s.is_closed()).cloned()
}
