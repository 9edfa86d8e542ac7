//! An upstream cluster: its endpoints (static or from DNS), the balancer, outlier detection,
//! health checks and the pooled client that carries requests to them.

mod endpoint;
mod h1pool;
mod h2pool;
mod pool;
pub mod sessions;

use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::ServerName;

use proxyfleet_config::{Upstream, UpstreamProtocol};

pub use endpoint::{now_ms, pick, pick_avoiding, Endpoint};
pub use pool::{ConnectionFreshness, UpstreamConnector};

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
    pub client: Client<UpstreamConnector, UpstreamBody>,
    /// Our own HTTP/1.1 pool, used instead of `client` when the upstream speaks HTTP/1.1.
    h1: Option<Arc<h1pool::H1Pool>>,
    /// Our own HTTP/2 connections, used when the upstream is configured `protocol: h2`.
    h2: Option<h2pool::H2Pool>,
    pub scheme: http::uri::Scheme,
    pub metrics: UpstreamMetrics,
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
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(config.pool.idle_timeout.get())
            .pool_max_idle_per_host(config.pool.max_idle_per_endpoint as usize)
            .http2_only(config.protocol == UpstreamProtocol::H2)
            .http2_keep_alive_interval(Some(Duration::from_secs(30)))
            .retry_canceled_requests(true)
            .set_host(false);
        // HTTP/1.1 for sure: configured so, or plain TCP (no ALPN) without `h2`.
        let h1_only = config.protocol == UpstreamProtocol::Http1
            || (config.tls.is_none() && config.protocol == UpstreamProtocol::Auto);
        let h1 = h1_only.then(|| {
            Arc::new(h1pool::H1Pool::new(
                connector.clone(),
                config.pool.max_idle_per_endpoint as usize,
                config.pool.idle_timeout.get(),
            ))
        });
        let h2 =
            (config.protocol == UpstreamProtocol::H2).then(|| h2pool::H2Pool::new(connector.clone(), scheme.clone()));
        let client = builder.build(connector);
        let endpoints = static_endpoints(config)?;
        let cluster = Arc::new(Self {
            name: name.into(),
            config: config.clone(),
            material,
            endpoints: ArcSwap::from_pointee(endpoints),
            client,
            h1,
            h2,
            scheme,
            metrics,
        });
        if cluster.h1.is_some() {
            tokio::spawn(h1pool::reap_until_dropped(Arc::downgrade(&cluster)));
        }
        if config.dns.is_some() {
            tokio::spawn(refresh_dns(Arc::downgrade(&cluster)));
        }
        if config.health_check.is_some() {
            tokio::spawn(health_check(Arc::downgrade(&cluster)));
        }
        Ok(cluster)
    }

    /// The request target for `path_and_query` at `endpoint`: origin-form for our HTTP/1.1
    /// and HTTP/2 pools (what an origin server expects; the h2 pool adds the request's own host as
    /// `:authority`), absolute for hyper-util's client (its pool key).
    pub fn request_uri(
        &self,
        endpoint: &http::uri::Authority,
        path_and_query: http::uri::PathAndQuery,
    ) -> Result<http::Uri, http::Error> {
        if self.h1.is_some() || self.h2.is_some() {
            return Ok(http::Uri::from(path_and_query));
        }
        http::Uri::builder()
            .scheme(self.scheme.clone())
            .authority(endpoint.clone())
            .path_and_query(path_and_query)
            .build()
    }

    /// Sends `req` (its URI from `request_uri`) to `endpoint`. Returns the response and whether
    /// it came on a reused connection.
    pub async fn send(
        &self,
        endpoint: &Arc<Endpoint>,
        req: http::Request<UpstreamBody>,
    ) -> Result<(http::Response<hyper::body::Incoming>, bool), SendError> {
        if let Some(h1) = &self.h1 {
            return h1.send(endpoint, req).await.map_err(|e| SendError {
                connect: matches!(e, h1pool::H1Error::Connect(_) | h1pool::H1Error::Handshake { .. }),
                error: Box::new(e),
            });
        }
        if let Some(h2) = &self.h2 {
            return h2.send(endpoint, req).await.map_err(|e| SendError {
                connect: matches!(e, h2pool::H2Error::Connect(_) | h2pool::H2Error::Handshake { .. }),
                error: Box::new(e),
            });
        }
        match self.client.request(req).await {
            Ok(resp) => {
                let reused = resp
                    .extensions()
                    .get::<ConnectionFreshness>()
                    .is_some_and(|f| !f.take_fresh());
                Ok((resp, reused))
            }
            Err(e) => Err(SendError {
                connect: e.is_connect(),
                error: Box::new(e),
            }),
        }
    }

    /// Sends an upgrade request on a dedicated HTTP/1.1 connection. Only HTTP/1.1 clusters
    /// (plain, or `protocol: http1`) can: an h2 or ALPN-negotiated connection cannot switch.
    pub async fn send_upgrade(
        &self,
        endpoint: &Arc<Endpoint>,
        req: http::Request<UpstreamBody>,
    ) -> Result<http::Response<hyper::body::Incoming>, SendError> {
        let Some(h1) = &self.h1 else {
            return Err(SendError {
                connect: false,
                error: "upgrades need an HTTP/1.1 upstream (protocol: http1 for TLS upstreams)".into(),
            });
        };
        h1.send_upgrade(endpoint, req).await.map_err(|e| SendError {
            connect: matches!(e, h1pool::H1Error::Connect(_) | h1pool::H1Error::Handshake { .. }),
            error: Box::new(e),
        })
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

/// Active HTTP health checks of every endpoint until the cluster is dropped.
async fn health_check(cluster: Weak<UpstreamCluster>) {
    loop {
        let Some(c) = cluster.upgrade() else { return };
        let Some(hc) = c.config.health_check.clone() else {
            return;
        };
        let endpoints = c.endpoints.load_full();
        for e in endpoints.iter() {
            let Ok(pq) = http::uri::PathAndQuery::try_from(hc.path.as_str()) else {
                continue;
            };
            let Ok(uri) = c.request_uri(&e.authority, pq) else {
                continue;
            };
            let mut req = http::Request::new(UpstreamBody::Empty);
            *req.uri_mut() = uri;
            if let Ok(host) = http::HeaderValue::from_str(e.authority.as_str()) {
                req.headers_mut().insert(http::header::HOST, host);
            }
            let healthy = matches!(
                tokio::time::timeout(hc.timeout.get(), c.send(e, req)).await,
                Ok(Ok((resp, _))) if resp.status().is_success()
            );
            let was = e.healthy.swap(healthy, std::sync::atomic::Ordering::Relaxed);
            if was != healthy {
                tracing::warn!(upstream = %c.name, endpoint = %e.authority, healthy, "health check changed");
            }
        }
        drop(c);
        tokio::time::sleep(hc.interval.get()).await;
    }
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
