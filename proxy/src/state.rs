//! The running state built from one configuration: compiled routes, upstream clusters,
//! listener TLS configs. Built whole, then swapped atomically; a failed build changes nothing.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::ServerConfig;
use sha2::{Digest, Sha256};

use proxyfleet_config::{ProxyConfig, Route, Upstream};

use crate::metrics::{BundleLabels, CertLabels, Metrics};
use crate::mirror::CompiledMirror;
use crate::router::CompiledRoute;
use crate::split::CompiledBackend;
use crate::tls::{self, CertificateInfo, ServerResumption, SniCertificates, TlsError};
use crate::upstream::{UpstreamCluster, UpstreamError};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("listener {listener}: {source}")]
    ListenerTls { listener: String, source: TlsError },
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("route {route}: unknown upstream {upstream}")]
    UnknownUpstream { route: String, upstream: String },
    #[error("route {route}: {source}")]
    Jwks {
        route: String,
        source: crate::jwt::JwksError,
    },
    #[error("route {route}: grpcTranscoding: {source}")]
    Transcoding {
        route: String,
        source: crate::transcode::TranscodeLoadError,
    },
    #[error("trust bundle: {0}")]
    TrustBundle(TlsError),
    #[error(transparent)]
    TcpListener(#[from] crate::tcp_service::TcpServiceError),
    #[error(transparent)]
    Quic(#[from] crate::http3::QuicConfigError),
}

pub struct ProxyState {
    pub config: ProxyConfig,
    pub routes: Vec<CompiledRoute>,
    pub upstreams: HashMap<String, Arc<UpstreamCluster>>,
    /// Current TLS config of each TLS listener, by listener name, with its certificates.
    pub listener_tls: ListenerTlsMap,
    /// The QUIC config of each listener with `tls.http3`, its certificates, and whether it
    /// takes 0-RTT.
    pub listener_quic: ListenerQuicMap,
    /// `forwarding.trustedProxies`, parsed.
    pub trusted_proxies: Vec<proxyfleet_config::Cidr>,
    /// `tracing`: trace context and span export.
    pub tracer: Option<crate::trace_context::Tracer>,
    pub certificates: Vec<(String, CertificateInfo)>,
    pub trust_bundle_sha256: Option<String>,
    /// TCP listeners (passthrough, plain TCP, SOCKS5) by name.
    pub tcp_listeners: HashMap<String, Arc<crate::tcp_service::TcpService>>,
}

/// Fingerprint of an upstream's TLS files: a cluster is reused across reloads only when
/// both its configuration and these files are unchanged.
fn upstream_material(u: &Upstream) -> String {
    let mut h = Sha256::new();
    if let Some(t) = &u.tls {
        let files = t
            .ca_file
            .iter()
            .chain(t.client_certificate.iter().flat_map(|c| [&c.cert_file, &c.key_file]));
        for f in files {
            h.update(f.as_bytes());
            h.update(std::fs::read(f).unwrap_or_default());
        }
    }
    tls::hex(&h.finalize())
}

/// A route with its backends (the one upstream, or each weighted backend) and mirror resolved.
fn compile_route(
    r: &Route,
    upstreams: &HashMap<String, Arc<UpstreamCluster>>,
    metrics: &Metrics,
) -> Result<CompiledRoute, StateError> {
    let lookup = |name: &str| {
        upstreams.get(name).cloned().ok_or_else(|| StateError::UnknownUpstream {
            route: r.name.clone(),
            upstream: name.to_string(),
        })
    };
    let names: Vec<&str> = if r.backends.is_empty() {
        vec![r.upstream.as_str()]
    } else {
        r.backends.iter().map(|b| b.upstream.as_str()).collect()
    };
    let backends = names
        .into_iter()
        .map(|name| {
            Ok(CompiledBackend {
                upstream: lookup(name)?,
                metrics: metrics.route_handles(&r.name, name),
            })
        })
        .collect::<Result<Vec<_>, StateError>>()?;
    let mirror = match &r.mirror {
        Some(m) => Some(CompiledMirror::new(
            &r.name,
            m,
            lookup(&m.upstream)?,
            r.timeout.get(),
            metrics,
        )),
        None => None,
    };
    let mut compiled = CompiledRoute::new(r, backends, mirror);
    compiled.refused = Some(metrics.route_handles(&r.name, ""));
    if let Some(j) = &r.jwt {
        let jwt = crate::jwt::CompiledJwt::load(&r.name, j, metrics).map_err(|source| StateError::Jwks {
            route: r.name.clone(),
            source,
        })?;
        compiled.jwt = Some(jwt);
    }
    if let Some(t) = &r.grpc_transcoding {
        let loaded =
            crate::transcode::Transcoder::load(&r.name, t, metrics).map_err(|source| StateError::Transcoding {
                route: r.name.clone(),
                source,
            })?;
        compiled.transcoder = Some(loaded);
    }
    compiled.cors = r
        .cors
        .as_ref()
        .map(|c| crate::cors::CompiledCors::new(c, &r.name, metrics));

    Ok(compiled)
}

/// Each TLS listener's server config and certificates, and what the certificates are.
fn listeners_tls(
    config: &ProxyConfig,
    resumption: &HashMap<String, Arc<ServerResumption>>,
    metrics: &Metrics,
) -> Result<(ListenerTlsMap, Vec<(String, CertificateInfo)>), StateError> {
    let mut listener_tls = HashMap::new();
    let mut certificates = Vec::new();
    for l in &config.listeners {
        let Some(t) = &l.tls else { continue };
        let loaded = t
            .certificates
            .iter()
            .map(tls::load_certificate)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| StateError::ListenerTls {
                listener: l.name.clone(),
                source,
            })?;
        for c in &loaded {
            certificates.push((l.name.clone(), c.info.clone()));
        }
        let ocsp = |result| {
            metrics
                .ocsp_staples
                .get_or_create(&crate::metrics::OcspLabels {
                    listener: l.name.clone(),
                    result,
                })
                .clone()
        };
        for c in &loaded {
            match &c.ocsp {
                Some(Ok(_)) => ocsp("stapled").inc(),
                Some(Err(refusal)) => {
                    tracing::warn!(listener = %l.name, reason = refusal.label(), "OCSP response not stapled");
                    ocsp(refusal.label()).inc()
                }
                None => 0,
            };
        }
        let sni = Arc::new(SniCertificates::new(&loaded).with_staple_expiry_counter(ocsp("expired")));
        let fallback;
        let res = match resumption.get(&l.name) {
            Some(r) => r.as_ref(),
            None => {
                fallback = ServerResumption::new();
                &fallback
            }
        };
        let server = tls::server_config(&l.name, t, sni.clone(), res).map_err(|source| StateError::ListenerTls {
            listener: l.name.clone(),
            source,
        })?;
        listener_tls.insert(l.name.clone(), (server, sni));
    }

    Ok((listener_tls, certificates))
}

/// The QUIC config of every listener with `tls.http3`, from its TLS config.
fn listeners_quic(config: &ProxyConfig, tls: &ListenerTlsMap) -> Result<ListenerQuicMap, StateError> {
    let mut out = HashMap::new();
    for l in &config.listeners {
        let (Some(h3), Some((server, certs))) = (l.tls.as_ref().and_then(|t| t.http3.as_ref()), tls.get(&l.name))
        else {
            continue;
        };
        let quic = crate::http3::quic_server_config(&l.name, server, h3)?;
        out.insert(l.name.clone(), (quic, certs.clone(), h3.zero_rtt));
    }
    Ok(out)
}

/// A route whose rate limit or retry settings did not change keeps its buckets and retry
/// budget across a reload (a certificate renewed must not hand every limited client a full
/// burst again), as nginx keeps its `limit_req` zones.
fn keep_budgets(previous: &ProxyState, config: &ProxyConfig, routes: &mut [CompiledRoute]) {
    for (r, compiled) in config.routes.iter().zip(routes.iter_mut()) {
        let Some(i) = previous.config.routes.iter().position(|p| p.name == r.name) else {
            continue;
        };
        let (old, old_compiled) = (&previous.config.routes[i], &previous.routes[i]);
        if old.rate_limit == r.rate_limit {
            compiled.rate_limit = old_compiled.rate_limit.clone();
        }
        if old.retries == r.retries {
            compiled.retry_budget = old_compiled.retry_budget.clone();
        }
    }
}

/// What a rebuilt upstream keeps of its predecessor's endpoints.
/// - A DNS upstream (its TLS files changed, say) starts from the endpoints its predecessor
///   resolved, not from none until its first lookup answers (every request would get 503
///   until then, longer if DNS fails just then), as Envoy warms a cluster first.
/// - When nothing but its endpoint list or outlier detection changed, the endpoints that
///   remain are the same objects: their idle connections (no new handshakes after a scale-out
///   that a reload carries), latency estimate, ejection and health.
fn carry_endpoints(previous: Option<&ProxyState>, u: &proxyfleet_config::Upstream, next: &UpstreamCluster) {
    let Some(old) = previous.and_then(|p| p.upstreams.get(&u.name)) else {
        return;
    };
    if u.dns.is_some() && old.config.dns == u.dns {
        next.set_endpoints(old.endpoints.load().iter().map(|e| e.authority.clone()).collect());
    }
    if old.material == next.material && same_connections(&old.config, u) {
        next.adopt_endpoints(old);
    }
}

/// Whether two upstreams open and keep the same connections: equal but for their endpoint
/// list and outlier detection (read at each failure from the new cluster's config).
fn same_connections(a: &proxyfleet_config::Upstream, b: &proxyfleet_config::Upstream) -> bool {
    let strip = |u: &proxyfleet_config::Upstream| proxyfleet_config::Upstream {
        endpoints: Vec::new(),
        outlier_detection: Default::default(),
        ..u.clone()
    };
    strip(a) == strip(b)
}

/// TLS listeners by name: the server config and the certificates it selects from.
type ListenerTlsMap = HashMap<String, (Arc<ServerConfig>, Arc<SniCertificates>)>;
/// HTTP/3 listeners by name: the QUIC config, its certificates, and whether 0-RTT is on.
type ListenerQuicMap = HashMap<String, (Arc<quinn::ServerConfig>, Arc<SniCertificates>, bool)>;

impl ProxyState {
    pub fn build(
        config: ProxyConfig,
        previous: Option<&ProxyState>,
        metrics: &Metrics,
        resumption: &HashMap<String, Arc<ServerResumption>>,
    ) -> Result<Self, StateError> {
        let (listener_tls, certificates) = listeners_tls(&config, resumption, metrics)?;
        let listener_quic = listeners_quic(&config, &listener_tls)?;

        let mut upstreams = HashMap::new();
        for u in &config.upstreams {
            let material = upstream_material(u);
            let reused = previous
                .and_then(|p| p.upstreams.get(&u.name))
                .filter(|old| old.config == *u && old.material == material)
                .cloned();
            let cluster = match reused {
                Some(c) => c,
                None => {
                    let c = UpstreamCluster::build(u, material, metrics.upstream_handles(&u.name))?;
                    carry_endpoints(previous, u, &c);
                    c
                }
            };
            upstreams.insert(u.name.clone(), cluster);
        }

        let mut routes = config
            .routes
            .iter()
            .map(|r| compile_route(r, &upstreams, metrics))
            .collect::<Result<Vec<_>, StateError>>()?;
        if let Some(p) = previous {
            keep_budgets(p, &config, &mut routes);
        }

        let tcp_listeners = crate::tcp_service::build(&config, &upstreams, metrics)?;
        let trust_bundle_sha256 =
            tls::bundle_fingerprint(&config.trust_bundle_files).map_err(StateError::TrustBundle)?;

        let trusted_proxies = config
            .forwarding
            .trusted_proxies
            .iter()
            .filter_map(|c| proxyfleet_config::Cidr::parse(c))
            .collect();
        let tracer = config
            .tracing
            .as_ref()
            .map(|t| crate::trace_context::Tracer::new(t, metrics.spans_dropped.clone()));
        Ok(Self {
            tracer,
            trusted_proxies,
            config,
            routes,
            upstreams,
            listener_tls,
            listener_quic,
            certificates,
            trust_bundle_sha256,
            tcp_listeners,
        })
    }

    /// Retires the clusters of `previous` this state does not run (`UpstreamCluster::retire`):
    /// called once this state is in service.
    pub fn retire_replaced(&self, previous: &ProxyState) {
        for (name, old) in &previous.upstreams {
            let now = self.upstreams.get(name);
            if !now.is_some_and(|now| Arc::ptr_eq(now, old)) {
                old.retire();
            }
            // No checks (any more), no panic: a retired predecessor may have left the gauge at 1.
            if now.is_none_or(|now| now.config.health_check.is_none()) {
                old.metrics.healthy_panic.set(0);
            }
        }
    }

    /// Publishes the state's certificate and trust-bundle gauges (old label sets are cleared).
    pub fn publish_metrics(&self, metrics: &Metrics) {
        metrics.certificate_not_after.clear();
        for (listener, c) in &self.certificates {
            metrics
                .certificate_not_after
                .get_or_create(&CertLabels {
                    listener: listener.clone(),
                    serial: c.serial.clone(),
                    subject: c.subject.clone(),
                })
                .set(c.not_after_unix);
        }
        metrics.trust_bundle.clear();
        if let Some(sha) = &self.trust_bundle_sha256 {
            metrics
                .trust_bundle
                .get_or_create(&BundleLabels { sha256: sha.clone() })
                .set(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(endpoints: &str, previous: Option<&ProxyState>, metrics: &Metrics) -> ProxyState {
        let yaml = format!(
            "listeners: [{{name: http, address: \"127.0.0.1:0\"}}]\nadmin: {{address: \"127.0.0.1:0\"}}\nroutes: [{{name: all, upstream: u}}]\nupstreams: [{{name: u, endpoints: [{endpoints}], healthCheck: {{path: /healthz, interval: 1h}}}}]\n"
        );
        let config = ProxyConfig::from_yaml(&yaml).expect("config");
        ProxyState::build(config, previous, metrics, &HashMap::new()).expect("state")
    }

    /// A rebuilt upstream takes its predecessor's endpoints, but the predecessor keeps running
    /// (health checks, reaper) until the new state is in service: a reload refused after the
    /// upstreams were built leaves the running state whole.
    #[tokio::test]
    async fn a_replaced_cluster_is_retired_only_once_its_successor_is_in_service() {
        let metrics = Metrics::new();
        let running = state("\"127.0.0.1:1\"", None, &metrics);
        let next = state("\"127.0.0.1:1\", \"127.0.0.1:2\"", Some(&running), &metrics);
        let (old, new) = (&running.upstreams["u"], &next.upstreams["u"]);
        assert!(
            Arc::ptr_eq(&old.endpoints.load()[0], &new.endpoints.load()[0]),
            "adopted"
        );
        assert!(!old.superseded(), "not retired by building its successor");
        next.retire_replaced(&running);
        assert!(old.superseded() && !new.superseded());
        let same = state("\"127.0.0.1:1\", \"127.0.0.1:2\"", Some(&next), &metrics);
        same.retire_replaced(&next);
        assert!(
            !new.superseded(),
            "a cluster the new state runs as it is is not retired"
        );
    }
}
