//! The caches the controllers read, and the wake-ups their watches send. Every cache is filled
//! by one watch; a watch that must wake a controller does so after the cache holds the change,
//! so the reconcile it triggers reads what woke it.

use futures::channel::mpsc::{unbounded, UnboundedReceiver, UnboundedSender};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::{ControllerRevision, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};

use crate::app::spec::AppRollout;
use crate::cache_trim::{Cached, Owned, Trim};
use crate::context::{ByOwner, Stores};
use crate::crd::ProxyDeployment;
use crate::labels;
use crate::owner_index::{controller_of, OwnerIndex};
use crate::policy::spec::ProxyFleetPolicy;
use crate::resources::OperatorSettings;
use crate::shared_input::{shared_input, Triggers};

/// What wakes the controllers besides their own watches. Every one is sent after the cache
/// holds the change that caused it, so the reconcile it triggers reads that change.
pub struct Wake {
    /// Namespaces whose CA Secret or labels changed (every fleet there is woken).
    pub ca_namespaces: UnboundedReceiver<String>,
    /// Fleets an owned object (Deployment, Service, Secret), an AppRollout or an app track's
    /// Service points at. The caches' watches stand in for `Controller::owns`: one watch per
    /// kind, not one per controller and kind.
    pub fleets: UnboundedReceiver<ObjectRef<ProxyDeployment>>,
    /// AppRollouts whose Deployment or Service changed.
    pub apps: UnboundedReceiver<ObjectRef<AppRollout>>,
    /// Fleets an AppRollout names (a new bundle revision to propagate).
    pub propagated: UnboundedReceiver<ObjectRef<ProxyDeployment>>,
    /// A member cluster Secret changed: every fleet (placements may select it).
    pub all_fleets: UnboundedReceiver<()>,
    /// A ProxyFleetPolicy changed: every fleet (the fleet controller enforces them).
    pub policies: UnboundedReceiver<()>,
    /// Every change to a ProxyDeployment, for the fleet controller and for the propagation
    /// controller (one watch and one cache for both).
    pub fleet_changes: Triggers<ProxyDeployment>,
    pub propagation_changes: Triggers<ProxyDeployment>,
    /// Every change to an AppRollout, for the AppRollout controller (its cache is `apps`).
    pub app_changes: Triggers<AppRollout>,
}

pub struct Caches {
    pub stores: Stores,
    /// Every ProxyDeployment; the fleet and the propagation controllers reconcile from it.
    pub fleets: Store<ProxyDeployment>,
    pub apps: Store<AppRollout>,
    pub cluster_secrets: Vec<Store<Secret>>,
    pub wake: Wake,
    /// The watches; aborted when the caches are dropped (also mid-sync, on lost leadership).
    pub task: crate::task::AbortOnDrop<()>,
}

/// The senders behind [`Wake`]'s owner wake-ups.
#[derive(Clone)]
struct Owners {
    fleets: UnboundedSender<ObjectRef<ProxyDeployment>>,
    apps: UnboundedSender<ObjectRef<AppRollout>>,
}

impl Owners {
    /// Wakes whichever fleet or AppRollout controls `object` (what `Controller::owns` does).
    fn wake<K: Resource>(&self, object: &K) {
        if let Some(fleet) = controller_of::<ProxyDeployment>(object.meta()) {
            let _ = self.fleets.unbounded_send(fleet);
        }
        if let Some(app) = controller_of::<AppRollout>(object.meta()) {
            let _ = self.apps.unbounded_send(app);
        }
    }

    /// Wakes the fleet cert-manager filled this Secret for (it has no owner reference).
    fn wake_cert_manager(&self, secret: &Secret) {
        if let Some(fleet) = crate::certs::cert_manager::fleet_of(secret) {
            let _ = self.fleets.unbounded_send(fleet);
        }
    }
}

impl Caches {
    pub fn start(client: &Client, settings: &OperatorSettings) -> Self {
        let (fleet_tx, fleets) = unbounded::<ObjectRef<ProxyDeployment>>();
        let (app_tx, apps_woken) = unbounded::<ObjectRef<AppRollout>>();
        let (propagated_tx, propagated) = unbounded::<ObjectRef<ProxyDeployment>>();
        let owners = Owners {
            fleets: fleet_tx.clone(),
            apps: app_tx,
        };
        let by_owner = ByOwner::default();
        let deployment_owners = owners.clone();
        let (deployments, f1) = indexed_store_with(client, settings, &by_owner.deployments, move |d: &Deployment| {
            deployment_owners.wake(d)
        });
        let (config_maps, f2) = indexed_store::<ConfigMap>(client, settings, &by_owner.config_maps);
        // AppRollouts reshape the routes of the fleets they name: a change wakes that fleet.
        let (apps, [app_changes], f8) =
            crate::app::controller::store(client, settings, [fleet_tx.clone(), propagated_tx]);
        let (fleets_store, [fleet_changes, propagation_changes], f12) = shared_input(
            settings.api::<ProxyDeployment>(client),
            watcher::Config::default().page_size(crate::cache_trim::LIST_PAGE),
            |_: &ProxyDeployment| {},
        );
        let (services, f3) = service_store(client, settings, &by_owner.services, owners.clone(), (&apps, fleet_tx));
        let (service_accounts, f4) = owned_store::<ServiceAccount>(client, settings);
        let (pdbs, f5) = indexed_store::<PodDisruptionBudget>(client, settings, &by_owner.pdbs);
        let (revisions, f7) = indexed_store::<ControllerRevision>(client, settings, &by_owner.revisions);
        let (network_policies, f11) = owned_store::<NetworkPolicy>(client, settings);
        let (ca_namespaces, (secrets, f6), (namespaces, f9)) = namespace_wide(client, settings, owners);
        let (all_tx, all_fleets) = unbounded::<()>();
        // A policy change may allow or refuse any fleet.
        let (policy_tx, policies_changed) = unbounded::<()>();
        let propagation_tx = all_tx.clone();
        let (policies, f10) = policy_store(client, [policy_tx, propagation_tx]);
        let (cluster_secrets, cluster_watches) = cluster_secret_stores(client, settings, all_tx);
        // One task keeps every watch; boxing a dozen futures once costs nothing per event.
        let mut watches: Vec<BoxFuture<'static, ()>> = vec![f1.boxed(), f2.boxed(), f3.boxed(), f4.boxed()];
        watches.extend([f5.boxed(), f6.boxed(), f7.boxed(), f8.boxed(), f9.boxed(), f10.boxed()]);
        watches.extend([
            f11.boxed(),
            f12.boxed(),
            futures::future::join_all(cluster_watches).map(drop).boxed(),
        ]);
        let stores = Stores {
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
            by_owner,
            fleets: fleets_store.clone(),
        };
        watches.push(sweep_owner_indexes(stores.clone()).boxed());
        let task = crate::task::AbortOnDrop(tokio::spawn(futures::future::join_all(watches).map(drop)));
        Self {
            stores,
            fleets: fleets_store,
            apps,
            cluster_secrets,
            wake: Wake {
                ca_namespaces,
                fleets,
                apps: apps_woken,
                propagated,
                all_fleets,
                policies: policies_changed,
                fleet_changes,
                propagation_changes,
                app_changes,
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
            self.fleets.wait_until_ready(),
            s.policies.wait_until_ready(),
            s.namespaces.wait_until_ready(),
        );
    }
}

/// The caches whose changes wake every fleet of a namespace, and the namespaces they name: a
/// namespace's CA Secret is shared by its fleets (no owner reference), so any change to it (a
/// rotation step, a rotation request) wakes them all; a namespace's labels choose its
/// policies. The Secret cache also wakes the owners of the other Secrets.
#[allow(clippy::type_complexity)]
fn namespace_wide(
    client: &Client,
    settings: &OperatorSettings,
    owners: Owners,
) -> (
    UnboundedReceiver<String>,
    (Store<Secret>, impl std::future::Future<Output = ()>),
    (
        Store<PartialObjectMeta<Namespace>>,
        impl std::future::Future<Output = ()>,
    ),
) {
    let (ca_tx, ca_namespaces) = unbounded::<String>();
    let ns_tx = ca_tx.clone();
    let secrets = owned_store_with(client, settings, move |secret: &Secret| {
        owners.wake(secret);
        owners.wake_cert_manager(secret);
        if crate::certs::ca::is_ca_secret(secret) {
            let _ = ca_tx.unbounded_send(secret.metadata.namespace.clone().unwrap_or_default());
        }
    });
    let namespaces = namespace_store(client, settings, move |ns| {
        let _ = ns_tx.unbounded_send(ns.metadata.name.clone().unwrap_or_default());
    });
    (ca_namespaces, secrets, namespaces)
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
            reflector::reflector(
                writer,
                watcher(api, watcher::Config::default().labels(&selector)).modify(Secret::trim),
            )
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
/// cache holds it; every cache here is one of these ([`shared_input`] with no controller of
/// its own). Objects are trimmed to what a reconcile reads before the cache keeps them
/// ([`Trim`]).
fn store_all<K>(
    api: Api<K>,
    config: watcher::Config,
    on_touched: impl FnMut(&K) + Send + 'static,
) -> (Store<K>, impl std::future::Future<Output = ()>)
where
    K: Cached,
{
    let (reader, [], watch) = shared_input(api, config, on_touched);
    (reader, watch)
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
    K: Owned,
{
    owned_store_with(client, settings, |_: &K| {})
}

/// The Services we own; a change wakes their fleet, and an app track's Service (it got its
/// ClusterIP, which the fleet renders as the endpoint) the fleet its AppRollout names.
fn service_store(
    client: &Client,
    settings: &OperatorSettings,
    index: &OwnerIndex,
    owners: Owners,
    (apps, fleet_tx): (&Store<AppRollout>, UnboundedSender<ObjectRef<ProxyDeployment>>),
) -> (Store<Service>, impl std::future::Future<Output = ()>) {
    let apps = apps.clone();
    indexed_store_with(client, settings, index, move |svc: &Service| {
        owners.wake(svc);
        if let Some(fleet) = crate::app::controller::fleet_of_service(&apps, svc) {
            let _ = fleet_tx.unbounded_send(fleet);
        }
    })
}

/// [`owned_store`], noting every object in `index` under the fleet that controls it.
fn indexed_store<K>(
    client: &Client,
    settings: &OperatorSettings,
    index: &OwnerIndex,
) -> (Store<K>, impl std::future::Future<Output = ()>)
where
    K: Owned,
{
    indexed_store_with(client, settings, index, |_: &K| {})
}

/// [`indexed_store`], then `on_touched` (see [`owned_store_with`]).
fn indexed_store_with<K>(
    client: &Client,
    settings: &OperatorSettings,
    index: &OwnerIndex,
    mut on_touched: impl FnMut(&K) + Send + 'static,
) -> (Store<K>, impl std::future::Future<Output = ()>)
where
    K: Owned,
{
    let index = index.clone();
    owned_store_with(client, settings, move |o: &K| {
        index.note(o);
        on_touched(o)
    })
}

/// Every five minutes, lets the owner indexes forget objects their caches no longer hold.
async fn sweep_owner_indexes(stores: Stores) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(300));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let b = &stores.by_owner;
        b.deployments.sweep(&stores.deployments);
        b.config_maps.sweep(&stores.config_maps);
        b.services.sweep(&stores.services);
        b.pdbs.sweep(&stores.pdbs);
        b.revisions.sweep(&stores.revisions);
    }
}

/// [`owned_store`], calling `on_touched` for every object after the cache holds it — so a
/// reconcile it triggers reads the new version, never the one before.
pub fn owned_store_with<K>(
    client: &Client,
    settings: &OperatorSettings,
    on_touched: impl FnMut(&K) + Send + 'static,
) -> (Store<K>, impl std::future::Future<Output = ()>)
where
    K: Owned,
{
    let config = watcher::Config::default()
        .labels(&labels::managed_selector())
        .page_size(crate::cache_trim::LIST_PAGE);
    store_all(settings.api(client), config, on_touched)
}
