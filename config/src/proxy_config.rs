//! The proxy's configuration: one YAML document, rendered by the operator into a ConfigMap
//! and read by `proxyfleet-proxy --config`. Field names are camelCase so the same types
//! embed unchanged in the ProxyDeployment CRD.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::HumanDuration;

/// The whole configuration of one proxy process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyConfig {
    /// Listeners accepting client traffic.
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub listeners: Vec<Listener>,
    /// Routes, matched in order; the first match wins.
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub routes: Vec<Route>,
    /// Upstream clusters the routes send traffic to.
    #[serde(default)]
    #[schemars(length(max = 128))]
    pub upstreams: Vec<Upstream>,
    /// The admin listener serving /metrics, /healthz, /readyz and /config.
    #[serde(default)]
    pub admin: Admin,
    /// Protective limits on client connections and requests.
    #[serde(default)]
    pub limits: Limits,
    /// Graceful drain on SIGTERM.
    #[serde(default)]
    pub drain: Drain,
    /// HTTP CONNECT forward proxying; off unless an allow-list is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect: Option<ConnectProxy>,
    /// Worker threads, each with its own event loop, listening socket per listener
    /// (`SO_REUSEPORT`) and idle upstream connections; defaults to the available cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub worker_threads: Option<u16>,
    /// Microseconds a worker thread spins before it sleeps, while work keeps arriving within
    /// twice that and the thread is mostly busy (adaptive: an idle proxy never spins); saves the
    /// senders waking it under load, and adds the spin to the CPU a busy proxy reports. Default
    /// 20, or 0 under a CPU quota; 0 turns it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1000))]
    pub idle_spin_micros: Option<u16>,
    /// Trust bundle files whose fingerprint the proxy reports (used to confirm CA rotation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trust_bundle_files: Vec<String>,
    /// `X-Forwarded-For` trust and `X-Request-Id`.
    #[serde(default, skip_serializing_if = "crate::Forwarding::is_default")]
    pub forwarding: crate::Forwarding,
    /// W3C `traceparent` propagation and OTLP span export; off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<crate::TraceSettings>,
}

/// A listening socket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Listener {
    /// Name of the listener, unique, used in metrics.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Address to bind, `IP:port`, e.g. `0.0.0.0:8443`.
    pub address: String,
    /// TLS termination; plain HTTP when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ListenerTls>,
    /// Answer every request with a redirect to HTTPS (plain listeners only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https_redirect: Option<crate::HttpsRedirect>,
    /// One JSON line per request on standard output; off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log: Option<crate::AccessLog>,
    /// Relay TCP instead of serving HTTP: TLS passthrough by SNI, or plain TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<crate::TcpProxy>,
}

/// TLS termination on a listener (TLS 1.2 and 1.3 only, ALPN h2 and http/1.1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListenerTls {
    /// Certificates chosen by SNI.
    #[schemars(length(min = 1, max = 16))]
    pub certificates: Vec<CertificateFiles>,
    /// PEM CA bundle; when set, clients must present a certificate signed by it (mTLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca_file: Option<String>,
    /// Allow clients to resume sessions (tickets and a session cache). Default true.
    #[serde(default = "default_true")]
    pub session_resumption: bool,
    /// HTTP/3 over QUIC on the same port number over UDP; off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http3: Option<crate::Http3>,
}

/// A certificate chain and its private key, on disk (e.g. a mounted Secret).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertificateFiles {
    /// PEM certificate chain, leaf first.
    pub cert_file: String,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: String,
    /// SNI names served with this certificate: exact (`api.example.com`) or wildcard (`*.example.com`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server_names: Vec<String>,
    /// Serve this certificate when the client sends no SNI or an unknown name. At most one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
    /// A DER OCSP response to staple, when this file exists: stapled only while it is a
    /// successful, fresh `good` response for this certificate; re-read when it changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ocsp_file: Option<String>,
}

/// Routes a request to an upstream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Route {
    /// Name of the route, used in metrics.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// What a request must look like to take this route.
    #[serde(default, rename = "match")]
    pub matches: RouteMatch,
    /// Name of the upstream cluster, one of `upstreams[].name`; give this or `backends`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 63))]
    pub upstream: String,
    /// Weighted upstreams, split per request (weights sum to 100); instead of `upstream`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub backends: Vec<crate::Backend>,
    /// Hash this header or cookie (a user id) into 100 buckets so a user keeps one backend;
    /// requests without it take the weighted split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sticky: Option<crate::StickyKey>,
    /// Requests matching one of these go to its backend whatever the weights; first match wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub overrides: Vec<crate::BackendOverride>,
    /// Copy a share of the requests to another upstream (shadow traffic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<crate::Mirror>,
    /// How long the upstream has to answer (to the last response header), counted from the end
    /// of the client's request body, as Envoy's route timeout is: while the proxy waits on the
    /// client's body, `limits.clientBodyTimeout` bounds each wait instead. Default 15s.
    #[serde(default = "default_route_timeout")]
    pub timeout: HumanDuration,
    /// Retries of idempotent requests without a body, on another endpoint when there is one:
    /// after a connect failure, an answer that never came (an HTTP/1.1 connection closed before
    /// a byte of it, an HTTP/2 stream refused or above a GOAWAY's last one), or 502/503/504.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<Retries>,
    /// Fault injection for chaos drills and canary tests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<Fault>,
    /// Local rate limit (per proxy): a token bucket; requests over it get 429 with Retry-After.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// Headers added, set or removed on requests and responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<crate::HeaderRules>,
    /// Path prefix and host rewrites towards the upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<crate::Rewrite>,
    /// Require a valid JWT before the upstream (401 otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt: Option<crate::JwtAuth>,
    /// CORS: preflights answered by the proxy, response headers for allowed origins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<crate::Cors>,
    /// Serve the upstream's gRPC methods as HTTP/JSON by their `google.api.http` rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_transcoding: Option<crate::GrpcTranscoding>,
    /// An upgraded (WebSocket) connection with no byte either way for this long is closed.
    /// Default 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_idle_timeout: Option<HumanDuration>,
    /// Longest wait for the next part of the upstream's response body once its headers have
    /// come (nginx's `proxy_read_timeout`, Envoy's stream idle timeout): an upstream silent
    /// for longer has its response cut off (the client sees it end unfinished) and its
    /// connection closed. Set it above the longest quiet spell of a stream (server-sent events,
    /// a gRPC server stream) that sends no keep-alives of its own. Default 5m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_idle_timeout: Option<HumanDuration>,
}

impl Route {
    /// `responseIdleTimeout`, defaulted.
    pub fn response_idle_timeout(&self) -> std::time::Duration {
        self.response_idle_timeout
            .map_or(std::time::Duration::from_secs(300), |d| d.get())
    }
}

/// A token bucket: `requestsPerSecond` refill, `burst` capacity; one bucket for the route, or
/// one per client IP or per value of a header.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateLimit {
    /// Sustained rate.
    #[schemars(range(min = 0.001, max = 1000000.0))]
    pub requests_per_second: f64,
    /// Bucket size (requests allowed at once). Default: one second's worth, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub burst: Option<u32>,
    /// One bucket per client IP address.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_client_ip: bool,
    /// One bucket per value of this request header (e.g. an API key); requests without it
    /// share one bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub per_header: Option<String>,
}

/// Request match; all given parts must match.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteMatch {
    /// Host (without port): exact or `*.suffix`. Any host when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub host: Option<String>,
    /// Path prefix, starting with `/`. Default `/`.
    #[serde(default = "default_path_prefix")]
    #[schemars(length(min = 1, max = 1024), pattern(r"^/"))]
    pub path_prefix: String,
    /// A header that must be present with exactly this value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<HeaderMatch>,
}

/// An exact header match.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderMatch {
    /// Header name (case-insensitive).
    pub name: String,
    /// Exact value.
    pub value: String,
}

/// Bounded retries with a budget so retries cannot multiply an outage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Retries {
    /// Extra attempts after the first (idempotent methods only).
    #[schemars(range(min = 0, max = 5))]
    pub attempts: u8,
    /// Retries may add at most this percentage on top of the route's requests. Default 20.
    #[serde(default = "default_retry_budget")]
    #[schemars(range(min = 0, max = 100))]
    pub budget_percent: u8,
}

/// Fault injection.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fault {
    /// Answer a share of requests with a status code instead of proxying them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort: Option<FaultAbort>,
    /// Delay a share of requests before proxying them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<FaultDelay>,
}

/// Abort a percentage of requests with a status.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultAbort {
    /// HTTP status to answer with (200-599).
    #[schemars(range(min = 200, max = 599))]
    pub status: u16,
    /// Share of requests, 0-100.
    #[schemars(range(min = 0.0, max = 100.0))]
    pub percent: f64,
}

/// Delay a percentage of requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultDelay {
    /// Added delay.
    pub duration: HumanDuration,
    /// Share of requests, 0-100.
    #[schemars(range(min = 0.0, max = 100.0))]
    pub percent: f64,
}

/// An upstream cluster of endpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Upstream {
    /// Name, unique, referenced by routes.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Static `host:port` endpoints (IP addresses or names resolved at connect time).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub endpoints: Vec<String>,
    /// A DNS name re-resolved periodically (e.g. a headless Service); all its addresses become endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsEndpoints>,
    /// TLS to the upstream; plain when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTls>,
    /// HTTP version to the upstream: `http1`, `h2`, or `auto` (by ALPN over TLS; http1 when plain).
    #[serde(default)]
    pub protocol: UpstreamProtocol,
    /// Connection pool settings.
    #[serde(default)]
    pub pool: Pool,
    /// HTTP/2 flow-control windows toward the upstream (`protocol: h2`, or `auto` that agreed on h2).
    #[serde(default, skip_serializing_if = "UpstreamHttp2::is_default")]
    pub http2: UpstreamHttp2,
    /// Passive outlier ejection.
    #[serde(default)]
    pub outlier_detection: OutlierDetection,
    /// Active HTTP health check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
}

/// Endpoints from a DNS name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DnsEndpoints {
    /// Name to resolve, e.g. `echo.default.svc.cluster.local`.
    pub name: String,
    /// Port of every resolved address.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// How often to re-resolve. Default 5s.
    #[serde(default = "default_dns_refresh")]
    pub refresh_interval: HumanDuration,
}

/// HTTP version towards an upstream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamProtocol {
    #[default]
    Auto,
    Http1,
    H2,
}

/// A TLS protocol version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TlsVersion {
    #[serde(rename = "1.2")]
    Tls12,
    #[serde(rename = "1.3")]
    Tls13,
}

/// TLS towards an upstream.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpstreamTls {
    /// SNI and verified name; defaults to the endpoint's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// PEM CA bundle to verify the upstream; the system's Mozilla roots are not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Client certificate for mTLS to the upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<CertificateFiles>,
    /// In a ProxyDeployment: a Secret of the fleet's namespace whose `ca.crt` verifies the
    /// upstream, mounted into the pods and hot-reloaded (instead of `caFile`). The standalone
    /// proxy reads files only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub ca_secret: Option<String>,
    /// In a ProxyDeployment: a `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`) of the fleet's
    /// namespace presented to the upstream, mounted and hot-reloaded (instead of
    /// `clientCertificate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub client_certificate_secret: Option<String>,
    /// Resume TLS sessions to the upstream (1.3 tickets, 1.2 sessions) per server name. Default true.
    #[serde(default = "default_true")]
    pub session_resumption: bool,
    /// Highest TLS version offered to the upstream: "1.3" (default) or "1.2". Resuming a
    /// TLS 1.2 session needs no key exchange, so it costs a CPU-bound upstream that closes
    /// connections often less; TLS 1.3 is the default for its forward secrecy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_version: Option<TlsVersion>,
    /// Skip verification of the upstream certificate. Only for tests; logged loudly.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_skip_verify: bool,
}

/// Receive windows of an HTTP/2 connection to an upstream. Every stream's unread data counts
/// against the connection's window, which all requests on it share; the proxy reads ahead of
/// its clients, so only a client that stops taking its response leaves data unread, at most a
/// stream window of it, until `limits.sendTimeout` resets that stream. The defaults leave
/// room for 128 such streams (nginx's default concurrent-stream limit) before the connection
/// waits; the connection window is also the most a connection can make the proxy hold.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpstreamHttp2 {
    /// Receive window per stream (bytes of a response the upstream may send ahead). Default
    /// 262144 (256 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 65535, max = 16777216))]
    pub stream_window_bytes: Option<u32>,
    /// Receive window per connection, shared by its streams. Default 33554432 (32 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 65535, max = 268435456))]
    pub connection_window_bytes: Option<u32>,
    /// Streams one connection carries at once: past it, the proxy opens another connection to
    /// the endpoint (as Envoy's pool does past a connection's limit), so long-lived streams
    /// (server-sent events, watches, gRPC streams) do not queue the requests behind them.
    /// Default 100, the least RFC 9113 asks a server to allow. An upstream that allows fewer
    /// (its SETTINGS_MAX_CONCURRENT_STREAMS) is given no more than it allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_concurrent_streams: Option<u32>,
}

impl UpstreamHttp2 {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// `maxConcurrentStreams`, defaulted.
    pub fn max_concurrent_streams(&self) -> u32 {
        self.max_concurrent_streams.unwrap_or(100)
    }

    /// The stream window, defaulted.
    pub fn stream_window(&self) -> u32 {
        self.stream_window_bytes.unwrap_or(256 * 1024)
    }

    /// The connection window, defaulted.
    pub fn connection_window(&self) -> u32 {
        self.connection_window_bytes.unwrap_or(32 * 1024 * 1024)
    }
}

/// Per-endpoint keep-alive connection pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pool {
    /// Idle connections kept per endpoint by each worker thread (as nginx's `keepalive` is per
    /// worker). Default 1024 (as many as `maxConnectionsPerEndpoint`'s default): a burst above
    /// the idle cap closes the connections it opened and pays a new upstream handshake per
    /// request afterwards; idle ones are closed after `idleTimeout`.
    #[serde(default = "default_max_idle")]
    #[schemars(range(min = 0, max = 100000))]
    pub max_idle_per_endpoint: u32,
    /// Idle connections are closed after this long. Default 60s.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout: HumanDuration,
    /// Requests in flight per endpoint, each counted until its answer's last part is read
    /// (an HTTP/1.1 connection is busy that long; over HTTP/2, its streams), and WebSocket or
    /// TCP tunnels for their life; further requests wait, up to the route's `timeout`, then
    /// get 504. An HTTP/2 upstream serving more long-lived streams (server-sent events,
    /// watches) per endpoint needs a higher value. Default 1024.
    #[serde(default = "default_max_connections")]
    #[schemars(range(min = 1, max = 1000000))]
    pub max_connections_per_endpoint: u32,
    /// TCP + TLS connect timeout. Default 3s.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: HumanDuration,
}

/// Eject an endpoint after consecutive failures, for a while.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutlierDetection {
    /// Consecutive 5xx answers or connect failures before ejection; 0 disables. Default 5.
    #[serde(default = "default_consecutive_failures")]
    #[schemars(range(min = 0, max = 1000))]
    pub consecutive_failures: u32,
    /// How long an ejected endpoint is skipped. Default 10s.
    #[serde(default = "default_ejection_time")]
    pub ejection_time: HumanDuration,
    /// Most of the upstream's endpoints ejected at once, in percent; one may always be, however
    /// few there are and even at 0 (Envoy's `max_ejection_percent` before its
    /// `always_eject_one_host`; `consecutiveFailures: 0` turns ejection off). An endpoint that fails past it stays in
    /// use, so a fault shared by many endpoints (an overload, a bad dependency) cannot send all
    /// the traffic to the few left. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_ejection_percent: Option<u32>,
}

impl OutlierDetection {
    /// `maxEjectionPercent`, defaulted. (Optional in the file so that a fleet's rendered
    /// configuration, and so its revision, does not change when the operator gains it.)
    pub fn max_ejection_percent(&self) -> u32 {
        self.max_ejection_percent.unwrap_or(10)
    }
}

/// Active health check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthCheck {
    /// Path requested with GET; 2xx is healthy.
    #[serde(default = "default_health_path")]
    pub path: String,
    /// Interval between checks. Default 5s.
    #[serde(default = "default_health_interval")]
    pub interval: HumanDuration,
    /// Timeout of one check. Default 1s.
    #[serde(default = "default_health_timeout")]
    pub timeout: HumanDuration,
    /// Failed checks in a row that take a healthy endpoint out (HAProxy's `fall`). Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub unhealthy_threshold: Option<u32>,
    /// Passed checks in a row that bring an unhealthy endpoint back (HAProxy's `rise`).
    /// Default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub healthy_threshold: Option<u32>,
    /// Percent of endpoints that must pass for the checks to steer traffic (Envoy's healthy
    /// panic threshold): below it, every endpoint is used as if it passed, so a check that is
    /// wrong or a partial outage does not pile all traffic on the few left. Outlier detection
    /// and P2C's shunning of failing endpoints still apply. Default 50; 0 turns it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub panic_threshold: Option<u32>,
}

impl HealthCheck {
    /// `panicThreshold`, defaulted.
    pub fn panic_threshold(&self) -> u32 {
        self.panic_threshold.unwrap_or(50)
    }

    /// `unhealthyThreshold` and `healthyThreshold`, defaulted. (Optional in the file so that
    /// a fleet's rendered configuration does not change when the operator gains them.)
    pub fn thresholds(&self) -> (u32, u32) {
        (
            self.unhealthy_threshold.unwrap_or(3),
            self.healthy_threshold.unwrap_or(2),
        )
    }
}

/// The admin listener.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Admin {
    /// Address to bind. Default `0.0.0.0:9901`.
    #[serde(default = "default_admin_address")]
    pub address: String,
    /// File holding the bearer token that authorises writes (`PUT /weights`); writes are
    /// refused when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// Directory of `LiveWeights` JSON documents (`*.json`, e.g. a mounted ConfigMap), applied
    /// at start and whenever they change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_weights_dir: Option<String>,
}

/// Limits protecting the proxy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limits {
    /// Largest request head (request line + headers) in bytes; larger gets 431. Default 65536.
    #[serde(default = "default_max_header_bytes")]
    #[schemars(range(min = 1024, max = 1048576))]
    pub max_header_bytes: u32,
    /// Time a client has to send the whole request head (slowloris). Default 10s.
    #[serde(default = "default_header_read_timeout")]
    pub header_read_timeout: HumanDuration,
    /// Largest request body in bytes; larger gets 413. Default 10 MiB.
    #[serde(default = "default_max_body_bytes")]
    pub max_request_body_bytes: u64,
    /// Concurrent client connections; further connections wait in the backlog. Default 10000.
    #[serde(default = "default_max_client_connections")]
    #[schemars(range(min = 1, max = 1000000))]
    pub max_connections: u32,
    /// Concurrent connections from one client IP address; more are closed at once, so one
    /// source cannot take every slot. Default: no cap of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub max_connections_per_client_ip: Option<u32>,
    /// HTTP/2 flow control and concurrency towards clients: what one connection may make the
    /// proxy buffer. Defaults: 256 streams, 1 MiB per stream and per connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http2: Option<Http2Limits>,
    /// A client connection is ended gracefully this long after it opened (HTTP/1.1: after the
    /// response in flight; HTTP/2: GOAWAY, open streams finish), so long-lived clients spread
    /// over new pods after a scale-out or a rollout. Default: no age limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connection_age: Option<HumanDuration>,
    /// A client connection is ended gracefully after this many requests (as Envoy's
    /// max_requests_per_connection). Default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_requests_per_connection: Option<u32>,
    /// An HTTP/2 or HTTP/3 client connection with no request in flight is ended gracefully
    /// (GOAWAY) after this long, even while it answers PINGs (nginx's `http2_idle_timeout`,
    /// Envoy's `idle_timeout`). Default 3m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<HumanDuration>,
    /// Longest wait between two reads of a request body (nginx's `client_body_timeout`): a
    /// body that trickles slower is cut off and, when no response has started, answered 408.
    /// Default 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_body_timeout: Option<HumanDuration>,
    /// Longest a write to a client may stay blocked (nginx's `send_timeout`): a client that
    /// stops reading its response is disconnected, so it holds no buffers or upstream
    /// connections. An HTTP/2 client that stops taking one stream's response from an HTTP/2
    /// upstream must take at least 64 KiB of it in every such period, or the stream is reset.
    /// Default 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_timeout: Option<HumanDuration>,
    /// `%2F` in a request path: `keep` (default, forwarded as sent; not a segment boundary),
    /// `reject` (400, as are `%5C` and a raw `\`) or `decode` (read and forwarded as `/`).
    /// Choose `reject` or `decode` when an upstream decodes `%2F` before it routes and a route
    /// guards a path prefix (a JWT check, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escaped_slashes: Option<crate::EscapedSlashes>,
    /// Read and forward `//` in a request path as `/` (nginx's `merge_slashes`), for
    /// upstreams that do the same before they route. Default false: forwarded as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_slashes: Option<bool>,
}

impl Limits {
    /// `escapedSlashes` and `mergeSlashes`, defaulted.
    pub fn path_rules(&self) -> crate::PathRules {
        crate::PathRules {
            escaped_slashes: self.escaped_slashes.unwrap_or_default(),
            merge_slashes: self.merge_slashes.unwrap_or(false),
        }
    }

    /// `idleTimeout`, defaulted.
    pub fn idle_timeout(&self) -> std::time::Duration {
        self.idle_timeout
            .map_or(std::time::Duration::from_secs(180), |d| d.get())
    }

    /// `clientBodyTimeout`, defaulted.
    pub fn client_body_timeout(&self) -> std::time::Duration {
        self.client_body_timeout
            .map_or(std::time::Duration::from_secs(60), |d| d.get())
    }

    /// `sendTimeout`, defaulted.
    pub fn send_timeout(&self) -> std::time::Duration {
        self.send_timeout
            .map_or(std::time::Duration::from_secs(60), |d| d.get())
    }
}

/// HTTP/2 limits per client connection.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Http2Limits {
    /// Concurrent streams a client may open. Default 256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_concurrent_streams: Option<u32>,
    /// Receive window per stream (bytes of a request body buffered before the client must
    /// wait). Default 1048576.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 65535, max = 16777216))]
    pub stream_window_bytes: Option<u32>,
    /// Receive window per connection. Default 1048576.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 65535, max = 67108864))]
    pub connection_window_bytes: Option<u32>,
}

/// Graceful drain.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Drain {
    /// After SIGTERM, /readyz fails at once but listeners keep accepting this long, so
    /// endpoints are removed before connections are refused. Default 5s.
    #[serde(default = "default_drain_grace")]
    pub grace_period: HumanDuration,
    /// Then in-flight requests get this long to finish before exit. Default 20s.
    #[serde(default = "default_drain_deadline")]
    pub deadline: HumanDuration,
}

/// HTTP CONNECT forward proxying.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConnectProxy {
    /// `host:port` targets allowed; a `*.` prefix allows subdomains, port `*` any port.
    #[schemars(length(min = 1, max = 64))]
    pub allow: Vec<String>,
    /// Networks (CIDRs) tunnels may reach although they are loopback, link-local, private or
    /// shared address space; checked on the resolved address, so a public name that resolves
    /// to `10.0.0.5` is refused unless listed. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 49)))]
    pub allowed_networks: Vec<String>,
    /// Time to connect to the target. Default 5s.
    #[serde(default = "default_connect_tunnel_connect_timeout")]
    pub connect_timeout: HumanDuration,
    /// A tunnel with no bytes either way for this long is closed. Default 5m.
    #[serde(default = "default_connect_tunnel_idle_timeout")]
    pub idle_timeout: HumanDuration,
}

fn default_connect_tunnel_connect_timeout() -> HumanDuration {
    HumanDuration::from_secs(5)
}
fn default_connect_tunnel_idle_timeout() -> HumanDuration {
    HumanDuration::from_secs(300)
}

fn default_true() -> bool {
    true
}
fn default_route_timeout() -> HumanDuration {
    HumanDuration::from_secs(15)
}
fn default_path_prefix() -> String {
    "/".to_string()
}
fn default_retry_budget() -> u8 {
    20
}
fn default_dns_refresh() -> HumanDuration {
    HumanDuration::from_secs(5)
}
fn default_max_idle() -> u32 {
    1024
}
fn default_idle_timeout() -> HumanDuration {
    HumanDuration::from_secs(60)
}
fn default_max_connections() -> u32 {
    1024
}
fn default_connect_timeout() -> HumanDuration {
    HumanDuration::from_secs(3)
}
fn default_consecutive_failures() -> u32 {
    5
}
fn default_ejection_time() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_health_path() -> String {
    "/healthz".to_string()
}
fn default_health_interval() -> HumanDuration {
    HumanDuration::from_secs(5)
}
fn default_health_timeout() -> HumanDuration {
    HumanDuration::from_secs(1)
}
fn default_admin_address() -> String {
    "0.0.0.0:9901".to_string()
}
fn default_max_header_bytes() -> u32 {
    65536
}
fn default_header_read_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_max_body_bytes() -> u64 {
    10 * 1024 * 1024
}
fn default_max_client_connections() -> u32 {
    10000
}
fn default_drain_grace() -> HumanDuration {
    HumanDuration::from_secs(5)
}
fn default_drain_deadline() -> HumanDuration {
    HumanDuration::from_secs(20)
}

impl Default for Pool {
    fn default() -> Self {
        Self {
            max_idle_per_endpoint: default_max_idle(),
            idle_timeout: default_idle_timeout(),
            max_connections_per_endpoint: default_max_connections(),
            connect_timeout: default_connect_timeout(),
        }
    }
}
impl Default for OutlierDetection {
    fn default() -> Self {
        Self {
            consecutive_failures: default_consecutive_failures(),
            ejection_time: default_ejection_time(),
            max_ejection_percent: None,
        }
    }
}
impl Default for Admin {
    fn default() -> Self {
        Self {
            address: default_admin_address(),
            token_file: None,
            live_weights_dir: None,
        }
    }
}
impl Default for Limits {
    fn default() -> Self {
        Self {
            max_header_bytes: default_max_header_bytes(),
            header_read_timeout: default_header_read_timeout(),
            max_request_body_bytes: default_max_body_bytes(),
            max_connections: default_max_client_connections(),
            max_connections_per_client_ip: None,
            http2: None,
            max_connection_age: None,
            max_requests_per_connection: None,
            idle_timeout: None,
            client_body_timeout: None,
            send_timeout: None,
            escaped_slashes: None,
            merge_slashes: None,
        }
    }
}
impl Default for Drain {
    fn default() -> Self {
        Self {
            grace_period: default_drain_grace(),
            deadline: default_drain_deadline(),
        }
    }
}
impl Default for RouteMatch {
    fn default() -> Self {
        Self {
            host: None,
            path_prefix: default_path_prefix(),
            header: None,
        }
    }
}
