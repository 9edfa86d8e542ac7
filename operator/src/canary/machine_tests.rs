use super::analysis::Verdict;
use super::machine::*;
use super::spec::*;

/// (time, canary pods ready, measurement) fed to the machine in order.
type ScriptStep = (i64, i32, Option<Vec<(String, Verdict)>>);

fn strategy(yaml: &str) -> CanaryStrategy {
    serde_yaml::from_str(yaml).unwrap()
}

const STEPS: &str = r#"
steps:
  - setWeight: 20
  - pause: {duration: 30s}
  - setWeight: 50
  - analysis: {interval: 10s, count: 2, metrics: [{name: errors, errorRate5xx: {max: 5}}]}
  - setWeight: 100
analysis: {interval: 10s, failureLimit: 1, metrics: [{name: errors, errorRate5xx: {max: 5}}]}
"#;

fn obs(now: i64, canary_ready: i32) -> Observations {
    Observations {
        desired_revision: "new".into(),
        stable_revision: Some("old".into()),
        stable_rolled_out: true,
        canary_ready,
        measurement: None,
        now,
    }
}

fn ok() -> Option<Vec<(String, Verdict)>> {
    Some(vec![("errors".into(), Verdict::Success(0.5))])
}
fn bad() -> Option<Vec<(String, Verdict)>> {
    Some(vec![("errors".into(), Verdict::Failure(20.0))])
}

#[test]
fn replica_math() {
    assert_eq!(canary_replicas(5, 20), 1);
    assert_eq!(canary_replicas(5, 50), 3);
    assert_eq!(canary_replicas(5, 100), 5);
    assert_eq!(canary_replicas(2, 1), 1);
    assert_eq!(canary_replicas(5, 0), 0);
}

#[test]
fn first_deploy_and_no_change_are_plain() {
    let s = strategy(STEPS);
    let mut o = obs(0, 0);
    o.stable_revision = None;
    let d = decide(&s, None, 5, &o, None);
    assert_eq!(d.stable_template, StableTemplate::Desired);
    assert_eq!(d.canary_replicas, None);
    o.stable_revision = Some("new".into());
    let d = decide(&s, None, 5, &o, None);
    assert_eq!(d.canary_replicas, None);
    assert_eq!(d.status.phase, IDLE);
}

#[test]
fn a_healthy_rollout_walks_every_step_once() {
    let s = strategy(STEPS);
    // Start: step 0 wants 1 canary pod.
    let d = decide(&s, None, 5, &obs(0, 0), None);
    assert_eq!(d.status.phase, PROGRESSING);
    assert_eq!((d.stable_replicas, d.canary_replicas), (4, Some(1)));
    assert_eq!(d.stable_template, StableTemplate::Current);
    assert!(d.events.iter().any(|e| e.reason == "RolloutStarted"));
    // Same observations again (e.g. after a restart): nothing moves.
    let again = decide(&s, Some(&d.status), 5, &obs(1, 0), None);
    assert_eq!(again.status.current_step_index, 0);
    // Canary ready: step 0 done, on to the pause.
    let d = decide(&s, Some(&d.status), 5, &obs(2, 1), None);
    assert_eq!(d.status.current_step_index, 1);
    let d = decide(&s, Some(&d.status), 5, &obs(3, 1), None);
    assert_eq!(d.status.phase, PAUSED);
    let d = decide(&s, Some(&d.status), 5, &obs(20, 1), None);
    assert_eq!(d.status.current_step_index, 1, "pause not over yet");
    // Pause over (30 s): the 50 % step starts and waits for 3 pods.
    let d = decide(&s, Some(&d.status), 5, &obs(40, 1), None);
    assert_eq!(d.status.current_step_index, 2);
    assert_eq!(d.canary_replicas, Some(3));
    let d = decide(&s, Some(&d.status), 5, &obs(41, 3), None);
    assert_eq!(d.status.current_step_index, 3);
    // Analysis step: two good measurements pass it.
    let mut o = obs(50, 3);
    o.measurement = ok();
    let d = decide(&s, Some(&d.status), 5, &o, None);
    assert_eq!(d.status.phase, ANALYZING);
    assert_eq!(d.status.current_step_index, 3);
    let mut o = obs(60, 3);
    o.measurement = ok();
    let d = decide(&s, Some(&d.status), 5, &o, None);
    assert_eq!(d.status.current_step_index, 4);
    let d = decide(&s, Some(&d.status), 5, &obs(61, 3), None);
    assert_eq!(d.canary_replicas, Some(5));
    assert_eq!(d.stable_replicas, 0);
    // Last step done: promotion rolls stable to the new revision.
    let d = decide(&s, Some(&d.status), 5, &obs(62, 5), None);
    let d = decide(&s, Some(&d.status), 5, &obs(63, 5), None);
    assert_eq!(d.status.phase, PROMOTING);
    assert_eq!(d.stable_template, StableTemplate::Desired);
    // Stable now runs "new" and has rolled out.
    let mut o = obs(70, 5);
    o.stable_revision = Some("new".into());
    let d = decide(&s, Some(&d.status), 5, &o, None);
    assert_eq!(d.status.phase, COMPLETED);
    assert_eq!(d.canary_replicas, None);
    assert!(d.events.iter().any(|e| e.reason == "RolloutCompleted"));
}

#[test]
fn failed_background_analysis_aborts_to_stable() {
    let s = strategy(STEPS);
    let d = decide(&s, None, 5, &obs(0, 0), None);
    let d = decide(&s, Some(&d.status), 5, &obs(1, 1), None);
    let mut o = obs(10, 1);
    o.measurement = bad();
    let d = decide(&s, Some(&d.status), 5, &o, None);
    assert_ne!(d.status.phase, ABORTED, "failureLimit 1 tolerates one failure");
    let mut o = obs(20, 1);
    o.measurement = bad();
    let d = decide(&s, Some(&d.status), 5, &o, None);
    assert_eq!(d.status.phase, ABORTED);
    assert_eq!(d.canary_replicas, Some(0));
    assert_eq!(d.stable_replicas, 5);
    assert_eq!(d.stable_template, StableTemplate::Current);
    assert_eq!(d.aborted.as_deref(), Some("AnalysisFailed"));
    // Stays aborted across reconciles and restarts, until retried or the spec changes.
    let again = decide(&s, Some(&d.status), 5, &obs(30, 0), None);
    assert_eq!(again.status.phase, ABORTED);
    assert!(again.aborted.is_none(), "the abort is reported once");
    let retried = decide(&s, Some(&again.status), 5, &obs(31, 0), Some(Command::Retry));
    assert_eq!(retried.status.phase, PROGRESSING);
    assert_eq!(retried.status.current_step_index, 0);
    let mut newer = obs(32, 0);
    newer.desired_revision = "newer".into();
    let fresh = decide(&s, Some(&d.status), 5, &newer, None);
    assert_eq!(fresh.status.phase, PROGRESSING);
    assert_eq!(fresh.status.canary_revision.as_deref(), Some("newer"));
}

#[test]
fn consecutive_errors_abort_and_are_never_a_pass() {
    let s = strategy(
        STEPS
            .replace(
                "analysis: {interval: 10s, failureLimit: 1,",
                "analysis: {interval: 10s, failureLimit: 1, consecutiveErrorLimit: 2,",
            )
            .as_str(),
    );
    let mut d = decide(&s, None, 5, &obs(0, 0), None);
    d = decide(&s, Some(&d.status), 5, &obs(1, 1), None);
    for (i, t) in [10, 20].iter().enumerate() {
        let mut o = obs(*t, 1);
        o.measurement = Some(vec![("errors".into(), Verdict::Error("prometheus unreachable".into()))]);
        d = decide(&s, Some(&d.status), 5, &o, None);
        assert_ne!(d.status.phase, ABORTED, "error {i} tolerated");
    }
    let mut o = obs(30, 1);
    o.measurement = Some(vec![("errors".into(), Verdict::Error("prometheus unreachable".into()))]);
    d = decide(&s, Some(&d.status), 5, &o, None);
    assert_eq!(d.status.phase, ABORTED);
    assert!(d.status.message.unwrap().contains("consecutiveErrorLimit"));
}

#[test]
fn a_new_revision_supersedes_the_rollout() {
    let s = strategy(STEPS);
    let d = decide(&s, None, 5, &obs(0, 0), None);
    let d = decide(&s, Some(&d.status), 5, &obs(1, 1), None);
    // The new revision's canary Deployment has no ready pods yet.
    let mut o = obs(2, 0);
    o.desired_revision = "newer".into();
    let d = decide(&s, Some(&d.status), 5, &o, None);
    assert_eq!(d.status.current_step_index, 0);
    assert_eq!(d.status.canary_revision.as_deref(), Some("newer"));
    assert!(d.events.iter().any(|e| e.reason == "RolloutSuperseded"));
}

#[test]
fn manual_commands() {
    let s = strategy("steps: [{setWeight: 20}, {pause: {}}, {setWeight: 60}]");
    let d = decide(&s, None, 5, &obs(0, 0), None);
    let d = decide(&s, Some(&d.status), 5, &obs(1, 1), None);
    let d = decide(&s, Some(&d.status), 5, &obs(2, 1), None);
    assert_eq!(d.status.phase, PAUSED);
    let d = decide(&s, Some(&d.status), 5, &obs(1000, 1), None);
    assert_eq!(d.status.phase, PAUSED, "an indefinite pause waits for promote");
    let d = decide(&s, Some(&d.status), 5, &obs(1001, 1), Some(Command::Promote));
    assert_eq!(d.status.current_step_index, 2);
    let d = decide(&s, Some(&d.status), 5, &obs(1002, 1), Some(Command::PromoteFull));
    assert_eq!(d.status.phase, PROMOTING);
    let d2 = decide(&s, None, 5, &obs(0, 0), Some(Command::Abort));
    assert_eq!(d2.status.phase, ABORTED);
    assert_eq!(d2.status.abort_reason.as_deref(), Some("ManualAbort"));
    // Pause on a weight step holds until resumed.
    let d = decide(&s, None, 5, &obs(0, 0), Some(Command::Pause));
    let held = decide(&s, Some(&d.status), 5, &obs(5, 1), None);
    assert_eq!(held.status.current_step_index, 0);
    let resumed = decide(&s, Some(&held.status), 5, &obs(6, 1), Some(Command::Resume));
    assert_eq!(resumed.status.current_step_index, 1);
}

#[test]
fn restart_in_every_phase_resumes_without_repeating_or_skipping() {
    // Replaying the last decision's status with the same observations is a fixed point in
    // every phase: a restarted operator continues where it was.
    let s = strategy(STEPS);
    let mut status: Option<CanaryStatus> = None;
    let script: Vec<ScriptStep> = vec![
        (0, 0, None),
        (1, 1, None),
        (2, 1, None),
        (40, 1, None),
        (41, 3, None),
        (50, 3, ok()),
        (60, 3, ok()),
        (61, 3, None),
        (62, 5, None),
        (63, 5, None),
    ];
    for (t, ready, m) in script {
        let mut o = obs(t, ready);
        o.measurement = m;
        let d = decide(&s, status.as_ref(), 5, &o, None);
        // "Restart": decide again from the persisted status, same world, no new measurement.
        let mut replay = obs(t, ready);
        replay.measurement = None;
        let r = decide(&s, Some(&d.status), 5, &replay, None);
        assert!(r.status.current_step_index >= d.status.current_step_index);
        assert!(
            r.status.current_step_index <= d.status.current_step_index + 1,
            "a replay skipped a step at t={t}"
        );
        assert_eq!(r.status.canary_revision, d.status.canary_revision);
        status = Some(d.status);
    }
}

#[test]
fn measurement_is_due_per_interval() {
    let s = strategy(STEPS);
    let d = decide(&s, None, 5, &obs(0, 0), None);
    assert!(!measurement_due(&s, &d.status, 0), "no traffic on the canary yet");
    let d = decide(&s, Some(&d.status), 5, &obs(1, 1), None);
    assert!(measurement_due(&s, &d.status, 1));
    let mut o = obs(10, 1);
    o.measurement = ok();
    let d = decide(&s, Some(&d.status), 5, &o, None);
    assert!(!measurement_due(&s, &d.status, 15));
    assert!(measurement_due(&s, &d.status, 20));
}

#[test]
fn a_stale_status_after_promotion_still_completes() {
    let s = strategy(STEPS);
    let mut st = CanaryStatus {
        phase: PROGRESSING.into(),
        current_step_index: 4,
        weight: 100,
        canary_revision: Some("new".into()),
        stable_revision: Some("old".into()),
        ..Default::default()
    };
    st.message = Some("stale".into());
    let mut o = obs(100, 5);
    o.stable_revision = Some("new".into());
    o.stable_rolled_out = false;
    let d = decide(&s, Some(&st), 5, &o, None);
    assert_eq!(d.status.phase, PROMOTING);
    o.stable_rolled_out = true;
    let d = decide(&s, Some(&d.status), 5, &o, None);
    assert_eq!(d.status.phase, COMPLETED);
}
