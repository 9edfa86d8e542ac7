//! `spec.placement` and the per-cluster status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which member clusters run this fleet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Member cluster names (of registered cluster Secrets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub clusters: Vec<String>,
    /// Member clusters by the labels of their Secrets; names in `clusters` are added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    /// JSON patches applied to the propagated spec, per cluster name or selector.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub overrides: Vec<ClusterOverride>,
    /// What happens in a member when it leaves the placement or the fleet is deleted. Default Delete.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// JSON pointers (e.g. `/spec/replicas`) that member-side edits may change; left alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub ignore_fields: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    #[default]
    Delete,
    Orphan,
}

/// Patches for the clusters named, or selected.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.clusterName) != has(self.clusterSelector)").message("each override needs exactly one of clusterName or clusterSelector"))]
pub struct ClusterOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    /// RFC 6902 operations on the ProxyDeployment (paths start with /spec).
    #[schemars(length(min = 1, max = 64))]
    pub patches: Vec<JsonPatchOperation>,
}

/// One RFC 6902 operation. A missing `value` for add/replace/test is reported in status.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JsonPatchOperation {
    pub op: PatchOp,
    /// JSON pointer; must start with /spec/ and may not touch /spec/placement.
    #[schemars(length(min = 1, max = 512), pattern(r"^/spec/"))]
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_value")]
    pub value: Option<serde_json::Value>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PatchOp {
    Add,
    Remove,
    Replace,
    Test,
}

/// One member cluster as the hub sees it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    pub name: String,
    /// Whether the current spec is applied there.
    pub applied: bool,
    pub reachable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<String>,
}

/// Any JSON value (a JSON patch's `value`).
fn any_value(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}
