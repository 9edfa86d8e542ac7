//! Pure: the app gray releases that travel with a fleet. Every AppRollout of the hub whose
//! route names the fleet goes to the fleet's members together with its workload Deployment
//! (scaled to zero: the member's operator runs the tracks), so each member runs the app's
//! canary on its own proxies and traffic. With waves, the fleet and its apps are one revision:
//! a member is done only when its fleet is Ready and every app's canary there completed, and
//! an app canary that aborts in a member aborts the whole rollout.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::placement::{DELETION_POLICY, FIELD_MANAGER, HUB_OBJECT, HUB_REVISION, HUB_UID};
use super::spec::ClusterAppStatus;
use super::waves::Progress;
use crate::app::objects::template_revision;
use crate::app::spec::AppRollout;
use crate::canary::spec::CanaryPhase;
use crate::labels;

/// Annotation on an app's copies: the name of the hub AppRollout they come from.
pub const HUB_APP: &str = "proxyfleet.io/hub-app";

/// One app as every member gets it: the AppRollout and its workload Deployment.
#[derive(Clone, Debug, PartialEq)]
pub struct AppCopy {
    pub name: String,
    /// The workload Deployment's name (`spec.workloadRef.name`).
    pub workload: String,
    /// Hash of what the member gets (the rollout's spec and the Deployment's); both copies
    /// carry it as `proxyfleet.io/hub-revision`.
    pub revision: String,
    pub rollout: Value,
    pub deployment: Value,
}

/// An app's copies as found in a member.
#[derive(Clone, Debug)]
pub struct SeenApp {
    pub rollout: AppRollout,
    pub deployment: Option<Deployment>,
}

fn short_hash(v: &impl serde::Serialize, bytes: usize) -> String {
    Sha256::digest(serde_json::to_vec(v).unwrap_or_default())
        .iter()
        .take(bytes)
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn metadata(namespace: &str, fleet: &str, hub_uid: &str, name: &str, app: &str, revision: &str, policy: &str) -> Value {
    let labels = BTreeMap::from([
        (labels::MANAGED_BY.to_string(), FIELD_MANAGER.to_string()),
        (HUB_UID.to_string(), hub_uid.to_string()),
    ]);
    json!({
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "annotations": {
            HUB_OBJECT: format!("{namespace}/{fleet}"),
            HUB_APP: app,
            HUB_REVISION: revision,
            DELETION_POLICY: policy,
        },
    })
}

/// The copies of one hub app (its AppRollout and the Deployment it names). The Deployment
/// keeps the team's selector and pod template, at `replicas: 0`.
pub fn copy(
    (namespace, fleet, hub_uid, policy): (&str, &str, &str, &str),
    rollout: &AppRollout,
    workload: &Deployment,
) -> Option<AppCopy> {
    let name = rollout.metadata.name.clone()?;
    let spec = workload.spec.as_ref()?;
    let deployment_spec = json!({"replicas": 0, "selector": spec.selector, "template": spec.template});
    let revision = short_hash(&(&name, &rollout.spec, &deployment_spec), 5);
    let workload_name = rollout.spec.workload_ref.name.clone();
    let mut deployment_meta = metadata(namespace, fleet, hub_uid, &workload_name, &name, &revision, policy);
    if let Some(team_labels) = &workload.metadata.labels {
        for (k, v) in team_labels {
            deployment_meta["labels"]
                .as_object_mut()
                .map(|l| l.entry(k.clone()).or_insert_with(|| Value::String(v.clone())));
        }
    }
    Some(AppCopy {
        rollout: json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "AppRollout",
            "metadata": metadata(namespace, fleet, hub_uid, &name, &name, &revision, policy),
            "spec": rollout.spec,
        }),
        deployment: json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": deployment_meta,
            "spec": deployment_spec,
        }),
        name,
        workload: workload_name,
        revision,
    })
}

/// The revision of a fleet together with its apps: the fleet's own revision when it has none
/// (so a fleet without apps keeps the revision it always had).
pub fn bundle_revision<'a>(fleet_revision: &str, apps: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut apps: Vec<(&str, &str)> = apps.into_iter().collect();
    if apps.is_empty() {
        return fleet_revision.to_string();
    }
    apps.sort();
    short_hash(&(fleet_revision, apps), 4)
}

fn annotation<'a>(meta: &'a kube::api::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The bundle revision a member carries: its fleet copy's and every app copy's. `None` when
/// the fleet copy carries none.
pub fn member_revision(fleet_revision: Option<String>, seen: &[SeenApp]) -> Option<String> {
    let fleet = fleet_revision?;
    let apps = seen.iter().map(|s| {
        (
            s.rollout.metadata.name.as_deref().unwrap_or_default(),
            annotation(&s.rollout.metadata, HUB_REVISION).unwrap_or_default(),
        )
    });
    Some(bundle_revision(&fleet, apps))
}

/// The template the member's copy of the workload runs, as the member's operator hashes it.
fn member_template(seen: &SeenApp) -> Option<String> {
    let spec = seen.deployment.as_ref()?.spec.as_ref()?;
    Some(template_revision(&spec.template))
}

/// What a member's operator reports about one app on the revision its copies carry.
pub fn progress(seen: &SeenApp) -> Progress {
    let name = seen.rollout.metadata.name.as_deref().unwrap_or_default();
    let Some(status) = &seen.rollout.status else {
        return Progress::Running;
    };
    let Some(template) = member_template(seen) else {
        return Progress::Running;
    };
    if status.observed_generation.unwrap_or(0) < seen.rollout.metadata.generation.unwrap_or(0) {
        return Progress::Running;
    }
    let canary = status.canary.as_ref();
    if let Some(c) = canary.filter(|c| c.phase == CanaryPhase::Aborted) {
        if c.canary_revision.as_deref() == Some(template.as_str()) {
            let why = super::status::abort_words(c);
            return Progress::Failed(format!("app {name}: its canary aborted: {why}"));
        }
    }
    if canary.is_some_and(|c| c.phase.in_rollout()) {
        return Progress::Running;
    }
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == crate::conditions::READY && c.status == "True");
    if ready && status.stable_revision.as_deref() == Some(template.as_str()) {
        Progress::Done
    } else {
        Progress::Running
    }
}

/// A member's fleet progress together with its apps': failed if any failed, done if all are.
pub fn combined(fleet: Progress, apps: impl IntoIterator<Item = Progress>) -> Progress {
    let mut out = fleet;
    for p in apps {
        out = match (out, p) {
            (Progress::Failed(f), _) => Progress::Failed(f),
            (_, Progress::Failed(f)) => Progress::Failed(f),
            (Progress::Done, Progress::Done) => Progress::Done,
            _ => Progress::Running,
        };
    }
    out
}

/// One app's line in the hub's `status.clusters[].apps`.
pub fn summary(seen: &SeenApp) -> ClusterAppStatus {
    let status = seen.rollout.status.as_ref();
    let canary = status.and_then(|s| s.canary.as_ref());
    let ready = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == crate::conditions::READY));
    ClusterAppStatus {
        name: seen.rollout.metadata.name.clone().unwrap_or_default(),
        revision: annotation(&seen.rollout.metadata, HUB_REVISION).map(str::to_string),
        canary_phase: canary.map(|c| c.phase.as_str().to_string()),
        weight: status.map(|s| i32::from(s.weight)),
        ready: ready.map(|c| c.status == "True"),
        message: ready
            .filter(|c| c.status != "True")
            .map(|c| format!("{}: {}", c.reason, c.message)),
    }
}

/// The spec waves keep as the stable one: the fleet's spec alone when it has no apps (the form
/// statuses always had), else the fleet's spec, the apps' copies, and the names of the apps
/// that were held then (`hub_apps::HubApps::held`: their copies in members were left as they
/// were, so a rollback to this spec leaves them too, never deletes them).
pub fn bundle_spec(fleet_spec: Value, apps: &[AppCopy], held: &[String]) -> Value {
    if apps.is_empty() && held.is_empty() {
        return fleet_spec;
    }
    let apps: Vec<Value> = apps
        .iter()
        .map(|a| json!({"rollout": a.rollout, "deployment": a.deployment}))
        .collect();
    if held.is_empty() {
        return json!({"proxyDeployment": fleet_spec, "apps": apps});
    }
    json!({"proxyDeployment": fleet_spec, "apps": apps, "held": held})
}

/// A kept stable spec taken apart (`bundle_spec`).
#[derive(Debug, PartialEq)]
pub struct KeptBundle {
    pub fleet: Value,
    pub apps: Vec<AppCopy>,
    /// Apps held when it was kept.
    pub held: Vec<String>,
}

/// The fleet's spec, the apps' copies and the held apps of a kept stable spec (either form).
pub fn split_bundle(kept: Value) -> KeptBundle {
    let is_bundle = kept.get("proxyDeployment").is_some() && kept.get("apps").is_some();
    if !is_bundle {
        return KeptBundle {
            fleet: kept,
            apps: Vec::new(),
            held: Vec::new(),
        };
    }
    let apps = kept["apps"]
        .as_array()
        .map(|a| a.iter().filter_map(kept_copy).collect())
        .unwrap_or_default();
    let held = held_of(&kept);
    KeptBundle {
        fleet: kept["proxyDeployment"].clone(),
        apps,
        held,
    }
}

/// The apps held when a kept stable spec completed (none in the fleet-only form).
pub fn held_of(kept: &Value) -> Vec<String> {
    if kept.get("proxyDeployment").is_none() {
        return Vec::new();
    }
    kept.get("held")
        .and_then(Value::as_array)
        .map(|h| h.iter().filter_map(|n| n.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

fn kept_copy(v: &Value) -> Option<AppCopy> {
    let rollout = v.get("rollout")?.clone();
    let deployment = v.get("deployment")?.clone();
    Some(AppCopy {
        name: rollout.pointer("/metadata/name")?.as_str()?.to_string(),
        workload: deployment.pointer("/metadata/name")?.as_str()?.to_string(),
        revision: rollout
            .pointer(&format!("/metadata/annotations/{}", HUB_REVISION.replace('/', "~1")))?
            .as_str()?
            .to_string(),
        rollout,
        deployment,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::app::spec::AppRolloutStatus;
    use crate::canary::spec::CanaryStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    pub(crate) fn hub_app(image: &str) -> (AppRollout, Deployment) {
        let rollout: AppRollout = serde_json::from_value(json!({
            "apiVersion": "proxyfleet.io/v1alpha1", "kind": "AppRollout",
            "metadata": {"name": "shop", "namespace": "team-a", "uid": "app-uid"},
            "spec": {"workloadRef": {"name": "shop"}, "port": 8080, "route": {"proxyDeployment": "edge", "name": "shop"},
                     "strategy": {"steps": [{"setWeight": 50}]}},
        }))
        .expect("rollout");
        let deployment: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "shop", "namespace": "team-a", "labels": {"app": "shop"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "shop"}},
                     "template": {"metadata": {"labels": {"app": "shop"}},
                                  "spec": {"containers": [{"name": "shop", "image": image}]}}},
        }))
        .expect("deployment");
        (rollout, deployment)
    }

    const WHO: (&str, &str, &str, &str) = ("team-a", "edge", "hub-uid", "Delete");

    /// The member's copies as its API server returns them, with the status its operator wrote.
    fn seen(copy: &AppCopy, status: Option<AppRolloutStatus>) -> SeenApp {
        let mut rollout: AppRollout = serde_json::from_value(copy.rollout.clone()).expect("rollout copy");
        rollout.metadata.generation = Some(1);
        rollout.status = status;
        SeenApp {
            rollout,
            deployment: Some(serde_json::from_value(copy.deployment.clone()).expect("deployment copy")),
        }
    }

    fn status(seen_app: &SeenApp, phase: CanaryPhase, stable: bool, canary: bool) -> AppRolloutStatus {
        let template = member_template(seen_app).expect("template");
        AppRolloutStatus {
            observed_generation: Some(1),
            stable_revision: Some(if stable { template.clone() } else { "old".into() }),
            canary: Some(CanaryStatus {
                phase,
                canary_revision: canary.then(|| template.clone()),
                abort_reason: Some("p99 412ms > 250ms".into()),
                ..Default::default()
            }),
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: "Stable".into(),
                message: String::new(),
                observed_generation: Some(1),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn copies_keep_the_template_at_zero_replicas_and_carry_the_hub_marks() {
        let (r, d) = hub_app("shop:v1");
        let c = copy(WHO, &r, &d).expect("copy");
        assert_eq!(c.deployment["spec"]["replicas"], 0);
        assert_eq!(c.deployment["metadata"]["labels"][HUB_UID], "hub-uid");
        assert_eq!(c.deployment["metadata"]["labels"]["app"], "shop");
        assert_eq!(c.rollout["metadata"]["annotations"][HUB_OBJECT], "team-a/edge");
        assert_eq!(c.rollout["metadata"]["annotations"][HUB_REVISION], c.revision.as_str());
        assert_eq!(c.workload, "shop");
        let v2 = copy(WHO, &r, &hub_app("shop:v2").1).expect("copy");
        assert_ne!(v2.revision, c.revision, "a new template is a new revision");
    }

    #[test]
    fn a_fleet_without_apps_keeps_its_own_revision_and_stable_spec_form() {
        assert_eq!(bundle_revision("abcd", []), "abcd");
        assert_ne!(bundle_revision("abcd", [("shop", "r1")]), "abcd");
        assert_eq!(
            bundle_revision("abcd", [("a", "1"), ("b", "2")]),
            bundle_revision("abcd", [("b", "2"), ("a", "1")])
        );
        let spec = json!({"replicas": 2});
        let kept = |apps: Vec<AppCopy>, held: Vec<String>| KeptBundle {
            fleet: spec.clone(),
            apps,
            held,
        };
        assert_eq!(bundle_spec(spec.clone(), &[], &[]), spec);
        assert_eq!(split_bundle(spec.clone()), kept(Vec::new(), Vec::new()));
        let (r, d) = hub_app("shop:v1");
        let c = copy(WHO, &r, &d).expect("copy");
        assert_eq!(
            split_bundle(bundle_spec(spec.clone(), std::slice::from_ref(&c), &[])),
            kept(vec![c.clone()], Vec::new())
        );
        let held = vec!["cart".to_string()];
        assert_eq!(
            split_bundle(bundle_spec(spec.clone(), std::slice::from_ref(&c), &held)),
            kept(vec![c], held.clone()),
            "the apps held when it was kept are kept with it"
        );
        assert_eq!(
            split_bundle(bundle_spec(spec.clone(), &[], &held)),
            kept(Vec::new(), held),
            "a fleet whose only app is held"
        );
    }

    #[test]
    fn a_member_carries_the_bundle_revision_only_with_every_app_copy() {
        let (r, d) = hub_app("shop:v1");
        let c = copy(WHO, &r, &d).expect("copy");
        let desired = bundle_revision("f1", [(c.name.as_str(), c.revision.as_str())]);
        assert_eq!(
            member_revision(Some("f1".into()), &[seen(&c, None)]),
            Some(desired.clone())
        );
        assert_ne!(
            member_revision(Some("f1".into()), &[]),
            Some(desired.clone()),
            "app copy missing"
        );
        let old = copy(WHO, &r, &hub_app("shop:v0").1).expect("copy");
        assert_ne!(member_revision(Some("f1".into()), &[seen(&old, None)]), Some(desired));
        assert_eq!(member_revision(None, &[seen(&c, None)]), None);
    }

    #[test]
    fn an_app_is_done_only_when_its_member_promoted_this_template_and_failed_when_it_aborted_it() {
        let (r, d) = hub_app("shop:v1");
        let c = copy(WHO, &r, &d).expect("copy");
        let fresh = seen(&c, None);
        assert_eq!(
            progress(&fresh),
            Progress::Running,
            "the member's operator has not reported"
        );
        let with = |phase, stable, canary| {
            let mut s = seen(&c, None);
            s.rollout.status = Some(status(&s, phase, stable, canary));
            s
        };
        assert_eq!(progress(&with(CanaryPhase::Completed, true, true)), Progress::Done);
        assert_eq!(
            progress(&with(CanaryPhase::Idle, true, false)),
            Progress::Done,
            "first release"
        );
        assert_eq!(
            progress(&with(CanaryPhase::Completed, false, false)),
            Progress::Running,
            "still the previous template's status"
        );
        assert_eq!(progress(&with(CanaryPhase::Analyzing, false, true)), Progress::Running);
        let Progress::Failed(why) = progress(&with(CanaryPhase::Aborted, false, true)) else {
            panic!("an abort of this template is a failure")
        };
        assert!(why.contains("app shop") && why.contains("p99 412ms"), "{why}");
        assert_eq!(
            progress(&with(CanaryPhase::Aborted, false, false)),
            Progress::Running,
            "an abort of an older template is not this revision's"
        );
        let mut lagging = with(CanaryPhase::Completed, true, true);
        lagging.rollout.metadata.generation = Some(2);
        assert_eq!(progress(&lagging), Progress::Running, "spec not observed yet");
    }

    #[test]
    fn the_fleet_and_its_apps_are_done_together_and_fail_together() {
        use Progress::*;
        assert_eq!(combined(Done, []), Done);
        assert_eq!(combined(Done, [Done, Done]), Done);
        assert_eq!(combined(Done, [Done, Running]), Running);
        assert_eq!(combined(Running, [Failed("x".into())]), Failed("x".into()));
        assert_eq!(combined(Failed("f".into()), [Failed("x".into())]), Failed("f".into()));
    }
}
