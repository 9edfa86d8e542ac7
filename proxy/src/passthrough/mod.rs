//! TCP listeners: TLS passthrough routed by the ClientHello's SNI, or plain TCP to one
//! upstream. The upstream's endpoints, P2C balancing, connection limit, connect timeout and
//! outlier ejection are the same as for HTTP; the bytes pass untouched.

mod proxy_protocol;
pub mod sniff;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use proxyfleet_config::{TcpMode, TcpProxy};

use crate::metrics::{Metrics, TcpLabels};
use crate::router::HostMatch;
use crate::upstream::{pick_avoiding, EndpointSlot, UpstreamCluster};
use sniff::{Sniffed, Sniffer};

/// Where one route's connections go, with its counters.
pub struct TcpTarget {
    matches: Vec<HostMatch>,
    upstream: Arc<UpstreamCluster>,
    relayed: Counter,
    upstream_failed: Counter,
    to_upstream: Counter,
    to_client: Counter,
    duration: Histogram,
}

/// A TCP listener's compiled settings (rebuilt on reload, like HTTP routes).
pub struct CompiledTcpListener {
    /// Read the ClientHello and route by its SNI (tlsPassthrough), or not (tcp).
    sniff_sni: bool,
    routes: Vec<TcpTarget>,
    default: Option<TcpTarget>,
    idle: Duration,
    hello_timeout: Duration,
    proxy_protocol: bool,
    no_route: Counter,
    not_tls: Counter,
}

impl CompiledTcpListener {
    /// `lookup` resolves an upstream name (validated beforehand, so None only on a bug).
    pub fn new(
        listener: &str,
        t: &TcpProxy,
        lookup: impl Fn(&str) -> Option<Arc<UpstreamCluster>>,
        metrics: &Metrics,
    ) -> Option<Self> {
        let target = |route: &str, names: &[String], upstream: &str| -> Option<TcpTarget> {
            let labels = TcpLabels {
                listener: listener.to_string(),
                route: route.to_string(),
            };
            let result = |result| metrics.tcp.connections(&labels, result);
            let bytes = |direction| metrics.tcp.bytes(&labels, direction);
            Some(TcpTarget {
                matches: names.iter().map(|n| HostMatch::parse(n)).collect(),
                upstream: lookup(upstream)?,
                relayed: result("relayed"),
                upstream_failed: result("upstream_failed"),
                to_upstream: bytes("to_upstream"),
                to_client: bytes("to_client"),
                duration: metrics.tcp.duration.get_or_create(&labels).clone(),
            })
        };
        let routes = t
            .routes
            .iter()
            .map(|r| target(&r.name, &r.server_names, &r.upstream))
            .collect::<Option<Vec<_>>>()?;
        let default = match &t.default_upstream {
            Some(u) => Some(target("default", &[], u)?),
            None => None,
        };
        let refusals = TcpLabels {
            listener: listener.to_string(),
            route: String::new(),
        };
        let refused = |result| metrics.tcp.connections(&refusals, result);
        Some(Self {
            sniff_sni: t.mode == TcpMode::TlsPassthrough,
            routes,
            default,
            idle: t.idle_timeout.get(),
            hello_timeout: t.client_hello_timeout.get(),
            proxy_protocol: t.proxy_protocol,
            no_route: refused("no_route"),
            not_tls: refused("not_tls"),
        })
    }

    fn target(&self, server_name: Option<&str>) -> Option<&TcpTarget> {
        server_name
            .and_then(|n| self.routes.iter().find(|r| r.matches.iter().any(|m| m.matches(n))))
            .or(self.default.as_ref())
    }
}

/// Reads until the ClientHello is complete: the bytes read, and the server name.
async fn read_client_hello(client: &mut TcpStream) -> Result<(Vec<u8>, Option<String>), ()> {
    let mut sniffer = Sniffer::default();
    let mut seen = Vec::with_capacity(2048);
    let mut buf = [0u8; 4096];
    loop {
        let n = client.read(&mut buf).await.map_err(|_| ())?;
        if n == 0 {
            return Err(());
        }
        seen.extend_from_slice(&buf[..n]);
        match sniffer.feed(&buf[..n]) {
            Sniffed::NeedMore => {}
            Sniffed::Hello { server_name } => return Ok((seen, server_name)),
            Sniffed::NotTls => return Err(()),
        }
    }
}

/// Connects to an endpoint of the upstream: P2C, at most two endpoints tried, each within the
/// upstream's connect timeout (a wait for one of its connection permits first, within the same
/// timeout again); connect failures count towards ejection, a full endpoint does not.
async fn connect(cluster: &UpstreamCluster) -> Option<(TcpStream, EndpointSlot)> {
    let endpoints = cluster.endpoints.load_full();
    let timeout = cluster.config.pool.connect_timeout.get();
    let mut tried: Option<http::uri::Authority> = None;
    for _ in 0..2.min(endpoints.len()) {
        let endpoint = pick_avoiding(&endpoints, tried.as_ref())?.clone();
        tried = Some(endpoint.authority.clone());
        // An endpoint at its own connection limit is our limit, not its failure: no ejection.
        let Ok(Some(slot)) = tokio::time::timeout(timeout, EndpointSlot::take(endpoint.clone())).await else {
            continue;
        };
        let attempt = tokio::time::timeout(timeout, TcpStream::connect(endpoint.authority.as_str()));
        if let Ok(Ok(tcp)) = attempt.await {
            cluster.metrics.connect_ok.inc();
            endpoint.record_success();
            let _ = tcp.set_nodelay(true);
            return Some((tcp, slot));
        }
        cluster.metrics.connect_error.inc();
        cluster.record_failure(&endpoint, true);
    }
    None
}

/// One client connection on a TCP listener.
pub async fn serve(listener: &CompiledTcpListener, mut client: TcpStream, remote: SocketAddr, local: SocketAddr) {
    let started = Instant::now();
    let (first_bytes, server_name) = if listener.sniff_sni {
        match tokio::time::timeout(listener.hello_timeout, read_client_hello(&mut client)).await {
            Ok(Ok(hello)) => hello,
            _ => {
                listener.not_tls.inc();
                return;
            }
        }
    } else {
        (Vec::new(), None)
    };
    let Some(target) = listener.target(server_name.as_deref()) else {
        listener.no_route.inc();
        tracing::debug!(client = %remote, sni = ?server_name, "tcp: no route for this server name");
        return;
    };
    let Some((mut upstream, _slot)) = connect(&target.upstream).await else {
        target.upstream_failed.inc();
        return;
    };
    let mut preamble = if listener.proxy_protocol {
        proxy_protocol::header(remote, local)
    } else {
        Vec::new()
    };
    preamble.extend_from_slice(&first_bytes);
    if !preamble.is_empty() && upstream.write_all(&preamble).await.is_err() {
        target.upstream_failed.inc();
        return;
    }
    target.relayed.inc();
    let moved = crate::relay::relay(client, upstream, listener.idle).await;
    target.to_upstream.inc_by(moved.to_upstream + first_bytes.len() as u64);
    target.to_client.inc_by(moved.to_client);
    target.duration.observe(started.elapsed().as_secs_f64());
}
