//! proxyfleet-operator: reconciles ProxyDeployments into running proxy fleets.
//!
//! Reading order: `crd` (the API) → `controller` (the loop) → `desired` (what to own) →
//! `resources` (pure builders) → `apply` (writes) → `status` / `conditions`; then the
//! capabilities: `certs`, `canary`, `propagation`, `app` (gray releases of the apps behind a fleet).

pub mod admin;
pub mod app;
pub mod apply;
pub mod backoff;
pub mod cache_trim;
pub mod caches;
pub mod canary;
pub mod certs;
pub mod command_annotation;
pub mod conditions;
pub mod context;
pub mod controller;
pub mod crd;
pub mod crypto;
pub mod desired;
pub mod event_recorder;
pub mod heap_trim;
pub mod history;
pub mod labels;
pub mod latest_object;
pub mod leader;
pub mod metrics;
pub mod owned_set;
pub mod owner_index;
pub mod pod_problem;
pub mod policy;
pub mod propagation;
pub mod resources;
pub mod schema;
pub mod secret_refs;
pub mod shared_input;
pub mod spec_check;
pub mod status;
pub mod status_apply;
pub mod task;
pub mod verdict;
pub mod verdict_wait;

#[cfg(test)]
mod golden_tests;
