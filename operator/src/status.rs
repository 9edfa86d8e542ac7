//! The status a reconcile reports: a pure function of what it saw.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::conditions::{self, Want, DEGRADED, PROGRESSING, READY};
use crate::crd::{Phase, ProxyDeployment, ProxyDeploymentStatus};
use crate::labels::{self, Track};

/// Whether a Deployment has rolled out `replicas` pods of its current template, all ready.
pub fn rolled_out(d: &Deployment, replicas: i32) -> bool {
    let Some(s) = &d.status else { return replicas == 0 };
    let observed = s.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0);
    observed
        && s.updated_replicas.unwrap_or(0) >= replicas
        && s.ready_replicas.unwrap_or(0) >= replicas
        && s.replicas.unwrap_or(0) == replicas
}

/// What went wrong, if anything, in this reconcile.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    pub reason: String,
    pub message: String,
}

pub struct Observed<'a> {
    pub stable: Option<&'a Deployment>,
    pub canary: Option<&'a Deployment>,
    pub revision: Option<String>,
    pub image: Option<String>,
    pub problem: Option<Problem>,
    pub extra_conditions: Vec<Want>,
}

pub fn compute(pxd: &ProxyDeployment, observed: &Observed<'_>, now: &Time) -> ProxyDeploymentStatus {
    let old = pxd.status.clone().unwrap_or_default();
    let spec_replicas = pxd.spec.replicas;
    let deployments = [observed.stable, observed.canary];
    let count = |f: fn(&k8s_openapi::api::apps::v1::DeploymentStatus) -> Option<i32>| -> i32 {
        deployments
            .iter()
            .flatten()
            .filter_map(|d| d.status.as_ref().and_then(f))
            .sum()
    };
    let replicas = count(|s| s.replicas);
    let ready = count(|s| s.ready_replicas);
    let updated = count(|s| s.updated_replicas);
    let stable_done = observed
        .stable
        .is_some_and(|d| rolled_out(d, d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)));
    let canary_running = observed
        .canary
        .is_some_and(|d| d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0) > 0);
    let complete = stable_done && !canary_running && ready >= spec_replicas;

    let counts = Counts {
        spec: spec_replicas,
        ready,
        updated,
        complete,
        canary_running,
    };
    let (phase, mut wanted) = phase_and_conditions(observed, &counts);
    wanted.extend(observed.extra_conditions.iter().cloned());

    ProxyDeploymentStatus {
        observed_generation: pxd.metadata.generation,
        phase: Some(phase),
        replicas,
        ready_replicas: ready,
        updated_replicas: updated,
        selector: pxd
            .metadata
            .name
            .as_deref()
            .map(|n| labels::selector_string(&labels::fleet_selector(n))),
        revision: observed.revision.clone().or(old.revision.clone()),
        image: observed.image.clone().or(old.image.clone()),
        conditions: conditions::merge(&old.conditions, &wanted, pxd.metadata.generation, now),
        ..old
    }
}

/// Replica counts over the fleet's Deployments.
struct Counts {
    spec: i32,
    ready: i32,
    updated: i32,
    /// Stable rolled out, no canary running, enough ready.
    complete: bool,
    canary_running: bool,
}

/// The phase and the Ready/Progressing/Degraded conditions for what was observed.
fn phase_and_conditions(observed: &Observed<'_>, c: &Counts) -> (Phase, Vec<Want>) {
    let mut wanted = Vec::new();
    let phase = if let Some(p) = &observed.problem {
        wanted.push(Want::new(DEGRADED, true, p.reason.clone(), p.message.clone()));
        wanted.push(Want::new(PROGRESSING, false, p.reason.clone(), p.message.clone()));
        wanted.push(Want::new(
            READY,
            c.complete,
            if c.complete { "Ready" } else { p.reason.as_str() },
            format!("{}/{} ready", c.ready, c.spec),
        ));
        Phase::Degraded
    } else if observed.stable.is_none() {
        wanted.push(Want::new(DEGRADED, false, "AsExpected", ""));
        wanted.push(Want::new(
            PROGRESSING,
            true,
            "Creating",
            "creating the proxy Deployment",
        ));
        wanted.push(Want::new(READY, false, "Creating", format!("0/{} ready", c.spec)));
        Phase::Pending
    } else if c.complete {
        wanted.push(Want::new(DEGRADED, false, "AsExpected", ""));
        wanted.push(Want::new(
            PROGRESSING,
            false,
            "RolloutComplete",
            "all pods run the current revision",
        ));
        wanted.push(Want::new(READY, true, "Ready", format!("{}/{} ready", c.ready, c.spec)));
        Phase::Ready
    } else {
        let why = if c.canary_running {
            "CanaryInProgress"
        } else {
            "RollingUpdate"
        };
        wanted.push(Want::new(DEGRADED, false, "AsExpected", ""));
        wanted.push(Want::new(
            PROGRESSING,
            true,
            why,
            format!("{}/{} updated, {} ready", c.updated, c.spec, c.ready),
        ));
        wanted.push(Want::new(READY, false, why, format!("{}/{} ready", c.ready, c.spec)));
        Phase::Progressing
    };
    (phase, wanted)
}

/// The revision label on a Deployment's pod template.
pub fn revision_of(d: &Deployment) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .labels
        .as_ref()?
        .get(labels::REVISION)
        .cloned()
}

pub fn track_of(d: &Deployment) -> Option<Track> {
    match d.metadata.labels.as_ref()?.get(labels::TRACK)?.as_str() {
        "stable" => Some(Track::Stable),
        "canary" => Some(Track::Canary),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::fixtures::basic;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};
    use k8s_openapi::jiff::Timestamp;

    fn dep(replicas: i32, ready: i32, updated: i32) -> Deployment {
        Deployment {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                generation: Some(2),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                replicas: Some(2),
                ..Default::default()
            }),
            status: Some(DeploymentStatus {
                observed_generation: Some(2),
                replicas: Some(replicas),
                ready_replicas: Some(ready),
                updated_replicas: Some(updated),
                ..Default::default()
            }),
        }
    }

    fn now(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn observed(d: Option<&Deployment>, problem: Option<Problem>) -> Observed<'_> {
        Observed {
            stable: d,
            canary: None,
            revision: Some("r1".into()),
            image: Some("img".into()),
            problem,
            extra_conditions: vec![],
        }
    }

    #[test]
    fn ready_when_rolled_out() {
        let d = dep(2, 2, 2);
        let s = compute(&basic(), &observed(Some(&d), None), &now(1));
        assert_eq!(s.phase, Some(Phase::Ready));
        assert!(conditions::is_true(&s.conditions, READY));
        assert_eq!(s.observed_generation, Some(1));
    }

    #[test]
    fn progressing_while_rolling() {
        let d = dep(3, 2, 1);
        let s = compute(&basic(), &observed(Some(&d), None), &now(1));
        assert_eq!(s.phase, Some(Phase::Progressing));
        assert!(conditions::is_true(&s.conditions, PROGRESSING));
    }

    #[test]
    fn degraded_with_reason() {
        let d = dep(2, 2, 2);
        let p = Problem {
            reason: "InvalidSpec".into(),
            message: "spec.routes[0].upstream: unknown".into(),
        };
        let s = compute(&basic(), &observed(Some(&d), Some(p)), &now(1));
        assert_eq!(s.phase, Some(Phase::Degraded));
        let c = s.conditions.iter().find(|c| c.type_ == DEGRADED).unwrap();
        assert_eq!(c.reason, "InvalidSpec");
    }

    #[test]
    fn recomputing_an_unchanged_world_changes_nothing() {
        let d = dep(2, 2, 2);
        let mut pxd = basic();
        pxd.status = Some(compute(&pxd, &observed(Some(&d), None), &now(1)));
        let again = compute(&pxd, &observed(Some(&d), None), &now(999));
        assert_eq!(Some(again), pxd.status);
    }
}
