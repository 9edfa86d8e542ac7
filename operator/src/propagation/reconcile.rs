//! The hub side of propagation, run inside the ProxyDeployment reconcile when `spec.placement`
//! is set (or was: the finalizer remembers). Safety rules, in order of importance:
//! - a failure to list clusters or to reach a member never deletes anything anywhere;
//! - only objects labelled with this hub object's uid are ever deleted or orphaned;
//! - a bad override applies nothing to any cluster;
//! - deletion waits for members' clean-up at most `cleanup_timeout`, then lets go and says so.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use futures::FutureExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;

use super::clusters::{self, MemberCluster};
use super::member::{self, MemberError, Released};
use super::placement::{self, MemberObject, HUB_CA, HUB_OBJECT};
use super::spec::ClusterStatus;
use super::status::{self, Observation};
use crate::certs;
use crate::conditions::Want;
use crate::context::Context;
use crate::crd::ProxyDeployment;
use crate::labels;
use crate::resources::Owner;

/// Finalizer on hub objects that were propagated: members are cleaned up before they go.
pub const FINALIZER: &str = "proxyfleet.io/propagation";

pub use super::state::Propagation;

/// What propagation adds to the hub object's status.
pub struct Outcome {
    /// `None`: the fleet is not propagated; the `Propagated` condition is removed.
    pub condition: Option<Want>,
    pub clusters: Vec<ClusterStatus>,
    pub requeue: Option<Duration>,
    /// The wave rollout as this pass decided it; `None` keeps what the status shows while the
    /// placement has waves (a pass that could not judge them changes nothing there).
    pub waves: Option<super::spec::WaveStatus>,
    /// The pass could not do its work (an API error, caches not loaded, members left to clean
    /// up): retried on the fleet's backoff instead of `requeue`.
    pub retry: bool,
}

impl Outcome {
    fn none() -> Self {
        Self {
            condition: None,
            clusters: Vec::new(),
            requeue: None,
            waves: None,
            retry: false,
        }
    }
}

/// Why propagation could not look at or write the hub side.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("the cluster Secrets are not loaded yet")]
    ClustersNotLoaded,
    #[error("updating the finalizers of ProxyDeployment {namespace}/{name}: {source}")]
    Finalizers {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("the CA members share: {0}")]
    Ca(#[from] certs::ca::CaError),
}

fn has_finalizer(pxd: &ProxyDeployment) -> bool {
    pxd.finalizers().iter().any(|f| f == FINALIZER)
}

/// Every registered member cluster, or an error when any cluster list is not loaded yet.
pub(super) fn registered(p: &Propagation) -> Result<Vec<MemberCluster>, HubError> {
    let mut out = Vec::new();
    for store in &p.cluster_secrets {
        if store.wait_until_ready().now_or_never().is_none() {
            return Err(HubError::ClustersNotLoaded);
        }
        out.extend(store.state().iter().filter_map(|s| clusters::from_secret(s)));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

async fn set_finalizers(pxd: &ProxyDeployment, ctx: &Context, finalizers: Vec<String>) -> Result<(), HubError> {
    let api: Api<ProxyDeployment> = Api::namespaced(ctx.client.clone(), &pxd.namespace().unwrap_or_default());
    // The resourceVersion makes this a compare-and-swap: a concurrent change fails it, we retry.
    let patch = serde_json::json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": pxd.resource_version(),
    }});
    let written = api
        .patch(&pxd.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| HubError::Finalizers {
            namespace: pxd.namespace().unwrap_or_default(),
            name: pxd.name_any(),
            source,
        })?;
    ctx.metrics.api_write("ProxyDeployment", "patch");
    // The next pass compares-and-swaps from this version, not the cache's older one.
    ctx.latest_fleets.record(written);
    Ok(())
}

/// The CA Secret members get when the fleet uses the managed issuer: the hub's namespace CA,
/// so a client trusts one root whichever cluster answers (see docs/multicluster.md).
async fn shared_ca(pxd: &ProxyDeployment, namespace: &str, ctx: &Context) -> Result<Option<Secret>, HubError> {
    if !certs::reconcile::uses_managed_ca(&pxd.spec) {
        return Ok(None);
    }
    // certs::reconcile::ensure ran earlier in this reconcile: read, do not step the rotation again.
    let m = certs::ca::current(namespace, ctx).await?;
    let data = [
        ("ca.crt", m.ca.cert_pem),
        ("ca.key", m.ca.key_pem),
        ("bundle.crt", m.bundle),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v.into_bytes())))
    .collect::<BTreeMap<_, _>>();
    Ok(Some(Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(certs::reconcile::CA_SECRET.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
                (crate::certs::ca::CA_LABEL.to_string(), "true".to_string()),
            ])),
            annotations: Some(BTreeMap::from([
                (HUB_OBJECT.to_string(), format!("{namespace}/*")),
                (HUB_CA.to_string(), m.secret_uid.clone()),
            ])),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    }))
}

/// Releases the fleet from `clusters` (delete or orphan, per the policy recorded on each copy).
/// Returns the clusters where that could not be done, with why.
/// `previous`: the fleet's last cluster statuses (which of them showed app copies).
async fn release_from(
    p: &Propagation,
    clusters: &[&MemberCluster],
    (owner, previous): (&Owner, &[ClusterStatus]),
    ctx: &Context,
) -> Vec<(String, MemberError)> {
    let results = join_all(clusters.iter().map(|c| async move {
        let had_apps = status::had_apps(previous, &c.name);
        let r = match p.clients.client(c).await {
            Ok(client) => release_one(&client, owner, had_apps).await,
            Err(e) => Err(e),
        };
        (c.name.clone(), r)
    }))
    .await;
    let mut failed = Vec::new();
    for (name, r) in results {
        match r {
            Ok(Released::NothingThere) => {}
            Ok(Released::Deleted) => {
                ctx.record(
                    owner,
                    "MemberDeleted",
                    &format!("deleted the fleet's copy in cluster {name}"),
                )
                .await
            }
            Ok(Released::Orphaned) => {
                ctx.record(
                    owner,
                    "MemberOrphaned",
                    &format!("left the fleet's copy in cluster {name} (Orphan)"),
                )
                .await
            }
            Err(e) => failed.push((name, e)),
        }
    }
    failed
}

/// Releases the fleet's apps from one member, then the fleet itself.
async fn release_one(client: &kube::Client, owner: &Owner, had_apps: bool) -> Result<Released, MemberError> {
    super::member_apps::release(client, &owner.namespace, &owner.reference.uid, had_apps).await?;
    member::release(client, &owner.namespace, &owner.name, &owner.reference.uid).await
}

/// Nothing propagated while the platform policy refuses the spec; members keep what they have.
pub fn held(pxd: &ProxyDeployment, message: &str) -> Outcome {
    if pxd.spec.placement.is_none() && !has_finalizer(pxd) {
        return Outcome::none();
    }
    let previous: Vec<ClusterStatus> = pxd.status.as_ref().map(|s| s.clusters.clone()).unwrap_or_default();
    settled(
        &previous,
        Want::new(crate::conditions::PROPAGATED, false, "PolicyViolation", message),
    )
}

fn not_propagated(reason: &str, message: String) -> Want {
    Want::new(crate::conditions::PROPAGATED, false, reason, message)
}

/// Propagates a live (not deleted) hub object.
pub async fn propagate(pxd: &ProxyDeployment, owner: &Owner, ctx: &Context) -> Outcome {
    let p = &ctx.propagation;
    let previous: Vec<ClusterStatus> = pxd.status.as_ref().map(|s| s.clusters.clone()).unwrap_or_default();
    let keep_previous = |condition: Want| keep(&previous, condition);
    let registered = match registered(p) {
        Ok(r) => r,
        Err(m) => return keep_previous(not_propagated("ClusterListUnavailable", m.to_string())),
    };
    p.clients.retain(&registered);

    let Some(placement) = &pxd.spec.placement else {
        return release_everywhere(pxd, owner, ctx, &registered, &previous).await;
    };

    if let Err(e) = ensure_finalizer(pxd, ctx).await {
        // Without the finalizer a deletion could leave members behind: do not propagate yet.
        return keep_previous(not_propagated("FinalizerNotSet", e.to_string()));
    }

    let selection = match placement::select(placement, &owner.namespace, &registered) {
        Ok(s) => s,
        Err(m) => return settled(&previous, status::condition(&[], Some(&m.to_string()))),
    };
    let prev = |name: &str| previous.iter().find(|c| c.name == name);
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);

    let objects = member_objects(pxd, owner, ctx, &selection.targets);
    let apps = match super::hub_apps::desired(pxd, owner, ctx).await {
        Ok(a) => a,
        Err(e) => return keep_previous(not_propagated("AppsUnreadable", e.to_string())),
    };
    let ca = match &objects {
        Ok(_) => shared_ca(pxd, &owner.namespace, ctx).await,
        Err(_) => Ok(None),
    };
    let (mut waves, mut requeue) = (None, p.resync);
    let mut entries: Vec<ClusterStatus> = match (&objects, &ca) {
        (Err(invalid), _) => {
            let message = invalid.to_string();
            return not_applied(ctx, owner, &selection.targets, &previous, &message, true, &now).await;
        }
        (_, Err(e)) => {
            let message = e.to_string();
            return not_applied(ctx, owner, &selection.targets, &previous, &message, false, &now).await;
        }
        (Ok(objects), Ok(ca)) if !placement.waves.is_empty() => {
            let desired = (objects.as_slice(), &apps);
            let (entries, status, due) = rolled_entries(pxd, owner, ctx, &selection, desired, ca.as_ref(), &now).await;
            (waves, requeue) = (Some(status), due);
            entries
        }
        (Ok(objects), Ok(ca)) => sync_selected(p, (owner, &previous), &selection, (objects, &apps), ca.as_ref())
            .await
            .into_iter()
            .map(|(n, o)| status::cluster_status(n, &o, prev(n), &now))
            .collect(),
    };
    // A cluster that left the placement and still holds a copy stays listed until released.
    for (name, e) in release_leaving(ctx, owner, &registered, &selection.targets, &previous).await {
        entries.push(status::cluster_status(
            &name,
            &Observation::Failed(e),
            prev(&name),
            &now,
        ));
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    announce(ctx, owner, &entries, &previous).await;

    Outcome {
        condition: Some(status::condition(&entries, None)),
        clusters: entries,
        requeue: Some(requeue),
        waves,
        retry: false,
    }
}

/// The status entries of a pass over the waves (`waves_shell::roll`), the waves' status and
/// when to look again.
async fn rolled_entries(
    pxd: &ProxyDeployment,
    owner: &Owner,
    ctx: &Context,
    selection: &placement::Selection<'_>,
    desired: (&[MemberObject], &super::hub_apps::HubApps),
    ca: Option<&Secret>,
    now: &str,
) -> (Vec<ClusterStatus>, super::spec::WaveStatus, Duration) {
    let placement = pxd.spec.placement.clone().unwrap_or_default();
    let previous: Vec<ClusterStatus> = pxd.status.as_ref().map(|s| s.clusters.clone()).unwrap_or_default();
    let prev = |name: &str| previous.iter().find(|c| c.name == name);
    let rolled = super::waves_shell::roll(pxd, owner, ctx, &placement, selection, desired, ca).await;
    let mut entries: Vec<ClusterStatus> = rolled
        .observations
        .into_iter()
        .map(|(n, o, wave)| ClusterStatus {
            wave: Some(wave),
            ..status::cluster_status(n, &o, prev(n), now)
        })
        .collect();
    let unselectable = unselectable(owner, selection);
    entries.extend(
        unselectable
            .iter()
            .map(|(n, o)| status::cluster_status(n, o, prev(n), now)),
    );
    (entries, rolled.status, rolled.due)
}

/// Every selected cluster brought to its object (concurrently), plus what is known of the
/// names that could not be selected. `previous`: the fleet's last cluster statuses.
async fn sync_selected<'a>(
    p: &Propagation,
    (owner, previous): (&Owner, &[ClusterStatus]),
    selection: &'a placement::Selection<'a>,
    (objects, apps): (&[MemberObject], &super::hub_apps::HubApps),
    ca: Option<&Secret>,
) -> Vec<(&'a str, Observation)> {
    let synced = join_all(selection.targets.iter().zip(objects).map(|(c, fleet)| {
        let desired = super::sync::Desired {
            fleet,
            apps: &apps.copies,
            held: &apps.held,
        };
        let had_apps = status::had_apps(previous, &c.name);
        super::sync::sync_one(&p.clients, (c, had_apps), owner, desired, ca)
    }))
    .await;
    let named = selection.targets.iter().map(|c| c.name.as_str()).zip(synced);
    named.chain(unselectable(owner, selection)).collect()
}

/// What is known of the names the placement lists that could not be selected.
fn unselectable<'a>(owner: &Owner, selection: &'a placement::Selection<'a>) -> Vec<(&'a str, Observation)> {
    let unknown = selection
        .unknown
        .iter()
        .map(|n| (n.as_str(), Observation::NotRegistered));
    let denied = selection
        .denied
        .iter()
        .map(|n| (n.as_str(), Observation::NotAdmitted(owner.namespace.clone())));
    unknown.chain(denied).collect()
}

async fn ensure_finalizer(pxd: &ProxyDeployment, ctx: &Context) -> Result<(), HubError> {
    if has_finalizer(pxd) {
        return Ok(());
    }
    let mut f = pxd.finalizers().to_vec();
    f.push(FINALIZER.into());
    set_finalizers(pxd, ctx, f).await
}

/// The previous cluster entries with a condition only a change of the spec (or the platform's
/// policy) can resolve: nothing to retry.
fn settled(previous: &[ClusterStatus], condition: Want) -> Outcome {
    Outcome {
        retry: false,
        ..keep(previous, condition)
    }
}

/// The previous cluster entries with a new condition; retried on the backoff.
fn keep(previous: &[ClusterStatus], condition: Want) -> Outcome {
    Outcome {
        condition: Some(condition),
        clusters: previous.to_vec(),
        requeue: None,
        waves: None,
        retry: true,
    }
}

/// Placement removed: release the fleet everywhere, then drop the finalizer.
async fn release_everywhere(
    pxd: &ProxyDeployment,
    owner: &Owner,
    ctx: &Context,
    registered: &[MemberCluster],
    previous: &[ClusterStatus],
) -> Outcome {
    if !has_finalizer(pxd) {
        return Outcome::none();
    }
    let all: Vec<&MemberCluster> = registered.iter().collect();
    let failed = release_from(&ctx.propagation, &all, (owner, previous), ctx).await;
    if failed.is_empty() {
        let rest: Vec<String> = pxd.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
        if let Err(e) = set_finalizers(pxd, ctx, rest).await {
            tracing::warn!(error = %e, "could not remove the propagation finalizer");
        }
        return Outcome::none();
    }
    let message = failed
        .iter()
        .map(|(n, e)| format!("{n}: {e}"))
        .collect::<Vec<_>>()
        .join("; ");
    keep(
        previous,
        Want::new(
            crate::conditions::PROPAGATED,
            false,
            "CleanupPending",
            format!("placement removed; clean-up pending in {message}"),
        ),
    )
}

/// Nothing written anywhere: an override is invalid (`invalid_override`) or the shared CA is
/// unavailable.
/// Every cluster's object first; one bad override, or one whose result the platform's policy
/// refuses, and nothing is written anywhere.
fn member_objects(
    pxd: &ProxyDeployment,
    owner: &Owner,
    ctx: &Context,
    targets: &[&MemberCluster],
) -> Result<Vec<MemberObject>, placement::OverrideError> {
    targets
        .iter()
        .map(|c| {
            let object = placement::member_object(&owner.namespace, &owner.name, &owner.reference.uid, &pxd.spec, c)?;
            allowed_for(object, c, owner, ctx)
        })
        .collect()
}

/// The member's spec (overrides applied) checked against the hub's policies as the fleet's own
/// spec is: an override may not give a cluster what the fleet could not ask for itself. The
/// namespace it goes to, when created there, gets the hub namespace's Pod Security labels: the
/// team's apps travel with the fleet, and must not run with more rights there than here.
pub(super) fn allowed_for(
    mut object: MemberObject,
    cluster: &MemberCluster,
    owner: &Owner,
    ctx: &Context,
) -> Result<MemberObject, placement::OverrideError> {
    let refused = crate::policy::refusal(
        &ctx.stores.policies,
        &ctx.stores.namespaces,
        &owner.namespace,
        &object.spec,
        &ctx.settings.default_proxy_image,
    );
    match refused {
        None => {
            object.namespace_labels = hub_namespace_labels(ctx, &owner.namespace);
            Ok(object)
        }
        Some((_, message)) => Err(placement::OverrideError {
            index: None,
            cluster: cluster.name.clone(),
            problem: format!("the spec they make is not allowed: {message}"),
        }),
    }
}

/// The hub namespace's labels (its platform team's, not the tenant's), for a member namespace we
/// create: its Pod Security level, and what the member's ProxyFleetPolicies, NetworkPolicies
/// and admission rules select namespaces by. Kubernetes' own name label is the member's.
fn hub_namespace_labels(ctx: &Context, namespace: &str) -> std::collections::BTreeMap<String, String> {
    let ns = ctx
        .stores
        .namespaces
        .get(&kube::runtime::reflector::ObjectRef::new(namespace));
    inherited(ns.and_then(|n| n.metadata.labels.clone()).unwrap_or_default())
}

fn inherited(labels: std::collections::BTreeMap<String, String>) -> std::collections::BTreeMap<String, String> {
    labels
        .into_iter()
        .filter(|(k, _)| k != "kubernetes.io/metadata.name" && k != crate::labels::MANAGED_BY)
        .collect()
}

async fn not_applied(
    ctx: &Context,
    owner: &Owner,
    targets: &[&MemberCluster],
    previous: &[ClusterStatus],
    message: &str,
    invalid_override: bool,
    now: &str,
) -> Outcome {
    let prev = |name: &str| previous.iter().find(|c| c.name == name);
    let entries: Vec<ClusterStatus> = targets
        .iter()
        .map(|c| {
            status::cluster_status(
                &c.name,
                &Observation::NotApplied(message.to_string()),
                prev(&c.name),
                now,
            )
        })
        .collect();
    let condition = match invalid_override {
        true => {
            ctx.warn(owner, "InvalidOverride", message).await;
            status::condition(&entries, Some(message))
        }
        false => Want::new(
            crate::conditions::PROPAGATED,
            false,
            "CAUnavailable",
            message.to_string(),
        ),
    };
    Outcome {
        condition: Some(condition),
        clusters: entries,
        requeue: Some(ctx.propagation.resync),
        waves: None,
        retry: false,
    }
}

/// One event per cluster that became applied or unreachable.
async fn announce(ctx: &Context, owner: &Owner, entries: &[ClusterStatus], previous: &[ClusterStatus]) {
    for e in entries {
        let was = previous.iter().find(|c| c.name == e.name);
        if e.applied && was.is_none_or(|w| !w.applied) {
            ctx.record(owner, "Propagated", &format!("applied to cluster {}", e.name))
                .await;
        } else if !e.reachable && was.is_none_or(|w| w.reachable) {
            ctx.warn(
                owner,
                "ClusterUnreachable",
                &format!("cluster {}: {}", e.name, e.message.as_deref().unwrap_or("")),
            )
            .await;
        }
    }
}

/// Clusters that left the placement (label change, name removed) and that the last status
/// lists (they hold a copy, or did): release there. Returns those where that failed, to stay
/// in the status with why; they are tried again next pass. Clusters never placed on are not
/// asked at all.
async fn release_leaving(
    ctx: &Context,
    owner: &Owner,
    registered: &[MemberCluster],
    targets: &[&MemberCluster],
    previous: &[ClusterStatus],
) -> Vec<(String, MemberError)> {
    let leaving: Vec<&MemberCluster> = registered
        .iter()
        .filter(|c| !targets.iter().any(|t| t.name == c.name))
        .filter(|c| previous.iter().any(|p| p.name == c.name))
        .collect();
    let failed = release_from(&ctx.propagation, &leaving, (owner, previous), ctx).await;
    failed
        .into_iter()
        .map(|(name, e)| {
            tracing::warn!(cluster = %name, error = %e, "could not release a cluster that left the placement");
            let left = |m: String| format!("left the placement; its copy is not released yet: {m}");
            let e = match e {
                MemberError::Unreachable(m) => MemberError::Unreachable(left(m)),
                MemberError::Refused(m) => MemberError::Refused(left(m)),
                MemberError::BadCredentials(m) => MemberError::BadCredentials(left(m)),
            };
            (name, e)
        })
        .collect()
}

/// Clean-up of a deleted hub object. Returns when to look again, or `None` once the finalizer
/// is gone.
pub async fn finalize(pxd: &ProxyDeployment, owner: &Owner, ctx: &Context) -> Option<Duration> {
    if !has_finalizer(pxd) {
        return None;
    }
    let p = &ctx.propagation;
    let deleted_for = pxd
        .metadata
        .deletion_timestamp
        .as_ref()
        .map(|t| {
            let secs = k8s_openapi::jiff::Timestamp::now().as_second() - t.0.as_second();
            Duration::from_secs(secs.max(0) as u64)
        })
        .unwrap_or_default();
    let timed_out = deleted_for >= p.cleanup_timeout;
    let failed = match registered(p) {
        Ok(registered) => {
            let all: Vec<&MemberCluster> = registered.iter().collect();
            let previous = pxd.status.as_ref().map(|s| s.clusters.as_slice()).unwrap_or_default();
            release_from(p, &all, (owner, previous), ctx)
                .await
                .into_iter()
                .map(|(n, e)| format!("{n}: {e}"))
                .collect()
        }
        Err(m) => vec![m.to_string()],
    };
    if !failed.is_empty() && !timed_out {
        tracing::info!(pending = %failed.join("; "), "waiting for member clean-up");
        return Some(Duration::from_secs(5));
    }
    if !failed.is_empty() {
        ctx.warn(
            owner,
            "CleanupTimedOut",
            &format!(
                "gave up after {:?}; the fleet's copies may remain in: {}",
                p.cleanup_timeout,
                failed.join("; ")
            ),
        )
        .await;
    }
    let rest: Vec<String> = pxd.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
    match set_finalizers(pxd, ctx, rest).await {
        Ok(()) => None,
        Err(e) => {
            tracing::warn!(error = %e, "could not remove the propagation finalizer");
            Some(Duration::from_secs(5))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{registered, HubError, Propagation};
    use k8s_openapi::api::core::v1::Secret;
    use kube::runtime::watcher::Event;

    /// A cluster list that has not finished its first list is an error, never "no clusters":
    /// "no clusters" would release the fleet everywhere.
    #[test]
    fn cluster_secrets_not_loaded_are_an_error_not_an_empty_list() {
        let (ours, mut ours_writer) = kube::runtime::reflector::store::<Secret>();
        let (argocd, mut argocd_writer) = kube::runtime::reflector::store::<Secret>();
        let p = Propagation {
            cluster_secrets: vec![ours, argocd],
            clients: Default::default(),
            resync: std::time::Duration::from_secs(15),
            cleanup_timeout: std::time::Duration::from_secs(60),
        };
        assert!(matches!(registered(&p), Err(HubError::ClustersNotLoaded)));
        ours_writer.apply_watcher_event(&Event::Init);
        ours_writer.apply_watcher_event(&Event::InitDone);
        assert!(
            matches!(registered(&p), Err(HubError::ClustersNotLoaded)),
            "one of two loaded"
        );
        argocd_writer.apply_watcher_event(&Event::Init);
        argocd_writer.apply_watcher_event(&Event::InitDone);
        assert!(registered(&p).expect("both loaded").is_empty());
    }

    /// A member namespace we create carries what the hub namespace's platform team labelled it
    /// with (Pod Security, the labels policies select by), not Kubernetes' name or our mark.
    #[test]
    fn a_member_namespace_inherits_the_hub_namespaces_labels() {
        let hub = std::collections::BTreeMap::from(
            [
                ("kubernetes.io/metadata.name", "team-a"),
                ("pod-security.kubernetes.io/enforce", "restricted"),
                ("tenant", "true"),
                (crate::labels::MANAGED_BY, "someone"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        let got: Vec<_> = super::inherited(hub).into_keys().collect();
        assert_eq!(got, ["pod-security.kubernetes.io/enforce", "tenant"]);
    }
}
