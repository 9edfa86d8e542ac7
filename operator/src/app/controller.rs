//! The AppRollout controller, beside the fleet controller in the same process: one watch of
//! AppRollouts feeds a cache both read (fleets render the routes AppRollouts split) and wakes
//! the fleet each one names; the team's Deployments wake the AppRollouts that release them.

use std::sync::Arc;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};

use super::reconcile::{error_policy, reconcile};
use super::spec::AppRollout;
use crate::context::Context;
use crate::crd::ProxyDeployment;
use crate::owner_index::controller_of;
use crate::shared_input::{shared_input, Triggers};

/// A cache of every AppRollout, the changes the AppRollout controller reconciles, and the
/// task keeping both (one watch); each change also sends the fleet the rollout names (before
/// and after an edit) to each of `fleets`, after the cache holds it.
pub fn store(
    client: &Client,
    settings: &crate::resources::OperatorSettings,
    fleets: [UnboundedSender<ObjectRef<ProxyDeployment>>; 2],
) -> (
    Store<AppRollout>,
    [Triggers<AppRollout>; 1],
    impl std::future::Future<Output = ()>,
) {
    let api: Api<AppRollout> = settings.api(client);
    let config = watcher::Config::default().page_size(crate::cache_trim::LIST_PAGE);
    shared_input(api, config, move |ar: &AppRollout| {
        let fleet = ObjectRef::new(&ar.spec.route.proxy_deployment).within(&ar.namespace().unwrap_or_default());
        for tx in &fleets {
            let _ = tx.unbounded_send(fleet.clone());
        }
    })
}

/// Runs the AppRollout controller until `stop` completes. `changes` are the AppRollouts' own
/// (from the watch that fills `ctx.apps`); `owned_changed` carries the rollouts whose own
/// Deployments or Services changed (from the shared caches' watches).
pub async fn run(
    client: Client,
    ctx: Arc<Context>,
    (changes, owned_changed): (Triggers<AppRollout>, UnboundedReceiver<ObjectRef<AppRollout>>),
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let apps = ctx.apps.clone();
    let s = &ctx.settings;
    // A new template in the team's Deployment starts a rollout: its name is all that is read,
    // so the watch asks for metadata only.
    let team_deployments = watcher(
        s.api::<PartialObjectMeta<Deployment>>(&client),
        watcher::Config::default(),
    )
    .touched_objects();
    Controller::for_shared_stream(changes, ctx.apps.clone())
        .reconcile_on(owned_changed)
        .watches_stream(team_deployments, move |d| releasing(&apps, &d))
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            if let Err(e) = res {
                tracing::debug!(error = %e, "app controller event");
            }
            futures::future::ready(())
        })
        .await;
}

/// The fleet whose route an app track's Service serves, if `svc` is one.
pub fn fleet_of_service(apps: &Store<AppRollout>, svc: &Service) -> Option<ObjectRef<ProxyDeployment>> {
    let rollout = svc.labels().get(super::objects::APP_ROLLOUT)?;
    let namespace = svc.namespace()?;
    let ar = apps.get(&ObjectRef::new(rollout).within(&namespace))?;
    Some(ObjectRef::new(&ar.spec.route.proxy_deployment).within(&namespace))
}

/// The AppRollouts `d` concerns: those whose workload it is (a new template starts a rollout),
/// and those routed through the fleet that controls it. A fleet's Deployment changes while its
/// pods come and go (a re-render, a rollout, a scale); the new pods' weights must be confirmed
/// and counted again, not a minute later at the next periodic pass.
fn releasing(apps: &Store<AppRollout>, d: &PartialObjectMeta<Deployment>) -> Vec<ObjectRef<AppRollout>> {
    let (name, namespace) = (d.metadata.name.as_deref(), d.metadata.namespace.as_deref());
    let fleet = controller_of::<ProxyDeployment>(&d.metadata).map(|f| f.name);
    apps.state()
        .iter()
        .filter(|ar| ar.metadata.namespace.as_deref() == namespace)
        .filter(|ar| {
            name == Some(ar.spec.workload_ref.name.as_str()) || fleet.as_ref() == Some(&ar.spec.route.proxy_deployment)
        })
        .map(|ar| ObjectRef::from_obj(ar.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::render::tests::rollout;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use kube::Resource;

    fn deployment(name: &str, namespace: &str, fleet: Option<&str>) -> PartialObjectMeta<Deployment> {
        let mut d: PartialObjectMeta<Deployment> = PartialObjectMeta::default();
        d.metadata.name = Some(name.into());
        d.metadata.namespace = Some(namespace.into());
        d.metadata.owner_references = fleet.map(|f| {
            vec![OwnerReference {
                api_version: ProxyDeployment::api_version(&()).into(),
                kind: ProxyDeployment::kind(&()).into(),
                name: f.into(),
                uid: "u1".into(),
                controller: Some(true),
                ..Default::default()
            }]
        });
        d
    }

    fn names(refs: Vec<ObjectRef<AppRollout>>) -> Vec<String> {
        let mut n: Vec<String> = refs.into_iter().map(|r| r.name).collect();
        n.sort();
        n
    }

    #[test]
    fn a_workload_or_its_fleet_wakes_the_rollouts_that_use_it() {
        let (apps, mut writer) = reflector::store::<AppRollout>();
        // shop and cart go through fleet edge, api through fleet inner; all release "shop".
        for (name, fleet) in [("shop", "edge"), ("cart", "edge"), ("api", "inner")] {
            writer.apply_watcher_event(&Event::Apply(rollout(name, fleet, "r")));
        }
        let mut elsewhere = rollout("other", "edge", "r");
        elsewhere.metadata.namespace = Some("team-b".into());
        writer.apply_watcher_event(&Event::Apply(elsewhere));

        let fleet_deployment = deployment("edge", "team", Some("edge"));
        assert_eq!(names(releasing(&apps, &fleet_deployment)), ["cart", "shop"]);
        let workload = deployment("shop", "team", None);
        assert_eq!(names(releasing(&apps, &workload)), ["api", "cart", "shop"]);
        let unrelated = deployment("db", "team", Some("db"));
        assert!(releasing(&apps, &unrelated).is_empty());
    }
}
