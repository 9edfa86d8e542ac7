//! An upstream cluster: its endpoints (static or from DNS), the balancer, outlier detection,
//! health checks and the pooled client that carries requests to them.

mod endpoint;
mod h1pool;
mod h1relay;
mod h1wire;
mod h2pool;
mod health;
pub mod outlier;
mod pool;
pub mod read_ahead;
pub mod response;
pub mod sessions;

use std::sync::{Arc, Weak};

use arc_swap::ArcSwap;
use rustls::pki_types::ServerName;

use proxyfleet_config::{Upstream, UpstreamProtocol};

pub use endpoint::{now_ms, pick, pick_avoiding, Alpn, Endpoint, EndpointSlot};
pub use h1relay::resendable;
pub use pool::UpstreamConnector;
pub use read_ahead::{ClientStalled, StreamCut};
pub use response::UpstreamResponse;

use crate::body::UpstreamBody;
use crate::metrics::UpstreamMetrics;
use crate::tls::{client_config, TlsError};

pub struct UpstreamCluster {
    pub name: Arc<str>,
    pub config: Upstream,
    /// Fingerprint of the TLS files this cluster was built from, so a reload can tell
    /// whether it may keep the cluster (and its warm pool).
    pub material: String,
    pub endpoints: ArcSwap<Vec<Arc<Endpoint>>>,
    /// HTTP/1.1 connections: configured `http1`, plain `auto`, or TLS `auto` endpoints that
    /// agreed on http/1.1.
    h1: Option<Arc<h1pool::H1Pool>>,
    /// HTTP/2 connections: configured `h2`, or TLS `auto` endpoints that agreed on h2.
    h2: Option<h2pool::H2Pool>,
    /// TLS with `protocol: auto`: each endpoint's first connection learns its protocol (ALPN).
    learns_alpn: bool,
    connector: UpstreamConnector,
    pub scheme: http::uri::Scheme,
    pub metrics: UpstreamMetrics,
    /// Held while an ejection is weighed against `maxEjectionPercent` (rare: a threshold
    /// reached), so endpoints failing together cannot all pass the cap at once.
    ejecting: std::sync::Mutex<()>,
    /// Set when a reload's cluster took over its endpoints: its background tasks stop.
    superseded: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for UpstreamCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamCluster").field("name", &self.name).finish()
    }
}

/// Why an upstream request got no response.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct SendError {
    /// The connection could not be made (safe to retry elsewhere).
    pub connect: bool,
    /// The upstream did not take the request in, for sure: never sent, or refused (HTTP/2
    /// REFUSED_STREAM, or above a GOAWAY's last stream, RFC 9113 §8.7). Any idempotent request
    /// may go to another endpoint (the route's `retries`).
    pub unsent: bool,
    /// No byte of answer came on an HTTP/1.1 connection that ended: the upstream may have
    /// carried the request out, so only a safe method goes again (as the pool's own resend).
    pub unanswered: bool,
    #[source]
    pub error: Box<dyn std::error::Error + Send + Sync>,
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream {upstream}: {source}")]
    Tls { upstream: String, source: TlsError },
    #[error("upstream {upstream}: endpoint {endpoint:?} is not host:port")]
    Endpoint { upstream: String, endpoint: String },
    #[error("upstream {upstream}: TLS server name {name:?} is invalid")]
    ServerName { upstream: String, name: String },
}

impl UpstreamCluster {
    pub fn build(config: &Upstream, material: String, metrics: UpstreamMetrics) -> Result<Arc<Self>, UpstreamError> {
        let name = config.name.clone();
        let alpn: &[&[u8]] = match config.protocol {
            UpstreamProtocol::Auto => &[b"h2", b"http/1.1"],
            UpstreamProtocol::Http1 => &[b"http/1.1"],
            UpstreamProtocol::H2 => &[b"h2"],
        };
        let tls = tls_of(config, alpn)?;
        let scheme = if tls.is_some() {
            http::uri::Scheme::HTTPS
        } else {
            http::uri::Scheme::HTTP
        };
        let connector = UpstreamConnector {
            tls,
            connect_timeout: config.pool.connect_timeout.get(),
            metrics: metrics.clone(),
        };
        let learns_alpn = config.tls.is_some() && config.protocol == UpstreamProtocol::Auto;
        let h1 = (config.protocol != UpstreamProtocol::H2).then(|| {
            Arc::new(h1pool::H1Pool::new(
                connector.clone(),
                config.pool.max_idle_per_endpoint as usize,
                config.pool.idle_timeout.get(),
            ))
        });
        let h2 = (config.protocol == UpstreamProtocol::H2 || learns_alpn)
            .then(|| h2pool::H2Pool::new(connector.clone(), scheme.clone(), config));
        let endpoints = static_endpoints(config)?;
        let cluster = Arc::new(Self {
            name: name.into(),
            config: config.clone(),
            material,
            endpoints: ArcSwap::from_pointee(endpoints),
            h1,
            h2,
            learns_alpn,
            connector,
            scheme,
            metrics,
            ejecting: Default::default(),
            superseded: Default::default(),
        });
        if cluster.h1.is_some() {
            tokio::spawn(h1pool::reap_until_dropped(Arc::downgrade(&cluster)));
        }
        if config.dns.is_some() {
            tokio::spawn(refresh_dns(Arc::downgrade(&cluster)));
        }
        if config.health_check.is_some() {
            tokio::spawn(health::check_until_dropped(Arc::downgrade(&cluster)));
        }
        Ok(cluster)
    }

    /// The request target for `path_and_query` at `endpoint`: origin-form, what an origin
    /// server expects (the h2 pool adds the request's own host as `:authority`).
    pub fn request_uri(
        &self,
        _endpoint: &http::uri::Authority,
        path_and_query: http::uri::PathAndQuery,
    ) -> Result<http::Uri, http::Error> {
        Ok(http::Uri::from(path_and_query))
    }

    /// Sends `req` (its URI from `request_uri`) to `endpoint`. Returns the response and whether
    /// it came on a reused connection.
    pub async fn send(
        &self,
        endpoint: &Arc<Endpoint>,
        req: http::Request<UpstreamBody>,
    ) -> Result<(UpstreamResponse, bool), SendError> {
        let (h1, h2) = (self.h1.as_ref(), self.h2.as_ref());
        let alpn = if self.learns_alpn {
            endpoint.alpn()
        } else if h2.is_some() {
            Alpn::H2
        } else {
            Alpn::Http1
        };
        match (alpn, h1, h2) {
            (Alpn::H2, _, Some(h2)) => h2_send(h2, endpoint, req).await,
            (Alpn::Http1, Some(h1), _) => h1.send(endpoint, req).await.map_err(h1_error),
            (_, Some(h1), Some(h2)) => self.learn(endpoint, h1, h2, req).await,
            _ => Err(SendError {
                connect: false,
                unsent: false,
                unanswered: false,
                error: "no connection pool for this upstream".into(),
            }),
        }
    }

    /// An `auto` TLS endpoint's first connection: ALPN says which pool it joins.
    async fn learn(
        &self,
        endpoint: &Arc<Endpoint>,
        h1: &Arc<h1pool::H1Pool>,
        h2: &h2pool::H2Pool,
        req: http::Request<UpstreamBody>,
    ) -> Result<(UpstreamResponse, bool), SendError> {
        let io = self.connector.dial(&endpoint.authority).await.map_err(|e| SendError {
            connect: true,
            unsent: false,
            unanswered: false,
            error: Box::new(e),
        })?;
        if io.inner().negotiated_h2() {
            endpoint.learn_alpn(Alpn::H2);
            h2.adopt(endpoint, io).await.map_err(h2_error)?;
            h2_send(h2, endpoint, req).await
        } else {
            endpoint.learn_alpn(Alpn::Http1);
            h1.send_on(endpoint, io, req).await.map_err(h1_error)
        }
    }

    /// Sends an upgrade request on a dedicated HTTP/1.1 connection. Only HTTP/1.1 clusters
    /// (plain, or `protocol: http1`) can: an h2 or ALPN-negotiated connection cannot switch.
    pub async fn send_upgrade(
        &self,
        endpoint: &Arc<Endpoint>,
        req: http::Request<UpstreamBody>,
    ) -> Result<http::Response<hyper::body::Incoming>, SendError> {
        // An `auto` TLS endpoint upgrades once it is known to speak HTTP/1.1.
        let h1 = self
            .h1
            .as_ref()
            .filter(|_| !self.learns_alpn || endpoint.alpn() == Alpn::Http1);
        let Some(h1) = h1 else {
            return Err(SendError {
                connect: false,
                unsent: false,
                unanswered: false,
                error: "upgrades need an HTTP/1.1 upstream (protocol: http1 for TLS upstreams)".into(),
            });
        };
        h1.send_upgrade(endpoint, req).await.map_err(h1_error)
    }

    /// Takes `old`'s endpoint objects for the authorities both have (their pools, estimates,
    /// ejection and health); the others stay new. (A read-modify-write: a DNS answer stored
    /// meanwhile is not lost.) `old` is retired once the state holding `self` is in service.
    pub fn adopt_endpoints(&self, old: &UpstreamCluster) {
        let theirs = old.endpoints.load();
        self.endpoints.rcu(|mine| {
            mine.iter()
                .map(|e| {
                    theirs
                        .iter()
                        .find(|o| o.authority == e.authority)
                        .cloned()
                        .unwrap_or_else(|| e.clone())
                })
                .collect::<Vec<_>>()
        });
    }

    /// Replaced by a reload that took over its endpoints (`adopt_endpoints`).
    /// Replaced by a reload now in service: its health checks stop, though a connection that
    /// outlives the reload (a TCP pass-through) may keep it alive, so they never judge
    /// endpoints it shares with its successor twice, nor report its health as the upstream's.
    /// Not before the reload is in service: one refused later (a bad JWKS file) keeps this
    /// cluster running.
    pub fn retire(&self) {
        self.superseded.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn superseded(&self) -> bool {
        self.superseded.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Replaces the endpoint set, keeping the state of endpoints that remain.
    pub fn set_endpoints(&self, authorities: Vec<http::uri::Authority>) {
        let current = self.endpoints.load();
        let next: Vec<_> = authorities
            .into_iter()
            .map(|a| {
                current
                    .iter()
                    .find(|e| e.authority == a)
                    .cloned()
                    .unwrap_or_else(|| Arc::new(Endpoint::new(a, self.config.pool.max_connections_per_endpoint)))
            })
            .collect();
        let changed =
            next.len() != current.len() || next.iter().zip(current.iter()).any(|(a, b)| a.authority != b.authority);
        if changed {
            tracing::info!(upstream = %self.name, endpoints = ?next.iter().map(|e| e.authority.as_str()).collect::<Vec<_>>(), "upstream endpoints changed");
            self.endpoints.store(Arc::new(next));
        }
    }
}

/// Re-resolves the cluster's DNS name until the cluster is dropped (replaced by a reload).
async fn refresh_dns(cluster: Weak<UpstreamCluster>) {
    loop {
        let Some(c) = cluster.upgrade() else { return };
        let Some(dns) = c.config.dns.clone() else {
            return;
        };
        match tokio::net::lookup_host((dns.name.as_str(), dns.port)).await {
            Ok(addrs) => {
                let mut authorities: Vec<http::uri::Authority> =
                    addrs.filter_map(|a| a.to_string().parse().ok()).collect();
                authorities.sort_by(|a, b| a.as_str().cmp(b.as_str()));
                authorities.dedup();
                // An empty answer is kept out: better stale endpoints than none on a DNS hiccup.
                if !authorities.is_empty() {
                    c.set_endpoints(authorities);
                }
            }
            Err(e) => {
                tracing::warn!(upstream = %c.name, name = %dns.name, error = %e, "DNS refresh failed; keeping endpoints")
            }
        }
        drop(c);
        tokio::time::sleep(dns.refresh_interval.get()).await;
    }
}

async fn h2_send(
    h2: &h2pool::H2Pool,
    endpoint: &Arc<Endpoint>,
    req: http::Request<UpstreamBody>,
) -> Result<(UpstreamResponse, bool), SendError> {
    let (resp, reused, stream) = h2.send(endpoint, req).await.map_err(h2_error)?;
    Ok((resp.map(|b| response::FromUpstream::from(b).on_stream(stream)), reused))
}

fn h1_error(e: h1pool::H1Error) -> SendError {
    use h1pool::H1Error;
    SendError {
        connect: matches!(e, H1Error::Connect(_) | H1Error::Handshake { .. }),
        unsent: matches!(&e, H1Error::Request(h) if h.is_canceled()),
        unanswered: matches!(&e, H1Error::Relay(r) if r.unanswered()),
        error: Box::new(e),
    }
}

fn h2_error(e: h2pool::H2Error) -> SendError {
    use h2pool::H2Error;
    SendError {
        connect: matches!(e, H2Error::Connect(_) | H2Error::Handshake { .. }),
        unsent: matches!(&e, H2Error::Request(h) if h.is_canceled() || refused(h)),
        unanswered: false,
        error: Box::new(e),
    }
}

/// Whether an HTTP/2 request was refused unprocessed: its stream reset with REFUSED_STREAM, or
/// above the last stream of a GOAWAY the upstream sent.
fn refused(e: &hyper::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM) || (h2.is_go_away() && h2.is_remote());
        }
        cur = err.source();
    }
    false
}

/// A TLS client config and the name to present, for an upstream with TLS.
type UpstreamTlsClient = (Arc<rustls::ClientConfig>, Option<ServerName<'static>>);

/// The upstream's TLS client config and server name, when it has TLS.
fn tls_of(config: &Upstream, alpn: &[&[u8]]) -> Result<Option<UpstreamTlsClient>, UpstreamError> {
    let name = &config.name;
    Ok(match &config.tls {
        None => None,
        Some(t) => {
            // Enough TLS 1.3 tickets for every connection the pool may hold to reconnect
            // at once (at least 8, rustls's own default).
            let tickets = (config.pool.max_idle_per_endpoint as usize).clamp(8, 1024);
            let cfg = client_config(name, t, alpn, tickets).map_err(|source| UpstreamError::Tls {
                upstream: name.clone(),
                source,
            })?;
            let sn = match &t.server_name {
                Some(n) => Some(ServerName::try_from(n.clone()).map_err(|_| UpstreamError::ServerName {
                    upstream: name.clone(),
                    name: n.clone(),
                })?),
                None => None,
            };
            Some((cfg, sn))
        }
    })
}

/// The configured `host:port` endpoints.
fn static_endpoints(config: &Upstream) -> Result<Vec<Arc<Endpoint>>, UpstreamError> {
    config
        .endpoints
        .iter()
        .map(|e| {
            e.parse::<http::uri::Authority>()
                .map(|a| Arc::new(Endpoint::new(a, config.pool.max_connections_per_endpoint)))
                .map_err(|_| UpstreamError::Endpoint {
                    upstream: config.name.clone(),
                    endpoint: e.clone(),
                })
        })
        .collect()
}
