//! Propagation as a controller of its own over the same ProxyDeployments: a slow or
//! unreachable member never delays a fleet's local reconcile, and the local reconcile never
//! delays a member. It owns `status.clusters` and the `Propagated` condition, written by
//! server-side apply under its own field manager (`conditions` is a list keyed by `type`, so
//! the fleet controller's conditions and this one coexist), and the propagation finalizer.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::ResourceExt;

use super::reconcile::{self, Outcome};
use crate::conditions::PROPAGATED;
use crate::context::Context;
use crate::crd::ProxyDeployment;
use crate::resources::Owner;

/// Field manager of the hub's propagation status (not of writes to members).
pub const STATUS_MANAGER: &str = "proxyfleet-propagation-status";

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

/// Applies `status.clusters` and the `Propagated` condition when they changed. A fleet that is
/// not propagated gets an empty sub-tree: server-side apply then removes what we owned.
async fn write(pxd: &ProxyDeployment, owner: &Owner, ctx: &Context, outcome: &Outcome) -> Result<(), Error> {
    let (clusters, previous) = current_part(pxd);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let condition = outcome.condition.as_ref().and_then(|want| {
        crate::conditions::merge(
            previous.as_slice(),
            std::slice::from_ref(want),
            pxd.metadata.generation,
            &now,
        )
        .into_iter()
        .find(|c| c.type_ == PROPAGATED)
    });
    let unchanged = clusters == outcome.clusters && condition == previous;
    if unchanged {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ProxyDeployment",
        "status": {"clusters": outcome.clusters, "conditions": condition.into_iter().collect::<Vec<_>>()},
    });
    let api: Api<ProxyDeployment> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    api.patch_status(
        &owner.name,
        &PatchParams::apply(STATUS_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|source| Error::Status {
        namespace: owner.namespace.clone(),
        name: owner.name.clone(),
        source,
    })?;
    ctx.metrics.api_write("ProxyDeployment/status", "apply");
    Ok(())
}

/// One pass: clean up a deleted fleet, hold one the policy refuses, else propagate it.
pub async fn reconcile(pxd: Arc<ProxyDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let owner = Owner::of(&pxd).map_err(|e| Error::Metadata(e.to_string()))?;
    if pxd.metadata.deletion_timestamp.is_some() {
        return Ok(match reconcile::finalize(&pxd, &owner, &ctx).await {
            Some(again) => Action::requeue(again),
            None => Action::await_change(),
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
    Ok(match outcome.requeue {
        Some(again) => Action::requeue(again),
        None if pxd.spec.placement.is_some() => Action::requeue(ctx.propagation.resync),
        None => Action::await_change(),
    })
}

fn error_policy(pxd: Arc<ProxyDeployment>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(name = %pxd.name_any(), error = %error, "propagation failed");
    let key = format!(
        "propagation/{}",
        pxd.metadata.uid.clone().unwrap_or_else(|| pxd.name_any())
    );
    Action::requeue(ctx.backoff.failed(&key))
}

/// Runs until `stop` completes. `clusters_changed` fires when a member cluster Secret changes
/// (every placement may select it).
pub async fn run(
    api: Api<ProxyDeployment>,
    ctx: Arc<Context>,
    clusters_changed: impl futures::Stream<Item = ()> + Send + 'static,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    Controller::new(api, watcher::Config::default().any_semantic())
        .reconcile_all_on(clusters_changed)
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
