//! Pure builders of every object a ProxyDeployment owns. No I/O: spec in, objects out.

pub mod config_map;
pub mod deployment;
pub mod network_policy;
pub mod pdb;
pub mod service;
pub mod service_account;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::crd::ProxyDeployment;
use crate::labels;

/// Operator-wide settings that shape owned objects.
#[derive(Clone, Debug)]
pub struct OperatorSettings {
    /// Proxy image when the spec names none.
    pub default_proxy_image: String,
    /// Lifetime of newly created managed CAs.
    pub ca_duration: std::time::Duration,
    /// Where member cluster Secrets (label `proxyfleet.io/cluster`) are read.
    pub clusters_namespace: String,
    /// Where Argo CD's cluster Secrets are read, when set.
    pub argocd_namespace: Option<String>,
    /// How often members are re-read for drift and status.
    pub propagation_resync: std::time::Duration,
    /// How long a deleted propagated fleet waits for unreachable members.
    pub propagation_cleanup_timeout: std::time::Duration,
    /// The one namespace this controller instance watches and writes (a namespaced install
    /// runs one instance per namespace, with Roles only); `None`: every namespace.
    pub watch_namespace: Option<String>,
    /// The operator's own namespace: its pods may reach the fleets' admin ports.
    pub operator_namespace: String,
    /// Fleets reconciled at once (0: no limit).
    pub reconcile_concurrency: u16,
}

impl OperatorSettings {
    /// The API of a namespaced kind in this instance's scope.
    pub fn api<K>(&self, client: &kube::Client) -> kube::Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match &self.watch_namespace {
            Some(ns) => kube::Api::namespaced(client.clone(), ns),
            None => kube::Api::all(client.clone()),
        }
    }
}

/// See docs/operator-footprint.md for the measurement behind it.
pub const DEFAULT_RECONCILE_CONCURRENCY: u16 = 16;

impl Default for OperatorSettings {
    fn default() -> Self {
        Self {
            default_proxy_image: format!("proxyfleet.local/proxy:{}", env!("CARGO_PKG_VERSION")),
            ca_duration: std::time::Duration::from_secs(365 * 24 * 3600),
            clusters_namespace: "proxyfleet-system".into(),
            argocd_namespace: None,
            propagation_resync: std::time::Duration::from_secs(15),
            propagation_cleanup_timeout: std::time::Duration::from_secs(300),
            watch_namespace: None,
            operator_namespace: "proxyfleet-system".into(),
            reconcile_concurrency: DEFAULT_RECONCILE_CONCURRENCY,
        }
    }
}

/// Name, namespace and owner reference of a ProxyDeployment, for owned objects' metadata.
#[derive(Clone, Debug)]
pub struct Owner {
    pub name: String,
    pub namespace: String,
    pub reference: OwnerReference,
}

#[derive(Debug, thiserror::Error)]
#[error("ProxyDeployment has no {0} yet")]
pub struct MissingMetadata(&'static str);

impl Owner {
    pub fn of(pxd: &ProxyDeployment) -> Result<Self, MissingMetadata> {
        let name = pxd.metadata.name.clone().ok_or(MissingMetadata("name"))?;
        let namespace = pxd.metadata.namespace.clone().ok_or(MissingMetadata("namespace"))?;
        let uid = pxd.metadata.uid.clone().ok_or(MissingMetadata("uid"))?;
        Ok(Self {
            name: name.clone(),
            namespace,
            reference: OwnerReference {
                api_version: ProxyDeployment::api_version(&()).to_string(),
                kind: ProxyDeployment::kind(&()).to_string(),
                name,
                uid,
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        })
    }

    /// Metadata of an owned object: our labels, the owner reference.
    pub fn meta(&self, name: impl Into<String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels::owned(&self.name)),
            owner_references: Some(vec![self.reference.clone()]),
            ..Default::default()
        }
    }
}

#[cfg(test)]
pub(crate) mod fixtures;
