//! The proxy process: shared state, listeners, admin, reload, and graceful drain.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use proxyfleet_config::{Listener, ProxyConfig};

use crate::client_slots::ConnectionSlot;
pub use crate::config_file::{read_config, ConfigFileError};
use crate::connection_life::{Ending, RequestBudget};
use crate::forwarding::TlsFacts;
use crate::handler::{self, ClientInfo};
use crate::metrics::{ClientHandshakeLabels, ListenerLabels, Metrics};
use crate::state::{ProxyState, StateError};
use crate::tls::ServerResumption;

pub use crate::shared::Shared;
use crate::workers::Workers;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    ConfigFile(#[from] ConfigFileError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("binding {what} {address}: {source}")]
    Bind {
        what: String,
        address: String,
        source: std::io::Error,
    },
}

/// A started proxy: its bound addresses and a handle to drain it.
pub struct RunningProxy {
    pub listener_addrs: HashMap<String, SocketAddr>,
    pub admin_addr: SocketAddr,
    pub shared: Arc<Shared>,
    shutdown_tx: watch::Sender<bool>,
    pub done: tokio::task::JoinHandle<()>,
}

impl RunningProxy {
    /// Starts the SIGTERM-style drain (readiness off, grace, stop accepting, finish in-flight).
    pub fn drain(&self) {
        let _ = self.shutdown_tx.send(true);
    }
}

/// The state built from `config`, and the DNS upstreams readiness waits for: a pod that cannot
/// reach any upstream yet must not receive traffic.
fn build_shared(
    config: &ProxyConfig,
    config_path: Option<PathBuf>,
) -> Result<(Arc<Shared>, Vec<Arc<crate::upstream::UpstreamCluster>>), ServerError> {
    let metrics = Metrics::new();
    let resumption: HashMap<_, _> = config
        .listeners
        .iter()
        .map(|l| (l.name.clone(), Arc::new(ServerResumption::new())))
        .collect();
    let state = ProxyState::build(config.clone(), None, &metrics, &resumption)?;
    state.publish_metrics(&metrics);
    if std::env::var_os("SSLKEYLOGFILE").is_some() {
        tracing::warn!(
            "SSLKEYLOGFILE is set: TLS session secrets are being written to it. Never do this in production."
        );
    }
    let no_route_metrics = metrics.route_handles("", "");
    let dns_upstreams: Vec<_> = state
        .upstreams
        .values()
        .filter(|u| u.config.dns.is_some())
        .cloned()
        .collect();
    let shared = Arc::new(Shared {
        state: ArcSwap::from_pointee(state),
        metrics,
        ready: AtomicBool::new(dns_upstreams.is_empty()),
        resumption,
        config_path,
        no_route_metrics,
        live_weights: Default::default(),
        acme: Default::default(),
        per_ip: Default::default(),
    });

    Ok((shared, dns_upstreams))
}

async fn bind_admin(address: &str) -> Result<(TcpListener, SocketAddr), ServerError> {
    let admin = TcpListener::bind(address).await.map_err(|source| ServerError::Bind {
        what: "admin".into(),
        address: address.to_string(),
        source,
    })?;
    let admin_addr = admin.local_addr().map_err(|source| ServerError::Bind {
        what: "admin".into(),
        address: address.to_string(),
        source,
    })?;
    Ok((admin, admin_addr))
}

/// Starts a proxy on the calling runtime alone (one worker).
pub async fn start(config: ProxyConfig, config_path: Option<PathBuf>) -> Result<RunningProxy, ServerError> {
    start_with_workers(config, config_path, Workers::none()).await
}

/// Starts a proxy whose listeners accept on the calling runtime (worker 0) and on each of
/// `workers`, which run until the drain has ended.
pub async fn start_with_workers(
    config: ProxyConfig,
    config_path: Option<PathBuf>,
    workers: Workers,
) -> Result<RunningProxy, ServerError> {
    let (shared, dns_upstreams) = build_shared(&config, config_path)?;

    // Weights from the mounted directory are in force before the first request is accepted.
    if let Some(dir) = &config.admin.live_weights_dir {
        crate::live_weights::spawn_watch(shared.clone(), dir.into());
    }

    let (admin, admin_addr) = bind_admin(&config.admin.address).await?;
    tokio::spawn(crate::admin::serve(admin, shared.clone()));

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    if !dns_upstreams.is_empty() {
        let shared = shared.clone();
        let shutdown = shutdown_rx.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            while !dns_upstreams.iter().all(|u| !u.endpoints.load().is_empty())
                && started.elapsed() < Duration::from_secs(30)
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if !*shutdown.borrow() {
                shared.ready.store(true, Ordering::Relaxed);
            }
        });
    }
    let (stop_accepting_tx, stop_accepting_rx) = watch::channel(false);
    let graceful = Arc::new(crate::connection_life::Drain::default());
    let conn_limit = Arc::new(Semaphore::new(config.limits.max_connections as usize));
    let mut listener_addrs = HashMap::new();
    let mut accept_tasks = Vec::new();
    let accepting = Accepting {
        shared: &shared,
        graceful: &graceful,
        conn_limit: &conn_limit,
        stop: &stop_accepting_rx,
        workers: workers.handles(),
    };
    for l in &config.listeners {
        let (addr, tasks) = start_listener(l, &accepting)?;
        listener_addrs.insert(l.name.clone(), addr);
        accept_tasks.extend(tasks);
    }
    crate::reload::spawn_watch(shared.clone());

    let done = tokio::spawn(drain_on_shutdown(
        shared.clone(),
        shutdown_rx.clone(),
        stop_accepting_tx,
        accept_tasks,
        graceful,
        workers,
    ));

    Ok(RunningProxy {
        listener_addrs,
        admin_addr,
        shared,
        shutdown_tx,
        done,
    })
}

/// What every accept loop of a proxy shares.
struct Accepting<'a> {
    shared: &'a Arc<Shared>,
    graceful: &'a Arc<crate::connection_life::Drain>,
    conn_limit: &'a Arc<Semaphore>,
    stop: &'a watch::Receiver<bool>,
    /// The workers beside the calling runtime's; each accepts on its own socket.
    workers: &'a [tokio::runtime::Handle],
}

impl Accepting<'_> {
    fn accept_loop(&self, l: &Listener, tcp: TcpListener) -> impl Future<Output = ()> + Send + 'static {
        accept_loop(
            l.clone(),
            tcp,
            self.shared.clone(),
            self.graceful.clone(),
            self.conn_limit.clone(),
            self.stop.clone(),
        )
    }
}

/// Binds one listener (TCP on every worker, and UDP for HTTP/3 on the calling one) and starts
/// accepting; returns its address and its accept tasks.
fn start_listener(
    l: &Listener,
    accepting: &Accepting<'_>,
) -> Result<(SocketAddr, Vec<tokio::task::JoinHandle<()>>), ServerError> {
    let mut accept_tasks = Vec::new();
    let failed = |source| ServerError::Bind {
        what: format!("listener {}", l.name),
        address: l.address.clone(),
        source,
    };
    let reuse_port = !accepting.workers.is_empty();
    let address = parse_address(&l.address).map_err(failed)?;
    // Held until every worker's socket is bound, so that no one else takes the port between.
    let probe = if reuse_port {
        Some(unclaimed(address).map_err(failed)?)
    } else {
        None
    };
    let address = probe.as_ref().map_or(Ok(address), |p| p.local_addr()).map_err(failed)?;
    let tcp = bind(address, reuse_port).map_err(failed)?;
    let addr = tcp.local_addr().map_err(failed)?;
    if let Some(endpoint) = bind_quic(l, &tcp, accepting.shared)? {
        let (l, shared, graceful, limit, stop) = (
            l.clone(),
            accepting.shared.clone(),
            accepting.graceful.clone(),
            accepting.conn_limit.clone(),
            accepting.stop.clone(),
        );
        accept_tasks.push(tokio::spawn(async move {
            crate::http3::serve(&l, endpoint, shared, graceful, limit, stop).await
        }));
    }
    for worker in accepting.workers {
        // Its socket is registered with the worker's own I/O driver.
        let _in_worker = worker.enter();
        let own = bind(addr, true).map_err(failed)?;
        accept_tasks.push(worker.spawn(accepting.accept_loop(l, own)));
    }
    accept_tasks.push(tokio::spawn(accepting.accept_loop(l, tcp)));
    drop(probe);
    Ok((addr, accept_tasks))
}

/// The QUIC endpoint of a listener with `tls.http3`: UDP, on the TCP listener's own address.
fn bind_quic(l: &Listener, tcp: &TcpListener, shared: &Shared) -> Result<Option<quinn::Endpoint>, ServerError> {
    let Some((config, ..)) = shared.state.load().listener_quic.get(&l.name).cloned() else {
        return Ok(None);
    };
    let failed = |source| ServerError::Bind {
        what: format!("listener {} (HTTP/3, UDP)", l.name),
        address: l.address.clone(),
        source,
    };
    let address = tcp.local_addr().map_err(failed)?;
    crate::http3::bind(address, &config).map(Some).map_err(failed)
}

fn parse_address(address: &str) -> std::io::Result<SocketAddr> {
    address
        .parse()
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not IP:port"))
}

/// A socket bound to `addr` (port 0 resolved to a free port) when nothing listens on it yet: a
/// group of `SO_REUSEPORT` sockets would otherwise let another process of the same user (a
/// second instance, a stale one) join it and take part of the traffic, where a plain bind
/// fails. Bound, not listening: no client can connect to it, and the group can still form
/// beside it.
fn unclaimed(addr: SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
    let probe = reusable_socket(addr)?;
    probe.bind(addr)?;
    Ok(probe)
}

/// A TCP socket of `addr`'s family with `SO_REUSEADDR` (a restart binds despite TIME_WAIT).
fn reusable_socket(addr: SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    Ok(socket)
}

/// A listening socket on `addr`; with `reuse_port`, one of several (one per worker) that the
/// kernel spreads new connections across. Linux lets only the same user join such a group.
fn bind(addr: SocketAddr, reuse_port: bool) -> std::io::Result<TcpListener> {
    let socket = reusable_socket(addr)?;
    if reuse_port {
        socket.set_reuseport(true)?;
    }
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

/// On shutdown: readiness off, the grace period (still accepting), stop accepting, then wait
/// for in-flight requests up to the drain deadline.
async fn drain_on_shutdown(
    shared: Arc<Shared>,
    mut rx: watch::Receiver<bool>,
    stop_accepting_tx: watch::Sender<bool>,
    accept_tasks: Vec<tokio::task::JoinHandle<()>>,
    graceful: Arc<crate::connection_life::Drain>,
    workers: Workers,
) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            break;
        }
    }
    let drain = shared.state.load().config.drain.clone();
    shared.ready.store(false, Ordering::Relaxed);
    tracing::info!(grace = %drain.grace_period, "draining: readiness off, still accepting during the grace period");
    tokio::time::sleep(drain.grace_period.get()).await;
    let _ = stop_accepting_tx.send(true);
    for t in accept_tasks {
        let _ = t.await;
    }
    tracing::info!(deadline = %drain.deadline, "stopped accepting; waiting for in-flight requests");
    if tokio::time::timeout(drain.deadline.get(), graceful.drained())
        .await
        .is_err()
    {
        tracing::warn!("drain deadline reached with requests still in flight");
    }
    tracing::info!("drained");
    workers.stop();
}

/// What every connection of one listener shares.
struct ListenerContext {
    shared: Arc<Shared>,
    builder: ConnectionBuilders,
    name: String,
    is_tls: bool,
    /// A TCP listener (passthrough or plain TCP): bytes are relayed, no HTTP.
    is_tcp: bool,
    handshake_timeout: Duration,
    active: prometheus_client::metrics::gauge::Gauge,
    /// Client handshakes: full, resumed, failed.
    handshakes: [prometheus_client::metrics::counter::Counter; 3],
    access_log: Option<Arc<crate::access_log::ListenerLog>>,
    https_redirect: Option<proxyfleet_config::HttpsRedirect>,
    /// `Alt-Svc` advertising HTTP/3, added to every response when `tls.http3` advertises.
    alt_svc: Option<http::HeaderValue>,
}

impl ListenerContext {
    fn new(listener: &Listener, shared: Arc<Shared>, port: u16) -> Self {
        let active = shared
            .metrics
            .active_connections
            .get_or_create(&ListenerLabels {
                listener: listener.name.clone(),
            })
            .clone();
        let hs = |kind| {
            shared
                .metrics
                .client_handshakes
                .get_or_create(&ClientHandshakeLabels {
                    listener: listener.name.clone(),
                    kind,
                })
                .clone()
        };
        let handshakes = [hs("full"), hs("resumed"), hs("failed")];
        let limits = shared.state.load().config.limits.clone();
        let access_log = crate::access_log::ListenerLog::for_listener(listener, &shared.metrics);
        Self {
            builder: ConnectionBuilders::new(&limits),
            name: listener.name.clone(),
            is_tls: listener.tls.is_some(),
            is_tcp: listener.tcp.is_some(),
            handshake_timeout: limits.header_read_timeout.get(),
            active,
            handshakes,
            access_log,
            https_redirect: listener.https_redirect.clone(),
            alt_svc: listener
                .tls
                .as_ref()
                .and_then(|t| t.http3.as_ref())
                .filter(|h| h.advertises())
                .and_then(|h| http::HeaderValue::from_str(&h.alt_svc(port)).ok()),
            shared,
        }
    }

    fn client(
        &self,
        remote: SocketAddr,
        tls: Option<TlsFacts>,
        (slot, drain): (ConnectionSlot, watch::Receiver<bool>),
    ) -> Arc<ClientInfo> {
        let mut client = ClientInfo::new(remote, tls);
        client.access_log = self.access_log.clone();
        client.slot = Some(slot);
        client.drain = Some(drain);
        Arc::new(client)
    }

    /// The service for one connection's requests: the proxy, or the HTTPS redirect.
    fn service(
        &self,
        client: Arc<ClientInfo>,
        budget: Arc<RequestBudget>,
    ) -> impl hyper::service::Service<
        http::Request<hyper::body::Incoming>,
        Response = http::Response<crate::body::ClientBody>,
        Error = std::convert::Infallible,
        Future = impl Future<Output = Result<http::Response<crate::body::ClientBody>, std::convert::Infallible>> + Send,
    > + Send
           + 'static {
        let shared = self.shared.clone();
        let redirect = self.https_redirect.clone();
        let alt_svc = self.alt_svc.clone();
        hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let in_flight = budget.count();
            let (shared, client, redirect) = (shared.clone(), client.clone(), redirect.clone());
            let alt_svc = alt_svc.clone();
            async move {
                let _in_flight = in_flight;
                match redirect {
                    // An ACME HTTP-01 challenge is answered on a redirecting listener too.
                    Some(r) => Ok(shared
                        .acme
                        .answer(&req)
                        .unwrap_or_else(|| crate::redirect::https_redirect(&req, &r))),
                    None => {
                        // Boxed: the request's future is ~14 KiB, and hyper moves the one it is
                        // given into a task per HTTP/2 stream (three copies of all of it per
                        // request, profiled: 73 % of the bytes memcpy moved at -m1); this way
                        // it is built once, in place, and what moves is a pointer.
                        let mut resp = Box::pin(handler::handle(req.map(Into::into), shared, client)).await?;
                        if let Some(v) = alt_svc {
                            resp.headers_mut().entry(http::header::ALT_SVC).or_insert(v);
                        }
                        Ok(resp)
                    }
                }
            }
        })
    }

    /// One client connection: the TLS handshake when the listener has TLS, then HTTP.
    async fn connection(
        self: Arc<Self>,
        stream: tokio::net::TcpStream,
        remote: SocketAddr,
        drain: watch::Receiver<bool>,
        slot: ConnectionSlot,
    ) {
        self.active.inc();
        if self.is_tcp {
            let tcp = self.shared.state.load().tcp_listeners.get(&self.name).cloned();
            if let (Some(tcp), Ok(local)) = (tcp, stream.local_addr()) {
                tcp.serve(stream, remote, local).await;
            }
            drop((drain, slot));
            self.active.dec();
            return;
        }
        let limits = &self.shared.state.load().config.limits;
        let (max_age, budget) = (
            limits.max_connection_age.map(|d| d.get()),
            Arc::new(RequestBudget::new(limits.max_requests_per_connection)),
        );
        let held = (slot, drain.clone());
        let ending = Ending {
            drain,
            max_age,
            budget: &budget,
            idle: Some(limits.idle_timeout()),
        };
        let timers = Timers {
            first_byte: self.handshake_timeout,
            send: limits.send_timeout(),
        };
        if !self.is_tls {
            let svc = self.service(self.client(remote, None, held), budget.clone());
            serve(&self.builder, false, ending, stream, svc, timers).await;
        } else if let Some((tls_config, certs)) = self.shared.state.load().listener_tls.get(&self.name).cloned() {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls_config);
            match tokio::time::timeout(self.handshake_timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let conn = tls.get_ref().1;
                    let resumed = conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
                    self.handshakes[usize::from(!resumed)].inc();
                    let facts = TlsFacts {
                        sni: conn.server_name().map(str::to_ascii_lowercase),
                        version: match conn.protocol_version() {
                            Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
                            _ => "TLSv1.3",
                        },
                        resumed,
                        certs,
                    };
                    // Serve what ALPN agreed on (RFC 7301): no HTTP/1.1 on an h2 connection.
                    let h2 = conn.alpn_protocol() == Some(b"h2");
                    let svc = self.service(self.client(remote, Some(facts), held), budget.clone());
                    serve(&self.builder, h2, ending, tls, svc, timers).await;
                }
                _ => {
                    self.handshakes[2].inc();
                }
            }
        }
        self.active.dec();
    }
}

async fn accept_loop(
    listener: Listener,
    tcp: TcpListener,
    shared: Arc<Shared>,
    graceful: Arc<crate::connection_life::Drain>,
    conn_limit: Arc<Semaphore>,
    mut stop_accepting: watch::Receiver<bool>,
) {
    let port = tcp.local_addr().map_or(0, |a| a.port());
    let ctx = Arc::new(ListenerContext::new(&listener, shared, port));
    loop {
        let accepted = tokio::select! {
            a = tcp.accept() => a,
            _ = stop_accepting.changed() => return,
        };
        let (stream, remote) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(listener = %listener.name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // The slot is taken once a connection is there, so that no idle accept loop (one per
        // listener and worker) holds one; at the limit this loop holds one accepted connection
        // and waits, and the kernel's backlog holds the rest. The drain's stop ends the wait.
        let permit = tokio::select! {
            p = conn_limit.clone().acquire_owned() => p,
            _ = stop_accepting.changed() => return,
        };
        let Ok(permit) = permit else { return };
        let ip_slot = match ctx.shared.state.load().config.limits.max_connections_per_client_ip {
            None => None,
            Some(cap) => match ctx.shared.per_ip.try_take(remote.ip(), cap) {
                Some(s) => Some(s),
                None => {
                    ctx.shared
                        .metrics
                        .refused_connections
                        .get_or_create(&PER_CLIENT_IP)
                        .inc();
                    tracing::debug!(listener = %listener.name, client = %remote.ip(), "connection refused: client IP at its cap");
                    continue; // dropping the stream closes it
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let slot = ConnectionSlot {
            _permit: permit,
            _ip: ip_slot,
        };
        tokio::spawn(ctx.clone().connection(stream, remote, graceful.watcher(), slot));
    }
}

const PER_CLIENT_IP: crate::metrics::RefusalLabels = crate::metrics::RefusalLabels {
    reason: "per_client_ip",
};

/// Connection builders: `auto` detects HTTP/1.1 or the HTTP/2 preface (plain listeners, TLS
/// with ALPN http/1.1 or none) and allows upgrades; `h2` serves only HTTP/2 (ALPN h2).
struct ConnectionBuilders {
    auto: auto::Builder<TokioExecutor>,
    h2: auto::Builder<TokioExecutor>,
}

impl ConnectionBuilders {
    fn new(limits: &proxyfleet_config::Limits) -> Self {
        let h2 = limits.http2.clone().unwrap_or_default();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout.get())
            .max_buf_size((limits.max_header_bytes as usize).max(8192))
            // A client may shut down its write side after sending the request (HTTP/1.0 style
            // clients, health checkers, `nc -N`). Without this hyper closes the connection when
            // it reads that EOF before the response is written: found by the request fuzzer,
            // ~1 in 1500 well-formed requests dropped without an answer.
            .half_close(true)
            .keep_alive(true);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_header_list_size(limits.max_header_bytes)
            .max_concurrent_streams(h2.max_concurrent_streams.unwrap_or(256))
            .initial_stream_window_size(h2.stream_window_bytes.unwrap_or(H2_WINDOW))
            .initial_connection_window_size(h2.connection_window_bytes.unwrap_or(H2_WINDOW))
            // A peer that stops answering PINGs (gone without a FIN, a dead NAT entry) is
            // closed instead of holding its slot for ever.
            .keep_alive_interval(Some(H2_PING_INTERVAL))
            .keep_alive_timeout(H2_PING_TIMEOUT)
            // WebSocket over HTTP/2 (RFC 8441).
            .enable_connect_protocol();
        Self {
            // Only `serve_connection` honours http2_only (hyper-util); h2 has no upgrades anyway.
            h2: builder.clone().http2_only(),
            auto: builder,
        }
    }
}

/// hyper's default windows, stated: a client can make us buffer at most this per stream and
/// per connection before flow control stops it.
const H2_WINDOW: u32 = 1024 * 1024;
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection's own timers.
#[derive(Clone, Copy)]
struct Timers {
    /// Enough to pick a protocol must arrive within this (the header-read timeout).
    first_byte: Duration,
    /// `limits.sendTimeout`.
    send: Duration,
}

/// Serves one connection (HTTP/2 only when `h2`); closes it when the client has not sent
/// enough to pick a protocol (nothing, or part of the HTTP/2 preface) within
/// `timers.first_byte`: hyper's header-read timer only starts once HTTP/1.1 is chosen.
async fn serve<I, S>(builders: &ConnectionBuilders, h2: bool, ending: Ending<'_>, io: I, svc: S, timers: Timers)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<crate::body::ClientBody>,
            Error = std::convert::Infallible,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    let (io, seen) = crate::first_byte::FirstByte::new(io);
    let io = TokioIo::new(crate::send_timeout::SendTimeout::new(io, timers.send));
    if h2 {
        let conn = builders.h2.serve_connection(io, svc);
        let served = crate::connection_life::run(conn, ending, |c| c.graceful_shutdown());
        drive(served, &seen, timers.first_byte).await;
    } else {
        let conn = builders.auto.serve_connection_with_upgrades(io, svc);
        let served = crate::connection_life::run(conn, ending, |c| c.graceful_shutdown());
        drive(served, &seen, timers.first_byte).await;
    }
}

/// Runs a connection to its end, unless it has sent too little by `first_byte_timeout`.
async fn drive<F: Future>(served: F, seen: &std::sync::atomic::AtomicUsize, first_byte_timeout: Duration) {
    tokio::pin!(served);
    tokio::select! {
        _ = &mut served => return,
        _ = tokio::time::sleep(first_byte_timeout) => {}
    }
    if seen.load(std::sync::atomic::Ordering::Relaxed) < crate::first_byte::PREFACE_LEN {
        tracing::debug!("closing a connection that sent too little to be served");
        return; // dropping the connection closes it
    }
    let _ = served.await;
}

/// Runs a proxy from `config`, read from `config_path` (reloads read it again), on the calling
/// runtime and `workers`, until `shutdown` completes, then drains and returns.
pub async fn run(
    config: ProxyConfig,
    config_path: PathBuf,
    workers: Workers,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let running = start_with_workers(config, Some(config_path), workers).await?;
    for (name, addr) in &running.listener_addrs {
        tracing::info!(listener = %name, %addr, "listening");
    }
    tracing::info!(addr = %running.admin_addr, "admin listening");
    shutdown.await;
    running.drain();
    let _ = running.done.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_of_reuse_port_sockets_is_not_formed_on_an_address_another_socket_listens_on() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = unclaimed(addr).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
        drop(taken);
        assert_eq!(unclaimed(addr).unwrap().local_addr().unwrap(), addr);

        let probe = unclaimed("127.0.0.1:0".parse().unwrap()).unwrap();
        let free = probe.local_addr().unwrap();
        assert_ne!(free.port(), 0);
        // The group forms beside the probe; once it listens, the probe's plain bind is refused.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _group = rt.block_on(async { [bind(free, true).unwrap(), bind(free, true).unwrap()] });
        drop(probe);
        assert_eq!(unclaimed(free).unwrap_err().kind(), std::io::ErrorKind::AddrInUse);
    }
}
