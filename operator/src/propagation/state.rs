//! Propagation's share of the operator's state (held by the shared `Context`).

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::Store;

use super::member::MemberClients;

/// Propagation's share of the operator's state.
pub struct Propagation {
    /// Cluster Secrets: ours, and Argo CD's when configured.
    pub cluster_secrets: Vec<Store<Secret>>,
    pub clients: MemberClients,
    /// How often members are re-read (drift, member status) without a hub change.
    pub resync: Duration,
    /// How long a deleted hub object waits for unreachable members.
    pub cleanup_timeout: Duration,
}
