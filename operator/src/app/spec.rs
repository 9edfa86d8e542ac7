//! The AppRollout API.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use proxyfleet_config::{CookieMatch, HeaderMatch, HumanDuration, StickyKey};

use crate::canary::spec::{CanaryStatus, CanaryStrategy};

/// A gray release of an application served by a ProxyDeployment route. The team keeps
/// applying its own Deployment (kubectl, Helm, Argo CD), scaled to zero; the operator runs its
/// pod template as `<name>-stable` and `<name>-canary`, shifts the route's traffic between
/// them step by step, judges the canary from the proxies' metrics, and promotes or rolls back.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "proxyfleet.io",
    version = "v1alpha1",
    kind = "AppRollout",
    namespaced,
    shortname = "apr",
    status = "AppRolloutStatus",
    derive = "PartialEq",
    category = "proxyfleet",
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 56").message("metadata.name must be a DNS-1035 label of at most 56 characters: it names the Services <name>-stable and <name>-canary"),
    printcolumn = r#"{"name":"Phase", "type":"string", "jsonPath":".status.canary.phase"}"#,
    printcolumn = r#"{"name":"Weight", "type":"integer", "jsonPath":".status.weight"}"#,
    printcolumn = r#"{"name":"Stable", "type":"string", "jsonPath":".status.stableRevision"}"#,
    printcolumn = r#"{"name":"Canary", "type":"string", "jsonPath":".status.canary.canaryRevision"}"#,
    printcolumn = r#"{"name":"Age", "type":"date", "jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AppRolloutSpec {
    /// The team's Deployment (apps/v1, same namespace) whose pod template is released. Keep it
    /// at `replicas: 0`: the operator runs the pods.
    pub workload_ref: WorkloadRef,
    /// Pods of the stable version (the canary gets its share of them per step).
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 1000))]
    pub replicas: i32,
    /// The container port the app serves on; the proxies send to it.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// The route that serves the app, in a ProxyDeployment of the same namespace.
    pub route: RouteRef,
    /// Keep a user on one version: hash this header or cookie into 100 buckets. Users already on
    /// the canary stay on it while its weight grows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sticky: Option<StickyKey>,
    /// Requests matching one of these always go to the canary while a rollout runs (testers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub canary_match: Vec<CanaryMatch>,
    /// The steps, analysis and limits: the same strategy a ProxyDeployment's canary takes.
    pub strategy: CanaryStrategy,
    /// How long canary pods may take to become Ready before the rollout aborts. Default 600s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10s') && duration(self) <= duration('24h')").message("spec.progressDeadline must be between 10s and 24h"))]
    pub progress_deadline: Option<HumanDuration>,
}

fn default_replicas() -> i32 {
    2
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadRef {
    /// Name of the Deployment (of the AppRollout's namespace).
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteRef {
    /// The ProxyDeployment (of the AppRollout's namespace).
    #[schemars(
        length(min = 1, max = 54),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub proxy_deployment: String,
    /// One of its `spec.routes[].name`. Its upstream's settings (TLS, pool, timeouts) are kept;
    /// its endpoints become the `<name>-stable` and `<name>-canary` Services.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
}

/// A header or a cookie (exactly one) that forces the canary.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.header) != has(self.cookie)").message("give exactly one of header or cookie"))]
pub struct CanaryMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<HeaderMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<CookieMatch>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppRolloutStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Revision (pod template hash) the stable Deployment runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_revision: Option<String>,
    /// Share of the route's requests the canary gets in the proxies now.
    #[serde(default)]
    pub weight: u8,
    /// Generation of the live weights last written (monotonic; the proxies ignore older ones).
    #[serde(default)]
    pub weights_generation: u64,
    /// Proxy pods that confirmed the current weights generation, of those found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights_applied: Option<String>,
    /// The rollout, as the fleet canary reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
