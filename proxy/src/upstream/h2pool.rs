//! Multiplexed HTTP/2 connections per endpoint and worker for upstreams configured
//! `protocol: h2` and TLS `auto` endpoints whose ALPN agreed on h2: a request takes the oldest
//! open connection with room for one more stream (the lower of `http2.maxConcurrentStreams`
//! and the upstream's SETTINGS_MAX_CONCURRENT_STREAMS, as last seen: hyper shows it to the
//! task that hands requests to the connection, so it is read when a request is handed over,
//! and a new connection's first burst may still queue past it), and a new one is
//! opened when all are full, as Envoy's pool does past a connection's stream limit (else
//! streams past the upstream's limit would queue in the connection behind the ones in flight,
//! until the route's timeout). Until the upstream's first SETTINGS have been read, h2 opens
//! one stream on a new connection and holds the requests given it after that one (a round trip
//! at most): it would otherwise open up to 100 at once, and an upstream allowing fewer refuses
//! the rest (REFUSED_STREAM, a 502 without `retries`). Our count takes the new connection to
//! allow our limit in that while, so a burst does not dial a connection per request. Our own rather than hyper-util's client so the request's own host travels
//! as `:authority` (RFC 9113 §8.3.1): that client keys its pool by the URI, which must then
//! name the endpoint, and a `host` header would contradict it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use super::endpoint::{now_ms, Endpoint};
use super::pool::{ConnectError, UpstreamConnection, UpstreamConnector};
use crate::body::UpstreamBody;

type Sender = http2::SendRequest<UpstreamBody>;

/// An endpoint's HTTP/2 connections, one list per worker (`crate::workers`), as Envoy keeps one
/// pool per worker: a connection's task runs on the worker that opened it, so shared
/// connections would put every worker's upstream I/O, TLS and body forwarding on one thread.
#[derive(Default)]
pub struct H2Connection(crate::workers::PerWorker<WorkerConnections>);

/// One worker's connections, oldest first, and a lock that lets one request connect while the
/// others wait for it instead of dialling too.
#[derive(Default)]
struct WorkerConnections {
    open: Mutex<Vec<Conn>>,
    connecting: tokio::sync::Mutex<()>,
}

/// A connection and its load.
struct Conn {
    sender: Sender,
    load: Arc<Load>,
}

/// The streams a connection carries (`StreamCount`s alive), since when it carries none, and
/// the most the upstream allows on it (`drive`).
#[derive(Default)]
struct Load {
    streams: AtomicU32,
    idle_since_ms: AtomicU64,
    peer_limit: AtomicU32,
}

/// A stream counted on its connection until dropped: the response body holds it until its
/// last part is read (`response::FromUpstream`). A request body still streaming after the
/// answer's end is no longer counted; the connection may then carry one stream more than the
/// limit for that while, which the upstream's own limit queues.
pub struct StreamCount(Arc<Load>);

impl Drop for StreamCount {
    fn drop(&mut self) {
        if self.0.streams.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.0.idle_since_ms.store(now_ms(), Ordering::Relaxed);
        }
    }
}

impl H2Connection {
    /// The calling worker's connections.
    fn mine(&self) -> &WorkerConnections {
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
    /// `upstreams[].http2`: the receive windows, the streams per connection.
    windows: proxyfleet_config::UpstreamHttp2,
    /// `pool.idleTimeout`: a connection past the first carrying nothing this long is closed.
    idle_timeout_ms: u64,
    /// `auto` over TLS: a new connection must still agree on h2 (else the endpoint is learnt
    /// again).
    learns_alpn: bool,
}

impl H2Pool {
    pub fn new(connector: UpstreamConnector, scheme: http::uri::Scheme, config: &proxyfleet_config::Upstream) -> Self {
        Self {
            connector,
            scheme,
            windows: config.http2.clone(),
            idle_timeout_ms: config
                .pool
                .idle_timeout
                .get()
                .as_millis()
                .try_into()
                .unwrap_or(u64::MAX),
            learns_alpn: config.tls.is_some() && config.protocol == proxyfleet_config::UpstreamProtocol::Auto,
        }
    }

    /// Sends `req` (origin-form target, the client's Host in its headers) on one of the
    /// endpoint's connections; the Host becomes `:authority`. Returns the response, whether the
    /// connection was already open, and the stream's count on it.
    pub async fn send(
        &self,
        endpoint: &Arc<Endpoint>,
        mut req: http::Request<UpstreamBody>,
    ) -> Result<(http::Response<Incoming>, bool, StreamCount), H2Error> {
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
        let (mut sender, stream, reused) = self.sender(endpoint).await?;
        let resp = sender.send_request(req).await.map_err(H2Error::Request)?;
        Ok((resp, reused, stream))
    }

    async fn sender(&self, endpoint: &Endpoint) -> Result<(Sender, StreamCount, bool), H2Error> {
        let mine = endpoint.h2.mine();
        let limit = self.windows.max_concurrent_streams();
        let idle = self.idle_timeout_ms;
        if let Some((s, n)) = room(mine, limit, idle) {
            return Ok((s, n, true));
        }
        let _connecting = mine.connecting.lock().await;
        if let Some((s, n)) = room(mine, limit, idle) {
            return Ok((s, n, true));
        }
        match self.dial(endpoint, mine).await {
            Ok((sender, load)) => Ok((sender, StreamCount(load), false)),
            // Full connections still carry the request (the upstream queues it past its own
            // limit), as it would have before another connection was tried.
            Err(e) => least_loaded(mine).map(|(s, n)| (s, n, true)).ok_or(e),
        }
    }

    /// A new connection for `worker`, carrying the request that dialled it.
    async fn dial(&self, endpoint: &Endpoint, worker: &WorkerConnections) -> Result<(Sender, Arc<Load>), H2Error> {
        let io = self.connector.dial(&endpoint.authority).await?;
        if self.learns_alpn && !io.inner().negotiated_h2() {
            endpoint.learn_alpn(super::endpoint::Alpn::Unknown);
            return Err(H2Error::Connect(ConnectError::Renegotiated {
                endpoint: endpoint.authority.to_string(),
                now: "http/1.1",
            }));
        }
        self.handshake(endpoint, worker, io, 1).await
    }

    /// Makes `io`, a new connection that agreed on h2, one of the calling worker's connections
    /// to `endpoint` unless one has room already.
    pub async fn adopt(&self, endpoint: &Endpoint, io: TokioIo<UpstreamConnection>) -> Result<(), H2Error> {
        let mine = endpoint.h2.mine();
        let _connecting = mine.connecting.lock().await;
        let limit = self.windows.max_concurrent_streams();
        if room(mine, limit, self.idle_timeout_ms).is_none() {
            self.handshake(endpoint, mine, io, 0).await?;
        }
        Ok(())
    }

    /// Makes `io` a connection of `worker`'s, carrying `streams` already (the request that
    /// opened it, whatever the limit: it waited for it).
    async fn handshake(
        &self,
        endpoint: &Endpoint,
        worker: &WorkerConnections,
        io: TokioIo<UpstreamConnection>,
        streams: u32,
    ) -> Result<(Sender, Arc<Load>), H2Error> {
        // One stream until the upstream's first SETTINGS; after them, h2 holds its limit or
        // none (usize::MAX).
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .initial_max_send_streams(1)
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
        let load = Arc::new(Load {
            streams: AtomicU32::new(streams),
            idle_since_ms: AtomicU64::new(now_ms()),
            peer_limit: AtomicU32::new(u32::MAX),
        });
        tokio::spawn(drive(conn, load.clone(), endpoint.authority.to_string()));
        let mut open = worker.open.lock().unwrap_or_else(|p| p.into_inner());
        open.push(Conn {
            sender: sender.clone(),
            load: load.clone(),
        });
        Ok((sender, load))
    }
}

/// Runs the connection's dispatch (hyper runs the connection's I/O as a task of its own),
/// keeping `load.peer_limit` at what the upstream last said in its SETTINGS, read after each
/// turn, that is each request handed over (a field behind h2's lock, stored only when it
/// changes). h2's 1 before the first SETTINGS is not taken (nor, so, an upstream
/// that says 1: its requests queue on the connection, as they did before limits were read). A
/// limit of 0 is taken as 1: the request that opens a connection goes on it whatever its limit.
async fn drive(
    conn: http2::Connection<TokioIo<UpstreamConnection>, UpstreamBody, TokioExecutor>,
    load: Arc<Load>,
    name: String,
) {
    use std::future::Future;
    tokio::pin!(conn);
    let ended = std::future::poll_fn(|cx| {
        let turn = conn.as_mut().poll(cx);
        let said = conn.current_max_send_streams();
        let peer = u32::try_from(said).unwrap_or(u32::MAX).max(1);
        if said != 1 && load.peer_limit.load(Ordering::Relaxed) != peer {
            load.peer_limit.store(peer, Ordering::Relaxed);
        }
        turn
    })
    .await;
    if let Err(e) = ended {
        tracing::debug!(endpoint = %name, error = %e, "upstream HTTP/2 connection ended");
    }
}

/// The oldest open connection with room for one more stream, and that stream counted on it.
/// Connections that closed are dropped from the list, and so are those past the first that
/// carried nothing for `idle_ms` (`pool.idleTimeout`: a burst's extra connections), which
/// closes them. (Under the list's lock, so two requests never both take a last room.)
fn room(c: &WorkerConnections, limit: u32, idle_ms: u64) -> Option<(Sender, StreamCount)> {
    let mut open = c.open.lock().unwrap_or_else(|p| p.into_inner());
    open.retain(|c| !c.sender.is_closed());
    if open.len() > 1 {
        let now = now_ms();
        let mut index = 0;
        open.retain(|c| {
            index += 1;
            index == 1 || !c.load.idle_for(now, idle_ms)
        });
    }
    let conn = open.iter().find(|c| c.load.has_room(limit))?;
    conn.load.streams.fetch_add(1, Ordering::Relaxed);
    Some((conn.sender.clone(), StreamCount(conn.load.clone())))
}

/// The open connection carrying the fewest streams, that stream counted on it whatever the
/// limit (a dial failed).
fn least_loaded(c: &WorkerConnections) -> Option<(Sender, StreamCount)> {
    let open = c.open.lock().unwrap_or_else(|p| p.into_inner());
    let conn = open
        .iter()
        .filter(|c| !c.sender.is_closed())
        .min_by_key(|c| c.load.streams.load(Ordering::Relaxed))?;
    conn.load.streams.fetch_add(1, Ordering::Relaxed);
    Some((conn.sender.clone(), StreamCount(conn.load.clone())))
}

impl Load {
    /// Carries fewer streams than `limit` and than the upstream allows.
    fn has_room(&self, limit: u32) -> bool {
        self.streams.load(Ordering::Relaxed) < limit.min(self.peer_limit.load(Ordering::Relaxed))
    }

    /// Carries no stream, and has carried none for `idle_ms`.
    fn idle_for(&self, now: u64, idle_ms: u64) -> bool {
        self.streams.load(Ordering::Relaxed) == 0
            && now.saturating_sub(self.idle_since_ms.load(Ordering::Relaxed)) >= idle_ms
    }
}
