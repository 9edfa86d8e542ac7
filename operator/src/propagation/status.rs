//! Pure: what the hub says about each member and about propagation as a whole.
//! `lastSyncTime` moves only when an entry changes, so a quiet resync writes no status.

use super::member::MemberError;
use super::spec::{ClusterAppStatus, ClusterStatus};
use crate::conditions::{Want, PROPAGATED};
use crate::crd::ProxyDeployment;

/// Field manager of the hub's propagation status (not of writes to members).
pub const STATUS_MANAGER: &str = "proxyfleet-propagation-status";

/// What one reconcile learned about one selected cluster.
#[derive(Debug)]
pub enum Observation {
    /// Named in `placement.clusters`, but no cluster Secret has that name.
    NotRegistered,
    /// Named in `placement.clusters`, but its Secret does not admit the fleet's namespace.
    NotAdmitted(String),
    /// The member answered; `member` is its copy after our apply (or as found, if unchanged).
    Synced {
        member: Box<ProxyDeployment>,
        desired_hash: String,
        /// The fleet's apps there, as the member reports them.
        apps: Vec<ClusterAppStatus>,
    },
    Failed(MemberError),
    /// Overrides could not be applied; nothing was written anywhere.
    NotApplied(String),
    /// Not sent this pass (its wave has not come): the member as found, and why.
    Held {
        member: Option<Box<ProxyDeployment>>,
        desired_hash: String,
        why: String,
        apps: Vec<ClusterAppStatus>,
    },
}

/// The hub revision a member's copy carries.
pub fn member_revision(member: &ProxyDeployment) -> Option<String> {
    member
        .metadata
        .annotations
        .as_ref()?
        .get(super::placement::HUB_REVISION)
        .cloned()
}

/// What a member's own operator reports about the revision its copy carries (waves read it).
pub fn progress(member: &ProxyDeployment) -> super::waves::Progress {
    use super::waves::Progress;
    use crate::canary::spec::CanaryPhase;
    let Some(status) = &member.status else {
        return Progress::Running;
    };
    if status.observed_generation.unwrap_or(0) < member.metadata.generation.unwrap_or(0) {
        return Progress::Running;
    }
    if let Some(c) = status.canary.as_ref().filter(|c| c.phase == CanaryPhase::Aborted) {
        return Progress::Failed(format!("its canary aborted: {}", abort_words(c)));
    }
    let condition = |t: &str| status.conditions.iter().find(|c| c.type_ == t && c.status == "True");
    // A member that refuses or cannot run the spec (a missing Secret, pods that never become
    // ready) failed it, even while its old pods still serve, and even mid-canary (a blocked
    // pass keeps the canary's status as it stood).
    if let Some(d) = condition(crate::conditions::DEGRADED) {
        return Progress::Failed(format!("its fleet is degraded: {}: {}", d.reason, d.message));
    }
    let in_canary = status.canary.as_ref().is_some_and(|c| {
        matches!(
            c.phase,
            CanaryPhase::Progressing | CanaryPhase::Paused | CanaryPhase::Analyzing | CanaryPhase::Promoting
        )
    });
    if in_canary {
        return Progress::Running;
    }
    if condition(crate::conditions::READY).is_some() {
        Progress::Done
    } else {
        Progress::Running
    }
}

/// Why a canary aborted, in its own words: its reason and its message.
pub fn abort_words(c: &crate::canary::spec::CanaryStatus) -> String {
    match (&c.abort_reason, &c.message) {
        (Some(r), Some(m)) if !m.is_empty() && m != r => format!("{r}: {m}"),
        (Some(r), _) => r.clone(),
        (None, Some(m)) => m.clone(),
        (None, None) => "no reason given".into(),
    }
}

/// The member's own canary as it reports it: (phase, step, weight).
fn canary_of(member: &ProxyDeployment) -> (Option<String>, Option<i32>, Option<i32>) {
    match member.status.as_ref().and_then(|s| s.canary.as_ref()) {
        Some(c) => (
            Some(c.phase.as_str().to_string()),
            Some(c.current_step_index),
            Some(c.weight),
        ),
        None => (None, None, None),
    }
}

fn member_summary(member: &ProxyDeployment) -> (Option<i64>, Option<String>, Option<bool>, Option<String>) {
    let Some(status) = &member.status else {
        return (
            None,
            None,
            None,
            Some("the member's operator has not reported yet".into()),
        );
    };
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == crate::conditions::READY)
        .map(|c| c.status == "True");
    let message = status
        .conditions
        .iter()
        .find(|c| c.type_ == crate::conditions::DEGRADED && c.status == "True")
        .map(|c| format!("{}: {}", c.reason, c.message));
    (
        status.observed_generation,
        status.phase.map(|p| p.as_str().to_string()),
        ready,
        message,
    )
}

pub fn cluster_status(
    name: &str,
    observation: &Observation,
    previous: Option<&ClusterStatus>,
    now: &str,
) -> ClusterStatus {
    let mut entry = ClusterStatus {
        name: name.to_string(),
        ..Default::default()
    };
    match observation {
        Observation::NotRegistered => {
            entry.message = Some(format!("no cluster Secret named {name:?} is registered"));
        }
        Observation::NotAdmitted(namespace) => {
            entry.message = Some(format!(
                "cluster {name} does not admit fleets of namespace {namespace}: the platform team lists \
                 admitted namespaces in the annotation {} of its cluster Secret",
                super::clusters::ALLOWED_NAMESPACES
            ));
        }
        Observation::Synced {
            member,
            desired_hash,
            apps,
        } => {
            synced(&mut entry, member, desired_hash);
            with_apps(&mut entry, apps);
        }
        Observation::Held {
            member,
            desired_hash,
            why,
            apps,
        } => {
            match member {
                Some(m) => synced(&mut entry, m, desired_hash),
                None => entry.reachable = true,
            }
            with_apps(&mut entry, apps);
            if !entry.applied {
                entry.message = Some(why.clone());
            }
        }
        Observation::Failed(e) => {
            entry.reachable = !matches!(e, MemberError::Unreachable(_) | MemberError::BadCredentials(_));
            entry.message = Some(e.to_string());
            // What we knew of the member's state stays: it keeps serving with it.
            if let Some(p) = previous {
                keep_known(&mut entry, p);
            }
        }
        Observation::NotApplied(message) => {
            entry.reachable = previous.is_some_and(|p| p.reachable);
            entry.message = Some(message.clone());
            if let Some(p) = previous {
                keep_known(&mut entry, p);
            }
        }
    }
    entry.last_sync_time = match previous {
        Some(p) if same_but_time(p, &entry) => p.last_sync_time.clone(),
        _ => Some(now.to_string()),
    };
    entry
}

/// Whether the fleet's last status showed app copies in cluster `name`.
pub fn had_apps(previous: &[ClusterStatus], name: &str) -> bool {
    previous.iter().any(|c| c.name == name && !c.apps.is_empty())
}

/// The member's apps, and the revision of its fleet and apps together (as waves judge it).
fn with_apps(entry: &mut ClusterStatus, apps: &[ClusterAppStatus]) {
    entry.apps = apps.to_vec();
    if let (Some(fleet), false) = (&entry.revision, apps.is_empty()) {
        let revisions = apps
            .iter()
            .map(|a| (a.name.as_str(), a.revision.as_deref().unwrap_or_default()));
        entry.revision = Some(super::apps::bundle_revision(fleet, revisions));
    }
}

/// What was last known of a member that could not be read now.
fn keep_known(entry: &mut ClusterStatus, p: &ClusterStatus) {
    entry.observed_generation = p.observed_generation;
    entry.phase = p.phase.clone();
    entry.ready = p.ready;
    entry.revision = p.revision.clone();
    (entry.canary_phase, entry.canary_step, entry.canary_weight) =
        (p.canary_phase.clone(), p.canary_step, p.canary_weight);
    entry.apps = p.apps.clone();
}

/// An entry from the member's copy as it stands.
fn synced(entry: &mut ClusterStatus, member: &ProxyDeployment, desired_hash: &str) {
    entry.reachable = true;
    let applied_hash = member
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(super::placement::PROPAGATED_HASH));
    entry.applied = applied_hash.map(String::as_str) == Some(desired_hash);
    let member_generation = member.metadata.generation;
    let (observed, phase, ready, message) = member_summary(member);
    // The member's status is about the current spec only once it observed its generation.
    entry.observed_generation = observed;
    entry.phase = phase;
    entry.ready = ready;
    entry.message = match (observed, member_generation) {
        (Some(o), Some(g)) if o < g => Some("the member's operator has not caught up with the spec yet".into()),
        _ => message,
    };
    entry.revision = member_revision(member);
    (entry.canary_phase, entry.canary_step, entry.canary_weight) = canary_of(member);
}

fn same_but_time(a: &ClusterStatus, b: &ClusterStatus) -> bool {
    ClusterStatus {
        last_sync_time: None,
        ..a.clone()
    } == ClusterStatus {
        last_sync_time: None,
        ..b.clone()
    }
}

/// The `Propagated` condition over all selected clusters.
pub fn condition(entries: &[ClusterStatus], invalid: Option<&str>) -> Want {
    if let Some(message) = invalid {
        return Want::new(PROPAGATED, false, "InvalidPlacement", message);
    }
    if entries.is_empty() {
        return Want::new(
            PROPAGATED,
            false,
            "NoClustersSelected",
            "the placement selects no registered cluster that admits this namespace",
        );
    }
    let behind: Vec<&ClusterStatus> = entries.iter().filter(|e| !e.applied).collect();
    if behind.is_empty() {
        return Want::new(
            PROPAGATED,
            true,
            "Propagated",
            format!("applied to {} cluster(s)", entries.len()),
        );
    }
    let reason = if behind
        .iter()
        .any(|e| e.message.as_deref().is_some_and(|m| m.contains("no cluster Secret")))
    {
        "ClusterNotFound"
    } else if behind.iter().any(|e| {
        e.message
            .as_deref()
            .is_some_and(|m| m.contains("does not admit fleets"))
    }) {
        "ClusterNotAdmitted"
    } else if behind.iter().any(|e| !e.reachable) {
        "ClusterUnreachable"
    } else {
        "NotApplied"
    };
    let names: Vec<String> = behind
        .iter()
        .map(|e| format!("{} ({})", e.name, e.message.as_deref().unwrap_or("pending")))
        .collect();
    Want::new(
        PROPAGATED,
        false,
        reason,
        format!(
            "{}/{} cluster(s) up to date; behind: {}",
            entries.len() - behind.len(),
            entries.len(),
            names.join("; ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn member(hash: &str, generation: i64, observed: i64) -> ProxyDeployment {
        let mut m: ProxyDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1", "kind": "ProxyDeployment",
            "metadata": {"name": "demo", "namespace": "ns", "generation": generation},
            "spec": {"listeners": [], "routes": [], "upstreams": []},
            "status": {"observedGeneration": observed, "phase": "Ready",
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }))
        .unwrap();
        m.metadata.annotations = Some(BTreeMap::from([(
            super::super::placement::PROPAGATED_HASH.to_string(),
            hash.to_string(),
        )]));
        m
    }

    #[test]
    fn a_degraded_member_failed_the_spec_even_while_ready() {
        use super::super::waves::Progress;
        let mut m = member("h1", 3, 3);
        assert_eq!(progress(&m), Progress::Done);
        let degraded: k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition =
            serde_json::from_value(serde_json::json!({
            "type": "Degraded", "status": "True", "reason": "SecretNotFound",
            "message": "spec.tls.secretName: Secret x not found", "lastTransitionTime": "2026-01-01T00:00:00Z"}))
            .unwrap();
        m.status.as_mut().unwrap().conditions.push(degraded);
        assert!(matches!(progress(&m), Progress::Failed(w) if w.contains("SecretNotFound")));
        // Blocked mid-canary: the canary's status stands as it was, and the member failed.
        m.status.as_mut().unwrap().canary = Some(crate::canary::spec::CanaryStatus {
            phase: crate::canary::spec::CanaryPhase::Progressing,
            ..Default::default()
        });
        assert!(matches!(progress(&m), Progress::Failed(w) if w.contains("SecretNotFound")));
        m.metadata.generation = Some(4);
        assert_eq!(
            progress(&m),
            Progress::Running,
            "not judged before it looked at the spec"
        );
    }

    #[test]
    fn synced_member_reports_its_own_status() {
        let o = Observation::Synced {
            member: Box::new(member("h1", 3, 3)),
            desired_hash: "h1".into(),
            apps: Vec::new(),
        };
        let s = cluster_status("eu-1", &o, None, "t1");
        assert!(s.applied && s.reachable);
        assert_eq!(s.phase.as_deref(), Some("Ready"));
        assert_eq!(s.ready, Some(true));
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(s.last_sync_time.as_deref(), Some("t1"));
        // Nothing changed: the time stays, so the status is not rewritten.
        let again = cluster_status("eu-1", &o, Some(&s), "t2");
        assert_eq!(again, s);
        let lagging = Observation::Synced {
            member: Box::new(member("h1", 4, 3)),
            desired_hash: "h1".into(),
            apps: Vec::new(),
        };
        assert!(cluster_status("eu-1", &lagging, Some(&s), "t3")
            .message
            .unwrap()
            .contains("not caught up"));
    }

    #[test]
    fn an_unreachable_member_keeps_its_last_known_state() {
        let ok = cluster_status(
            "eu-1",
            &Observation::Synced {
                member: Box::new(member("h1", 1, 1)),
                desired_hash: "h1".into(),
                apps: Vec::new(),
            },
            None,
            "t1",
        );
        let down = cluster_status(
            "eu-1",
            &Observation::Failed(MemberError::Unreachable("connection refused".into())),
            Some(&ok),
            "t2",
        );
        assert!(!down.reachable && !down.applied);
        assert_eq!(down.phase.as_deref(), Some("Ready"));
        let c = condition(&[ok.clone(), down], None);
        assert!(!c.status);
        assert_eq!(c.reason, "ClusterUnreachable");
        assert!(c.message.contains("1/2"), "{}", c.message);
        assert!(condition(&[ok], None).status);
    }

    #[test]
    fn unknown_clusters_and_bad_overrides_have_their_reasons() {
        let unknown = cluster_status("ap-9", &Observation::NotRegistered, None, "t");
        assert_eq!(condition(&[unknown], None).reason, "ClusterNotFound");
        assert_eq!(condition(&[], Some("bad patch")).reason, "InvalidPlacement");
        assert_eq!(condition(&[], None).reason, "NoClustersSelected");
    }
}
