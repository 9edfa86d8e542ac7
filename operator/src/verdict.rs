//! What `kubectl proxyfleet status NAME` concludes from a fleet as read: pure, so CI gates built
//! on its exit code are tested. A status that predates what the user just did (a spec the
//! operator has not observed, a command it has not taken, a wave rollout not caught up) is
//! never a verdict: the plugin keeps waiting.

use crate::canary::rollout::COMMAND_ANNOTATION;
use crate::canary::spec::CanaryPhase;
use crate::conditions::{DEGRADED, PROPAGATED};
use crate::crd::{Phase, ProxyDeployment};
use crate::propagation::spec::WavePhase;
use crate::propagation::waves_shell::WAVE_COMMAND;

/// The plugin's conclusion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not decided yet: keep waiting.
    Pending,
    /// Healthy on the spec's revision (exit 0).
    Ready(String),
    /// Failed (exit 1).
    Failed(String),
}

/// The verdict on `pxd`.
pub fn of_fleet(pxd: &ProxyDeployment) -> Verdict {
    let st = pxd.status.clone().unwrap_or_default();
    if st.observed_generation != pxd.metadata.generation {
        return Verdict::Pending;
    }
    // Degraded for anything but the canary's own abort first: a fleet held for a policy or a
    // missing Secret acts on no command, so one waiting on it must not keep the verdict pending.
    let condition = st.conditions.iter().find(|c| c.type_ == DEGRADED);
    let held = st.phase == Some(Phase::Degraded) && condition.is_none_or(|c| c.reason != "RolloutAborted");
    if held {
        return Verdict::Failed(format!("Degraded: {}", degraded(&st).unwrap_or_default()));
    }
    let annotations = pxd.metadata.annotations.as_ref();
    if annotations.is_some_and(|a| a.contains_key(COMMAND_ANNOTATION) || a.contains_key(WAVE_COMMAND)) {
        return Verdict::Pending;
    }
    if st.phase == Some(Phase::Degraded) || st.canary.as_ref().is_some_and(|c| c.phase == CanaryPhase::Aborted) {
        let why = st
            .canary
            .as_ref()
            .and_then(|c| c.message.clone())
            .or_else(|| degraded(&st));
        return Verdict::Failed(format!("Degraded: {}", why.unwrap_or_default()));
    }
    let rolled = st
        .canary
        .as_ref()
        .is_none_or(|c| c.phase == CanaryPhase::Completed || c.phase == CanaryPhase::Idle);
    if st.phase != Some(Phase::Ready) || !rolled {
        return Verdict::Pending;
    }
    let ready = format!(
        "Ready ({}/{} ready, revision {})",
        st.ready_replicas,
        pxd.spec.replicas,
        st.revision.clone().unwrap_or_default()
    );
    if pxd.spec.placement.as_ref().is_none_or(|p| p.waves.is_empty()) {
        return Verdict::Ready(ready);
    }
    // Across clusters: the wave rollout of this generation, completed, and propagated (a
    // propagation that failed this generation keeps the waves' status of the one before).
    let propagated = st.conditions.iter().find(|c| c.type_ == PROPAGATED);
    if propagated.is_none_or(|c| c.observed_generation != pxd.metadata.generation || c.status != "True") {
        return Verdict::Pending;
    }
    match st.waves.as_ref().map(|w| (w.phase, w)) {
        Some((WavePhase::Aborted, w)) => Verdict::Failed(format!(
            "wave rollout aborted: {}",
            w.abort_reason.clone().unwrap_or_default()
        )),
        Some((WavePhase::Completed, w)) => Verdict::Ready(format!("{ready}; every wave runs {}", w.revision)),
        _ => Verdict::Pending,
    }
}

/// The Degraded condition's message, if any.
fn degraded(st: &crate::crd::ProxyDeploymentStatus) -> Option<String> {
    st.conditions
        .iter()
        .find(|c| c.type_ == DEGRADED)
        .map(|c| c.message.clone())
}

/// Why the operator would not act on `verb` for a rollout whose canary status is `canary`
/// (None: it would), so the plugin says so and exits non-zero rather than "requested".
pub fn command_refusal(canary: Option<&crate::canary::spec::CanaryStatus>, verb: &str) -> Option<String> {
    let phase = canary.map(|c| c.phase).unwrap_or_default();
    let running = matches!(
        phase,
        CanaryPhase::Progressing | CanaryPhase::Paused | CanaryPhase::Analyzing
    );
    let why = match verb {
        "retry" if phase != CanaryPhase::Aborted => "only an aborted rollout is retried",
        "resume" if phase != CanaryPhase::Paused => "only a paused rollout is resumed",
        "abort" | "pause" if phase == CanaryPhase::Promoting => {
            "the promotion has started (stable already runs the new template); `kubectl proxyfleet undo` goes back"
        }
        "promote" | "promote-full" | "abort" | "pause" if !running => {
            "no rollout is in progress (one started by a spec just applied shows within seconds)"
        }
        _ => return None,
    };
    Some(format!("{why}; the rollout is {}", phase.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canary::spec::CanaryStatus;
    use crate::propagation::spec::WaveStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn fleet(waves: bool) -> ProxyDeployment {
        let mut spec = serde_json::json!({"replicas": 2, "listeners": [], "routes": [], "upstreams": []});
        if waves {
            spec["placement"] = serde_json::json!({"clusterSelector": {}, "waves": [{"name": "first"}]});
        }
        let mut pxd = ProxyDeployment::new("web", serde_json::from_value(spec).expect("spec"));
        pxd.metadata.generation = Some(4);
        let mut st = crate::crd::ProxyDeploymentStatus {
            observed_generation: Some(4),
            phase: Some(Phase::Ready),
            ready_replicas: 2,
            ..Default::default()
        };
        st.conditions.push(condition(PROPAGATED, 4));
        pxd.status = Some(st);
        pxd
    }

    fn condition(type_: &str, generation: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: "True".into(),
            observed_generation: Some(generation),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            reason: "R".into(),
            message: String::new(),
        }
    }

    fn with_canary(mut pxd: ProxyDeployment, phase: CanaryPhase) -> ProxyDeployment {
        let st = pxd.status.as_mut().expect("status");
        st.canary = Some(CanaryStatus {
            phase,
            ..Default::default()
        });
        pxd
    }

    #[test]
    fn a_ready_fleet_passes_and_an_aborted_canary_fails() {
        assert!(matches!(of_fleet(&fleet(false)), Verdict::Ready(_)));
        assert!(matches!(
            of_fleet(&with_canary(fleet(false), CanaryPhase::Aborted)),
            Verdict::Failed(_)
        ));
        assert_eq!(
            of_fleet(&with_canary(fleet(false), CanaryPhase::Progressing)),
            Verdict::Pending
        );
    }

    /// A status from before what the user just did is no verdict.
    #[test]
    fn a_status_older_than_the_spec_or_a_pending_command_is_no_verdict() {
        let mut newer = with_canary(fleet(false), CanaryPhase::Aborted);
        newer.metadata.generation = Some(5);
        assert_eq!(of_fleet(&newer), Verdict::Pending);
        let mut retried = with_canary(fleet(false), CanaryPhase::Aborted);
        retried.metadata.annotations = Some([(COMMAND_ANNOTATION.to_string(), "retry".to_string())].into());
        assert_eq!(of_fleet(&retried), Verdict::Pending);
        // Degraded by that abort, the retry is still awaited; held (a policy), it is not.
        let mut aborted = retried.clone();
        let st = aborted.status.as_mut().expect("status");
        st.phase = Some(Phase::Degraded);
        st.conditions.push(Condition {
            reason: "RolloutAborted".into(),
            ..condition(DEGRADED, 4)
        });
        assert_eq!(of_fleet(&aborted), Verdict::Pending);
        let mut held = aborted.clone();
        held.status.as_mut().expect("status").conditions[1].reason = "PolicyViolation".into();
        assert!(matches!(of_fleet(&held), Verdict::Failed(_)));
    }

    #[test]
    fn across_clusters_only_a_completed_wave_rollout_of_this_generation_passes() {
        let waves = |phase| {
            let mut pxd = fleet(true);
            pxd.status.as_mut().expect("status").waves = Some(WaveStatus {
                revision: "r1".into(),
                phase,
                abort_reason: Some("cluster m1: canary aborted".into()),
                ..Default::default()
            });
            pxd
        };
        assert_eq!(of_fleet(&waves(WavePhase::Progressing)), Verdict::Pending);
        assert!(matches!(of_fleet(&waves(WavePhase::Aborted)), Verdict::Failed(m) if m.contains("cluster m1")));
        assert!(matches!(of_fleet(&waves(WavePhase::Completed)), Verdict::Ready(_)));
        let mut behind = waves(WavePhase::Completed);
        behind.status.as_mut().expect("status").conditions = vec![condition(PROPAGATED, 3)];
        assert_eq!(of_fleet(&behind), Verdict::Pending);
        let mut failed = waves(WavePhase::Completed);
        failed.status.as_mut().expect("status").conditions[0].status = "False".into();
        assert_eq!(
            of_fleet(&failed),
            Verdict::Pending,
            "the waves' status is the generation before's"
        );
    }

    #[test]
    fn commands_the_operator_would_ignore_are_refused_by_the_plugin() {
        let at = |phase| CanaryStatus {
            phase,
            ..Default::default()
        };
        assert!(command_refusal(Some(&at(CanaryPhase::Progressing)), "retry").is_some());
        assert!(command_refusal(Some(&at(CanaryPhase::Aborted)), "retry").is_none());
        assert!(command_refusal(Some(&at(CanaryPhase::Analyzing)), "resume").is_some());
        assert!(command_refusal(Some(&at(CanaryPhase::Paused)), "resume").is_none());
        assert!(command_refusal(Some(&at(CanaryPhase::Promoting)), "abort").is_some_and(|w| w.contains("undo")));
        assert!(command_refusal(None, "promote").is_some_and(|w| w.contains("no rollout")));
        for verb in ["promote", "promote-full", "abort", "pause"] {
            assert!(
                command_refusal(Some(&at(CanaryPhase::Analyzing)), verb).is_none(),
                "{verb}"
            );
        }
        assert!(command_refusal(Some(&at(CanaryPhase::Paused)), "pause").is_none());
    }
}
