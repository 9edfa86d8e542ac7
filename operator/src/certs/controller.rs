//! The namespace CA and its rotation, in a controller of their own keyed by the CA Secret
//! (`proxyfleet-ca`, label `proxyfleet.io/ca`). Fleets only create a missing CA and read it;
//! this controller alone takes rotation steps, so a rotation is no longer kept consistent by
//! compare-and-swap races between the fleets of a namespace, and a fleet's reconcile never
//! waits on another namespace's rotation. Every step it writes wakes the namespace's fleets
//! (they reissue and republish), through the Secret watch the fleet controller already has.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

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
    let next = ca::step(&secret, &ctx).await?;
    ctx.backoff.succeeded(&backoff_key(&secret));
    Ok(Action::requeue(next))
}

fn backoff_key(secret: &Secret) -> String {
    format!("ca:{}/{}", secret.namespace().unwrap_or_default(), secret.name_any())
}

/// Retries with the operator's backoff (5 s doubling to 5 min), not every 10 s for ever: a
/// CA Secret someone broke stays broken until they fix it. One that keeps failing is told as
/// a Warning event on the Secret, where `kubectl describe` shows it.
fn error_policy(secret: Arc<Secret>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(name = %secret.name_any(), %error, "CA rotation step failed; retrying");
    let failures = ctx.backoff.count_failure(&backoff_key(&secret));
    if crate::backoff::worth_telling(failures) {
        let note = format!("failed {failures} times in a row; retrying with backoff: {error}");
        let reference = secret.object_ref(&());
        tokio::spawn(async move { ctx.record_on(&reference, true, "CARotationFailing", &note).await });
    }
    Action::requeue(crate::backoff::delay(failures))
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
