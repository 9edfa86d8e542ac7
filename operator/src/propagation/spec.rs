//! `spec.placement` and the per-cluster status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::KubeSchema;
use proxyfleet_config::HumanDuration;
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
    /// Ordered waves of the selected clusters. A new revision reaches wave N+1 only when every
    /// cluster of wave N reports its own canary for it Completed and its fleet Ready, and
    /// `soakTime` passed; clusters in no wave form the last wave. Empty: every cluster at once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub waves: Vec<Wave>,
    /// How long a completed wave is watched before the next one starts. Default 0s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak_time: Option<HumanDuration>,
    /// How long one wave may take (a member that does not finish, or cannot be reached) before
    /// the rollout aborts. Default 30m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave_timeout: Option<HumanDuration>,
    /// What an aborted wave rollout does to the clusters already on the new revision: Hold (keep
    /// it; each member's own canary has already gone back to its stable pods) or Rollback (send
    /// them the last completed spec). Default Hold.
    #[serde(default)]
    pub on_failure: WaveFailurePolicy,
}

/// One wave: clusters by name or by the labels of their Secrets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Wave {
    /// Shown in status and events; default `wave-<index>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub clusters: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    /// How many clusters of this wave may be taking the new revision at once. Default: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_unavailable_clusters: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum WaveFailurePolicy {
    #[default]
    Hold,
    Rollback,
}

/// Where a rollout across waves stands (hub only). Everything needed to go on after an
/// operator restart or a leader change lives here.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveStatus {
    /// The revision being rolled out: a hash of the spec without its placement.
    pub revision: String,
    /// The last revision every cluster completed; `None` before the first completed rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_revision: Option<String>,
    pub phase: WavePhase,
    /// Index of the wave that is rolling (or soaking).
    #[serde(default)]
    pub current_wave: u32,
    /// Waves in order with their clusters, as last computed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<WaveEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave_started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak_started_at: Option<String>,
    /// Retries of this revision after an abort (`kubectl proxyfleet resume`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempt: u32,
    /// Clusters whose canary aborted on the revision when `resume` retried it: each is asked to
    /// retry its canaries once, and leaves this list once they took it (its failures count).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retrying: Vec<String>,
    /// Canary retries this fleet's waves asked of members so far: each retry's token carries
    /// it, so no token is used twice, not even when a revision is rolled out again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_serial: u32,
    /// Why the rollout waits, or what it did last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_reason: Option<String>,
    /// The spec (without placement) of `stableRevision`: what `onFailure: Rollback` sends back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_value")]
    pub stable_spec: Option<serde_json::Value>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveEntry {
    pub name: String,
    #[serde(default)]
    pub clusters: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum WavePhase {
    #[default]
    Progressing,
    Soaking,
    Paused,
    Completed,
    Aborted,
}

impl WavePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Progressing => "Progressing",
            Self::Soaking => "Soaking",
            Self::Paused => "Paused",
            Self::Completed => "Completed",
            Self::Aborted => "Aborted",
        }
    }
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
    /// The wave this cluster is in (when the placement has waves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave: Option<u32>,
    /// The hub revision the member's copy carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The member's own canary: phase, step index and weight, as it reports them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_step: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_weight: Option<i32>,
    /// The fleet's app gray releases (AppRollouts) in that cluster, as its operator reports them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apps: Vec<ClusterAppStatus>,
}

/// One AppRollout in a member cluster, as the member's operator reports it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAppStatus {
    pub name: String,
    /// The hub revision of the app its copies carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_phase: Option<String>,
    /// Share of the route's requests its canary gets there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Any JSON value (a JSON patch's `value`).
fn any_value(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}
