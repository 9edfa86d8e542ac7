//! The ProxyDeployment API (group proxyfleet.io, version v1alpha1). Listeners are a Kubernetes
//! view (ports, hostnames); routes, upstreams, limits and drain are the proxy's own config types,
//! embedded unchanged.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use proxyfleet_config::{ConnectProxy, Drain, HumanDuration, Limits, Route, Upstream};

use crate::canary::spec::Strategy;
use crate::certs::spec::TlsSpec;
use crate::propagation::spec::Placement;

pub const GROUP: &str = "proxyfleet.io";

/// A fleet of proxyfleet proxies: listeners, routes and upstreams, how certificates are
/// issued, how changes roll out, and which clusters run it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "proxyfleet.io",
    version = "v1alpha1",
    kind = "ProxyDeployment",
    namespaced,
    shortname = "pxd",
    status = "ProxyDeploymentStatus",
    derive = "PartialEq",
    category = "proxyfleet",
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 54").message("metadata.name must be a DNS-1035 label (lower-case letters, digits, '-'; starting with a letter) of at most 54 characters: it names the Service and <name>-headless, <name>-canary, <name>-config-<hash>, <name>-tls"),
    scale = r#"{"specReplicasPath":".spec.replicas", "statusReplicasPath":".status.replicas", "labelSelectorPath":".status.selector"}"#,
    printcolumn = r#"{"name":"Ready", "type":"string", "jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Replicas", "type":"string", "jsonPath":".status.readyReplicas", "description":"ready replicas"}"#,
    printcolumn = r#"{"name":"Desired", "type":"integer", "jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Phase", "type":"string", "jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Revision", "type":"string", "jsonPath":".status.revision"}"#,
    printcolumn = r#"{"name":"Canary", "type":"string", "jsonPath":".status.canary.weight", "priority":1}"#,
    printcolumn = r#"{"name":"Age", "type":"date", "jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("self.upstreams.all(u, !has(u.tls) || ((!has(u.tls.caFile) || !has(u.tls.caSecret)) && (!has(u.tls.clientCertificate) || !has(u.tls.clientCertificateSecret))))").message("spec.upstreams[].tls: give caFile or caSecret, and clientCertificate or clientCertificateSecret, not both").field_path(".upstreams"))]
#[x_kube(validation = Rule::new("!has(self.drain) || ((!has(self.drain.gracePeriod) || duration(self.drain.gracePeriod) <= duration('5m')) && (!has(self.drain.deadline) || duration(self.drain.deadline) <= duration('1h')))").message("spec.drain: gracePeriod at most 5m and deadline at most 1h (they set the pods' termination grace period, which node drains wait for)").field_path(".drain"))]
#[x_kube(validation = Rule::new("self.routes.all(r, !has(r.upstream) || r.upstream == '' || self.upstreams.exists(u, u.name == r.upstream))").message("every spec.routes[].upstream must name one of spec.upstreams[].name").field_path(".routes"))]
#[x_kube(validation = Rule::new("!has(self.tls) || !has(self.tls.acme) || self.listeners.exists(l, l.protocol == 'HTTP' && (has(l.servicePort) ? l.servicePort : l.port) == 80)").message("spec.tls.acme: HTTP-01 is validated on port 80: add a listener with protocol HTTP and servicePort 80").field_path(".tls.acme"))]
#[x_kube(validation = Rule::new("!has(self.tls) || !has(self.tls.acme) || self.listeners.all(l, !has(l.hostnames) || l.hostnames.all(h, !h.startsWith('*')))").message("spec.listeners[].hostnames: ACME HTTP-01 cannot validate wildcard names").field_path(".listeners"))]
#[x_kube(validation = Rule::new("!has(self.tls) || !has(self.tls.acme) || self.listeners.exists(l, has(l.hostnames) && size(l.hostnames) > 0) || (has(self.tls.dnsNames) && size(self.tls.dnsNames) > 0)").message("spec.tls.acme: name at least one hostname (spec.listeners[].hostnames or spec.tls.dnsNames) to order a certificate for").field_path(".tls.acme"))]
#[x_kube(validation = Rule::new("size(self.routes) > 0 || self.listeners.all(l, has(l.tcp))").message("spec.routes: at least one route is needed for HTTP(S) listeners").field_path(".routes"))]
#[x_kube(validation = Rule::new("self.listeners.all(l, !has(l.tcp) || !has(l.tcp.mode) || l.tcp.mode != 'socks5' || has(self.connect))").message("spec.connect: a socks5 listener needs connect (its allow-list and address checks decide where clients may go)").field_path(".connect"))]
#[x_kube(validation = Rule::new("self.listeners.all(l, !has(l.tcp) || !has(l.tcp.mode) || l.tcp.mode != 'socks5' || (!has(l.tcp.defaultUpstream) && (!has(l.tcp.routes) || size(l.tcp.routes) == 0) && (!has(l.tcp.proxyProtocol) || !l.tcp.proxyProtocol)))").message("spec.listeners[].tcp: a socks5 listener takes no routes, defaultUpstream or proxyProtocol (clients name their target; connect.allow decides)").field_path(".listeners"))]
#[x_kube(validation = Rule::new("self.listeners.all(l, !has(l.tcp) || !has(l.tcp.socks5) || (has(l.tcp.mode) && l.tcp.mode == 'socks5'))").message("spec.listeners[].tcp.socks5 needs tcp.mode socks5").field_path(".listeners"))]
#[x_kube(validation = Rule::new("self.listeners.all(l, (has(l.protocol) && l.protocol == 'TCP') == has(l.tcp))").message("spec.listeners[]: protocol TCP needs tcp (SNI routes or a defaultUpstream), and tcp needs protocol TCP").field_path(".listeners"))]
#[x_kube(validation = Rule::new("self.listeners.all(l, !has(l.tcp) || ((!has(l.hostnames) || size(l.hostnames) == 0) && !has(l.clientCaSecret) && !has(l.httpsRedirect) && !has(l.accessLog)))").message("spec.listeners[]: a TCP listener relays bytes; hostnames, clientCaSecret, httpsRedirect and accessLog are for HTTP(S) listeners (name the SNI in tcp.routes[].serverNames)").field_path(".listeners"))]
#[x_kube(validation = Rule::new("self.listeners.all(l, !has(l.http3) || !has(l.protocol) || l.protocol == 'HTTPS')").message("spec.listeners[].http3 is for HTTPS listeners (QUIC always carries TLS)").field_path(".listeners"))]
#[x_kube(validation = Rule::new("self.listeners.all(l, self.listeners.exists_one(m, m.port == l.port))").message("spec.listeners[].port must be unique").field_path(".listeners"))]
#[x_kube(validation = Rule::new("self.listeners.all(l, self.listeners.exists_one(m, m.name == l.name))").message("spec.listeners[].name must be unique").field_path(".listeners"))]
#[x_kube(validation = Rule::new("self.upstreams.all(u, self.upstreams.exists_one(v, v.name == u.name))").message("spec.upstreams[].name must be unique").field_path(".upstreams"))]
#[x_kube(validation = Rule::new("self.routes.all(r, self.routes.exists_one(q, q.name == r.name))").message("spec.routes[].name must be unique").field_path(".routes"))]
#[x_kube(validation = Rule::new("self.upstreams.all(u, (has(u.endpoints) && size(u.endpoints) > 0) != has(u.dns))").message("each spec.upstreams[] needs exactly one of endpoints or dns").field_path(".upstreams"))]
#[x_kube(validation = Rule::new("self.routes.all(r, !has(r.timeout) || duration(r.timeout) > duration('0s'))").message("spec.routes[].timeout must be positive").field_path(".routes"))]
#[x_kube(validation = Rule::new("self.upstreams.all(u, !has(u.pool) || !has(u.pool.connectTimeout) || duration(u.pool.connectTimeout) > duration('0s'))").message("spec.upstreams[].pool.connectTimeout must be positive").field_path(".upstreams"))]
#[serde(rename_all = "camelCase")]
pub struct ProxyDeploymentSpec {
    /// Number of proxy pods.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,
    /// Proxy image. Defaults to the proxy image matching the operator's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// Image pull policy of the proxy container (Always, IfNotPresent, Never). Default IfNotPresent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// CPU and memory of the proxy container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Ports the proxies listen on, and how they are exposed by the Service.
    #[schemars(length(min = 1, max = 16))]
    pub listeners: Vec<ListenerSpec>,
    /// Routes of the HTTP(S) listeners, matched in order; the first match wins. None are
    /// needed when every listener is TCP.
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub routes: Vec<Route>,
    /// Upstream clusters the routes send traffic to.
    #[schemars(length(min = 1, max = 128))]
    pub upstreams: Vec<Upstream>,
    /// Limits protecting the proxies (header size, slowloris timeout, body size, connections).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// Graceful drain; the pods' termination grace period is derived from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<Drain>,
    /// HTTP CONNECT forward proxying (off unless an allow-list is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect: Option<ConnectProxy>,
    /// `X-Forwarded-For` trust (which peers' addresses are kept) and `X-Request-Id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarding: Option<proxyfleet_config::Forwarding>,
    /// W3C trace context propagation and OTLP span export from every proxy of the fleet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<proxyfleet_config::TraceSettings>,
    /// Where the listeners' certificates come from. Default: the operator's managed CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// The Service in front of the proxies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceSpec>,
    /// Scheduling and metadata of the proxy pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodOverrides>,
    /// Runtime tuning of the proxies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<Tuning>,
    /// How changes roll out. Default: a rolling update with no unavailable pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
    /// How long new pods may take to become Ready (default 600s, as a Deployment's
    /// progressDeadlineSeconds). Past it a canary aborts and a plain rollout reports
    /// Degraded/ProgressDeadlineExceeded, quoting the pods' reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10s') && duration(self) <= duration('24h')").message("spec.progressDeadline must be between 10s and 24h"))]
    pub progress_deadline: Option<HumanDuration>,
    /// Which member clusters also run this fleet (set on the hub cluster only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

fn default_replicas() -> i32 {
    2
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// A port the proxies listen on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListenerSpec {
    /// Name, unique; also the Service port's name.
    #[schemars(length(min = 1, max = 15), pattern(r"^[a-z]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// Container port (1024-65535: the proxies run unprivileged).
    #[schemars(range(min = 1024, max = 65535))]
    pub port: i32,
    /// Port on the Service. Defaults to `port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub service_port: Option<i32>,
    /// HTTPS (TLS terminated by the proxy, the default), HTTP, or TCP (bytes relayed: TLS
    /// passthrough by SNI or plain TCP, see `tcp`).
    #[serde(default)]
    pub protocol: ListenerProtocol,
    /// Host names served on this listener; they become SANs of the managed certificate.
    /// Lower-case DNS names; a wildcard only as the whole leftmost label (`*.example.com`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(
            length(min = 1, max = 253),
            pattern(r"^([*][.])?[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        )
    )]
    pub hostnames: Vec<String>,
    /// Require client certificates signed by the CA in this Secret's `ca.crt` (mTLS). A Secret
    /// of the fleet's own namespace: a name, never `namespace/name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub client_ca_secret: Option<String>,
    /// Answer every request with a redirect to HTTPS (HTTP listeners only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https_redirect: Option<proxyfleet_config::HttpsRedirect>,
    /// One JSON line per request on the proxies' standard output (`kubectl logs`); off when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log: Option<proxyfleet_config::AccessLog>,
    /// With protocol TCP: relay connections by the ClientHello's SNI without terminating TLS
    /// (`mode: tlsPassthrough`), to one upstream (`mode: tcp`), or speak SOCKS5 (`mode:
    /// socks5`, targets checked by `spec.connect`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<proxyfleet_config::TcpProxy>,
    /// HTTPS listeners: also serve HTTP/3 over QUIC on the same port number over UDP (the
    /// Service gets a UDP port beside the TCP one) and advertise it with `Alt-Svc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http3: Option<proxyfleet_config::Http3>,
}

impl ListenerSpec {
    /// The port clients reach on the Service.
    pub fn service_port(&self) -> i32 {
        self.service_port.unwrap_or(self.port)
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ListenerProtocol {
    #[default]
    HTTPS,
    HTTP,
    /// TLS passthrough by SNI, plain TCP or SOCKS5 (`tcp` says which).
    TCP,
}

/// The Service in front of the proxies.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// ClusterIP (default), NodePort or LoadBalancer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#type: Option<ServiceType>,
    /// Also create `<name>-headless`, a headless Service selecting every proxy pod.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub headless: bool,
    /// Annotations of the Service (e.g. for a cloud load balancer).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ServiceType {
    ClusterIP,
    NodePort,
    LoadBalancer,
}

/// Scheduling and metadata of the proxy pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodOverrides {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// Extra pod annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub annotations: BTreeMap<String, String>,
    /// Extra pod labels (the operator's own labels win).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64, "additionalProperties" = {"type": "string", "maxLength": 63, "pattern": "^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"}))]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

/// Runtime tuning.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tuning {
    /// Worker threads per proxy, each with its own event loop, listening socket (SO_REUSEPORT)
    /// and idle upstream connections; default: the CPUs the container may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub worker_threads: Option<u16>,
    /// Microseconds a proxy worker thread spins before it sleeps while work keeps arriving
    /// within twice that and the thread is mostly busy (adaptive: an idle proxy never spins);
    /// adds the spin to the CPU a busy proxy reports. Default 20, or 0 under a CPU limit (the
    /// spin would spend the quota); 0 turns it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1000))]
    pub idle_spin_micros: Option<u16>,
    /// Namespaced sysctls set on the pods; only Kubernetes' safe set is allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[x_kube(validation = Rule::new("self.all(s, s.name in ['net.ipv4.ip_local_port_range', 'net.ipv4.tcp_syncookies', 'net.ipv4.ping_group_range', 'net.ipv4.ip_unprivileged_port_start', 'net.ipv4.tcp_keepalive_time', 'net.ipv4.tcp_fin_timeout', 'net.ipv4.tcp_keepalive_intvl', 'net.ipv4.tcp_keepalive_probes'])").message("spec.tuning.sysctls[].name must be one of Kubernetes' safe sysctls"))]
    pub sysctls: Vec<Sysctl>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct Sysctl {
    #[schemars(length(min = 1, max = 128))]
    pub name: String,
    #[schemars(length(max = 128))]
    pub value: String,
}

/// Observed state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyDeploymentStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pending, Progressing, Ready or Degraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    #[serde(default)]
    pub replicas: i32,
    #[serde(default)]
    pub ready_replicas: i32,
    #[serde(default)]
    pub updated_replicas: i32,
    /// Label selector of the proxy pods (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Revision of the pod template (image + config hash) running as stable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Image of the stable pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Keyed by `type`: the fleet controller and the propagation controller each own theirs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Certificates the fleet serves (issuer, serial, validity, renewal time).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<crate::certs::spec::CertificateStatus>,
    /// Managed CA rotation progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_rotation: Option<crate::certs::spec::CaRotationStatus>,
    /// ACME orders (spec.tls.acme only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acme: Option<crate::certs::spec::AcmeStatus>,
    /// Canary rollout progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<crate::canary::spec::CanaryStatus>,
    /// Per member cluster propagation state (hub only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<crate::propagation::spec::ClusterStatus>,
    /// Rollout across waves of member clusters (hub only; `spec.placement.waves`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waves: Option<crate::propagation::spec::WaveStatus>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    Pending,
    Progressing,
    Ready,
    Degraded,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Progressing => "Progressing",
            Self::Ready => "Ready",
            Self::Degraded => "Degraded",
        }
    }
}
