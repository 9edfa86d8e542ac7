//! The I/O shell of an AppRollout: read the team's Deployment, the fleet and the two tracks;
//! measure when due; let the canary machine decide; move the proxies' weights (before any
//! scale-down, so a rollback takes traffic away first); apply the tracks; write status.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::measure;
use super::objects::{self, AppOwner};
use super::push;
use super::render::{shape_spec, AppTrack};
use super::spec::{AppRollout, AppRolloutStatus};
use super::weights;
use crate::apply::ApplyError;
use crate::canary::machine::{self, Command, Decision, Observations, StableTemplate};
use crate::canary::rollout::COMMAND_ANNOTATION;
use crate::conditions::{self, Want};
use crate::context::Context;
use crate::crd::ProxyDeployment;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("AppRollout has no {0} yet")]
    Metadata(&'static str),
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("reading {what} for AppRollout {namespace}/{name}: {source}")]
    Read {
        what: String,
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("writing status of AppRollout {namespace}/{name}: {source}")]
    Status {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    /// A command is acted on only once its annotation is gone (else the next pass acts on it
    /// again: a `promote` would skip a step each time).
    #[error("clearing the command annotation of AppRollout {namespace}/{name} before acting on it: {source}")]
    Command {
        namespace: String,
        name: String,
        source: kube::Error,
    },
}

/// Field manager of one rollout: its key of the shared weights ConfigMap stays its own.
pub(super) fn field_manager(owner: &AppOwner) -> String {
    format!("proxyfleet-app-{}", owner.name)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// What the shell read before deciding.
struct Inputs {
    target: Deployment,
    stable: Option<Arc<Deployment>>,
    canary: Option<Arc<Deployment>>,
}

pub async fn reconcile(ar: Arc<AppRollout>, ctx: Arc<Context>) -> Result<Action, AppError> {
    let ar = ctx.latest_apps.newest(ar);
    let owner = AppOwner::of(&ar).ok_or(AppError::Metadata("name, namespace or uid"))?;
    let inputs = match read_inputs(&ar, &owner, &ctx).await? {
        Ok(i) => i,
        Err(blocked) => return blocked_status(&ar, &owner, &ctx, blocked).await,
    };
    let template = inputs
        .target
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let revision = objects::template_revision(&template);
    let command = take_command(&ctx, &owner, &ar).await;
    let decision = decide(&ar, &owner, &ctx, &inputs, &revision, command).await;
    let previous = ar.status.clone().unwrap_or_default();
    let moved = push::move_weights(&ar, &owner, &ctx, &previous, &decision).await;
    let canary_replicas = canary_kept(&decision, &inputs, &moved);
    let tracks = apply_tracks(
        &ar,
        &owner,
        &ctx,
        &inputs,
        (&template, &revision),
        (&decision, canary_replicas),
    );
    // Told whatever the writes do: the next pass goes on from the decision recorded below.
    publish_events(&ar, &ctx, &decision).await;
    // The proxies count `<name>-canary` whatever revision runs behind it: a window of a
    // rollout that superseded another starts from a snapshot of its own.
    let superseded =
        previous.canary.as_ref().and_then(|c| c.canary_revision.as_ref()) != decision.status.canary_revision.as_ref();
    if let Err(e) = tracks.await {
        if superseded {
            measure::forget(&ctx, &owner);
        }
        keep_decision(&ctx, &owner, &previous, &decision, &moved).await;
        return Err(e);
    }
    let all_applied = moved.all_applied();
    let status = status_of(&ar, &previous, &decision, &moved);
    if ar.status.as_ref() != Some(&status) {
        write_status(&ctx, &owner, &status).await?;
    }
    if superseded
        || matches!(
            decision.status.phase,
            machine::COMPLETED | machine::ABORTED | machine::IDLE
        )
    {
        measure::forget(&ctx, &owner);
    }
    ctx.backoff.succeeded(&format!("app:{}", owner.reference.uid));
    let pending = format!("app-weights:{}", owner.reference.uid);
    let requeue = if all_applied {
        ctx.backoff.succeeded(&pending);
        Duration::from_secs(decision.requeue_after.clamp(1, 60))
    } else {
        // Not every proxy pod confirms the weights (none runs yet, or one does not answer):
        // look again soon, then less often (2.5 s doubling to a minute), not every 2 s forever.
        (ctx.backoff.failed(&pending) / 2).min(Duration::from_secs(60))
    };
    Ok(Action::requeue(requeue))
}

/// Why the rollout cannot run yet: (reason, message) for the Ready condition.
type Blocked = (&'static str, String);

async fn read_inputs(ar: &AppRollout, owner: &AppOwner, ctx: &Context) -> Result<Result<Inputs, Blocked>, AppError> {
    let read_err = |what: &str, source| AppError::Read {
        what: what.to_string(),
        namespace: owner.namespace.clone(),
        name: owner.name.clone(),
        source,
    };
    // The platform's policy first: the operator queries the analyses' Prometheus for the team.
    let policies = (&ctx.stores.policies, &ctx.stores.namespaces);
    if let Some((reason, message)) =
        crate::policy::app_refusal(policies.0, policies.1, &owner.namespace, &ar.spec.strategy)
    {
        let reason = if reason == "PolicyUnavailable" {
            "PolicyUnavailable"
        } else {
            "PolicyViolation"
        };
        return Ok(Err((reason, message)));
    }
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let Some(target) = deployments
        .get_opt(&ar.spec.workload_ref.name)
        .await
        .map_err(|e| read_err("the workload Deployment", e))?
    else {
        let msg = format!("Deployment {:?} not found", ar.spec.workload_ref.name);
        return Ok(Err(("WorkloadNotFound", msg)));
    };
    let fleets: Api<ProxyDeployment> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let fleet_name = &ar.spec.route.proxy_deployment;
    let Some(fleet) = fleets
        .get_opt(fleet_name)
        .await
        .map_err(|e| read_err("the ProxyDeployment", e))?
    else {
        return Ok(Err((
            "ProxyDeploymentNotFound",
            format!("ProxyDeployment {fleet_name:?} not found"),
        )));
    };
    let peers = ctx.apps.state();
    let peers: Vec<&AppRollout> = peers
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| p.namespace() == ar.namespace())
        .collect();
    let (_, conflicts) = shape_spec(&fleet.spec, fleet_name, &owner.namespace, &peers, &|_: &str| None);
    if let Some(c) = conflicts.iter().find(|c| c.rollout == owner.name) {
        return Ok(Err(("RouteConflict", c.reason.clone())));
    }
    let cached = |track| {
        ctx.stores
            .deployments
            .get(&ObjectRef::new(&super::render::track_name(&owner.name, track)).within(&owner.namespace))
    };
    Ok(Ok(Inputs {
        target,
        stable: cached(AppTrack::Stable),
        canary: cached(AppTrack::Canary),
    }))
}

fn ready_on_template(d: &Deployment) -> i32 {
    let Some(s) = &d.status else { return 0 };
    if s.observed_generation.unwrap_or(0) < d.metadata.generation.unwrap_or(0) {
        return 0;
    }
    s.ready_replicas.unwrap_or(0).min(s.updated_replicas.unwrap_or(0))
}

/// Seconds a canary pod must have been Ready before it gets traffic: the Service's endpoints
/// reach every node's kube-proxy a moment after the pod turns Ready, and a connection opened in
/// between waits for a SYN retransmission (≈ 1 s), which a small window's P99 reads as a slow
/// canary.
const ENDPOINT_SETTLE_SECS: i64 = 5;

/// Canary pods of `revision` Ready for at least `ENDPOINT_SETTLE_SECS`.
async fn settled_canary_pods(ctx: &Context, owner: &AppOwner, revision: &str) -> i32 {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let selector = format!(
        "{}={},{}=canary,{}={revision}",
        objects::APP_ROLLOUT,
        owner.name,
        objects::APP_TRACK,
        crate::labels::REVISION
    );
    let Ok(list) = pods.list(&kube::api::ListParams::default().labels(&selector)).await else {
        return 0;
    };
    let settled_before =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(ENDPOINT_SETTLE_SECS);
    list.items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
                .and_then(|c| c.last_transition_time.as_ref())
                .is_some_and(|t| t.0 <= settled_before)
        })
        .count() as i32
}

/// Whether every pod of `track` (terminating ones included) runs `revision`. A Deployment counts
/// a rollout done while old pods still drain; until they are gone the proxies' pooled
/// connections can still reach them, so traffic returns to stable only then.
async fn only_revision_left(ctx: &Context, owner: &AppOwner, track: AppTrack, revision: &str) -> bool {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let selector = format!(
        "{}={},{}={}",
        objects::APP_ROLLOUT,
        owner.name,
        objects::APP_TRACK,
        track.as_str()
    );
    let Ok(list) = pods.list(&kube::api::ListParams::default().labels(&selector)).await else {
        return false;
    };
    list.items.iter().all(|p| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::labels::REVISION))
            .is_some_and(|r| r == revision)
    })
}

async fn decide(
    ar: &AppRollout,
    owner: &AppOwner,
    ctx: &Context,
    inputs: &Inputs,
    revision: &str,
    command: Option<Command>,
) -> Decision {
    let total = ar.spec.replicas;
    let previous = ar.status.as_ref().and_then(|s| s.canary.clone());
    let stable_revision = inputs.stable.as_deref().and_then(crate::status::revision_of);
    let stable_rolled_out = inputs
        .stable
        .as_deref()
        .is_some_and(|d| stable_revision.as_deref() == Some(revision) && crate::status::rolled_out(d, total))
        && only_revision_left(ctx, owner, AppTrack::Stable, revision).await;
    let deployment_ready = inputs
        .canary
        .as_deref()
        .filter(|d| crate::status::revision_of(d).as_deref() == Some(revision))
        .map(ready_on_template)
        .unwrap_or(0);
    let canary_ready = if deployment_ready > 0 {
        deployment_ready.min(settled_canary_pods(ctx, owner, revision).await)
    } else {
        0
    };
    let mut obs = Observations {
        desired_revision: revision.to_string(),
        stable_revision,
        stable_rolled_out,
        canary_ready,
        progress_deadline: ar
            .spec
            .progress_deadline
            .as_ref()
            .map_or(machine::DEFAULT_PROGRESS_DEADLINE, |d| d.get().as_secs() as i64),
        weights_confirmed: Some(ar.status.as_ref().is_some_and(weights_confirmed)),
        retry_token: crate::canary::rollout::retry_token(&ar.metadata),
        now: now(),
        ..Default::default()
    };
    if let Some(prev) = previous
        .as_ref()
        .filter(|p| p.canary_revision.as_deref() == Some(revision))
    {
        if machine::measurement_due(&ar.spec.strategy, prev, obs.now) {
            if let Some((analysis, _)) = machine::active_analysis(&ar.spec.strategy, prev) {
                obs.measurement = Some(measure::measure(ctx, owner, &ar.spec.route.proxy_deployment, analysis).await);
            }
        }
    }
    let decision = machine::decide(&ar.spec.strategy, previous.as_ref(), total, &obs, command);
    tracing::info!(
        approllout = %owner.name,
        phase = %decision.status.phase,
        step = decision.status.current_step_index,
        weight = decision.status.weight,
        stable_template = ?decision.stable_template,
        canary_replicas = ?decision.canary_replicas,
        "app canary decision"
    );
    decision
}

async fn apply_tracks(
    ar: &AppRollout,
    owner: &AppOwner,
    ctx: &Context,
    inputs: &Inputs,
    (template, revision): (&k8s_openapi::api::core::v1::PodTemplateSpec, &str),
    (decision, canary_replicas): (&Decision, i32),
) -> Result<(), AppError> {
    // The cache keeps no pod spec (cache_trim): a stable kept on its current template is read
    // whole, only then.
    let whole = match (decision.stable_template, inputs.stable.as_deref()) {
        (StableTemplate::Current, Some(d)) => {
            crate::cache_trim::untrimmed(&ctx.client, d)
                .await
                .map_err(|source| AppError::Read {
                    what: "the stable Deployment".into(),
                    namespace: owner.namespace.clone(),
                    name: owner.name.clone(),
                    source,
                })?
        }
        _ => None,
    };
    let kept = whole
        .as_ref()
        .and_then(|d| Some((objects::template_of(d)?, crate::status::revision_of(d)?)));
    // Stable keeps its full size through a rollout (Argo Rollouts' default with a traffic
    // router): the weights, not the pod counts, move the traffic.
    let replicas = ar.spec.replicas;
    let stable = match kept {
        Some((t, r)) => objects::deployment(owner, AppTrack::Stable, &t, &r, replicas),
        None => objects::deployment(owner, AppTrack::Stable, template, revision, replicas),
    };
    ctx.applier.apply(stable, &ctx.stores.deployments).await?;
    // No canary wanted: keep the object, scaled to zero (its weight is already gone).
    if canary_replicas > 0 || inputs.canary.is_some() {
        let canary = objects::deployment(owner, AppTrack::Canary, template, revision, canary_replicas);
        ctx.applier.apply(canary, &ctx.stores.deployments).await?;
    }
    for track in [AppTrack::Stable, AppTrack::Canary] {
        ctx.applier
            .apply(objects::service(owner, track, ar.spec.port), &ctx.stores.services)
            .await?;
    }
    Ok(())
}

async fn publish_events(ar: &AppRollout, ctx: &Context, decision: &Decision) {
    for e in &decision.events {
        ctx.record_on(&ar.object_ref(&()), e.warning, e.reason, &e.message)
            .await;
    }
}

/// The AppRollout's command, removed before the machine decides on it so it acts once. One
/// that cannot be removed is left for a later pass (at most a minute on): this pass decides
/// without it, so its measurement is still recorded.
async fn take_command(ctx: &Context, owner: &AppOwner, ar: &AppRollout) -> Option<Command> {
    let command = ar
        .annotations()
        .get(COMMAND_ANNOTATION)
        .and_then(|c| Command::parse(c))?;
    match clear_command(ctx, owner, ar).await {
        Ok(()) => Some(command),
        Err(error) => {
            tracing::warn!(%error, "the command could not be removed; deciding without it this pass");
            None
        }
    }
}

/// Removes the command annotation.
async fn clear_command(ctx: &Context, owner: &AppOwner, ar: &AppRollout) -> Result<(), AppError> {
    let api: Api<AppRollout> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    crate::command_annotation::clear(&api, ar, COMMAND_ANNOTATION, &ctx.latest_apps)
        .await
        .map_err(|source| AppError::Command {
            namespace: owner.namespace.clone(),
            name: owner.name.clone(),
            source,
        })
}

/// The Ready condition, merged so its transition time moves only on a real change.
fn ready(
    existing: &[Condition],
    generation: Option<i64>,
    status: bool,
    reason: &str,
    message: String,
) -> Vec<Condition> {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let want = Want::new(conditions::READY, status, reason, message);
    conditions::merge(existing, &[want], generation, &now)
}

/// (ready, reason, message) for a decision.
/// The decision stands when the Deployments could not be written: a command already removed,
/// a failure counted, an abort, and the weights already pushed are recorded (the rest of the
/// status as it was), so the next pass goes on from them rather than deciding them again.
async fn keep_decision(
    ctx: &Context,
    owner: &AppOwner,
    previous: &AppRolloutStatus,
    decision: &Decision,
    moved: &push::Moved,
) {
    let status = AppRolloutStatus {
        weight: weights::canary_weight(Some(&decision.status)),
        weights_generation: moved.generation,
        weights_applied: Some(format!("{}/{}", moved.confirmed, moved.pods)),
        canary: Some(decision.status.clone()),
        ..previous.clone()
    };
    if let Err(e) = write_status(ctx, owner, &status).await {
        tracing::warn!(approllout = %owner.name, error = %e, "could not record the decision of a failed pass");
    }
}

/// The status a pass that applied its decision writes.
fn status_of(
    ar: &AppRollout,
    previous: &AppRolloutStatus,
    decision: &Decision,
    moved: &push::Moved,
) -> AppRolloutStatus {
    let (ok, reason, message) = readiness(decision, moved);
    AppRolloutStatus {
        observed_generation: ar.metadata.generation,
        stable_revision: decision
            .status
            .stable_revision
            .clone()
            .or(previous.stable_revision.clone()),
        weight: weights::canary_weight(Some(&decision.status)),
        weights_generation: moved.generation,
        weights_applied: Some(format!("{}/{}", moved.confirmed, moved.pods)),
        canary: Some(decision.status.clone()),
        conditions: ready(&previous.conditions, ar.metadata.generation, ok, reason, message),
    }
}

/// Whether every proxy pod confirmed the weights the status holds ("n/n", at least one pod;
/// pushed at the end of the pass that wrote it).
fn weights_confirmed(status: &AppRolloutStatus) -> bool {
    let applied = status.weights_applied.as_deref().and_then(|a| a.split_once('/'));
    applied.is_some_and(|(confirmed, pods)| confirmed == pods && pods.parse::<usize>().is_ok_and(|n| n > 0))
}

/// The canary's pods: as decided, but never fewer than run now while some proxy pod has not
/// confirmed the weights pushed this pass (one that missed the abort's 0 % still sends the
/// canary its share, which an empty Service would answer with errors). They go on a later
/// pass, once every proxy pod has confirmed.
fn canary_kept(decision: &Decision, inputs: &Inputs, moved: &push::Moved) -> i32 {
    let running = inputs.canary.as_ref().and_then(|d| d.spec.as_ref()?.replicas);
    // No proxy pod at all sends the canary anything; a ConfigMap not written would start new
    // ones on the old weights.
    let confirmed = moved.listed && moved.problem.is_none() && moved.confirmed == moved.pods;
    kept_replicas(decision.canary_replicas.unwrap_or(0), running.unwrap_or(0), confirmed)
}

fn kept_replicas(decided: i32, running: i32, weights_confirmed: bool) -> i32 {
    if weights_confirmed {
        decided
    } else {
        decided.max(running)
    }
}

fn readiness(decision: &Decision, moved: &push::Moved) -> (bool, &'static str, String) {
    let msg = decision.status.message.clone().unwrap_or_default();
    match decision.status.phase {
        machine::ABORTED if !moved.all_applied() => (
            false,
            "RolloutAborted",
            format!("{msg}; not every proxy pod confirmed weight 0 yet: the canary keeps its pods until they do"),
        ),
        machine::ABORTED => (false, "RolloutAborted", msg),
        _ if let Some(problem) = &moved.problem => (false, "WeightsPending", format!("{problem}; {msg}")),
        _ if !moved.all_applied() => (
            false,
            "WeightsPending",
            format!("not every proxy pod confirmed the weights yet; {msg}"),
        ),
        p if p.in_rollout() => (true, "RolloutInProgress", msg),
        _ => (true, "Stable", msg),
    }
}

async fn blocked_status(
    ar: &AppRollout,
    owner: &AppOwner,
    ctx: &Context,
    (reason, message): Blocked,
) -> Result<Action, AppError> {
    let mut status = ar.status.clone().unwrap_or_default();
    status.observed_generation = ar.metadata.generation;
    let changed = status
        .conditions
        .first()
        .is_none_or(|c| c.reason != reason || c.message != message);
    if changed {
        ctx.record_on(&ar.object_ref(&()), true, reason, &message).await;
    }
    status.conditions = ready(&status.conditions, ar.metadata.generation, false, reason, message);
    write_status(ctx, owner, &status).await?;
    Ok(Action::requeue(Duration::from_secs(30)))
}

async fn write_status(ctx: &Context, owner: &AppOwner, status: &AppRolloutStatus) -> Result<(), AppError> {
    ctx.app_status_writer(&owner.namespace)
        .apply(&owner.name, status)
        .await
        .map_err(|source| AppError::Status {
            namespace: owner.namespace.clone(),
            name: owner.name.clone(),
            source,
        })
}

pub fn error_policy(ar: Arc<AppRollout>, error: &AppError, ctx: Arc<Context>) -> Action {
    tracing::warn!(name = %ar.name_any(), namespace = ?ar.namespace(), %error, "AppRollout reconcile failed; retrying");
    let key = format!("app:{}", ar.metadata.uid.clone().unwrap_or_else(|| ar.name_any()));
    ctx.metrics
        .reconcile_errors
        .get_or_create(&crate::metrics::ReasonLabels {
            reason: "approllout".into(),
        })
        .inc();
    Action::requeue(ctx.backoff.failed(&key))
}

#[cfg(test)]
mod tests {
    use super::kept_replicas;

    #[test]
    fn weights_are_confirmed_by_every_proxy_pod_of_at_least_one() {
        let with = |applied: Option<&str>| super::AppRolloutStatus {
            weights_applied: applied.map(str::to_string),
            ..Default::default()
        };
        assert!(super::weights_confirmed(&with(Some("3/3"))));
        assert!(!super::weights_confirmed(&with(Some("2/3"))));
        assert!(!super::weights_confirmed(&with(Some("0/0"))));
        assert!(!super::weights_confirmed(&with(None)));
    }

    #[test]
    fn the_canary_keeps_its_pods_until_every_proxy_confirmed_the_weights() {
        // Aborted, weight 0 pushed; one proxy pod did not answer: 3 pods stay.
        assert_eq!(kept_replicas(0, 3, false), 3);
        assert_eq!(kept_replicas(0, 3, true), 0);
        // Growing is never held back.
        assert_eq!(kept_replicas(4, 3, false), 4);
    }
}
