//! What the caches keep of each object: what a reconcile reads, nothing more (issue 24: the
//! operator's memory at 1 000 fleets). Every watch that fills a cache trims each object
//! before the cache holds it.
//!
//! Never kept: `managedFields` (nothing reads them; often the larger part of the metadata) and
//! kubectl's `last-applied-configuration` annotation (a second copy of the object). Per kind,
//! beyond that:
//! - ConfigMap: the data of the immutable ones (the rendered proxy configurations, named by
//!   their hash) is dropped — the applier compares the desired hash annotation, never the
//!   data; the others (the live weights) keep theirs (an app rollout compares its key before
//!   writing).
//! - ControllerRevision: `data` (a copy of the spec) is dropped — the history reads the
//!   revision label and number; `kubectl proxyfleet history/rollback` read the API server.
//! - Deployment: the pod spec (`spec.template.spec`: containers, volumes, probes — most of the
//!   object), the selector and the strategy are dropped; the template's metadata (the revision
//!   label), the replica count and the status stay. Only a stable track kept on its current
//!   template during a rollout needs the pod spec, and that reconcile reads the whole object
//!   from the API server ([`untrimmed`]).
//! - NetworkPolicy, PodDisruptionBudget, ServiceAccount: only the metadata stays. The applier
//!   reads the desired-hash annotation and the version, garbage collection the owner
//!   references; nothing reads their bodies.
//! - Service: of the spec only the cluster IP stays (an app track's Service is rendered as its
//!   ClusterIP); ports, selectors and the status go.
//! - Secret and the custom resources are kept whole: the reconcile reads certificates (and
//!   re-applies a leaf with its key) and every spec.

use k8s_openapi::api::apps::v1::{ControllerRevision, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::Resource;
use serde::de::DeserializeOwned;

/// Objects per page of the initial list of a watch whose kind has an object per fleet. The
/// page is decoded whole, before the cache trims its objects: at 1 000 fleets kube-runtime's
/// default (500), or no pages at all (`any_semantic`: the API server's watch cache ignores the
/// limit), held ≈ 36 MiB of untrimmed objects at once when the operator started over existing
/// fleets, and the allocator kept that RSS. A page of 100 costs ten list requests per kind.
pub const LIST_PAGE: u32 = 100;

/// kubectl's client-side apply record: the whole object again, as an annotation.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no reconcile reads from an object about to be cached.
pub trait Trim: Resource {
    fn trim(&mut self) {
        trim_meta(self);
    }
}

/// A kind a cache here holds: decoded from the API server, trimmed ([`Trim`]) before it is
/// kept, and shared across tasks.
pub trait Cached:
    Trim + Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
}

impl<K> Cached for K where
    K: Trim + Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
}

/// A namespaced kind a fleet owns: what the owned caches (and their owner indexes) hold.
pub trait Owned: Cached + Resource<Scope = k8s_openapi::NamespaceResourceScope> {}

impl<K> Owned for K where K: Cached + Resource<Scope = k8s_openapi::NamespaceResourceScope> {}

/// Drops what no reconcile reads from any object: managed fields and kubectl's last-applied copy.
pub fn trim_meta<K: Resource + ?Sized>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

impl Trim for Secret {}

impl Trim for Service {
    fn trim(&mut self) {
        trim_meta(self);
        let cluster_ip = self.spec.as_mut().and_then(|s| s.cluster_ip.take());
        self.spec = cluster_ip.map(|ip| k8s_openapi::api::core::v1::ServiceSpec {
            cluster_ip: Some(ip),
            ..Default::default()
        });
        self.status = None;
    }
}

impl Trim for ServiceAccount {
    fn trim(&mut self) {
        trim_meta(self);
        self.secrets = None;
        self.image_pull_secrets = None;
    }
}

impl Trim for PodDisruptionBudget {
    fn trim(&mut self) {
        trim_meta(self);
        self.spec = None;
        self.status = None;
    }
}

impl Trim for NetworkPolicy {
    fn trim(&mut self) {
        trim_meta(self);
        self.spec = None;
    }
}
impl Trim for PartialObjectMeta<Namespace> {}
impl Trim for crate::crd::ProxyDeployment {}
impl Trim for crate::app::spec::AppRollout {}
impl Trim for crate::policy::spec::ProxyFleetPolicy {}

impl Trim for ConfigMap {
    fn trim(&mut self) {
        trim_meta(self);
        if self.immutable == Some(true) {
            self.data = None;
            self.binary_data = None;
        }
    }
}

impl Trim for Deployment {
    fn trim(&mut self) {
        trim_meta(self);
        if let Some(spec) = self.spec.as_mut() {
            spec.template.spec = None;
            spec.selector = Default::default();
            spec.strategy = None;
        }
    }
}

/// The whole of a cached (trimmed) Deployment, from the API server: `None` when it is gone.
pub async fn untrimmed(client: &kube::Client, cached: &Deployment) -> Result<Option<Deployment>, kube::Error> {
    let namespace = cached.metadata.namespace.as_deref().unwrap_or_default();
    let name = cached.metadata.name.as_deref().unwrap_or_default();
    Api::<Deployment>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
}

impl Trim for ControllerRevision {
    fn trim(&mut self) {
        trim_meta(self);
        self.data = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

    fn meta(name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            managed_fields: Some(vec![ManagedFieldsEntry::default()]),
            annotations: Some(
                [
                    (LAST_APPLIED.to_string(), "{}".to_string()),
                    ("proxyfleet.io/desired-hash".to_string(), "h".to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn immutable_config_maps_lose_their_data_the_others_keep_it() {
        let data = Some([("proxy.yaml".to_string(), "x".to_string())].into());
        let mut config = ConfigMap {
            metadata: meta("edge-config-abc"),
            data: data.clone(),
            immutable: Some(true),
            ..Default::default()
        };
        config.trim();
        assert_eq!(config.data, None);
        assert_eq!(config.metadata.managed_fields, None);
        let annotations = config.metadata.annotations.unwrap_or_default();
        assert!(!annotations.contains_key(LAST_APPLIED));
        assert!(
            annotations.contains_key("proxyfleet.io/desired-hash"),
            "the applier reads it"
        );

        let mut weights = ConfigMap {
            metadata: meta("edge-weights"),
            data: data.clone(),
            ..Default::default()
        };
        weights.trim();
        assert_eq!(weights.data, data);
    }

    #[test]
    fn revisions_keep_their_number_not_their_data() {
        let mut cr = ControllerRevision {
            metadata: meta("edge-abc"),
            data: Some(RawExtension(serde_json::json!({"spec": {}}))),
            revision: 3,
        };
        cr.trim();
        assert_eq!((cr.data, cr.revision), (None, 3));
    }

    #[test]
    fn deployments_keep_their_revision_label_and_status_not_their_pod_spec() {
        use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};
        use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
        let template_meta = ObjectMeta {
            labels: Some([(crate::labels::REVISION.to_string(), "r1".to_string())].into()),
            ..Default::default()
        };
        let mut d = Deployment {
            metadata: meta("edge-stable"),
            spec: Some(DeploymentSpec {
                replicas: Some(3),
                template: PodTemplateSpec {
                    metadata: Some(template_meta.clone()),
                    spec: Some(PodSpec::default()),
                },
                ..Default::default()
            }),
            status: Some(DeploymentStatus {
                ready_replicas: Some(3),
                ..Default::default()
            }),
        };
        d.trim();
        assert_eq!(crate::status::revision_of(&d).as_deref(), Some("r1"));
        let spec = d.spec.as_ref().expect("spec");
        assert_eq!((spec.replicas, spec.template.spec.is_none()), (Some(3), true));
        assert_eq!(d.status.and_then(|s| s.ready_replicas), Some(3));
    }

    #[test]
    fn services_keep_their_cluster_ip_only_and_applied_kinds_their_metadata() {
        use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
        use k8s_openapi::api::networking::v1::NetworkPolicySpec;
        let mut svc = Service {
            metadata: meta("shop-canary"),
            spec: Some(ServiceSpec {
                cluster_ip: Some("10.96.0.7".into()),
                ports: Some(vec![ServicePort::default()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        svc.trim();
        let spec = svc.spec.expect("spec");
        assert_eq!((spec.cluster_ip.as_deref(), spec.ports), (Some("10.96.0.7"), None));
        let mut np = NetworkPolicy {
            metadata: meta("edge"),
            spec: Some(NetworkPolicySpec::default()),
        };
        np.trim();
        assert!(np.spec.is_none());
        let annotations = np.metadata.annotations.unwrap_or_default();
        assert!(
            annotations.contains_key("proxyfleet.io/desired-hash"),
            "the applier reads it"
        );
        let mut pdb = PodDisruptionBudget {
            metadata: meta("edge"),
            spec: Some(Default::default()),
            status: Some(Default::default()),
        };
        pdb.trim();
        assert!(pdb.spec.is_none() && pdb.status.is_none());
    }
}
