//! Propagation as a controller of its own over the same ProxyDeployments: a slow or
//! unreachable member never delays a fleet's local reconcile, and the local reconcile never
//! delays a member. It owns `status.clusters` and the `Propagated` condition, written by
//! server-side apply under its own field manager (`conditions` is a list keyed by `type`, so
//! the fleet controller's conditions and this one coexist), and the propagation finalizer.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::reconcile::{self, Outcome};
use crate::conditions::PROPAGATED;
use crate::context::Context;
use crate::crd::ProxyDeployment;
use crate::resources::Owner;

pub use super::status::STATUS_MANAGER;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("ProxyDeployment has no {0} yet")]
    Metadata(String),
    #[error("writing the propagation status of {namespace}/{name}: {source}")]
    Status {
        namespace: String,
        name: String,
        source: kube::Error,
    },
}

/// The status sub-tree this controller owns, as the fleet has it now.
fn current_part(
    pxd: &ProxyDeployment,
) -> (
    Vec<super::spec::ClusterStatus>,
    Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
) {
    let status = pxd.status.clone().unwrap_or_default();
    let condition = status.conditions.into_iter().find(|c| c.type_ == PROPAGATED);
    (status.clusters, condition)
}

/// The status patch this controller owes, or `None` when the fleet already shows it: pure.
/// A fleet that is not propagated gets an empty sub-tree (server-side apply then removes what
/// this manager owned).
pub fn status_patch(pxd: &ProxyDeployment, outcome: &Outcome, now: &Time) -> Option<serde_json::Value> {
    let (clusters, previous) = current_part(pxd);
    let shown_waves = pxd.status.as_ref().and_then(|s| s.waves.clone());
    let has_waves = pxd.spec.placement.as_ref().is_some_and(|p| !p.waves.is_empty());
    let waves = match &outcome.waves {
        Some(w) => Some(w.clone()),
        None if has_waves => shown_waves.clone(),
        None => None,
    };
    let condition = outcome.condition.as_ref().and_then(|want| {
        crate::conditions::merge(
            previous.as_slice(),
            std::slice::from_ref(want),
            pxd.metadata.generation,
            now,
        )
        .into_iter()
        .find(|c| c.type_ == PROPAGATED)
    });
    if clusters == outcome.clusters && condition == previous && waves == shown_waves {
        return None;
    }
    let mut status =
        serde_json::json!({"clusters": outcome.clusters, "conditions": condition.into_iter().collect::<Vec<_>>()});
    if let Some(w) = waves {
        status["waves"] = serde_json::to_value(w).unwrap_or_default();
    }
    Some(status)
}

async fn write(pxd: &ProxyDeployment, owner: &Owner, ctx: &Context, outcome: &Outcome) -> Result<(), Error> {
    let Some(status) = status_patch(pxd, outcome, &Time(k8s_openapi::jiff::Timestamp::now())) else {
        return Ok(());
    };
    ctx.status_writer(&owner.namespace, STATUS_MANAGER)
        .apply(&owner.name, &status)
        .await
        .map_err(|source| Error::Status {
            namespace: owner.namespace.clone(),
            name: owner.name.clone(),
            source,
        })
}

/// One pass: clean up a deleted fleet, hold one the policy refuses, else propagate it. It
/// decides on the newest version it knows (its own or the fleet controller's last write when
/// the cache lags): the wave machine never judges a status one write behind.
pub async fn reconcile(pxd: Arc<ProxyDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let pxd = ctx.latest_fleets.newest(pxd);
    let owner = Owner::of(&pxd).map_err(|e| Error::Metadata(e.to_string()))?;
    if pxd.metadata.deletion_timestamp.is_some() {
        return Ok(match reconcile::finalize(&pxd, &owner, &ctx).await {
            Some(again) => Action::requeue(again),
            None => {
                ctx.latest_fleets.forget(&owner.reference.uid);
                ctx.backoff.succeeded(&backoff_key(&pxd));
                Action::await_change()
            }
        });
    }
    let refused = crate::policy::refusal(
        &ctx.stores.policies,
        &ctx.stores.namespaces,
        &owner.namespace,
        &pxd.spec,
        &ctx.settings.default_proxy_image,
    );
    let outcome = match &refused {
        None => reconcile::propagate(&pxd, &owner, &ctx).await,
        Some((_, message)) => reconcile::held(&pxd, message),
    };
    write(&pxd, &owner, &ctx, &outcome).await?;
    if outcome.retry {
        return Ok(Action::requeue(ctx.backoff.failed(&backoff_key(&pxd))));
    }
    ctx.backoff.succeeded(&backoff_key(&pxd));
    Ok(match outcome.requeue {
        Some(again) => Action::requeue(again),
        None if pxd.spec.placement.is_some() => Action::requeue(ctx.propagation.resync),
        None => Action::await_change(),
    })
}

fn error_policy(pxd: Arc<ProxyDeployment>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(name = %pxd.name_any(), error = %error, "propagation failed");
    Action::requeue(ctx.backoff.failed(&backoff_key(&pxd)))
}

/// A fleet's failures in a row on the propagation path: one success resets them.
fn backoff_key(pxd: &ProxyDeployment) -> String {
    let id = pxd
        .metadata
        .uid
        .as_deref()
        .map_or_else(|| pxd.name_any(), str::to_string);
    format!("propagation/{id}")
}

/// Runs until `stop` completes, over the fleet controller's cache of ProxyDeployments and its
/// own stream of their changes (one watch for both). `clusters_changed` fires when a member cluster Secret changes
/// (every placement may select it); `apps_changed` names the fleet of an AppRollout that
/// changed (its spec, or its status when its Deployment's template changed: a new bundle
/// revision), from the shared AppRollout cache; a change to a member's copy wakes its hub
/// object.
pub async fn run(
    (fleets, changes): (
        kube::runtime::reflector::Store<ProxyDeployment>,
        crate::shared_input::Triggers<ProxyDeployment>,
    ),
    ctx: Arc<Context>,
    (clusters_changed, apps_changed): (
        impl futures::Stream<Item = ()> + Send + 'static,
        impl futures::Stream<Item = ObjectRef<ProxyDeployment>> + Send + 'static,
    ),
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (wake, woken) = futures::channel::mpsc::channel(256);
    let _members = crate::task::AbortOnDrop(tokio::spawn(super::member_watch::run(ctx.clone(), wake)));
    Controller::for_shared_stream(changes, fleets)
        .reconcile_on(apps_changed)
        .reconcile_all_on(clusters_changed)
        .reconcile_on(woken)
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            if let Err(e) = res {
                tracing::debug!(error = %e, "propagation controller event");
            }
            futures::future::ready(())
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::Want;
    use crate::propagation::spec::ClusterStatus;

    fn fleet() -> ProxyDeployment {
        let spec = serde_json::from_value(serde_json::json!({
            "replicas": 1, "listeners": [], "routes": [{"name": "all", "upstream": "app"}],
            "upstreams": [{"name": "app", "endpoints": ["app:8080"]}],
        }))
        .expect("spec");
        let mut pxd = ProxyDeployment::new("demo", spec);
        pxd.metadata.generation = Some(3);
        pxd
    }

    fn outcome(applied: bool) -> Outcome {
        Outcome {
            condition: Some(Want::new(PROPAGATED, applied, "Propagated", "applied to 1 cluster(s)")),
            clusters: vec![ClusterStatus {
                name: "member-1".into(),
                applied,
                ..Default::default()
            }],
            requeue: None,
            waves: None,
            retry: false,
        }
    }

    #[test]
    fn writes_only_its_own_sub_tree_and_only_when_it_changed() {
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).expect("time"));
        let mut pxd = fleet();
        let patch = status_patch(&pxd, &outcome(true), &now).expect("a first write");
        let status = patch.as_object().expect("status");
        assert_eq!(
            status.keys().collect::<Vec<_>>(),
            ["clusters", "conditions"],
            "nothing the fleet controller owns"
        );
        assert_eq!(patch["conditions"][0]["type"], "Propagated");
        // The fleet now shows it (beside the fleet controller's own conditions): nothing to write.
        let mut shown: crate::crd::ProxyDeploymentStatus = serde_json::from_value(patch.clone()).expect("status");
        shown
            .conditions
            .push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: "Ready".into(),
                message: String::new(),
                observed_generation: Some(3),
                last_transition_time: now.clone(),
            });
        pxd.status = Some(shown);
        let later = Time(k8s_openapi::jiff::Timestamp::from_second(2_000).expect("time"));
        assert_eq!(
            status_patch(&pxd, &outcome(true), &later),
            None,
            "a quiet resync writes nothing"
        );
        let changed = status_patch(&pxd, &outcome(false), &later).expect("a change is written");
        assert_eq!(changed["clusters"][0]["applied"], false);
        let gone = Outcome {
            condition: None,
            clusters: Vec::new(),
            requeue: None,
            waves: None,
            retry: false,
        };
        let cleared = status_patch(&pxd, &gone, &later).expect("placement removed");
        assert_eq!(cleared["conditions"], serde_json::json!([]));
    }
}
