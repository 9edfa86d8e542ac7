//! Reading, on the hub, the apps that travel with a fleet (see `apps`): the AppRollouts whose
//! route names it and the Deployments they release. A read that fails stops the pass (nothing
//! is sent or removed anywhere). A live AppRollout whose Deployment does not exist is held:
//! nothing is sent for it and its copies in members stay as they are, so a Deployment recreated
//! by Helm or Argo CD, or not applied yet, never deletes the app in every member at once, and
//! the rest of the fleet still propagates. Only an AppRollout that is gone removes its copies.

use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;

use super::apps::{self, AppCopy};
use crate::context::Context;
use crate::crd::ProxyDeployment;
use crate::resources::Owner;

/// Why the fleet's apps could not be read on the hub.
#[derive(Debug, thiserror::Error)]
pub enum HubAppsError {
    #[error("the AppRollout cache is not loaded yet")]
    NotLoaded,
    #[error("reading Deployment {namespace}/{name} of AppRollout {app}: {source}")]
    Read {
        namespace: String,
        name: String,
        app: String,
        source: kube::Error,
    },
}

/// What members get of the fleet's apps.
#[derive(Debug, Default)]
pub struct HubApps {
    /// The copies every member gets, sorted by name.
    pub copies: Vec<AppCopy>,
    /// Apps whose Deployment is missing on the hub, or that the hub's policy refuses: their
    /// copies stay as they are.
    pub held: Vec<String>,
}

/// The fleet's apps as members get them.
pub async fn desired(pxd: &ProxyDeployment, owner: &Owner, ctx: &Context) -> Result<HubApps, HubAppsError> {
    if ctx.apps.wait_until_ready().now_or_never().is_none() {
        return Err(HubAppsError::NotLoaded);
    }
    let policy = format!(
        "{:?}",
        pxd.spec
            .placement
            .as_ref()
            .map(|p| p.deletion_policy)
            .unwrap_or_default()
    );
    let mut rollouts: Vec<_> = ctx
        .apps
        .state()
        .into_iter()
        .filter(|a| {
            a.metadata.namespace.as_deref() == Some(owner.namespace.as_str())
                && a.spec.route.proxy_deployment == owner.name
                && a.metadata.deletion_timestamp.is_none()
        })
        .collect();
    rollouts.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let mut out = HubApps {
        copies: Vec::with_capacity(rollouts.len()),
        held: Vec::new(),
    };
    for rollout in rollouts {
        let name = &rollout.spec.workload_ref.name;
        let app = rollout.metadata.name.clone().unwrap_or_default();
        // What the hub's policy refuses here is not sent anywhere else either.
        let stores = (&ctx.stores.policies, &ctx.stores.namespaces);
        if let Some((_, why)) = crate::policy::app_refusal(stores.0, stores.1, &owner.namespace, &rollout.spec.strategy)
        {
            tracing::info!(app = %app, %why, "the hub's policy refuses the app: its copies are held");
            out.held.push(app);
            continue;
        }
        let workload = deployments.get_opt(name).await.map_err(|source| HubAppsError::Read {
            namespace: owner.namespace.clone(),
            name: name.clone(),
            app: app.clone(),
            source,
        })?;
        let Some(workload) = workload else {
            tracing::info!(app = %app, deployment = %name, "the app's Deployment is missing: its copies are held");
            out.held.push(app);
            continue;
        };
        let who = (
            owner.namespace.as_str(),
            owner.name.as_str(),
            owner.reference.uid.as_str(),
            policy.as_str(),
        );
        if let Some(copy) = apps::copy(who, &rollout, &workload) {
            out.copies.push(copy);
        }
    }
    Ok(out)
}
