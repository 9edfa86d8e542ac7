//! Why a track's pods are not ready, in words a user can act on: the kubelet's waiting or
//! terminated reason and the proxy's own last words (its termination message).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::context::Context;
use crate::crd::ProxyDeployment;
use crate::labels::{self, Track};
use crate::resources::Owner;

/// The fleet's progress deadline in seconds (`spec.progressDeadline`, default 600 s).
pub fn progress_deadline_secs(pxd: &ProxyDeployment) -> i64 {
    pxd.spec
        .progress_deadline
        .map(|d| d.get().as_secs() as i64)
        .unwrap_or(crate::canary::machine::DEFAULT_PROGRESS_DEADLINE)
}

/// The first not-ready pod's problem, e.g. `pod demo-canary-x: CrashLoopBackOff: reading
/// upstream CA /etc/nope/ca.pem: No such file` (None when every pod is ready). Pods of
/// `revision` (the one the rollout waits for) come first, then the newest: an older revision's
/// pod may be stuck for a reason of its own (its ConfigMap already replaced, say).
pub fn describe_pods(pods: &[Pod], revision: Option<&str>) -> Option<String> {
    let current = |p: &Pod| {
        revision.is_some()
            && p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::REVISION))
                .map(String::as_str)
                == revision
    };
    let mut order: Vec<&Pod> = pods.iter().collect();
    order.sort_by(|a, b| {
        current(b)
            .cmp(&current(a))
            .then_with(|| b.metadata.creation_timestamp.cmp(&a.metadata.creation_timestamp))
    });
    order.into_iter().find_map(describe_pod)
}

fn describe_pod(pod: &Pod) -> Option<String> {
    let name = pod.metadata.name.as_deref().unwrap_or("?");
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if ready || pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let scheduled = status.conditions.iter().flatten().find(|c| c.type_ == "PodScheduled");
    if let Some(c) = scheduled.filter(|c| c.status != "True") {
        let why = c.message.as_deref().or(c.reason.as_deref()).unwrap_or("not scheduled");
        return Some(format!("pod {name}: Unschedulable: {why}"));
    }
    let container = status.container_statuses.iter().flatten().find(|c| !c.ready);
    let Some(c) = container else {
        return Some(format!("pod {name}: {}", status.phase.as_deref().unwrap_or("Pending")));
    };
    let mut parts = Vec::new();
    if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
        let reason = w.reason.clone().unwrap_or_else(|| "Waiting".into());
        // CrashLoopBackOff's message only counts the back-off up; the last exit says why.
        if reason != "CrashLoopBackOff" {
            parts.extend(
                w.message
                    .clone()
                    .filter(|m| !m.is_empty())
                    .map(|m| format!("{reason}: {m}")),
            );
        }
        if parts.is_empty() {
            parts.push(reason);
        }
    }
    let terminated = c.state.as_ref().and_then(|s| s.terminated.as_ref());
    if let Some(t) = terminated.or_else(|| c.last_state.as_ref().and_then(|s| s.terminated.as_ref())) {
        let reason = t.reason.clone().unwrap_or_else(|| "Terminated".into());
        parts.push(format!("last exit {} ({reason})", t.exit_code));
        parts.extend(
            t.message
                .as_deref()
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(String::from),
        );
    }
    if parts.is_empty() {
        parts.push("running, not ready (readiness probe failing)".into());
    }
    Some(format!("pod {name}: {}", parts.join(": ")))
}

/// Lists the track's pods and describes the first one that is not ready, those of `revision`
/// first.
pub async fn describe(ctx: &Context, owner: &Owner, track: Track, revision: Option<&str>) -> Option<String> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let selector = labels::selector_string(&labels::track_selector(&owner.name, track));
    match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => describe_pods(&list.items, revision),
        Err(e) => Some(format!("could not list the {} pods: {e}", track.as_str())),
    }
}

/// The Deployment controller gave up waiting for progress (`progressDeadlineSeconds`).
pub fn deadline_exceeded(d: &Deployment) -> bool {
    d.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Progressing" && c.reason.as_deref() == Some("ProgressDeadlineExceeded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn crash_loop_quotes_the_termination_message() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "demo-canary-1"},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
              "containerStatuses": [{"name": "proxy", "ready": false, "restartCount": 3, "image": "x", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                  "message": "reading upstream CA /etc/nope/ca.pem: No such file or directory\n"}}}]}
        }));
        let d = describe_pods(&[p], None).unwrap();
        assert!(d.starts_with("pod demo-canary-1: CrashLoopBackOff"), "{d}");
        assert!(
            d.contains("last exit 1 (Error): reading upstream CA /etc/nope/ca.pem"),
            "{d}"
        );
    }

    #[test]
    fn the_current_revisions_pod_is_the_one_described() {
        // Created in the same second (a fleet patched right after its creation): only the
        // revision tells them apart.
        let status_creating = serde_json::json!({"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "proxy", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
              "state": {"waiting": {"reason": "ContainerCreating"}}}]});
        let status_crashing = serde_json::json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "proxy", "ready": false, "restartCount": 2, "image": "x", "imageID": "",
              "state": {"waiting": {"reason": "CrashLoopBackOff"}},
              "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "reading /etc/nope/ca.pem"}}}]});
        let meta = |name: &str, rev: &str| {
            serde_json::json!({"name": name, "creationTimestamp": "2026-12-02T07:00:00Z",
                "labels": {"proxyfleet.io/revision": rev}})
        };
        let old = pod(serde_json::json!({"metadata": meta("old", "r1"), "status": status_creating}));
        let new = pod(serde_json::json!({"metadata": meta("new", "r2"), "status": status_crashing}));
        let d = describe_pods(&[old.clone(), new.clone()], Some("r2")).unwrap();
        assert!(d.starts_with("pod new: CrashLoopBackOff"), "{d}");
        let d = describe_pods(&[new, old], Some("r1")).unwrap();
        assert!(d.starts_with("pod old: ContainerCreating"), "{d}");
    }

    #[test]
    fn ready_pods_have_no_problem_and_unscheduled_ones_say_why() {
        let ready = pod(serde_json::json!({"metadata": {"name": "a"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}));
        assert_eq!(describe_pods(std::slice::from_ref(&ready), None), None);
        let pending = pod(serde_json::json!({"metadata": {"name": "b"},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
              "reason": "Unschedulable", "message": "0/1 nodes are available: 1 Insufficient cpu."}]}}));
        let d = describe_pods(&[ready, pending], None).unwrap();
        assert_eq!(d, "pod b: Unschedulable: 0/1 nodes are available: 1 Insufficient cpu.");
    }
}
