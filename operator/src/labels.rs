//! The labels and annotations that mark what the operator owns.

use std::collections::BTreeMap;

pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGER: &str = "proxyfleet-operator";
pub const APP_NAME: &str = "app.kubernetes.io/name";
pub const PROXY_APP: &str = "proxyfleet-proxy";
pub const INSTANCE: &str = "proxyfleet.io/proxydeployment";
pub const TRACK: &str = "proxyfleet.io/track";
pub const REVISION: &str = "proxyfleet.io/revision";
pub const CONFIG_HASH: &str = "proxyfleet.io/config-hash";
pub const DESIRED_HASH: &str = "proxyfleet.io/desired-hash";
/// The server-side apply field manager of every write.
pub const FIELD_MANAGER: &str = "proxyfleet-operator";

/// Whether pods serve as the stable revision or the canary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Track {
    Stable,
    Canary,
}

impl Track {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stable => "stable",
            Self::Canary => "canary",
        }
    }
}

/// Labels on every object owned by ProxyDeployment `name`.
pub fn owned(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.to_string(), MANAGER.to_string()),
        (APP_NAME.to_string(), PROXY_APP.to_string()),
        (INSTANCE.to_string(), name.to_string()),
    ])
}

/// What the Service selects: every proxy pod of the fleet, stable and canary.
pub fn fleet_selector(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (APP_NAME.to_string(), PROXY_APP.to_string()),
        (INSTANCE.to_string(), name.to_string()),
    ])
}

/// What one Deployment selects: its track only.
pub fn track_selector(name: &str, track: Track) -> BTreeMap<String, String> {
    let mut s = fleet_selector(name);
    s.insert(TRACK.to_string(), track.as_str().to_string());
    s
}

pub fn selector_string(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The label selector for watching everything the operator manages.
pub fn managed_selector() -> String {
    format!("{MANAGED_BY}={MANAGER}")
}
