//! The operator's Prometheus metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub kind: String,
    pub verb: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    pub namespace: String,
    pub proxydeployment: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabels {
    pub namespace: String,
    pub proxydeployment: String,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub namespace: String,
    pub proxydeployment: String,
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MeasurementLabels {
    pub namespace: String,
    pub proxydeployment: String,
    pub metric: String,
}

pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Counter,
    pub reconcile_errors: Family<ReasonLabels, Counter>,
    pub reconcile_duration: Histogram,
    pub api_writes: Family<WriteLabels, Counter>,
    pub managed_objects: Gauge,
    pub certificate_expiration: Family<CertLabels, Gauge>,
    pub rollout_phase: Family<PhaseLabels, Gauge>,
    pub canary_weight: Family<ObjectLabels, Gauge>,
    pub analysis_value: Family<MeasurementLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub rollout_aborts: Family<ReasonLabels, Counter>,
    pub leader: Gauge,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("proxyfleet");
        let reconciles = Counter::default();
        registry.register("reconciles", "Reconciles of ProxyDeployments", reconciles.clone());
        let reconcile_errors = Family::default();
        registry.register(
            "reconcile_errors",
            "Failed reconciles by reason",
            reconcile_errors.clone(),
        );
        let reconcile_duration = Histogram::new([0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]);
        registry.register(
            "reconcile_duration_seconds",
            "Time per reconcile",
            reconcile_duration.clone(),
        );
        let api_writes = Family::default();
        registry.register(
            "operator_api_writes",
            "Write calls to the API server by kind and verb",
            api_writes.clone(),
        );
        let managed_objects = Gauge::default();
        registry.register(
            "managed_proxydeployments",
            "ProxyDeployments known to the operator",
            managed_objects.clone(),
        );
        let certificate_expiration = Family::default();
        registry.register(
            "certificate_expiration_timestamp_seconds",
            "notAfter of the certificates the operator manages, Unix seconds",
            certificate_expiration.clone(),
        );
        let rollout_phase = Family::default();
        registry.register(
            "rollout_phase",
            "Canary rollout phase (value 1 for the current phase)",
            rollout_phase.clone(),
        );
        let canary_weight = Family::default();
        registry.register(
            "canary_weight_percent",
            "Share of pods on the canary revision",
            canary_weight.clone(),
        );
        let analysis_value = Family::default();
        registry.register(
            "analysis_measurement",
            "Last canary analysis measurement per metric",
            analysis_value.clone(),
        );
        let rollout_aborts = Family::default();
        registry.register(
            "rollout_aborts",
            "Canary rollouts aborted, by reason",
            rollout_aborts.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "operator_leader",
            "1 when this replica holds the leader lease",
            leader.clone(),
        );
        Self {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            api_writes,
            managed_objects,
            certificate_expiration,
            rollout_phase,
            canary_weight,
            analysis_value,
            rollout_aborts,
            leader,
        }
    }

    pub fn api_write(&self, kind: &str, verb: &'static str) {
        self.api_writes
            .get_or_create(&WriteLabels {
                kind: kind.to_string(),
                verb,
            })
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
