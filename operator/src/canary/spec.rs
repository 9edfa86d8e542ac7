//! `spec.strategy` and the canary part of the status.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use proxyfleet_config::HumanDuration;

/// How changes roll out.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Strategy {
    /// Canary rollout; without it changes roll out as a plain rolling update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryStrategy>,
}

/// Moves traffic to a new revision step by step, judged by the proxies' own metrics.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.steps.filter(s, has(s.setWeight)).map(s, s.setWeight).isSorted() && self.steps.filter(s, has(s.setWeight)).all(s, self.steps.filter(t, has(t.setWeight) && t.setWeight == s.setWeight).size() == 1)").message("spec.strategy.canary.steps[].setWeight must be strictly increasing").field_path(".steps"))]
pub struct CanaryStrategy {
    /// Steps, in order: setWeight, pause or analysis.
    #[schemars(length(min = 1, max = 32))]
    pub steps: Vec<CanaryStep>,
    /// Background analysis, running throughout the rollout once the canary carries traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<Analysis>,
    /// With background analysis: a step is left (and the revision promoted) only once the
    /// latest measurement taken entirely at the current weight has passed. Default true; false
    /// lets steps advance on their own timers while the analysis runs beside them (Argo
    /// Rollouts' behaviour, where a rollout can finish before its analysis has judged it).
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub gate_on_background_analysis: bool,
}

fn default_true() -> bool {
    true
}
fn is_true(b: &bool) -> bool {
    *b
}

/// One step: exactly one of setWeight, pause or analysis.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.setWeight) ? 1 : 0) + (has(self.pause) ? 1 : 0) + (has(self.analysis) ? 1 : 0) == 1").message("each canary step needs exactly one of setWeight, pause or analysis"))]
pub struct CanaryStep {
    /// Percentage of pods (and so of traffic) on the canary revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub set_weight: Option<i32>,
    /// Wait: for `duration`, or until promoted when no duration is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<Pause>,
    /// Blocking analysis at this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<Analysis>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pause {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<HumanDuration>,
}

/// Measurements of the canary, repeated every `interval`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("duration(self.interval) >= duration('1s')").message("analysis interval must be at least 1s").field_path(".interval"))]
pub struct Analysis {
    /// Time between measurements. Default 10s.
    #[serde(default = "default_interval")]
    pub interval: HumanDuration,
    /// Look-back window of each measurement. Default 30s.
    #[serde(default = "default_window")]
    pub window: HumanDuration,
    /// Measurements of a blocking analysis step before it passes. Default 3.
    #[serde(default = "default_count")]
    #[schemars(range(min = 1, max = 100))]
    pub count: i32,
    /// Failed measurements tolerated; one more aborts the rollout. Default 1.
    #[serde(default = "default_failure_limit")]
    #[schemars(range(min = 0, max = 100))]
    pub failure_limit: i32,
    /// Consecutive errors (metric source unreachable) tolerated; one more aborts. Default 4.
    #[serde(default = "default_error_limit")]
    #[schemars(range(min = 0, max = 100))]
    pub consecutive_error_limit: i32,
    /// Below this many canary requests in the window a measurement is inconclusive. Default 20.
    #[serde(default = "default_min_requests")]
    #[schemars(range(min = 0))]
    pub min_requests: i64,
    /// What a window without data counts as. Default Inconclusive.
    #[serde(default)]
    pub on_no_data: OnNoData,
    /// Where built-in metrics come from. Default: scrape the pods directly.
    #[serde(default)]
    pub source: MetricSource,
    #[schemars(length(min = 1, max = 16))]
    pub metrics: Vec<Metric>,
}

fn default_interval() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_window() -> HumanDuration {
    HumanDuration::from_secs(30)
}
fn default_count() -> i32 {
    3
}
fn default_failure_limit() -> i32 {
    1
}
fn default_error_limit() -> i32 {
    4
}
fn default_min_requests() -> i64 {
    20
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum OnNoData {
    #[default]
    Inconclusive,
    Fail,
}

/// Source of the built-in metrics.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricSource {
    /// Query this Prometheus (PromQL generated from the proxy metrics); scrape pods directly when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusSource>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusSource {
    /// Base URL, e.g. http://prometheus.monitoring:9090 (plain HTTP: the operator's client
    /// does not speak TLS to Prometheus, so an https:// address is refused at admission).
    #[schemars(length(min = 1, max = 512), pattern(r"^http://"))]
    pub address: String,
}

/// One metric: exactly one of p99LatencyMs, errorRate5xx or prometheus.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.p99LatencyMs) ? 1 : 0) + (has(self.errorRate5xx) ? 1 : 0) + (has(self.prometheus) ? 1 : 0) == 1").message("each analysis metric needs exactly one of p99LatencyMs, errorRate5xx or prometheus"))]
pub struct Metric {
    /// Name, shown in status.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// The canary's P99 request latency, from the proxies' histogram.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_latency_ms: Option<Threshold>,
    /// The canary's share of 5xx responses, in percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_rate5xx: Option<Threshold>,
    /// Any PromQL query returning one number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusQuery>,
}

/// A limit: absolute (`max`), or relative to stable (`maxPercentWorseThanStable`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.max)").message("give max (relativeToStable, optional beside it, has nothing to compare with while stable serves no traffic, as at setWeight: 100)"))]
pub struct Threshold {
    /// Absolute maximum (milliseconds for latency, percent for error rate). Required: it judges
    /// the windows in which stable has no figure to compare with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub max: Option<f64>,
    /// The canary may be at most this many percent worse than stable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 10000.0))]
    pub relative_to_stable: Option<f64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusQuery {
    #[schemars(length(min = 1, max = 512), pattern(r"^http://"))]
    pub address: String,
    /// PromQL; `{{canary}}` and `{{stable}}` are replaced with pod label selectors.
    #[schemars(length(min = 1, max = 4096))]
    pub query: String,
    /// `result < 0.5`, `result <= 100`, `result > 1`, … (one comparison against `result`).
    #[schemars(length(min = 1, max = 256), pattern(r"^result\s*(<|<=|>|>=|==|!=)\s*-?[0-9.]+$"))]
    pub success_condition: String,
}

/// Where a canary rollout stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CanaryPhase {
    #[default]
    Idle,
    Progressing,
    Paused,
    Analyzing,
    Promoting,
    Completed,
    Aborted,
}

impl CanaryPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "Idle",
            Self::Progressing => "Progressing",
            Self::Paused => "Paused",
            Self::Analyzing => "Analyzing",
            Self::Promoting => "Promoting",
            Self::Completed => "Completed",
            Self::Aborted => "Aborted",
        }
    }

    /// A rollout is under way (or stopped by an abort) for the canary revision.
    pub fn in_rollout(self) -> bool {
        !matches!(self, Self::Idle | Self::Completed)
    }
}

impl std::fmt::Display for CanaryPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which analysis a metric's counters belong to.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AnalysisKind {
    /// The blocking analysis of the current step (counters restart with each step).
    #[default]
    Step,
    /// The background analysis (counters run for the whole rollout; never reset).
    Background,
}

/// Canary rollout progress: everything needed to resume exactly after a restart.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStatus {
    /// Idle, Progressing, Paused, Analyzing, Promoting, Aborted, Completed.
    pub phase: CanaryPhase,
    #[serde(default)]
    pub current_step_index: i32,
    /// Percentage of pods on the canary revision.
    #[serde(default)]
    pub weight: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_revision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_revision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_started_at: Option<String>,
    /// When the current weight started carrying traffic (measurements that count towards
    /// judging this weight start no earlier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_reached_at: Option<String>,
    /// The latest background measurement taken entirely at the current weight passed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub weight_verified: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_reason: Option<String>,
    /// A hash of the strategy this rollout runs under: edited mid-rollout, the rollout starts
    /// again from its first step (as Argo Rollouts' `currentStepHash`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy_hash: Option<String>,
    /// Paused by `kubectl proxyfleet pause` (not by a pause step): held until resumed or
    /// promoted, even on a timed pause step.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused_by_request: bool,
    /// The `proxyfleet.io/retry-token` annotation the object carried when a retry restarted
    /// this rollout: a hub's wave rollout learns from it that the retry it asked was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_token: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricStatus {
    pub name: String,
    /// Step (the current blocking analysis step) or Background (the whole rollout).
    #[serde(default)]
    pub analysis: AnalysisKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_value: Option<String>,
    #[serde(default)]
    pub successes: i32,
    #[serde(default)]
    pub failures: i32,
    #[serde(default)]
    pub inconclusive: i32,
    #[serde(default)]
    pub errors: i32,
    #[serde(default)]
    pub consecutive_errors: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_measured_at: Option<String>,
}
