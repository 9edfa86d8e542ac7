//! What every reconcile shares: the client, the caches of owned objects, the writer, the
//! event recorder, metrics and settings. At the bottom of the module graph: capability
//! modules import it, it imports none of them.

use k8s_openapi::api::apps::v1::{ControllerRevision, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::Store;
use kube::{Api, Client};
use std::sync::Arc;

use crate::app::spec::AppRollout;
use crate::apply::Applier;
use crate::crd::ProxyDeployment;
use crate::metrics::Metrics;
use crate::owner_index::OwnerIndex;
use crate::resources::{OperatorSettings, Owner};
use crate::status_apply::StatusWriter;

/// Caches of what the operator owns (everything labelled managed-by=proxyfleet-operator).
#[derive(Clone)]
pub struct Stores {
    pub deployments: Store<Deployment>,
    pub config_maps: Store<ConfigMap>,
    pub services: Store<Service>,
    pub service_accounts: Store<ServiceAccount>,
    pub pdbs: Store<PodDisruptionBudget>,
    pub secrets: Store<Secret>,
    pub revisions: Store<ControllerRevision>,
    pub network_policies: Store<k8s_openapi::api::networking::v1::NetworkPolicy>,
    /// Every ProxyFleetPolicy (cluster-scoped).
    pub policies: Store<crate::policy::spec::ProxyFleetPolicy>,
    /// Every namespace's metadata: its labels select the policies that govern it.
    pub namespaces: Store<kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Namespace>>,
    /// What each fleet controls, for the kinds a pass looks its own objects up in.
    pub by_owner: ByOwner,
    /// Every ProxyDeployment (a namespace's CA rotation waits for the fleets on that CA).
    pub fleets: Store<ProxyDeployment>,
}

/// Per kind, the cached objects each fleet controls (see `owner_index`).
#[derive(Clone, Default)]
pub struct ByOwner {
    pub deployments: OwnerIndex,
    pub config_maps: OwnerIndex,
    pub services: OwnerIndex,
    pub pdbs: OwnerIndex,
    pub revisions: OwnerIndex,
}

pub struct Context {
    pub client: Client,
    /// Each ProxyDeployment as our last write of it returned it, while the watch cache lags
    /// behind that write; decisions must not.
    pub latest_fleets: crate::latest_object::LatestObject<ProxyDeployment>,
    pub http: crate::canary::source::HttpGetter,
    pub snapshots: crate::canary::source::SnapshotHistory,
    pub stores: Stores,
    pub applier: Applier,
    pub events: crate::event_recorder::Events,
    pub metrics: Arc<Metrics>,
    pub settings: OperatorSettings,
    pub propagation: crate::propagation::state::Propagation,
    /// Retry delays of fleets that keep failing.
    pub backoff: crate::backoff::Backoff,
    /// Every AppRollout (they reshape the routes of the fleets they name).
    pub apps: Store<AppRollout>,
    /// The same for AppRollouts.
    pub latest_apps: crate::latest_object::LatestObject<AppRollout>,
    /// ACME orders in flight (leader only, like every reconcile).
    pub acme_orders: crate::certs::acme_orders::Orders,
}

impl Context {
    /// Writes ProxyDeployment statuses in `namespace` under `manager`.
    pub fn status_writer<'a>(&'a self, namespace: &str, manager: &'a str) -> StatusWriter<'a, ProxyDeployment> {
        StatusWriter {
            api: Api::namespaced(self.client.clone(), namespace),
            manager,
            latest: &self.latest_fleets,
            metrics: &self.metrics,
        }
    }

    /// Writes AppRollout statuses in `namespace`.
    pub fn app_status_writer(&self, namespace: &str) -> StatusWriter<'_, AppRollout> {
        StatusWriter {
            api: Api::namespaced(self.client.clone(), namespace),
            manager: crate::labels::FIELD_MANAGER,
            latest: &self.latest_apps,
            metrics: &self.metrics,
        }
    }

    /// Publishes a Normal event on the ProxyDeployment.
    pub async fn record(&self, owner: &Owner, reason: &str, note: &str) {
        self.publish(owner, EventType::Normal, reason, note).await;
    }

    pub async fn warn(&self, owner: &Owner, reason: &str, note: &str) {
        self.publish(owner, EventType::Warning, reason, note).await;
    }

    /// Publishes an event on any object.
    pub async fn record_on(&self, reference: &ObjectReference, warning: bool, reason: &str, note: &str) {
        let type_ = if warning { EventType::Warning } else { EventType::Normal };
        self.publish_on(reference, type_, reason, note).await;
    }

    async fn publish(&self, owner: &Owner, type_: EventType, reason: &str, note: &str) {
        let reference = ObjectReference {
            api_version: Some(owner.reference.api_version.clone()),
            kind: Some(owner.reference.kind.clone()),
            name: Some(owner.name.clone()),
            namespace: Some(owner.namespace.clone()),
            uid: Some(owner.reference.uid.clone()),
            ..Default::default()
        };
        self.publish_on(&reference, type_, reason, note).await;
    }

    async fn publish_on(&self, reference: &ObjectReference, type_: EventType, reason: &str, note: &str) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(crate::event_recorder::within_note_limit(note).to_string()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.events.publish(&ev, reference).await {
            tracing::debug!(error = %e, "event not published");
        }
    }
}

/// A context for unit tests of the I/O shells, against a mocked API server, with empty caches.
#[cfg(test)]
pub mod testing {
    use kube::runtime::reflector::store;

    use super::{Context, Stores};

    pub fn stores() -> Stores {
        Stores {
            deployments: store().0,
            config_maps: store().0,
            services: store().0,
            service_accounts: store().0,
            pdbs: store().0,
            secrets: store().0,
            revisions: store().0,
            network_policies: store().0,
            policies: store().0,
            namespaces: store().0,
            by_owner: Default::default(),
            fleets: store().0,
        }
    }

    pub fn test_context(client: kube::Client) -> Context {
        test_context_with(client, stores())
    }

    /// The same, with caches the test filled.
    pub fn test_context_with(client: kube::Client, stores: Stores) -> Context {
        crate::controller::context(
            &client,
            &std::sync::Arc::new(crate::metrics::Metrics::new()),
            Default::default(),
            "test".into(),
            stores,
            store().0,
            Vec::new(),
        )
    }
}
