//! The ProxyFleetPolicy API: what the platform team allows fleets of the namespaces it selects
//! to do through the operator (which acts with its own rights, not its users'). Cluster-scoped:
//! only whoever may write cluster-scoped objects (the platform team) can loosen it.
//!
//! Every field is a restriction; one left out restricts nothing. A fleet must satisfy every
//! policy that selects its namespace.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::crd::ServiceType;

/// What fleets in the selected namespaces may do through the operator.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "proxyfleet.io",
    version = "v1alpha1",
    kind = "ProxyFleetPolicy",
    shortname = "pxpol",
    category = "proxyfleet",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Age", "type":"date", "jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ProxyFleetPolicySpec {
    /// The namespaces governed. Absent: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Image repositories `spec.image` may name (e.g. `registry.example.com/proxyfleet/proxy`:
    /// any tag or digest of it). The operator's default image is always allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_image_repositories: Option<Vec<String>>,
    /// Service types `spec.service.type` may be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_service_types: Option<Vec<ServiceType>>,
    /// Whether `spec.service.annotations` may be set (cloud load-balancer annotations can open
    /// a fleet to the internet or pick another network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_service_annotations: Option<bool>,
    /// ClusterIssuers `spec.tls.certManager.issuerRef` may name (Issuers of the fleet's own
    /// namespace are always allowed): cert-manager's by name, another API group's (an external
    /// issuer) as `group/name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_cluster_issuers: Option<Vec<String>>,
    /// ACME directory URLs `spec.tls.acme.directory` may name (absent: any). Which names a fleet
    /// may order certificates for is `dnsNameSuffixes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_acme_directories: Option<Vec<String>>,
    /// DNS suffixes `spec.tls.dnsNames` must end with (`example.com` allows `example.com` and
    /// every name below it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_name_suffixes: Option<Vec<String>>,
    /// Whether `spec.pod` (node selector, tolerations, affinity, priority class, pod labels and
    /// annotations) may be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_pod_overrides: Option<bool>,
    /// Whether `spec.tuning` (worker threads, sysctls) may be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_tuning: Option<bool>,
    /// Whether upstreams may set `tls.insecureSkipVerify`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_insecure_skip_verify: Option<bool>,
    /// Whether the fleet may name Secrets of its namespace for the pods to mount (`tls.secretName`,
    /// a listener's `clientCaSecret`, an upstream's `caSecret`/`clientCertificateSecret`) or for
    /// the operator to read (`tls.acme.directoryCaSecret`, `tls.acme.externalAccountBinding`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_secret_references: Option<bool>,
    /// At most this many replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_replicas: Option<i32>,
    /// Prometheus base URLs a canary analysis may query (an analysis' `source.prometheus.address`
    /// and a metric's `prometheus.address`; absent: any). The operator sends those queries from
    /// its own namespace, which every fleet's NetworkPolicy admits to the proxies' admin port, and
    /// quotes the answer in the fleet's status: an address the tenant chooses is a request the
    /// operator makes on the tenant's behalf.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_prometheus_addresses: Option<Vec<String>>,
}
