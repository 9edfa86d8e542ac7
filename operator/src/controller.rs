//! The reconcile loop: ProxyDeployment → certificates → desired objects → apply → status.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use tracing::{field, info_span, Instrument};

use crate::apply::{Applier, ApplyError};
use crate::caches::Caches;
use crate::canary;
use crate::certs;
pub use crate::context::{Context, Stores};
use crate::crd::ProxyDeployment;
use crate::desired::{desired_objects, desired_revision, RevisionObjects, SpecError};
use crate::labels::{self, Track};
use crate::metrics::{Metrics, ObjectLabels, ReasonLabels};
use crate::resources::deployment::deployment_name;
use crate::resources::{OperatorSettings, Owner};
use crate::status::{self, Observed, Problem};
use crate::task::AbortOnDrop;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("writing status of {namespace}/{name}: {source}")]
    Status {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("ProxyDeployment is missing {0}")]
    Metadata(String),
    /// A command is acted on only once its annotation is gone: acting while it stays would
    /// act on it again next pass (a `promote` would skip a step each time).
    #[error("clearing the command annotation of {namespace}/{name} before acting on it: {source}")]
    Command {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("reading {what} of {namespace}/{name}: {source}")]
    Read {
        what: &'static str,
        namespace: String,
        name: String,
        source: kube::Error,
    },
}

impl Error {
    pub fn metric_label(&self) -> String {
        match self {
            Error::Apply(ApplyError::Apply { kind, .. }) => format!("apply_{}", kind.to_lowercase()),
            Error::Apply(ApplyError::Delete { kind, .. }) => format!("delete_{}", kind.to_lowercase()),
            Error::Apply(ApplyError::Read { kind, .. }) => format!("read_{}", kind.to_lowercase()),
            Error::Apply(ApplyError::NotOurs { kind, .. }) => format!("foreign_{}", kind.to_lowercase()),
            Error::Status { .. } => "status".into(),
            Error::Metadata(_) => "metadata".into(),
            Error::Command { .. } => "command".into(),
            Error::Read { .. } => "read".into(),
        }
    }
}

fn cached<K: Resource<DynamicType = ()> + Clone>(store: &Store<K>, namespace: &str, name: &str) -> Option<Arc<K>> {
    store.get(&ObjectRef::new(name).within(namespace))
}

pub async fn reconcile(pxd: Arc<ProxyDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    ctx.metrics.reconciles.inc();
    let span = info_span!("reconcile", namespace = field::Empty, name = %pxd.name_any());
    if let Some(ns) = pxd.namespace() {
        span.record("namespace", ns.as_str());
    }
    let result = reconcile_inner(pxd, ctx.clone()).instrument(span).await;
    ctx.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
    result
}

async fn reconcile_inner(pxd: Arc<ProxyDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let pxd = ctx.latest_fleets.newest(pxd);
    let owner = Owner::of(&pxd).map_err(|e| Error::Metadata(e.to_string()))?;
    if pxd.metadata.deletion_timestamp.is_some() {
        return Ok(finalize(&pxd, &owner, &ctx).await);
    }
    // The platform policy first: a refused spec gets nothing applied on its behalf.
    let refused = policy_refusal(&pxd, &owner, &ctx);
    let mut certs = match refused {
        None => certs::reconcile::ensure(&pxd, &ctx).await,
        Some(_) => certs::reconcile::held(&pxd),
    };
    cert_retry(&ctx, &pxd, &owner, &mut certs).await;
    let token = match refused {
        None => crate::app::token::ensure(&ctx, &owner).await,
        Some(_) => Ok(()),
    };
    // The routes as AppRollouts split them; everything else reads the fleet as written.
    let shaped = crate::app::render::shaped_fleet(&pxd, &ctx.apps, &ctx.stores.services);
    let mut pass = Pass::new(&certs);
    if let Err(e) = token {
        pass.token_failed(&ctx, &owner, &e).await;
    }
    let revision = match &refused {
        Some(refusal) => Err(refusal.clone()),
        None => desired_revision_checked(&shaped, &owner, &ctx, &certs).await,
    };
    match revision {
        Err(problem) => pass.block(&ctx, &pxd, &owner, problem).await,
        Ok(rev) => {
            if let Err(e) = roll_out(&shaped, &owner, &ctx, &certs, rev, &mut pass).await {
                return Err(keep_canary_decision(&pxd, &owner, &ctx, &mut pass, e).await);
            }
        }
    }
    let (stable, canary) = (
        cached_track(&ctx, &owner, Track::Stable),
        cached_track(&ctx, &owner, Track::Canary),
    );
    let written_stable = pass.written_stable.take();
    let stable = written_stable.as_ref().or(stable.as_deref());
    check_progress_deadline(&pxd, &owner, &ctx, stable, &mut pass).await;
    let new_status = new_status(&pxd, &certs, stable, canary.as_deref(), &mut pass);
    record_history(&pxd, &owner, &ctx, &new_status, stable, &mut pass).await;
    write_status(&pxd, &owner, &ctx, &new_status).await?;
    Ok(pass.finish(&ctx, &owner, &new_status))
}

/// Reasons of a certificate source that fails, as opposed to one waiting for cert-manager or an
/// ACME order.
const CERT_FAILURES: &[&str] = &[
    "SecretNotFound",
    "InvalidSecret",
    "SecretNotOurs",
    "SecretUnreadable",
    "UnsupportedKeyAlgorithm",
    "Invalid",
    "IssuanceFailed",
    "CAUnavailable",
    "AcmeUnavailable",
    "CertManagerUnavailable",
];

/// A certificate source that fails is retried on a backoff (5 s doubling, at most a minute: a
/// Secret the user creates does not wake the fleet), and a failure the fleet keeps serving
/// through (a renewal that failed, the old leaf still valid) is told once as a Warning event; a
/// blocking one is told by `Pass::block`.
async fn cert_retry(ctx: &Context, pxd: &ProxyDeployment, owner: &Owner, certs: &mut certs::reconcile::CertOutcome) {
    let key = format!("certs:{}", owner.reference.uid);
    let c = &certs.condition;
    if c.status || !CERT_FAILURES.contains(&c.reason.as_str()) {
        ctx.backoff.succeeded(&key);
        return;
    }
    certs.requeue_after = Some(ctx.backoff.failed(&key).min(Duration::from_secs(60)));
    let told = pxd
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|k| k.type_ == c.type_))
        .is_some_and(|k| k.status == "False" && k.message == c.message);
    if certs.blocking.is_none() && !told {
        ctx.warn(owner, &c.reason, &c.message).await;
    }
}

/// A pass that failed for a reason not the spec's (an apply's conflict, 5xx or timeout): the
/// status stays as it was (nothing new runs, so nothing new is reported), except the canary's
/// decision if one was made, which must not be lost (a measured failure, a command already
/// cleared). The pass then fails with `e`, on the backoff.
async fn keep_canary_decision(pxd: &ProxyDeployment, owner: &Owner, ctx: &Context, pass: &mut Pass, e: Error) -> Error {
    let Some(canary) = pass.canary_status.take() else {
        return e;
    };
    let mut kept = own_part(pxd.status.clone().unwrap_or_default());
    kept.canary = Some(canary);
    if let Err(status) = write_status(pxd, owner, ctx, &kept).await {
        tracing::warn!(error = %status, "the canary's decision could not be written either");
    }
    e
}

/// What one reconcile pass learned on its way through the steps.
struct Pass {
    problem: Option<Problem>,
    requeue: Duration,
    written_stable: Option<Deployment>,
    canary_status: Option<canary::spec::CanaryStatus>,
    revision: Option<String>,
    image: Option<String>,
    /// Set when the apply was refused: the backoff's delay, the pass's only requeue (a canary's
    /// 2 s look would retry the refused apply every 2 s).
    apply_failed: Option<Duration>,
}

impl Pass {
    fn new(certs: &certs::reconcile::CertOutcome) -> Self {
        Self {
            problem: None,
            requeue: certs.requeue_after.unwrap_or(MAX_REQUEUE).min(MAX_REQUEUE),
            written_stable: None,
            canary_status: None,
            revision: None,
            image: None,
            apply_failed: None,
        }
    }

    fn requeue_within(&mut self, d: Duration) {
        self.requeue = self.requeue.min(d);
    }

    /// The spec cannot roll out: say why once, touch nothing running.
    async fn block(
        &mut self,
        ctx: &Context,
        pxd: &ProxyDeployment,
        owner: &Owner,
        (reason, message): (String, String),
    ) {
        warn_once(ctx, pxd, owner, &reason, &message).await;
        tracing::warn!(%reason, %message, "not rolling out; existing objects left as they are");
        self.problem = Some(Problem { reason, message });
        // The canary stands where it was: an abort, its reason and its counts outlive the block
        // (dropped, the next pass would start the aborted revision again from its first step).
        self.canary_status = pxd.status.as_ref().and_then(|s| s.canary.clone());
        self.requeue_within(Duration::from_secs(60));
    }

    /// The admin token could not be created: the fleet serves, but weight and certificate
    /// pushes to its pods are refused until it exists. Told as a Warning event (a series, so a
    /// lasting failure is one Event counting up) and tried again within 30 s.
    async fn token_failed(&mut self, ctx: &Context, owner: &Owner, e: &crate::app::token::TokenError) {
        tracing::warn!(error = %e, "admin token not created; retrying");
        ctx.metrics
            .reconcile_errors
            .get_or_create(&ReasonLabels {
                reason: "admin_token".into(),
            })
            .inc();
        ctx.warn(owner, "AdminTokenFailed", &e.to_string()).await;
        self.requeue_within(Duration::from_secs(30));
    }

    fn finish(mut self, ctx: &Context, owner: &Owner, status: &crate::crd::ProxyDeploymentStatus) -> Action {
        if let Some(retry) = self.apply_failed {
            return Action::requeue(retry);
        }
        if matches!(
            status.phase,
            Some(crate::crd::Phase::Progressing | crate::crd::Phase::Pending)
        ) {
            self.requeue_within(Duration::from_secs(10));
        }
        ctx.backoff.succeeded(&owner.reference.uid);
        Action::requeue(self.requeue)
    }
}

const MAX_REQUEUE: Duration = Duration::from_secs(300);

/// The longest wait before a refused apply is tried again while a canary runs.
const CANARY_RETRY_AT_MOST: Duration = Duration::from_secs(30);

/// Owned objects follow through their owner references; nothing to do but forget the status.
async fn finalize(_pxd: &ProxyDeployment, owner: &Owner, ctx: &Context) -> Action {
    // Members are the propagation controller's (it holds the finalizer until they are done).
    ctx.latest_fleets.forget(&owner.reference.uid);
    ctx.acme_orders.forget(&owner.reference.uid);
    Action::await_change()
}

/// Why the platform policy refuses the spec, as (reason, message), if it does.
fn policy_refusal(pxd: &ProxyDeployment, owner: &Owner, ctx: &Context) -> Option<(String, String)> {
    crate::policy::refusal(
        &ctx.stores.policies,
        &ctx.stores.namespaces,
        &owner.namespace,
        &pxd.spec,
        &ctx.settings.default_proxy_image,
    )
}

fn cached_track(ctx: &Context, owner: &Owner, track: Track) -> Option<Arc<Deployment>> {
    cached(
        &ctx.stores.deployments,
        &owner.namespace,
        &deployment_name(&owner.name, track),
    )
}

/// The revision the spec asks for, or why it cannot run: the certificate source blocks, a
/// referenced Secret is missing, or the spec is invalid — as (reason, message).
async fn desired_revision_checked(
    pxd: &ProxyDeployment,
    owner: &Owner,
    ctx: &Context,
    certs: &certs::reconcile::CertOutcome,
) -> Result<RevisionObjects, (String, String)> {
    if let Some(block) = &certs.blocking {
        return Err((certs.condition.reason.clone(), block.clone()));
    }
    if let Some(problem) = crate::secret_refs::check(ctx, &owner.namespace, &pxd.spec).await {
        return Err(problem);
    }
    desired_revision(pxd, &ctx.settings, &certs.secrets).map_err(|SpecError(m)| ("InvalidSpec".to_string(), m))
}

/// Rollout plan (canary machine) → desired set → apply it and collect orphans.
async fn roll_out(
    pxd: &ProxyDeployment,
    owner: &Owner,
    ctx: &Context,
    certs: &certs::reconcile::CertOutcome,
    rev: RevisionObjects,
    pass: &mut Pass,
) -> Result<(), Error> {
    pass.revision = Some(rev.pod.revision.clone());
    pass.image = Some(rev.pod.image.clone());
    let command = take_command(ctx, owner, pxd, pass).await;
    let (stable_now, canary_now) = (
        cached_track(ctx, owner, Track::Stable),
        cached_track(ctx, owner, Track::Canary),
    );
    let decision = canary::rollout::decide(
        pxd,
        owner,
        ctx,
        &rev,
        (stable_now.as_deref(), canary_now.as_deref()),
        command,
    )
    .await;
    // The decision is recorded whatever follows: the machine moves only on what it observes
    // (ready canary pods, a rolled-out stable), so a step not applied is not taken, while a
    // command (cleared above), an abort and the analysis' counts must not be lost
    // (`keep_canary_decision` writes it when the pass fails from here on).
    if let Some(decision) = &decision {
        report_decision(ctx, owner, decision, pass).await;
    }
    let rollout = canary::rollout::plan(ctx, pxd.spec.replicas, decision.as_ref(), rev, stable_now.as_deref())
        .await
        .map_err(|source| Error::Read {
            what: "the stable Deployment",
            namespace: owner.namespace.clone(),
            name: owner.name.clone(),
            source,
        })?;
    let mut desired = desired_objects(pxd, &rollout.plans, &certs.secrets, &ctx.settings.operator_namespace)
        .map_err(|e| Error::Metadata(e.0))?;
    desired.deployments.extend(rollout.kept_stable.clone());
    let mut keep_config_maps: Vec<String> = desired
        .config_maps
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    keep_config_maps.extend(rollout.kept_config_map.clone());
    match crate::owned_set::apply_owned_set(ctx, owner, &desired, &keep_config_maps).await {
        Ok((changes, stable)) => {
            pass.written_stable = stable;
            if !changes.is_empty() {
                ctx.record(owner, "Applied", &changes.join("; ")).await;
            }
        }
        // Refused objects are the user's to fix: say so in status, retry with backoff (while
        // a canary runs, at least every 30 s, so its analysis can still abort it).
        Err(e) => {
            // Not the spec's fault: the pass fails, keeping the canary's decision
            // (`keep_canary_decision`).
            let Some(message) = e.refusal() else {
                return Err(e.into());
            };
            warn_once(ctx, pxd, owner, "ApplyFailed", &message).await;
            let mut retry = ctx.backoff.failed(&owner.reference.uid);
            if decision.is_some() {
                retry = retry.min(CANARY_RETRY_AT_MOST);
            }
            tracing::warn!(%message, retry_in = ?retry, "apply refused; retrying with backoff");
            pass.problem = Some(Problem {
                reason: "ApplyFailed".into(),
                message,
            });
            pass.apply_failed = Some(retry);
        }
    }
    Ok(())
}

/// Events, metrics and status of one canary decision.
async fn report_decision(ctx: &Context, owner: &Owner, decision: &canary::machine::Decision, pass: &mut Pass) {
    for e in &decision.events {
        if e.warning {
            ctx.warn(owner, e.reason, &e.message).await;
        } else {
            ctx.record(owner, e.reason, &e.message).await;
        }
    }
    if let Some(reason) = &decision.aborted {
        let labels = ReasonLabels { reason: reason.clone() };
        ctx.metrics.rollout_aborts.get_or_create(&labels).inc();
    }
    if decision.status.phase == canary::machine::ABORTED {
        pass.problem = Some(Problem {
            reason: "RolloutAborted".into(),
            message: decision.status.message.clone().unwrap_or_default(),
        });
    }
    let labels = ObjectLabels {
        namespace: owner.namespace.clone(),
        proxydeployment: owner.name.clone(),
    };
    ctx.metrics
        .canary_weight
        .get_or_create(&labels)
        .set(decision.status.weight as i64);
    pass.requeue_within(Duration::from_secs(decision.requeue_after.max(1)));
    pass.canary_status = Some(decision.status.clone());
}

/// A plain rollout whose pods never became Ready: Degraded/ProgressDeadlineExceeded.
async fn check_progress_deadline(
    pxd: &ProxyDeployment,
    owner: &Owner,
    ctx: &Context,
    stable: Option<&Deployment>,
    pass: &mut Pass,
) {
    if pass.problem.is_some() {
        return;
    }
    if let Some(d) = stable.filter(|d| crate::pod_problem::deadline_exceeded(d)) {
        pass.problem = Some(stalled(ctx, pxd, owner, d).await);
    }
}

fn new_status(
    pxd: &ProxyDeployment,
    certs: &certs::reconcile::CertOutcome,
    stable: Option<&Deployment>,
    canary: Option<&Deployment>,
    pass: &mut Pass,
) -> crate::crd::ProxyDeploymentStatus {
    let extra_conditions = vec![certs.condition.clone()];
    let observed = Observed {
        stable,
        canary,
        revision: pass.revision.clone(),
        image: pass.image.clone(),
        problem: pass.problem.clone(),
        extra_conditions,
    };
    let mut s = status::compute(pxd, &observed, &Time(k8s_openapi::jiff::Timestamp::now()));
    s.certificates = certs.statuses.clone();
    s.ca_rotation = certs.ca_rotation.clone();
    s.acme = certs.acme.clone();
    s.canary = pass.canary_status.clone();
    own_part(s)
}

/// The status this controller writes: everything but what the propagation controller owns
/// (`clusters`, `waves` and the `Propagated` condition, under its own field manager).
fn own_part(mut status: crate::crd::ProxyDeploymentStatus) -> crate::crd::ProxyDeploymentStatus {
    status.clusters.clear();
    // The wave rollout is the propagation controller's: carried over from a cached status that
    // lags its last write, a forced apply here would put an old wave status back (seen: an
    // abort's reason gone a second after it was written, a rollout started twice).
    status.waves = None;
    status.conditions.retain(|c| c.type_ != crate::conditions::PROPAGATED);
    status
}

/// A revision every pod runs and serves with is stable: keep it in the history for undo.
async fn record_history(
    pxd: &ProxyDeployment,
    owner: &Owner,
    ctx: &Context,
    status: &crate::crd::ProxyDeploymentStatus,
    stable: Option<&Deployment>,
    pass: &mut Pass,
) {
    let (Some(hash), Some(d)) = (&pass.revision, stable) else {
        return;
    };
    if status.phase != Some(crate::crd::Phase::Ready) || status::revision_of(d).as_deref() != Some(hash.as_str()) {
        return;
    }
    if let Err(e) = crate::history::record_stable(ctx, owner, &pxd.spec, hash).await {
        tracing::warn!(error = %e, "could not record the stable revision; retrying");
        pass.requeue_within(Duration::from_secs(10));
    }
}

/// Server-side apply of the status, only when it changed; remembers what it wrote, since the
/// watch cache can lag behind our own write.
async fn write_status(
    pxd: &ProxyDeployment,
    owner: &Owner,
    ctx: &Context,
    status: &crate::crd::ProxyDeploymentStatus,
) -> Result<(), Error> {
    if pxd.status.clone().map(own_part).as_ref() == Some(status) {
        return Ok(());
    }
    ctx.status_writer(&owner.namespace, labels::FIELD_MANAGER)
        .apply(&owner.name, status)
        .await
        .map_err(|source| Error::Status {
            namespace: owner.namespace.clone(),
            name: owner.name.clone(),
            source,
        })
}

/// The Deployment controller gave up on the stable pods: say which pod and why.
async fn stalled(ctx: &Context, pxd: &ProxyDeployment, owner: &Owner, d: &Deployment) -> Problem {
    let why = crate::pod_problem::describe(ctx, owner, Track::Stable, status::revision_of(d).as_deref())
        .await
        .unwrap_or_else(|| "no pod reported a reason".into());
    let message = format!(
        "Deployment {}: pods not Ready within progressDeadline ({}s): {why}",
        d.metadata.name.as_deref().unwrap_or(&owner.name),
        crate::pod_problem::progress_deadline_secs(pxd)
    );
    warn_once(ctx, pxd, owner, "ProgressDeadlineExceeded", &message).await;
    Problem {
        reason: "ProgressDeadlineExceeded".into(),
        message,
    }
}

/// A warning event for a problem, once per distinct message (the Degraded condition remembers it).
async fn warn_once(ctx: &Context, pxd: &ProxyDeployment, owner: &Owner, reason: &str, message: &str) {
    let changed = pxd
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == crate::conditions::DEGRADED))
        .is_none_or(|c| c.status != "True" || c.message != message);
    if changed {
        ctx.warn(owner, reason, message).await;
    }
}

/// The fleet's command (`proxyfleet.io/command`), removed before the machine decides on it so
/// it acts once. One that cannot be removed is left for a later pass, on a backoff: this pass
/// decides without it, so its measurement is still recorded.
async fn take_command(
    ctx: &Context,
    owner: &Owner,
    pxd: &ProxyDeployment,
    pass: &mut Pass,
) -> Option<canary::machine::Command> {
    let command = canary::rollout::command_of(pxd)?;
    let key = format!("command:{}", owner.reference.uid);
    match clear_command(ctx, owner, pxd).await {
        Ok(()) => {
            ctx.backoff.succeeded(&key);
            Some(command)
        }
        Err(error) => {
            let retry = ctx.backoff.failed(&key);
            tracing::warn!(%error, ?retry, "the command could not be removed; deciding without it this pass");
            pass.requeue_within(retry);
            None
        }
    }
}

/// Removes the handled command annotation, so it acts once.
async fn clear_command(ctx: &Context, owner: &Owner, pxd: &ProxyDeployment) -> Result<(), Error> {
    let api: Api<ProxyDeployment> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let annotation = canary::rollout::COMMAND_ANNOTATION;
    crate::command_annotation::clear(&api, pxd, annotation, &ctx.latest_fleets)
        .await
        .map_err(|source| Error::Command {
            namespace: owner.namespace.clone(),
            name: owner.name.clone(),
            source,
        })?;
    ctx.metrics.api_write("ProxyDeployment", "patch");
    Ok(())
}

pub fn error_policy(pxd: Arc<ProxyDeployment>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(name = %pxd.name_any(), namespace = ?pxd.namespace(), %error, "reconcile failed; retrying");
    ctx.metrics
        .reconcile_errors
        .get_or_create(&ReasonLabels {
            reason: error.metric_label(),
        })
        .inc();
    // 5 s, doubling per consecutive failure of this fleet, up to 5 min.
    let key = pxd.metadata.uid.clone().unwrap_or_else(|| pxd.name_any());
    let failures = ctx.backoff.count_failure(&key);
    // Errors that are not the spec's (the API server's 5xx, a conflict, a timeout) reach no
    // status; one that persists is told to the user as a Warning event on the fleet.
    if let Some(owner) = crate::backoff::worth_telling(failures)
        .then(|| Owner::of(&pxd).ok())
        .flatten()
    {
        let note = format!("reconcile failed {failures} times in a row; retrying with backoff: {error}");
        tokio::spawn(async move { ctx.warn(&owner, "ReconcileFailing", &note).await });
    }
    Action::requeue(crate::backoff::delay(failures))
}

/// Runs the controllers until `stop` completes. Returns after they have shut down.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    settings: OperatorSettings,
    identity: String,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let caches = Caches::start(&client, &settings);
    // Decisions need complete caches: wait for every initial list — or for the stop, which
    // must not wait for a long first sync (the successor takes over once we return).
    let stop = futures::FutureExt::shared(stop);
    tokio::select! {
        _ = caches.wait_until_ready() => {}
        _ = stop.clone() => return,
    }
    tracing::info!("caches synced; starting the controllers");
    let Caches {
        stores,
        fleets,
        apps,
        cluster_secrets,
        wake,
        task,
    } = caches;
    let ctx = Arc::new(context(
        &client,
        &metrics,
        settings,
        identity,
        stores,
        apps,
        cluster_secrets,
    ));
    let _orders = ctx.acme_orders.stop_on_drop();
    let controller = Controller::for_shared_stream(wake.fleet_changes, fleets.clone())
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.settings.reconcile_concurrency));
    let ca_changes = fleets_of_namespace(controller.store(), wake.ca_namespaces);
    // They end with this future: a leader that lost its lease is aborted here and must not
    // leave the caches' watches or the other controllers running.
    let caches_task = task;
    let mut others = Others::start(
        &client,
        &ctx,
        OthersWake {
            fleets,
            propagation_changes: wake.propagation_changes,
            app_changes: wake.app_changes,
            apps: wake.apps,
            propagated: wake.propagated,
            clusters_changed: wake.all_fleets,
        },
    );
    // Owned objects wake their fleet through `wake.fleets` (the caches' watches), not through
    // `owns` watches of their own.
    controller
        .reconcile_on(ca_changes)
        .reconcile_on(wake.fleets)
        .reconcile_all_on(wake.policies)
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            if let Err(e) = res {
                tracing::debug!(error = %e, "controller event");
            }
            futures::future::ready(())
        })
        .await;
    others.stop().await;
    metrics.managed_objects.set(0);
    drop(caches_task);
}

/// What wakes the other controllers, from the shared caches.
struct OthersWake {
    /// The fleet controller's cache of ProxyDeployments, which propagation reconciles too.
    fleets: Store<ProxyDeployment>,
    propagation_changes: crate::shared_input::Triggers<ProxyDeployment>,
    app_changes: crate::shared_input::Triggers<crate::app::spec::AppRollout>,
    apps: futures::channel::mpsc::UnboundedReceiver<ObjectRef<crate::app::spec::AppRollout>>,
    propagated: futures::channel::mpsc::UnboundedReceiver<ObjectRef<ProxyDeployment>>,
    clusters_changed: futures::channel::mpsc::UnboundedReceiver<()>,
}

/// The controllers beside the fleet controller, over the same caches and context: app
/// rollouts, propagation to members, and the namespace CAs' rotation.
struct Others {
    stop: Vec<futures::channel::oneshot::Sender<()>>,
    tasks: Vec<AbortOnDrop<()>>,
}

impl Others {
    fn start(client: &Client, ctx: &Arc<Context>, wake: OthersWake) -> Self {
        let mut out = Others {
            stop: Vec::new(),
            tasks: Vec::new(),
        };
        let mut stopper = || {
            let (tx, rx) = futures::channel::oneshot::channel::<()>();
            out.stop.push(tx);
            async move {
                let _ = rx.await;
            }
        };
        let (app, propagation, ca) = (stopper(), stopper(), stopper());
        let scope = &ctx.settings;
        out.tasks = vec![
            AbortOnDrop(tokio::spawn(crate::app::controller::run(
                client.clone(),
                ctx.clone(),
                (wake.app_changes, wake.apps),
                app,
            ))),
            AbortOnDrop(tokio::spawn(crate::propagation::controller::run(
                (wake.fleets, wake.propagation_changes),
                ctx.clone(),
                (wake.clusters_changed, wake.propagated),
                propagation,
            ))),
            AbortOnDrop(tokio::spawn(crate::certs::controller::run(
                scope.api::<Secret>(client),
                ctx.clone(),
                ca,
            ))),
        ];
        out
    }

    /// Asks each to finish, and waits until they have.
    async fn stop(&mut self) {
        for tx in self.stop.drain(..) {
            let _ = tx.send(());
        }
        for t in &mut self.tasks {
            t.join().await;
        }
    }
}

/// Every fleet of a namespace whose CA Secret changed.
fn fleets_of_namespace(
    fleets: Store<ProxyDeployment>,
    namespaces: futures::channel::mpsc::UnboundedReceiver<String>,
) -> impl futures::Stream<Item = ObjectRef<ProxyDeployment>> {
    namespaces.flat_map(move |namespace| {
        let refs: Vec<_> = fleets
            .state()
            .into_iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace.as_str()))
            .map(|p| ObjectRef::from_obj(&*p))
            .collect();
        futures::stream::iter(refs)
    })
}

pub(crate) fn context(
    client: &Client,
    metrics: &Arc<Metrics>,
    settings: OperatorSettings,
    identity: String,
    stores: Stores,
    apps: Store<crate::app::spec::AppRollout>,
    cluster_secrets: Vec<Store<Secret>>,
) -> Context {
    let events = crate::event_recorder::Events::new(
        client.clone(),
        Reporter {
            controller: "proxyfleet-operator".into(),
            instance: Some(identity),
        },
    );
    let (resync, cleanup_timeout) = (settings.propagation_resync, settings.propagation_cleanup_timeout);
    Context {
        client: client.clone(),
        stores,
        applier: Applier::new(client.clone(), metrics.clone()),
        events,
        metrics: metrics.clone(),
        settings,
        http: Default::default(),
        snapshots: Default::default(),
        latest_fleets: Default::default(),
        backoff: Default::default(),
        apps,
        latest_apps: Default::default(),
        acme_orders: Default::default(),
        propagation: crate::propagation::state::Propagation {
            cluster_secrets,
            clients: Default::default(),
            resync,
            cleanup_timeout,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_controller_never_writes_the_propagation_controllers_part() {
        let shown = crate::crd::ProxyDeploymentStatus {
            waves: Some(Default::default()),
            clusters: vec![Default::default()],
            ready_replicas: 2,
            ..Default::default()
        };
        let own = own_part(shown);
        assert!(own.waves.is_none() && own.clusters.is_empty());
        assert_eq!(own.ready_replicas, 2);
    }

    /// A command whose removal fails is not acted on this pass (the machine decides without
    /// it, so a measurement is still recorded) and is looked at again on the backoff.
    #[tokio::test]
    async fn a_command_that_cannot_be_removed_is_left_for_a_later_pass() {
        use kube::client::Body;
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let server = tokio::spawn(async move {
            let (request, send) = handle.next_request().await.expect("the patch");
            assert_eq!(request.method(), http::Method::PATCH);
            let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500});
            send.send_response(
                http::Response::builder()
                    .status(500)
                    .body(Body::from(serde_json::to_vec(&status).expect("json")))
                    .expect("response"),
            );
        });
        let ctx = crate::context::testing::test_context(kube::Client::new(mock, "default"));
        let mut pxd: ProxyDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "ProxyDeployment",
            "metadata": {"name": "demo", "namespace": "team-a", "uid": "u-1", "resourceVersion": "7",
                "annotations": {canary::rollout::COMMAND_ANNOTATION: "promote"}},
            "spec": {"replicas": 2, "listeners": [], "routes": [{"name": "all", "upstream": "app"}],
                "upstreams": [{"name": "app", "endpoints": ["app.default.svc:8080"]}]},
        }))
        .expect("fleet");
        let owner = Owner::of(&pxd).expect("owner");
        let mut pass = Pass {
            problem: None,
            requeue: MAX_REQUEUE,
            written_stable: None,
            canary_status: None,
            revision: None,
            image: None,
            apply_failed: None,
        };
        assert_eq!(take_command(&ctx, &owner, &pxd, &mut pass).await, None);
        server.await.expect("mock server");
        assert_eq!(pass.requeue, Duration::from_secs(5), "looked at again on the backoff");
        pxd.metadata.annotations = None;
        assert_eq!(
            take_command(&ctx, &owner, &pxd, &mut pass).await,
            None,
            "no command: no call"
        );
    }
}
