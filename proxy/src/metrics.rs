//! The proxy's Prometheus metrics (names documented in docs/metrics.md). Handles used on the
//! request path are resolved once per route/upstream when the configuration is loaded, so a
//! request only touches atomics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Request duration buckets: 100 µs to 10 s, fine enough for sub-millisecond P99.
pub const DURATION_BUCKETS: [f64; 24] = [
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1,
    0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
    pub upstream: String,
}

/// Status classes, in the order of `RouteMetrics::responses_by_class`.
pub const CODE_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

pub fn class_index(status: u16) -> usize {
    match status {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        _ => 4,
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseLabels {
    pub route: String,
    pub upstream: String,
    pub code_class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamResultLabels {
    pub upstream: String,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandshakeLabels {
    pub upstream: String,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub upstream: String,
    pub connection: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    pub listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClientHandshakeLabels {
    pub listener: String,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabels {
    pub listener: String,
    pub serial: String,
    pub subject: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FaultLabels {
    pub route: String,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteOnly {
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamOnly {
    pub upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BundleLabels {
    pub sha256: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: &'static str,
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

type HistogramFamily = Family<RouteLabels, Histogram, fn() -> Histogram>;

/// The request duration histogram (returned) and the build info gauge (set once).
fn register_static(registry: &mut Registry) -> HistogramFamily {
    let request_duration = HistogramFamily::new_with_constructor(duration_histogram as fn() -> Histogram);
    registry.register(
        proxyfleet_config::metric_names::REQUEST_DURATION,
        "Time from request received to upstream response headers sent to the client",
        request_duration.clone(),
    );
    let build_info: Family<BuildLabels, Gauge> = Family::default();
    build_info
        .get_or_create(&BuildLabels {
            version: env!("CARGO_PKG_VERSION"),
        })
        .set(1);
    registry.register("build_info", "Proxy version (value 1)", build_info);
    request_duration
}

/// The counters of what the proxy refused or could not do for a client.
/// The counters of the routes' admission phase (rate limit, JWT, CORS).
fn register_route_filters(
    registry: &mut Registry,
) -> (
    Family<RouteOnly, Counter>,
    Family<RouteReasonLabels, Counter>,
    Family<RouteResultLabels, Counter>,
) {
    (
        register(
            registry,
            "rate_limited_requests",
            "Requests refused with 429 by a route's rate limit",
        ),
        register(
            registry,
            "jwt_denied_requests",
            "Requests refused with 401 by a route's JWT validation, by reason",
        ),
        register(
            registry,
            "cors_preflights",
            "CORS preflights answered by the proxy, by result (allowed or refused)",
        ),
    )
}

/// Reloads by result, whether the last one was taken (1 until one is refused), and whether the
/// files hold a change that waits for a restart.
fn register_reloads(registry: &mut Registry) -> (Family<ResultLabels, Counter>, Gauge, Gauge) {
    let reloads = register(
        registry,
        "config_reloads",
        "Configuration and certificate reloads by result",
    );
    let last: Gauge = register(
        registry,
        "config_last_reload_successful",
        "Whether the last reload of configuration and certificate files was taken (1) or refused (0)",
    );
    last.set(1);
    let pending: Gauge = register(
        registry,
        "config_restart_pending",
        "Whether the configuration file holds a change only a restart applies (1); the rest of it was taken",
    );
    (reloads, last, pending)
}

/// Upstreams' faults: endpoints ejected, answers cut off mid-body, health checks in panic.
fn register_upstream_faults(registry: &mut Registry) -> UpstreamFaults {
    let ejections = register(registry, "outlier_ejections", "Endpoints ejected by outlier detection");
    let stalls = register(
        registry,
        "upstream_response_stalls",
        "Upstream responses cut off because the upstream sent nothing for the route's responseIdleTimeout",
    );
    let panic = register(
        registry,
        "upstream_healthy_panic",
        "Whether fewer of the upstream's endpoints pass health checks than its panicThreshold, so all are used (1)",
    );
    (ejections, stalls, panic)
}

type UpstreamFaults = (
    Family<UpstreamOnly, Counter>,
    Family<UpstreamOnly, Counter>,
    Family<UpstreamOnly, Gauge>,
);

fn register_certificates(registry: &mut Registry) -> (Family<CertLabels, Gauge>, Family<OcspLabels, Counter>) {
    (
        register(
            registry,
            "certificate_not_after_timestamp_seconds",
            "notAfter of each served certificate, Unix seconds",
        ),
        register(
            registry,
            "ocsp_staples",
            "OCSP responses found beside certificates, by whether they were stapled (counted on each load)",
        ),
    )
}

type ProtocolFamilies = (
    Family<ClientHandshakeLabels, Counter>,
    Family<ClientHandshakeLabels, Counter>,
    TranscodeFamily,
);

/// HTTP/3 and transcoding.
fn register_protocols(registry: &mut Registry) -> ProtocolFamilies {
    (
        register(
            registry,
            "quic_connections",
            "HTTP/3 (QUIC) client connections by kind (accepted, failed or refused)",
        ),
        register(
            registry,
            "quic_early_requests",
            "HTTP/3 requests received as 0-RTT early data, by kind (served at once, or waited for the handshake)",
        ),
        register(
            registry,
            "grpc_transcoded_requests",
            "HTTP/JSON requests transcoded to gRPC calls, by route, gRPC method and gRPC status",
        ),
    )
}

fn register_guards(registry: &mut Registry) -> (Counter, Counter, Family<RefusalLabels, Counter>, Counter, Counter) {
    (
        register(
            registry,
            "malformed_requests",
            "Requests refused as malformed before routing",
        ),
        register(
            registry,
            "access_log_dropped",
            "Access log lines dropped because the writer fell behind (the request path never waits)",
        ),
        register(
            registry,
            "refused_connections",
            "Client connections or CONNECT tunnels refused, by reason",
        ),
        register(
            registry,
            "misdirected_requests",
            "Requests answered 421: their Host is not covered by the connection's certificate",
        ),
        register(
            registry,
            "trace_spans_dropped",
            "Spans dropped because the OTLP exporter fell behind",
        ),
    )
}

/// Registers a metric family (or counter) and returns the handle kept in `Metrics`.
fn register<M>(registry: &mut Registry, name: &str, help: &str) -> M
where
    M: Default
        + Clone
        + prometheus_client::metrics::TypedMetric
        + prometheus_client::encoding::EncodeMetric
        + Send
        + Sync
        + std::fmt::Debug
        + 'static,
{
    let m = M::default();
    registry.register(name, help, m.clone());
    m
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TranscodeLabels {
    pub route: String,
    /// The gRPC method, `pkg.Service/Method` as its full name.
    pub method: String,
    /// The gRPC status name (`OK`, `NOT_FOUND`, …).
    pub code: &'static str,
}

pub type TranscodeFamily = Family<TranscodeLabels, Counter>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MirrorLabels {
    pub route: String,
    pub upstream: String,
    /// `2xx`..`5xx`, `error` (no response), or `skipped` (a body, or the mirror was busy).
    pub result: &'static str,
}

/// Every metric family the proxy exports.
pub struct Metrics {
    pub registry: Registry,
    pub request_duration: HistogramFamily,
    pub responses: Family<ResponseLabels, Counter>,
    pub upstream_connections: Family<UpstreamResultLabels, Counter>,
    pub upstream_handshakes: Family<HandshakeLabels, Counter>,
    pub upstream_requests: Family<PoolLabels, Counter>,
    pub client_handshakes: Family<ClientHandshakeLabels, Counter>,
    /// HTTP/3 client connections by kind: `accepted`, `failed` (handshake), `refused`
    /// (connection limits).
    pub quic_connections: Family<ClientHandshakeLabels, Counter>,
    /// HTTP/3 requests that arrived before the handshake completed (0-RTT early data), by
    /// kind: `served` at once (replay-safe), `waited` for the handshake.
    pub quic_early_requests: Family<ClientHandshakeLabels, Counter>,
    /// HTTP/JSON requests transcoded to gRPC, by route, method and gRPC status.
    pub transcoded: TranscodeFamily,
    pub active_connections: Family<ListenerLabels, Gauge>,
    pub reloads: Family<ResultLabels, Counter>,
    /// 1 when the last reload was taken (or none failed yet), 0 while the files on disk are
    /// refused: the proxy then serves what it had, certificates included, so an alert must say.
    pub last_reload_successful: Gauge,
    /// 1 while the file holds a change the running proxy cannot make (a listener, admin,
    /// connection limits, workers): those parts keep their running values until a restart.
    pub restart_pending: Gauge,
    pub certificate_not_after: Family<CertLabels, Gauge>,
    pub ocsp_staples: Family<OcspLabels, Counter>,
    pub faults: Family<FaultLabels, Counter>,
    pub retries: Family<RouteOnly, Counter>,
    pub upgrades: Family<RouteOnly, Counter>,
    pub rate_limited: Family<RouteOnly, Counter>,
    pub jwt_denied: Family<RouteReasonLabels, Counter>,
    pub cors_preflights: Family<RouteResultLabels, Counter>,
    pub tcp: TcpMetrics,
    pub ejections: Family<UpstreamOnly, Counter>,
    pub response_stalls: Family<UpstreamOnly, Counter>,
    pub healthy_panic: Family<UpstreamOnly, Gauge>,
    pub trust_bundle: Family<BundleLabels, Gauge>,
    pub malformed_requests: Counter,
    pub mirror_requests: Family<MirrorLabels, Counter>,
    pub access_log_dropped: Counter,
    pub refused_connections: Family<RefusalLabels, Counter>,
    pub misdirected_requests: Counter,
    pub spans_dropped: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TcpLabels {
    pub listener: String,
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TcpResultLabels {
    pub listener: String,
    pub route: String,
    /// `relayed`, `upstream_failed`, `no_route`, `not_tls`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TcpBytesLabels {
    pub listener: String,
    pub route: String,
    /// `to_upstream` or `to_client`.
    pub direction: &'static str,
}

/// The metrics of TCP listeners (passthrough and plain TCP).
pub struct TcpMetrics {
    connections: Family<TcpResultLabels, Counter>,
    bytes: Family<TcpBytesLabels, Counter>,
    pub duration: HistogramFamilyOf<TcpLabels>,
}

impl TcpMetrics {
    fn register(registry: &mut Registry) -> Self {
        let duration: HistogramFamilyOf<TcpLabels> = Family::new_with_constructor(tcp_duration_histogram);
        registry.register(
            "tcp_connection_duration_seconds",
            "Lifetime of relayed TCP connections, by route",
            duration.clone(),
        );
        Self {
            connections: register(
                registry,
                "tcp_connections",
                "Connections of TCP listeners (TLS passthrough, plain TCP) by route and result",
            ),
            bytes: register(
                registry,
                "tcp_bytes",
                "Bytes relayed by TCP listeners, by route and direction",
            ),
            duration,
        }
    }

    /// The connection counter of a TCP route (`labels`) for one result.
    pub fn connections(&self, labels: &TcpLabels, result: &'static str) -> Counter {
        self.connections
            .get_or_create(&TcpResultLabels {
                listener: labels.listener.clone(),
                route: labels.route.clone(),
                result,
            })
            .clone()
    }

    /// The byte counter of a TCP route in one direction.
    pub fn bytes(&self, labels: &TcpLabels, direction: &'static str) -> Counter {
        self.bytes
            .get_or_create(&TcpBytesLabels {
                listener: labels.listener.clone(),
                route: labels.route.clone(),
                direction,
            })
            .clone()
    }
}

/// A histogram family of connection durations (1 ms … ~1 h).
pub type HistogramFamilyOf<L> = Family<L, Histogram, fn() -> Histogram>;

fn tcp_duration_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 4.0, 12,
    ))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteReasonLabels {
    pub route: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteResultLabels {
    pub route: String,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OcspLabels {
    pub listener: String,
    /// `stapled`, or why not: `invalid`, `not_successful`, `mismatched`, `not_good`, `stale`;
    /// `expired` when a stapled response's nextUpdate passes in service.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// `per_client_ip` (the client's cap), `connect_target` (a CONNECT to a refused address).
    pub reason: &'static str,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(proxyfleet_config::metric_names::PREFIX);
        let request_duration = register_static(&mut registry);
        let (rate_limited, jwt_denied, cors_preflights) = register_route_filters(&mut registry);
        let (malformed_requests, access_log_dropped, refused_connections, misdirected_requests, spans_dropped) =
            register_guards(&mut registry);
        let (certificate_not_after, ocsp_staples) = register_certificates(&mut registry);
        let (quic_connections, quic_early_requests, transcoded) = register_protocols(&mut registry);
        let (reloads, last_reload_successful, restart_pending) = register_reloads(&mut registry);
        let (ejections, response_stalls, healthy_panic) = register_upstream_faults(&mut registry);
        Self {
            request_duration,
            responses: register(
                &mut registry,
                proxyfleet_config::metric_names::RESPONSES,
                "Responses sent to clients by route, upstream and status class",
            ),
            upstream_connections: register(
                &mut registry,
                "upstream_connections",
                "Upstream connection attempts by result",
            ),
            upstream_handshakes: register(
                &mut registry,
                "upstream_tls_handshakes",
                "Upstream TLS handshakes by kind (full or resumed)",
            ),
            upstream_requests: register(
                &mut registry,
                "upstream_requests",
                "Upstream requests by whether they reused a pooled connection",
            ),
            client_handshakes: register(
                &mut registry,
                "client_tls_handshakes",
                "Client TLS handshakes by kind (full, resumed or failed)",
            ),
            quic_connections,
            quic_early_requests,
            transcoded,
            active_connections: register(&mut registry, "active_connections", "Open client connections"),
            reloads,
            last_reload_successful,
            restart_pending,
            certificate_not_after,
            ocsp_staples,
            faults: register(&mut registry, "fault_injections", "Faults injected by route and kind"),
            retries: register(&mut registry, "upstream_retries", "Retried upstream requests by route"),
            upgrades: register(
                &mut registry,
                "upgraded_connections",
                "Connections switched to another protocol (WebSocket) by route",
            ),
            rate_limited,
            jwt_denied,
            cors_preflights,
            tcp: TcpMetrics::register(&mut registry),
            ejections,
            response_stalls,
            healthy_panic,
            trust_bundle: register(
                &mut registry,
                "trust_bundle_info",
                "SHA-256 of the loaded trust bundle (value 1)",
            ),
            malformed_requests,
            mirror_requests: register(
                &mut registry,
                "mirror_requests",
                "Shadow copies of requests by route, mirror upstream and result (responses discarded)",
            ),
            access_log_dropped,
            refused_connections,
            misdirected_requests,
            spans_dropped,
            registry,
        }
    }

    /// Resolves the per-route handles once, so the request path only touches atomics.
    pub fn route_handles(&self, route: &str, upstream: &str) -> RouteMetrics {
        let labels = RouteLabels {
            route: route.to_string(),
            upstream: upstream.to_string(),
        };
        let by_class = CODE_CLASSES.map(|code_class| {
            self.responses
                .get_or_create(&ResponseLabels {
                    route: route.to_string(),
                    upstream: upstream.to_string(),
                    code_class,
                })
                .clone()
        });
        // One statement per handle: get_or_create holds the family's lock until the end of the
        // statement, so two in one expression would deadlock.
        let duration = self.request_duration.get_or_create(&labels).clone();
        let fault_abort = self
            .faults
            .get_or_create(&FaultLabels {
                route: route.to_string(),
                kind: "abort",
            })
            .clone();
        let fault_delay = self
            .faults
            .get_or_create(&FaultLabels {
                route: route.to_string(),
                kind: "delay",
            })
            .clone();
        let retries = self
            .retries
            .get_or_create(&RouteOnly {
                route: route.to_string(),
            })
            .clone();
        let upgrades = self
            .upgrades
            .get_or_create(&RouteOnly {
                route: route.to_string(),
            })
            .clone();
        let rate_limited = self
            .rate_limited
            .get_or_create(&RouteOnly {
                route: route.to_string(),
            })
            .clone();
        RouteMetrics {
            duration,
            responses_by_class: by_class,
            fault_abort,
            fault_delay,
            retries,
            upgrades,
            rate_limited,
        }
    }

    pub fn upstream_handles(&self, upstream: &str) -> UpstreamMetrics {
        let u = || upstream.to_string();
        // One statement per handle (see route_handles).
        let connect_ok = self
            .upstream_connections
            .get_or_create(&UpstreamResultLabels {
                upstream: u(),
                result: "ok",
            })
            .clone();
        let connect_error = self
            .upstream_connections
            .get_or_create(&UpstreamResultLabels {
                upstream: u(),
                result: "error",
            })
            .clone();
        let handshake_full = self
            .upstream_handshakes
            .get_or_create(&HandshakeLabels {
                upstream: u(),
                kind: "full",
            })
            .clone();
        let handshake_resumed = self
            .upstream_handshakes
            .get_or_create(&HandshakeLabels {
                upstream: u(),
                kind: "resumed",
            })
            .clone();
        let request_new = self
            .upstream_requests
            .get_or_create(&PoolLabels {
                upstream: u(),
                connection: "new",
            })
            .clone();
        let request_reused = self
            .upstream_requests
            .get_or_create(&PoolLabels {
                upstream: u(),
                connection: "reused",
            })
            .clone();
        let ejections = self.ejections.get_or_create(&UpstreamOnly { upstream: u() }).clone();
        let response_stalls = self
            .response_stalls
            .get_or_create(&UpstreamOnly { upstream: u() })
            .clone();
        let healthy_panic = self
            .healthy_panic
            .get_or_create(&UpstreamOnly { upstream: u() })
            .clone();
        UpstreamMetrics {
            healthy_panic,
            connect_ok,
            connect_error,
            handshake_full,
            handshake_resumed,
            request_new,
            request_reused,
            ejections,
            response_stalls,
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Handles for one route.
#[derive(Clone)]
pub struct RouteMetrics {
    pub duration: Histogram,
    pub responses_by_class: [Counter; 5],
    pub fault_abort: Counter,
    pub fault_delay: Counter,
    pub retries: Counter,
    pub upgrades: Counter,
    pub rate_limited: Counter,
}

impl RouteMetrics {
    pub fn observe(&self, status: u16, seconds: f64) {
        self.duration.observe(seconds);
        self.responses_by_class[class_index(status)].inc();
    }
}

/// Handles for one upstream cluster.
#[derive(Clone)]
pub struct UpstreamMetrics {
    pub connect_ok: Counter,
    pub connect_error: Counter,
    pub handshake_full: Counter,
    pub handshake_resumed: Counter,
    pub request_new: Counter,
    pub request_reused: Counter,
    pub ejections: Counter,
    /// Responses cut off by the route's `responseIdleTimeout`.
    pub response_stalls: Counter,
    /// 1 while health checks are in panic (`health::publish`).
    pub healthy_panic: Gauge,
}
