//! The caches the controllers read, and the wake-ups their watches send. Every cache is filled
//! by one watch; a watch that must wake a controller does so after the cache holds the change,
//! so the reconcile it triggers reads what woke it.

use futures::channel::mpsc::{unbounded, UnboundedReceiver};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::app::spec::AppRollout;
use crate::context::Stores;
use crate::crd::ProxyDeployment;
use crate::labels;
use crate::policy::spec::ProxyFleetPolicy;
use crate::resources::OperatorSettings;

/// What wakes the fleet controller besides its own watches.
pub struct Wake {
    /// Namespaces whose CA Secret or labels changed (every fleet there is woken).
    pub ca_namespaces: UnboundedReceiver<String>,
    /// Fleets an AppRollout or an app track's Service names.
    pub fleets: UnboundedReceiver<ObjectRef<ProxyDeployment>>,
    /// A member cluster Secret changed: every fleet (placements may select it).
    pub all_fleets: UnboundedReceiver<()>,
    /// A ProxyFleetPolicy changed: every fleet (the fleet controller enforces them).
    pub policies: UnboundedReceiver<()>,
}

pub struct Caches {
    pub stores: Stores,
    pub apps: Store<AppRollout>,
    pub cluster_secrets: Vec<Store<Secret>>,
    pub wake: Wake,
    /// The watches; aborted when the caches are dropped (also mid-sync, on lost leadership).
    pub task: crate::task::AbortOnDrop<()>,
}

impl Caches {
    pub fn start(client: &Client, settings: &OperatorSettings) -> Self {
        let (deployments, f1) = owned_store::<Deployment>(client, settings);
        let (config_maps, f2) = owned_store::<ConfigMap>(client, settings);
        // AppRollouts reshape the routes of the fleets they name: a change wakes that fleet.
        let (fleet_tx, fleets) = unbounded::<ObjectRef<ProxyDeployment>>();
        let (apps, f8) = crate::app::controller::store(client, settings, fleet_tx.clone());
        // An app track's Service gets its ClusterIP: the fleet renders it as the endpoint.
        let app_store = apps.clone();
        let (services, f3) = owned_store_with(client, settings, move |svc: &Service| {
            if let Some(fleet) = crate::app::controller::fleet_of_service(&app_store, svc) {
                let _ = fleet_tx.unbounded_send(fleet);
            }
        });
        let (service_accounts, f4) = owned_store::<ServiceAccount>(client, settings);
        let (pdbs, f5) = owned_store::<PodDisruptionBudget>(client, settings);
        let (revisions, f7) = owned_store::<ControllerRevision>(client, settings);
        let (network_policies, f11) = owned_store::<NetworkPolicy>(client, settings);
        // A namespace's CA Secret is shared by its fleets (no owner reference): any change to
        // it (a rotation step, a rotation request) wakes every fleet of that namespace.
        let (ca_tx, ca_namespaces) = unbounded::<String>();
        let ca_tx_for_namespaces = ca_tx.clone();
        let (secrets, f6) = owned_store_with(client, settings, move |secret: &Secret| {
            if crate::certs::ca::is_ca_secret(secret) {
                let _ = ca_tx.unbounded_send(secret.metadata.namespace.clone().unwrap_or_default());
            }
        });
        // A namespace's labels choose its policies: a change wakes its fleets.
        let ns_tx = ca_tx_for_namespaces;
        let (namespaces, f9) = namespace_store(client, settings, move |ns| {
            let _ = ns_tx.unbounded_send(ns.metadata.name.clone().unwrap_or_default());
        });
        let (all_tx, all_fleets) = unbounded::<()>();
        // A policy change may allow or refuse any fleet.
        let (policy_tx, policies_changed) = unbounded::<()>();
        let propagation_tx = all_tx.clone();
        let (policies, f10) = policy_store(client, [policy_tx, propagation_tx]);
        let (cluster_secrets, cluster_watches) = cluster_secret_stores(client, settings, all_tx);
        let task = crate::task::AbortOnDrop(tokio::spawn(async move {
            tokio::join!(
                f1,
                f2,
                f3,
                f4,
                f5,
                f6,
                f7,
                f8,
                f9,
                f10,
                f11,
                futures::future::join_all(cluster_watches)
            );
        }));
        Self {
            stores: Stores {
                deployments,
                config_maps,
                services,
                service_accounts,
                pdbs,
                secrets,
                revisions,
                network_policies,
                policies,
                namespaces,
            },
            apps,
            cluster_secrets,
            wake: Wake {
                ca_namespaces,
                fleets,
                all_fleets,
                policies: policies_changed,
            },
            task,
        }
    }

    /// Waits for every initial list.
    pub async fn wait_until_ready(&self) {
        let s = &self.stores;
        let _ = tokio::join!(
            s.deployments.wait_until_ready(),
            s.config_maps.wait_until_ready(),
            s.services.wait_until_ready(),
            s.service_accounts.wait_until_ready(),
            s.pdbs.wait_until_ready(),
            s.secrets.wait_until_ready(),
            s.revisions.wait_until_ready(),
            s.network_policies.wait_until_ready(),
            self.apps.wait_until_ready(),
            s.policies.wait_until_ready(),
            s.namespaces.wait_until_ready(),
        );
    }
}

/// Member cluster Secrets (ours, and Argo CD's when the chart names its namespace); every
/// change is sent to `tx`.
fn cluster_secret_stores(
    client: &Client,
    settings: &OperatorSettings,
    tx: futures::channel::mpsc::UnboundedSender<()>,
) -> (Vec<Store<Secret>>, Vec<impl std::future::Future<Output = ()>>) {
    let mut sources = vec![(
        settings.clusters_namespace.clone(),
        crate::propagation::clusters::CLUSTER_LABEL.to_string(),
    )];
    if let Some(ns) = &settings.argocd_namespace {
        sources.push((
            ns.clone(),
            format!("{}=cluster", crate::propagation::clusters::ARGOCD_SECRET_TYPE),
        ));
    }
    let mut stores = Vec::new();
    let mut watches = Vec::new();
    for (ns, selector) in sources {
        let (reader, writer) = reflector::store();
        let tx = tx.clone();
        let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
        watches.push(
            reflector::reflector(writer, watcher(api, watcher::Config::default().labels(&selector)))
                .default_backoff()
                .touched_objects()
                .for_each(move |_| {
                    let _ = tx.unbounded_send(());
                    futures::future::ready(())
                }),
        );
        stores.push(reader);
    }
    (stores, watches)
}

/// A cache of the objects `api` and `config` select, calling `on_touched` for each after the
/// cache holds it; every cache here is one of these. `managedFields` are dropped before the
/// cache keeps an object: nothing reads them, and they are often the larger part of its
/// metadata (issue 24: the operator's memory at 1 000 fleets).
fn store_all<K>(
    api: Api<K>,
    config: watcher::Config,
    mut on_touched: impl FnMut(&K) + Send + 'static,
) -> (Store<K>, impl std::future::Future<Output = ()>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stripped = watcher(api, config).modify(|o| o.meta_mut().managed_fields = None);
    let stream = reflector::reflector(writer, stripped)
        .default_backoff()
        .touched_objects()
        .for_each(move |object| {
            if let Ok(object) = object {
                on_touched(&object);
            }
            futures::future::ready(())
        });
    (reader, stream)
}

/// Every ProxyFleetPolicy; each change is sent to every one of `wake`.
fn policy_store(
    client: &Client,
    wake: [futures::channel::mpsc::UnboundedSender<()>; 2],
) -> (Store<ProxyFleetPolicy>, impl std::future::Future<Output = ()>) {
    let config = watcher::Config::default().any_semantic();
    store_all(Api::all(client.clone()), config, move |_| {
        for tx in &wake {
            let _ = tx.unbounded_send(());
        }
    })
}

/// Namespaces' metadata (their labels select policies); no spec or status is read. A
/// namespaced instance reads only its own namespace (RBAC can then name it).
fn namespace_store(
    client: &Client,
    settings: &OperatorSettings,
    on_touched: impl FnMut(&PartialObjectMeta<Namespace>) + Send + 'static,
) -> (
    Store<PartialObjectMeta<Namespace>>,
    impl std::future::Future<Output = ()>,
) {
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
    let mut config = watcher::Config::default().any_semantic();
    if let Some(ns) = &settings.watch_namespace {
        config = config.fields(&format!("metadata.name={ns}"));
    }
    store_all(api, config, on_touched)
}

/// A cache of one owned kind, limited to objects we manage, kept by a background task.
pub fn owned_store<K>(client: &Client, settings: &OperatorSettings) -> (Store<K>, impl std::future::Future<Output = ()>)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    owned_store_with(client, settings, |_: &K| {})
}

/// [`owned_store`], calling `on_touched` for every object after the cache holds it — so a
/// reconcile it triggers reads the new version, never the one before.
pub fn owned_store_with<K>(
    client: &Client,
    settings: &OperatorSettings,
    on_touched: impl FnMut(&K) + Send + 'static,
) -> (Store<K>, impl std::future::Future<Output = ()>)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let config = watcher::Config::default()
        .labels(&labels::managed_selector())
        .any_semantic();
    store_all(settings.api(client), config, on_touched)
}
