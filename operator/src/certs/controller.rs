//! The namespace CA and its rotation, in a controller of their own keyed by the CA Secret
//! (`proxyfleet-ca`, label `proxyfleet.io/ca`). Fleets only create a missing CA and read it;
//! this controller alone takes rotation steps, so a rotation is no longer kept consistent by
//! compare-and-swap races between the fleets of a namespace, and a fleet's reconcile never
//! waits on another namespace's rotation. Every step it writes wakes the namespace's fleets
//! (they reissue and republish), through the Secret watch the fleet controller already has.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::ResourceExt;

use super::ca;
use crate::context::Context;
use crate::shared_input::shared_input;

#[derive(Debug, thiserror::Error)]
#[error("CA rotation: {0}")]
pub struct Error(#[from] ca::CaError);

async fn reconcile(secret: Arc<Secret>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ca::is_ca_secret(&secret) || secret.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(ca::step(&secret, &ctx).await?))
}

fn error_policy(secret: Arc<Secret>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(name = %secret.name_any(), %error, "CA rotation step failed; retrying");
    Action::requeue(Duration::from_secs(10))
}

/// Runs until `stop` completes, over the CA Secrets `api` can see.
pub async fn run(
    api: Api<Secret>,
    ctx: Arc<Context>,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let selector = format!("{}=true", ca::CA_LABEL);
    let config = watcher::Config::default().labels(&selector);
    let (cas, [changes], watch) = shared_input(api, config, |_: &Secret| {});
    let controller = Controller::for_shared_stream(changes, cas)
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            if let Err(e) = res {
                tracing::debug!(error = %e, "CA controller event");
            }
            futures::future::ready(())
        });
    // The watch runs for ever; the controller ends on `stop`.
    futures::pin_mut!(watch, controller);
    futures::future::select(controller, watch).await;
}
