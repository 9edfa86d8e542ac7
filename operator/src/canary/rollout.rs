//! The I/O shell around the canary state machine: reads the running Deployments, measures when
//! an analysis is due, and turns the decision into Deployments to apply.

use std::collections::HashMap;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::analysis::{condition_holds, judge_builtin, Verdict, Window};
use super::machine::{self, Command, Decision, Measurement, Observations, StableTemplate};
use super::source::{self, parse_proxy_metrics, Snapshot};
use super::spec::Analysis;
use crate::context::Context;
use crate::crd::ProxyDeployment;
use crate::desired::{RevisionObjects, TrackPlan};
use crate::labels::{self, Track};
use crate::resources::config_map::ADMIN_PORT;
use crate::resources::Owner;
use crate::status;

/// The deployments a reconcile should run, and the canary's new status.
pub struct RolloutPlan {
    /// Tracks that run the spec's revision (built by the pure builders).
    pub plans: Vec<TrackPlan>,
    /// The stable Deployment kept on its current template (during a rollout or after an abort).
    pub kept_stable: Option<Deployment>,
    /// ConfigMap the kept stable Deployment mounts (must not be deleted as an orphan).
    pub kept_config_map: Option<String>,
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn ready_on_current_template(d: &Deployment) -> i32 {
    let Some(s) = &d.status else { return 0 };
    if s.observed_generation.unwrap_or(0) < d.metadata.generation.unwrap_or(0) {
        return 0;
    }
    // Ready pods of the current template: at most the updated ones.
    s.ready_replicas.unwrap_or(0).min(s.updated_replicas.unwrap_or(0))
}

/// The stable Deployment as it runs, with another replica count: kept by re-applying it.
fn keep(d: &Deployment, replicas: i32) -> Deployment {
    let mut k = Deployment {
        metadata: d.metadata.clone(),
        spec: d.spec.clone(),
        status: None,
    };
    k.metadata.resource_version = None;
    k.metadata.uid = None;
    k.metadata.managed_fields = None;
    k.metadata.creation_timestamp = None;
    k.metadata.generation = None;
    k.metadata.annotations = k.metadata.annotations.map(|mut a| {
        a.remove(labels::DESIRED_HASH);
        a.remove("deployment.kubernetes.io/revision");
        a
    });
    if let Some(spec) = k.spec.as_mut() {
        spec.replicas = Some(replicas);
    }
    k
}

fn config_map_of(d: &Deployment) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .volumes
        .as_ref()?
        .iter()
        .find(|v| v.name == "config")?
        .config_map
        .as_ref()
        .map(|c| c.name.clone())
}

/// The canary machine's decision for this pass: `None` for a fleet without a canary strategy
/// (a plain rolling update). Measures first when an analysis is due.
pub async fn decide(
    pxd: &ProxyDeployment,
    owner: &Owner,
    ctx: &Context,
    revision: &RevisionObjects,
    tracks: (Option<&Deployment>, Option<&Deployment>),
    command: Option<Command>,
) -> Option<Decision> {
    let strategy = pxd.spec.strategy.as_ref().and_then(|s| s.canary.as_ref())?;
    let previous = pxd.status.as_ref().and_then(|s| s.canary.clone());
    let obs = observe(pxd, owner, ctx, strategy, revision, tracks).await;
    let decision = machine::decide(strategy, previous.as_ref(), pxd.spec.replicas, &obs, command);
    tracing::info!(
        phase = %decision.status.phase,
        step = decision.status.current_step_index,
        weight = decision.status.weight,
        stable_template = ?decision.stable_template,
        stable_replicas = decision.stable_replicas,
        canary_replicas = ?decision.canary_replicas,
        "canary decision"
    );
    if matches!(
        decision.status.phase,
        machine::COMPLETED | machine::ABORTED | machine::IDLE
    ) {
        ctx.snapshots.forget(&format!("{}/{}", owner.namespace, owner.name));
    }
    Some(decision)
}

/// The Deployments `decision` asks for (the spec's revision on one stable track without one).
/// The cache keeps no pod spec (cache_trim): a stable track kept on its current template is
/// read whole, only then; that read is the only thing that can fail.
pub async fn plan(
    ctx: &Context,
    total: i32,
    decision: Option<&Decision>,
    revision: RevisionObjects,
    stable: Option<&Deployment>,
) -> Result<RolloutPlan, kube::Error> {
    let Some(decision) = decision else {
        return Ok(RolloutPlan {
            plans: vec![TrackPlan {
                track: Track::Stable,
                replicas: total,
                revision,
            }],
            kept_stable: None,
            kept_config_map: None,
        });
    };
    let stable_whole = match (decision.stable_template, stable) {
        (StableTemplate::Current, Some(d)) => crate::cache_trim::untrimmed(&ctx.client, d).await?,
        _ => None,
    };
    Ok(tracks_of(decision, revision, stable_whole.as_ref()))
}

/// The tracks a decision asks for: pure. The stable track keeps its current template (and
/// ConfigMap) while a canary runs, or takes the desired one.
fn tracks_of(decision: &machine::Decision, revision: RevisionObjects, stable: Option<&Deployment>) -> RolloutPlan {
    let mut out = RolloutPlan {
        plans: Vec::new(),
        kept_stable: None,
        kept_config_map: None,
    };
    let desired_stable = |revision: RevisionObjects| TrackPlan {
        track: Track::Stable,
        replicas: decision.stable_replicas,
        revision,
    };
    match (decision.stable_template, stable) {
        (StableTemplate::Current, Some(d)) => {
            out.kept_stable = Some(keep(d, decision.stable_replicas));
            out.kept_config_map = config_map_of(d);
        }
        _ => out.plans.push(desired_stable(revision.clone())),
    }
    if let Some(replicas) = decision.canary_replicas {
        out.plans.push(TrackPlan {
            track: Track::Canary,
            replicas,
            revision,
        });
    }
    out
}

/// What the canary machine needs to know this time: revisions, readiness, and a measurement
/// when one is due (taken from the status as it stands).
async fn observe(
    pxd: &ProxyDeployment,
    owner: &Owner,
    ctx: &Context,
    strategy: &super::spec::CanaryStrategy,
    revision: &RevisionObjects,
    (stable, canary): (Option<&Deployment>, Option<&Deployment>),
) -> Observations {
    let total = pxd.spec.replicas;
    let previous = pxd.status.as_ref().and_then(|s| s.canary.clone());
    let stable_revision = stable.and_then(status::revision_of);
    // Rolled out means: the spec's revision, all `total` pods updated and ready. Judged against
    // what we want, not the cached spec, which may predate our last write.
    let stable_rolled_out = stable.is_some_and(|d| {
        status::revision_of(d).as_deref() == Some(revision.pod.revision.as_str()) && status::rolled_out(d, total)
    });
    let canary_ready = canary
        .filter(|d| status::revision_of(d).as_deref() == Some(revision.pod.revision.as_str()))
        .map(ready_on_current_template)
        .unwrap_or(0);
    let mut obs = Observations {
        desired_revision: revision.pod.revision.clone(),
        stable_revision,
        stable_rolled_out,
        canary_ready,
        progress_deadline: crate::pod_problem::progress_deadline_secs(pxd),
        retry_token: retry_token(&pxd.metadata),
        now: now(),
        ..Default::default()
    };
    // Past the deadline the machine aborts; say why the canary pods are not ready.
    if let Some(prev) = previous.as_ref().filter(|p| p.phase == machine::PROGRESSING) {
        let waited = obs.now - machine::started_at(prev).unwrap_or(obs.now);
        if waited >= obs.progress_deadline {
            obs.canary_problem =
                crate::pod_problem::describe(ctx, owner, Track::Canary, Some(&revision.pod.revision)).await;
        }
    }
    // Measure first when an analysis is due, from the status as it stands.
    if let Some(prev) = &previous {
        if prev.canary_revision.as_deref() == Some(obs.desired_revision.as_str())
            && machine::measurement_due(strategy, prev, obs.now)
        {
            if let Some((analysis, _)) = machine::active_analysis(strategy, prev) {
                let revisions = Revisions {
                    canary: &obs.desired_revision,
                    stable: obs.stable_revision.as_deref(),
                };
                obs.measurement = Some(measure(owner, ctx, analysis, &revisions).await);
            }
        }
    }
    obs
}

/// Takes one measurement of every metric of `analysis`.
/// The revisions the canary and the stable pods run, which scope every Prometheus query.
struct Revisions<'a> {
    canary: &'a str,
    stable: Option<&'a str>,
}

impl Revisions<'_> {
    fn selector(&self, owner: &Owner, track: &str) -> String {
        let revision = if track == "canary" {
            Some(self.canary)
        } else {
            self.stable
        };
        source::track_selector(&owner.namespace, &owner.name, track, revision)
    }
}

async fn measure(owner: &Owner, ctx: &Context, analysis: &Analysis, revisions: &Revisions<'_>) -> Measurement {
    let window_secs = analysis.window.get().as_secs().max(1) as i64;
    let taken_at = now();
    let builtin = analysis.metrics.iter().any(|m| m.prometheus.is_none());
    let windows: Result<Option<(Window, Window, i64)>, source::MeasureError> = if !builtin {
        Ok(None)
    } else if let Some(p) = &analysis.source.prometheus {
        prometheus_windows(ctx, &p.address, owner, revisions, window_secs)
            .await
            .map(|(c, s)| Some((c, s, taken_at - window_secs)))
    } else {
        direct_windows(ctx, owner, window_secs).await
    };
    let subject = Subject {
        namespace: &owner.namespace,
        name: &owner.name,
        canary_selector: revisions.selector(owner, "canary"),
        stable_selector: revisions.selector(owner, "stable"),
    };
    judge(ctx, analysis, &subject, windows, taken_at).await
}

/// What a measurement is about: for gauges, and the selectors `{{canary}}`/`{{stable}}` stand for.
pub struct Subject<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub canary_selector: String,
    pub stable_selector: String,
}

/// Judges every metric of `analysis` from the built-in windows (when its metrics need them)
/// and its own Prometheus queries. Shared by fleet and app rollouts.
pub async fn judge(
    ctx: &Context,
    analysis: &Analysis,
    subject: &Subject<'_>,
    windows: Result<Option<(Window, Window, i64)>, source::MeasureError>,
    taken_at: i64,
) -> Measurement {
    let window_secs = analysis.window.get().as_secs().max(1) as i64;
    let builtin = analysis.metrics.iter().any(|m| m.prometheus.is_none());
    let mut out = Vec::new();
    for m in &analysis.metrics {
        let verdict = if let Some(q) = &m.prometheus {
            let query = q
                .query
                .replace("{{canary}}", &subject.canary_selector)
                .replace("{{stable}}", &subject.stable_selector);
            match source::prometheus_scalar(&ctx.http, &q.address, &query).await {
                Ok(Some(v)) => match condition_holds(&q.success_condition, v) {
                    Some(true) => Verdict::Success(v),
                    Some(false) => Verdict::Failure(v),
                    None => Verdict::Error(format!("cannot evaluate successCondition {:?}", q.success_condition)),
                },
                Ok(None) => Verdict::Inconclusive("query returned no data".into()),
                Err(e) => Verdict::Error(e.to_string()),
            }
        } else {
            match &windows {
                Ok(Some((canary, stable, _))) => {
                    judge_builtin(m, canary, Some(stable), analysis.min_requests, analysis.on_no_data)
                }
                Ok(None) => Verdict::Inconclusive("baseline taken; the next measurement has a window".into()),
                Err(e) => Verdict::Error(e.to_string()),
            }
        };
        if let Verdict::Success(v) | Verdict::Failure(v) = verdict {
            ctx.metrics
                .analysis_value
                .get_or_create(&crate::metrics::MeasurementLabels {
                    namespace: subject.namespace.to_string(),
                    proxydeployment: subject.name.to_string(),
                    metric: m.name.clone(),
                })
                .set(v);
        }
        tracing::info!(metric = %m.name, ?verdict, "canary measurement");
        out.push((m.name.clone(), verdict));
    }
    // Prometheus queries look back one window from now; a direct scrape from its base snapshot.
    let window_start = match &windows {
        Ok(Some((_, _, start))) => *start,
        _ if !builtin => taken_at - window_secs,
        _ => taken_at,
    };
    Measurement {
        window_start,
        verdicts: out,
    }
}

/// Built-in windows from Prometheus for two selectors: (canary, stable).
pub async fn prometheus_pair(
    ctx: &Context,
    address: &str,
    selectors: [&str; 2],
    window_secs: i64,
) -> Result<(Window, Window), source::MeasureError> {
    let mut out = Vec::new();
    for selector in selectors {
        let [requests, errors, p99] = source::builtin_queries(selector, window_secs);
        let requests = source::prometheus_scalar(&ctx.http, address, &requests)
            .await?
            .unwrap_or(0.0);
        let errors = source::prometheus_scalar(&ctx.http, address, &errors)
            .await?
            .unwrap_or(0.0);
        let p99 = source::prometheus_scalar(&ctx.http, address, &p99).await?;
        out.push(Window {
            requests,
            errors_5xx: errors,
            buckets: Vec::new(),
            p99_ms: p99,
        });
    }
    let stable = out.pop().unwrap_or_default();
    let canary = out.pop().unwrap_or_default();
    Ok((canary, stable))
}

async fn prometheus_windows(
    ctx: &Context,
    address: &str,
    owner: &Owner,
    revisions: &Revisions<'_>,
    window_secs: i64,
) -> Result<(Window, Window), source::MeasureError> {
    let (canary, stable) = (revisions.selector(owner, "canary"), revisions.selector(owner, "stable"));
    prometheus_pair(ctx, address, [&canary, &stable], window_secs).await
}

/// When the pod started (unix seconds), from its status.
pub fn started_at(pod: &Pod) -> Option<i64> {
    Some(pod.status.as_ref()?.start_time.as_ref()?.0.as_second())
}

/// One proxy pod's /metrics.
async fn scrape<'a>(ctx: &Context, pod: &'a Pod, ip: &str) -> (&'a Pod, Result<String, source::HttpError>) {
    (pod, ctx.http.get(&format!("http://{ip}:{ADMIN_PORT}/metrics")).await)
}

/// Scrapes every proxy pod's /metrics and returns the windows since about `window_secs` ago.
async fn direct_windows(
    ctx: &Context,
    owner: &Owner,
    window_secs: i64,
) -> Result<Option<(Window, Window, i64)>, source::MeasureError> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let list = pods
        .list(&ListParams::default().labels(&format!("{}={}", labels::INSTANCE, owner.name)))
        .await
        .map_err(|source| source::MeasureError::ListPods {
            namespace: owner.namespace.clone(),
            fleet: owner.name.clone(),
            source,
        })?;
    let mut snap = Snapshot {
        at: now(),
        canary: HashMap::new(),
        stable: HashMap::new(),
    };
    let mut scraped = 0;
    let mut scrapes = Vec::new();
    for pod in list
        .items
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
    {
        if let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()) {
            scrapes.push(scrape(ctx, pod, ip));
        }
    }
    let answers: Vec<_> = futures::stream::iter(scrapes)
        .buffered(source::PODS_AT_ONCE)
        .collect()
        .await;
    for (pod, text) in answers {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let track = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::TRACK))
            .cloned()
            .unwrap_or_default();
        match text {
            Ok(text) => {
                scraped += 1;
                let counters = source::PodCounters {
                    started_at: started_at(pod),
                    ..parse_proxy_metrics(&text)
                };
                if track == "canary" {
                    snap.canary.insert(name, counters);
                } else {
                    snap.stable.insert(name, counters);
                }
            }
            Err(e) if track == "canary" && pod_ready(pod) => {
                return Err(source::MeasureError::CanaryPodNotScraped {
                    namespace: owner.namespace.clone(),
                    pod: name,
                    problem: e.to_string(),
                })
            }
            Err(e) => tracing::debug!(pod = %name, error = %e, "scrape failed"),
        }
    }
    if scraped == 0 {
        return Err(source::MeasureError::NoPodScraped {
            namespace: owner.namespace.clone(),
            fleet: owner.name.clone(),
        });
    }
    Ok(ctx
        .snapshots
        .push(&format!("{}/{}", owner.namespace, owner.name), snap, window_secs))
}

pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The command annotation, if any.
pub const COMMAND_ANNOTATION: &str = "proxyfleet.io/command";
/// Annotation a hub's wave rollout sets beside a `retry` command: the retry records it in the
/// canary's status (`CanaryStatus::retry_token`) when it restarts the rollout.
pub const RETRY_TOKEN: &str = "proxyfleet.io/retry-token";
/// Annotation beside the token: when the hub asked (RFC 3339), to tell a retry the member
/// dropped from one it is taking now.
pub const RETRY_ASKED_AT: &str = "proxyfleet.io/retry-asked-at";

/// The object's retry token, as the canary machine observes it.
pub fn retry_token(meta: &kube::api::ObjectMeta) -> Option<String> {
    meta.annotations.as_ref()?.get(RETRY_TOKEN).cloned()
}

pub fn command_of(pxd: &ProxyDeployment) -> Option<Command> {
    Command::parse(pxd.metadata.annotations.as_ref()?.get(COMMAND_ANNOTATION)?)
}
