//! The contract for changing a route's backend weights at run time, without a reload or a pod
//! restart: the operator PUTs a `LiveWeights` document to every proxy's admin listener and
//! writes the same document into a ConfigMap the proxies mount (so a restarted proxy starts
//! with it). A document only replaces one with a lower generation, so a stale file the kubelet
//! projects late can never undo a newer push.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Admin path taking `PUT` of a `LiveWeights` document (bearer token required).
pub const LIVE_WEIGHTS_PATH: &str = "/weights";

/// New weights for the backends of one route.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LiveWeights {
    /// Route name.
    pub route: String,
    /// Monotonic per route: a document with a lower generation than the applied one is ignored.
    pub generation: u64,
    /// Weight of each backend, by upstream name: exactly the route's backends, summing to 100.
    pub weights: BTreeMap<String, u8>,
    /// Whether the route's `overrides` (forced routing) apply; an app rollout turns them off
    /// while no canary runs, so testers' headers never reach a backend without pods.
    #[serde(default = "default_true")]
    pub overrides: bool,
}

fn default_true() -> bool {
    true
}

impl LiveWeights {
    pub fn to_json(&self) -> String {
        // Plain data: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}
