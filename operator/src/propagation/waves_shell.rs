//! The I/O around the wave machine (`waves::decide`): read every selected member's copy, let
//! the machine say what each one is sent, send it, and report transitions as events. Members
//! outside the current wave are read, never written.

use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};

use super::apps::{self, AppCopy, SeenApp};
use super::clusters::MemberCluster;
use super::member::MemberError;
use super::placement::{self, MemberObject, Selection};
use super::spec::{ClusterStatus, Placement, WavePhase, WaveStatus};
use super::status::{self, Observation};
use super::sync::{self, Desired, Found};
use super::wave_retry;
use super::waves::{self, Command, Member, Observed, Progress, Retry, Send};
use crate::context::Context;
use crate::crd::{ProxyDeployment, ProxyDeploymentSpec};
use crate::resources::Owner;

/// Annotation on the hub object: a manual command for the wave rollout
/// (`kubectl proxyfleet promote|abort|pause|resume` on a fleet with waves).
pub const WAVE_COMMAND: &str = "proxyfleet.io/wave-command";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// What a pass over the waves did.
pub struct Rolled<'a> {
    /// Per selected cluster: what was seen or done, and its wave.
    pub observations: Vec<(&'a str, Observation, u32)>,
    pub status: WaveStatus,
    /// When to look again at the latest.
    pub due: Duration,
}

type Seen = Result<(Client, Found), MemberError>;

/// What every member of one pass is judged against.
struct Judged<'a> {
    /// Apps held now (`hub_apps`): left out, as they are of the bundle.
    held: &'a [String],
    hub_uid: &'a str,
    /// The revision rolled out.
    revision: &'a str,
    /// The last completed revision, and the apps held when it completed.
    stable: Option<(&'a str, Vec<String>)>,
    /// The time of the pass (seconds).
    now: i64,
}

/// A member as the machine judges it: its fleet and the fleet's apps are one revision, done
/// together (see `apps`).
fn member_view(
    c: &MemberCluster,
    seen: &Seen,
    wave: usize,
    previous: Option<&ClusterStatus>,
    j: &Judged<'_>,
) -> Member {
    let mut retry = Retry::default();
    let (reachable, revision, progress) = match seen {
        // A copy this hub does not own (an orphaned one, another hub's) says nothing of ours.
        Ok((_, Found { copy: Some(copy), .. })) if !ours(copy, j.hub_uid) => (true, None, Progress::Running),
        Ok((_, Found { copy: Some(copy), apps })) => {
            let judged = judged_apps(apps, j.held);
            retry = wave_retry::observe(copy, &judged, j.revision, j.now);
            (
                true,
                member_revision(copy, (apps, &judged), j),
                apps::combined(status::progress(copy), judged.iter().map(apps::progress)),
            )
        }
        Ok((_, Found { copy: None, .. })) => (true, None, Progress::Running),
        // Not readable now: what it last carried, never done.
        Err(_) => (false, previous.and_then(|p| p.revision.clone()), Progress::Running),
    };
    Member {
        name: c.name.clone(),
        wave,
        reachable,
        revision,
        progress,
        retry,
    }
}

/// The bundle revision the member carries. One not on the revision rolled out may be on the
/// last completed one, which left out the apps held when it completed (a rollback to it leaves
/// their copies as they are) and judged those held now: it is recognised as that spec saw it.
fn member_revision(copy: &ProxyDeployment, (all, judged): (&[SeenApp], &[SeenApp]), j: &Judged<'_>) -> Option<String> {
    let fleet = status::member_revision(copy);
    let carried = apps::member_revision(fleet.clone(), judged);
    match &j.stable {
        Some((stable, held_then)) if carried.as_deref() != Some(j.revision) => {
            let without = judged_apps(all, held_then);
            let as_stable = apps::member_revision(fleet, &without);
            if as_stable.as_deref() == Some(*stable) {
                as_stable
            } else {
                carried
            }
        }
        _ => carried,
    }
}

/// The member's app copies the rollout judges: all but the held ones.
fn judged_apps(apps: &[SeenApp], held: &[String]) -> Vec<SeenApp> {
    apps.iter()
        .filter(|a| {
            let name = a.rollout.metadata.name.as_deref().unwrap_or_default();
            !held.iter().any(|h| h == name)
        })
        .cloned()
        .collect()
}

fn ours(copy: &ProxyDeployment, hub_uid: &str) -> bool {
    let labels = copy.metadata.labels.as_ref();
    labels
        .and_then(|l| l.get(super::placement::HUB_UID))
        .map(String::as_str)
        == Some(hub_uid)
}

fn observed(
    pxd: &ProxyDeployment,
    placement: &Placement,
    (targets, seen): (&[&MemberCluster], &[Seen]),
    hub_apps: &super::hub_apps::HubApps,
) -> Observed {
    let desired_apps = hub_apps.copies.as_slice();
    let hub_uid = pxd.metadata.uid.as_deref().unwrap_or_default();
    let (waves, index) = placement::assign_waves(placement, targets);
    let previous = |name: &str| {
        pxd.status
            .as_ref()
            .and_then(|s| s.clusters.iter().find(|c| c.name == name))
    };
    let revision = apps::bundle_revision(
        &placement::spec_revision(&pxd.spec),
        desired_apps.iter().map(|a| (a.name.as_str(), a.revision.as_str())),
    );
    let waves_status = pxd.status.as_ref().and_then(|s| s.waves.as_ref());
    let stable = waves_status.and_then(|w| {
        let held_then = apps::held_of(w.stable_spec.as_ref()?);
        Some((w.stable_revision.as_deref()?, held_then))
    });
    let now = chrono::Utc::now().timestamp();
    let judged = Judged {
        held: &hub_apps.held,
        hub_uid,
        revision: &revision,
        stable,
        now,
    };
    let members = targets
        .iter()
        .zip(seen)
        .zip(&index)
        .map(|((c, s), w)| member_view(c, s, *w, previous(&c.name), &judged))
        .collect();
    Observed {
        revision,
        spec: apps::bundle_spec(
            placement::spec_without_placement(&pxd.spec),
            desired_apps,
            &hub_apps.held,
        ),
        waves,
        members,
        soak_secs: placement
            .soak_time
            .as_ref()
            .map(|d| d.get().as_secs() as i64)
            .unwrap_or(0),
        timeout_secs: placement
            .wave_timeout
            .as_ref()
            .map(|d| d.get())
            .unwrap_or(DEFAULT_TIMEOUT)
            .as_secs() as i64,
        on_failure: placement.on_failure,
        command: pxd.annotations().get(WAVE_COMMAND).and_then(|c| Command::parse(c)),
        now,
    }
}

/// What a rollback sends a member: the fleet's object and the app copies of the last completed
/// spec, and the apps whose copies stay as they are (held now, or held when it completed).
struct Stable {
    object: MemberObject,
    apps: Vec<AppCopy>,
    held: Vec<String>,
}

/// The member object and app copies of the last completed spec for `cluster` (the placement
/// of today), allowed by today's policy as any spec sent to a member is; else why not.
fn stable_object(to: &Target<'_>, cluster: &MemberCluster) -> Result<Stable, String> {
    let unbuildable = "not rolled back: the last completed spec cannot be rebuilt for this cluster (it no longer \
                       parses, or an override of this cluster fails); held as it is";
    let kept = apps::split_bundle(to.stable.stable_spec.clone().ok_or(unbuildable)?);
    let mut spec: ProxyDeploymentSpec = serde_json::from_value(kept.fleet).map_err(|_| unbuildable)?;
    spec.placement = Some(to.placement.clone());
    let owner = to.owner;
    let object = placement::member_object(&owner.namespace, &owner.name, &owner.reference.uid, &spec, cluster)
        .map_err(|_| unbuildable)?;
    let object = super::reconcile::allowed_for(object, cluster, owner, to.ctx)
        .map_err(|e| format!("not rolled back: {}; held as it is", e.problem))?;
    let mut held = kept.held;
    let now: Vec<String> = to.hub_apps.held.iter().filter(|h| !held.contains(h)).cloned().collect();
    held.extend(now);
    Ok(Stable {
        object,
        apps: kept.apps,
        held,
    })
}

/// One pass over the waves of `placement`.
pub async fn roll<'a>(
    pxd: &ProxyDeployment,
    owner: &Owner,
    ctx: &Context,
    placement: &Placement,
    selection: &'a Selection<'a>,
    (objects, hub_apps): (&[MemberObject], &super::hub_apps::HubApps),
    ca: Option<&Secret>,
) -> Rolled<'a> {
    let targets = &selection.targets;
    let clients = &ctx.propagation.clients;
    let previous = pxd.status.as_ref().map(|s| s.clusters.as_slice()).unwrap_or_default();
    let seen: Vec<Seen> = join_all(targets.iter().map(|c| {
        let had_apps = super::status::had_apps(previous, &c.name);
        sync::observe_one(clients, (c, had_apps), owner)
    }))
    .await;
    let o = observed(pxd, placement, (targets, &seen), hub_apps);
    let (plan, saved) = decide(pxd, owner, ctx, &o).await;
    let (status, send, why) = match saved {
        Saved::Yes => {
            let why = plan.status.message.clone();
            (
                plan.status,
                plan.send,
                why.unwrap_or_else(|| "waiting for its wave".into()),
            )
        }
        Saved::No(previous) => (*previous, vec![Send::Nothing; plan.send.len()], NOT_SAVED.into()),
    };
    let to = Target {
        ctx,
        owner,
        ca,
        hub_apps,
        stable: &status,
        placement,
    };
    let sends = seen
        .into_iter()
        .zip(&send)
        .zip(targets.iter().zip(objects))
        .map(|((s, send), (c, desired))| send_one(&to, s, *send, c, desired, &why));
    let results = join_all(sends).await;
    let observations = targets
        .iter()
        .zip(results)
        .zip(&o.members)
        .map(|((c, r), m)| (c.name.as_str(), r, m.wave as u32))
        .collect();
    let due = match (&plan.transition, plan.due_in) {
        (Some(_), _) => Duration::from_secs(1),
        (None, Some(s)) => Duration::from_secs(s.max(1) as u64),
        (None, None) => ctx.propagation.resync,
    };
    Rolled {
        observations,
        status,
        due: due.min(ctx.propagation.resync),
    }
}

/// What every member of one pass is sent from.
struct Target<'a> {
    ctx: &'a Context,
    owner: &'a Owner,
    ca: Option<&'a Secret>,
    hub_apps: &'a super::hub_apps::HubApps,
    /// The wave status, with the last completed spec a rollback sends.
    stable: &'a WaveStatus,
    placement: &'a Placement,
}

/// Brings one member to what the plan sends it: the revision, the last completed spec back, or
/// nothing (held, with `why`).
async fn send_one(
    to: &Target<'_>,
    seen: Seen,
    send: Send,
    c: &MemberCluster,
    desired: &MemberObject,
    why: &str,
) -> Observation {
    let (client, found) = match seen {
        Ok(x) => x,
        Err(e) => return Observation::Failed(e),
    };
    let held = &to.hub_apps.held;
    let stable = (send == Send::Stable).then(|| stable_object(to, c));
    // Stale retries first: one pending would keep the current one from being asked (the ask
    // then waits for the next pass, from a fresh read).
    if let Err(e) = withdraw_retries(to, send, &client, &found).await {
        return Observation::Failed(e);
    }
    if send == Send::Retry {
        if let Err(e) = ask_retry(to, &client, c, &found).await {
            return Observation::Failed(e);
        }
    }
    let why = match (send, stable) {
        (Send::Revision | Send::Retry, _) => {
            let current = Desired {
                fleet: desired,
                apps: &to.hub_apps.copies,
                held,
            };
            return sync::bring(&client, found, c, to.owner, current, to.ca).await;
        }
        (Send::Stable, Some(Ok(stable))) => {
            let back = Desired {
                fleet: &stable.object,
                apps: &stable.apps,
                held: &stable.held,
            };
            return sync::bring(&client, found, c, to.owner, back, to.ca).await;
        }
        // Said, not left at "waiting for its wave": the rollback did not happen.
        (Send::Stable, Some(Err(not_back))) => not_back,
        _ => why.to_string(),
    };
    Observation::Held {
        member: found.copy.map(Box::new),
        desired_hash: desired.hash.clone(),
        why,
        apps: found.apps.iter().map(apps::summary).collect(),
    }
}

/// Asks the member's aborted canaries (its fleet's, its judged apps') to retry, for the
/// status' revision and retry serial.
async fn ask_retry(to: &Target<'_>, client: &Client, c: &MemberCluster, found: &Found) -> Result<(), MemberError> {
    let Some(copy) = &found.copy else { return Ok(()) };
    let judged = judged_apps(&found.apps, &to.hub_apps.held);
    let token = wave_retry::token(&to.stable.revision, to.stable.retry_serial);
    match wave_retry::ask(client, copy, &judged, &token, chrono::Utc::now().timestamp()).await? {
        Ok(()) => {}
        Err(not_now) => tracing::info!(cluster = %c.name, ?not_now, "canary retry not asked this pass"),
    }
    Ok(())
}

/// Takes back the hub's retries still pending in a member the plan sends anything: all of them
/// once the rollout aborted, else all but the current one. (A member sent nothing has none the
/// machine would take back.) No request when none is pending.
async fn withdraw_retries(to: &Target<'_>, send: Send, client: &Client, found: &Found) -> Result<(), MemberError> {
    let Some(copy) = found.copy.as_ref().filter(|_| send != Send::Nothing) else {
        return Ok(());
    };
    let current = wave_retry::token(&to.stable.revision, to.stable.retry_serial);
    let keep = (to.stable.phase != WavePhase::Aborted).then_some(current.as_str());
    let judged = judged_apps(&found.apps, &to.hub_apps.held);
    wave_retry::withdraw(client, copy, &judged, keep).await
}

async fn announce(ctx: &Context, owner: &Owner, plan: &waves::Plan) {
    let Some(t) = &plan.transition else { return };
    tracing::info!(fleet = %owner.name, reason = t.reason, message = %t.message, "wave rollout");
    if t.reason == "WaveRolloutAborted" {
        ctx.warn(owner, t.reason, &t.message).await;
    } else {
        ctx.record(owner, t.reason, &t.message).await;
    }
}

const NOT_SAVED: &str = "the wave status could not be saved; nothing is sent to a member before it is";

/// Whether a plan's status was saved before anything is sent from it; if not, the status the
/// pass keeps (the one it started from).
enum Saved {
    Yes,
    No(Box<WaveStatus>),
}

/// The machine's plan for what was observed, saved first when it moves the rollout (a
/// transition, a command taken): members are written only from a saved status, so a lost
/// write can never leave them rolled back (or sent on) with the status saying otherwise, nor an
/// abort or a command forgotten. Sends are a function of the status and what is observed, so
/// the next pass sends the same. A command's annotation goes once its effect is saved; if that
/// fails, the next pass reads it again, which changes nothing (every command is idempotent on
/// the status it produced). The transition is announced once saved.
async fn decide(pxd: &ProxyDeployment, owner: &Owner, ctx: &Context, o: &Observed) -> (waves::Plan, Saved) {
    let previous = pxd.status.as_ref().and_then(|s| s.waves.as_ref());
    let plan = waves::decide(previous, o);
    if waves::must_save_first(&plan, o) && !save_ahead(pxd, owner, ctx, &plan.status).await {
        let kept = previous.cloned().unwrap_or_else(|| plan.status.clone());
        return (plan, Saved::No(Box::new(kept)));
    }
    if o.command.is_some() {
        clear_command(pxd, owner, ctx).await;
    }
    announce(ctx, owner, &plan).await;
    (plan, Saved::Yes)
}

/// Saves `waves` beside the rest of this controller's part of the status, as it is.
async fn save_ahead(pxd: &ProxyDeployment, owner: &Owner, ctx: &Context, waves: &WaveStatus) -> bool {
    let status = pxd.status.clone().unwrap_or_default();
    let propagated: Vec<_> = status
        .conditions
        .into_iter()
        .filter(|c| c.type_ == crate::conditions::PROPAGATED)
        .collect();
    let patch = serde_json::json!({"clusters": status.clusters, "conditions": propagated, "waves": waves});
    let writer = ctx.status_writer(&owner.namespace, status::STATUS_MANAGER);
    match writer.apply(&owner.name, &patch).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(fleet = %owner.name, error = %e, "could not save the wave status; sending nothing");
            false
        }
    }
}

/// Removes the wave command once its effect is saved.
async fn clear_command(pxd: &ProxyDeployment, owner: &Owner, ctx: &Context) {
    let api: Api<ProxyDeployment> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    match crate::command_annotation::clear(&api, pxd, WAVE_COMMAND, &ctx.latest_fleets).await {
        Ok(()) => ctx.metrics.api_write("ProxyDeployment", "patch"),
        Err(e) => {
            tracing::warn!(fleet = %owner.name, error = %e, "could not clear the wave command; the next pass reads it again")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(hub_uid: Option<&str>) -> ProxyDeployment {
        let spec = serde_json::from_value(serde_json::json!({
            "replicas": 1, "listeners": [], "routes": [], "upstreams": [],
        }))
        .expect("spec");
        let mut pxd = ProxyDeployment::new("edge", spec);
        pxd.metadata.labels = hub_uid.map(|u| [(placement::HUB_UID.to_string(), u.to_string())].into());
        pxd.metadata.annotations = Some([(placement::HUB_REVISION.to_string(), "r1".to_string())].into());
        pxd
    }

    /// An orphaned copy (or another hub's) still carrying a revision annotation is not this
    /// hub's rollout on that cluster: never done, never on the revision.
    #[tokio::test]
    async fn a_copy_this_hub_does_not_own_is_on_no_revision() {
        let (mock, _handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let client = Client::new(mock, "default");
        let cluster = MemberCluster {
            name: "member-1".into(),
            labels: Default::default(),
            secret: "ns/member-1".into(),
            secret_version: "1".into(),
            kubeconfig: Err("unused".into()),
            allowed_namespaces: vec!["*".into()],
        };
        let seen = |c| -> Seen {
            Ok((
                client.clone(),
                Found {
                    copy: Some(c),
                    apps: Vec::new(),
                },
            ))
        };
        let judged = Judged {
            held: &[],
            hub_uid: "hub-1",
            revision: "r1",
            stable: None,
            now: 0,
        };
        let theirs = member_view(&cluster, &seen(copy(None)), 0, None, &judged);
        assert_eq!((theirs.revision, theirs.progress), (None, Progress::Running));
        let ours = member_view(&cluster, &seen(copy(Some("hub-1"))), 0, None, &judged);
        assert_eq!(
            ours.revision.as_deref(),
            Some(apps::member_revision(Some("r1".into()), &[]).unwrap().as_str())
        );
    }
}
