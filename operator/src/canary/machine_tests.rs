use super::analysis::Verdict;
use super::machine::*;
use super::spec::*;

/// (time, canary pods ready, measurement) fed to the machine in order.
type ScriptStep = (i64, i32, Option<Measurement>);

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

/// STEPS as Argo Rollouts runs it: background analysis beside the steps, never gating them.
fn ungated() -> CanaryStrategy {
    let mut s = strategy(STEPS);
    s.gate_on_background_analysis = false;
    s
}

fn obs(now: i64, canary_ready: i32) -> Observations {
    Observations {
        desired_revision: "new".into(),
        stable_revision: Some("old".into()),
        stable_rolled_out: true,
        canary_ready,
        now,
        ..Default::default()
    }
}

fn measured(window_start: i64, verdicts: Vec<(String, Verdict)>) -> Option<Measurement> {
    Some(Measurement { window_start, verdicts })
}
/// A passing measurement whose window started long ago (not entirely at any recent weight).
fn ok() -> Option<Measurement> {
    measured(-1000, vec![("errors".into(), Verdict::Success(0.5))])
}
fn bad() -> Option<Measurement> {
    measured(-1000, vec![("errors".into(), Verdict::Failure(20.0))])
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
    let s = ungated();
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
        o.measurement = measured(
            0,
            vec![("errors".into(), Verdict::Error("prometheus unreachable".into()))],
        );
        d = decide(&s, Some(&d.status), 5, &o, None);
        assert_ne!(d.status.phase, ABORTED, "error {i} tolerated");
    }
    let mut o = obs(30, 1);
    o.measurement = measured(
        0,
        vec![("errors".into(), Verdict::Error("prometheus unreachable".into()))],
    );
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
    let s = ungated();
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
        phase: PROGRESSING,
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

/// The demo's strategy (issue 16): background analysis only, judged every 10 s on 20 s windows.
const DEMO: &str = r#"
steps: [{setWeight: 34}, {pause: {duration: 15s}}, {setWeight: 67}, {pause: {duration: 15s}}, {setWeight: 100}]
analysis: {interval: 10s, window: 20s, minRequests: 10, metrics: [{name: errors, errorRate5xx: {max: 5}}, {name: p99, p99LatencyMs: {max: 250}}]}
"#;

/// Drives the machine the way the shell does: measure when due (a Prometheus-like window of
/// `window` seconds ending now), all canary pods ready at once, every decision persisted.
fn drive(s: &CanaryStrategy, verdict: impl Fn(&str) -> Verdict, until: i64) -> Vec<Decision> {
    let mut out: Vec<Decision> = Vec::new();
    let mut stable = "old".to_string();
    for now in 0..until {
        let prev = out.last().map(|d| d.status.clone());
        let mut o = obs(now, 3);
        o.stable_revision = Some(stable.clone());
        if let Some((a, _)) = prev
            .as_ref()
            .and_then(|p| active_analysis(s, p).filter(|_| measurement_due(s, p, now)))
        {
            let verdicts = a.metrics.iter().map(|m| (m.name.clone(), verdict(&m.name))).collect();
            o.measurement = measured(now - a.window.get().as_secs() as i64, verdicts);
        }
        let d = decide(s, prev.as_ref(), 3, &o, None);
        if d.stable_template == StableTemplate::Desired && d.status.phase == PROMOTING {
            stable = "new".into();
        }
        out.push(d);
    }
    out
}

#[test]
fn the_demos_bad_canary_is_aborted_never_promoted() {
    // Issue 16: 30 % 5xx on the canary, background analysis only, was promoted before.
    let s = strategy(DEMO);
    let run = drive(
        &s,
        |m| {
            if m == "errors" {
                Verdict::Failure(32.5)
            } else {
                Verdict::Success(12.0)
            }
        },
        200,
    );
    assert!(run.iter().all(|d| !matches!(d.status.phase, PROMOTING | COMPLETED)));
    let last = &run.last().unwrap().status;
    assert_eq!(last.phase, ABORTED);
    assert!(
        run.iter().all(|d| d.status.weight <= 34),
        "no weight after the first was entered"
    );
    let errors = last.metrics.iter().find(|m| m.name == "errors").unwrap();
    assert_eq!(errors.failures, 2, "aborted at failureLimit + 1 failures, none lost");
}

#[test]
fn the_demos_healthy_canary_is_judged_at_every_weight_then_promoted() {
    let s = strategy(DEMO);
    let run = drive(&s, |_| Verdict::Success(1.0), 300);
    let last = &run.last().unwrap().status;
    assert_eq!(last.phase, COMPLETED);
    // Each weight was left only after a pass whose window lay entirely at it.
    for w in [34, 67, 100] {
        let reached = run.iter().position(|d| d.status.weight == w).unwrap() as i64;
        let left = run
            .iter()
            .position(|d| d.status.weight > w || d.status.phase == PROMOTING)
            .unwrap() as i64;
        assert!(
            left - reached >= 20,
            "weight {w} left {}s after it was reached",
            left - reached
        );
    }
}

#[test]
fn a_pass_whose_window_began_before_the_weight_does_not_judge_it() {
    let s = strategy(DEMO);
    let d = decide(&s, None, 3, &obs(0, 0), None);
    let d = decide(&s, Some(&d.status), 3, &obs(1, 2), None);
    assert_eq!((d.status.weight, d.status.current_step_index), (34, 0));
    let pass = |start| {
        measured(
            start,
            vec![
                ("errors".into(), Verdict::Success(0.0)),
                ("p99".into(), Verdict::Success(9.0)),
            ],
        )
    };
    let mut o = obs(15, 2);
    o.measurement = pass(-5);
    let d = decide(&s, Some(&d.status), 3, &o, None);
    assert_eq!(d.status.current_step_index, 0, "window began at weight 0");
    assert!(d
        .status
        .message
        .as_deref()
        .unwrap()
        .contains("waits for a passing measurement"));
    assert!(
        measurement_due(&s, &d.status, 21),
        "the first full window is due at once"
    );
    let mut o = obs(21, 2);
    o.measurement = pass(1);
    let d = decide(&s, Some(&d.status), 3, &o, None);
    assert_eq!((d.status.current_step_index, d.status.phase), (1, PAUSED));
}

#[test]
fn canary_pods_that_never_start_abort_at_the_progress_deadline() {
    let s = strategy(DEMO);
    let d = decide(&s, None, 3, &obs(0, 0), None);
    let mut o = obs(599, 0);
    o.canary_problem = Some("pod demo-canary-x: CrashLoopBackOff: reading upstream CA".into());
    let d = decide(&s, Some(&d.status), 3, &o, None);
    assert_eq!(d.status.phase, PROGRESSING);
    o.now = 600;
    let d = decide(&s, Some(&d.status), 3, &o, None);
    assert_eq!(d.status.phase, ABORTED);
    assert_eq!(d.aborted.as_deref(), Some("ProgressDeadlineExceeded"));
    assert!(d
        .status
        .message
        .unwrap()
        .contains("CrashLoopBackOff: reading upstream CA"));
    assert_eq!(d.canary_replicas, Some(0));
}

/// Paused before its canary pods were ready and resumed long after: the step's progress
/// deadline counts from the resume, not from before the pause.
#[test]
fn a_resume_after_a_long_pause_restarts_the_steps_clock() {
    let s = strategy(STEPS);
    let at = |now: i64, ready: i32| Observations {
        progress_deadline: 600,
        ..obs(now, ready)
    };
    let d = decide(&s, None, 5, &at(0, 0), None);
    let paused = decide(&s, Some(&d.status), 5, &at(10, 0), Some(Command::Pause));
    assert_eq!(paused.status.phase, PAUSED);
    let resumed = decide(&s, Some(&paused.status), 5, &at(5000, 0), Some(Command::Resume));
    let next = decide(&s, Some(&resumed.status), 5, &at(5010, 0), None);
    assert_ne!(next.status.phase, ABORTED, "{:?}", next.status.message);
    let late = decide(&s, Some(&next.status), 5, &at(5700, 0), None);
    assert_eq!(late.status.phase, ABORTED, "the deadline still holds after the resume");
}

/// Steps edited mid-rollout (the first weight step removed, so the kept index would land past
/// the blocking analysis): the rollout starts again from its first step with fresh counts. An
/// aborted rollout stays aborted; a status from before the hash adopts it.
#[test]
fn a_strategy_edited_mid_rollout_restarts_from_the_first_step() {
    let before = ungated();
    let mut d = decide(&before, None, 5, &obs(0, 0), None);
    for t in 1..40 {
        d = decide(
            &before,
            Some(&d.status),
            5,
            &obs(t, 3),
            Some(Command::Promote).filter(|_| t == 3),
        );
        if d.status.current_step_index >= 3 {
            break;
        }
    }
    assert!(d.status.current_step_index >= 2, "{:?}", d.status);
    let mut after = before.clone();
    after.steps.remove(0);
    let restarted = decide(&after, Some(&d.status), 5, &obs(100, 3), None);
    assert_eq!(restarted.status.current_step_index, 0, "{:?}", restarted.status);
    assert!(restarted.events.iter().any(|e| e.reason == "RolloutRestarted"));
    assert_eq!(restarted.status.strategy_hash, Some(strategy_hash(&after)));
    let again = decide(&after, Some(&restarted.status), 5, &obs(101, 3), None);
    assert!(!again.events.iter().any(|e| e.reason == "RolloutRestarted"), "once");

    let aborted = decide(&before, Some(&d.status), 5, &obs(101, 3), Some(Command::Abort));
    let still = decide(&after, Some(&aborted.status), 5, &obs(102, 3), None);
    assert_eq!(still.status.phase, ABORTED);

    let mut old = d.status.clone();
    old.strategy_hash = None;
    let adopted = decide(&after, Some(&old), 5, &obs(103, 3), None);
    assert!(!adopted.events.iter().any(|e| e.reason == "RolloutRestarted"));
    assert_eq!(adopted.status.strategy_hash, Some(strategy_hash(&after)));
}

/// Promoting "new" while stable still runs "old", the spec goes back to "old": the promotion is
/// cancelled, not reported as promoting "old"; when the spec comes back to "new", its rollout
/// starts again from the first step instead of promoting at once.
#[test]
fn a_spec_reverted_during_a_promotion_cancels_it_and_a_return_starts_over() {
    let s = ungated();
    let d = decide(&s, None, 5, &obs(0, 0), None);
    let promoting = decide(&s, Some(&d.status), 5, &obs(1, 1), Some(Command::PromoteFull));
    assert_eq!(promoting.status.phase, PROMOTING);
    let mut back = obs(2, 1);
    back.desired_revision = "old".into();
    back.stable_rolled_out = false;
    let cancelled = decide(&s, Some(&promoting.status), 5, &back, None);
    assert_eq!(cancelled.status.phase, IDLE, "{:?}", cancelled.status);
    assert!(cancelled.events.iter().any(|e| e.reason == "RolloutCancelled"));
    // A completed status naming "new" while stable runs "old" (as the old machine left it).
    let mut stale = promoting.status.clone();
    stale.phase = COMPLETED;
    let again = decide(&s, Some(&stale), 5, &obs(3, 0), None);
    assert_eq!(again.status.phase, PROGRESSING);
    assert_eq!(again.status.current_step_index, 0);
    assert_eq!(again.canary_replicas, Some(1));
}

/// Paused by request during a timed pause step: the step's end does not move the rollout on;
/// a resume does.
#[test]
fn a_pause_by_request_holds_a_timed_pause_step_too() {
    let s = ungated();
    let mut d = decide(&s, None, 5, &obs(0, 0), None);
    for t in 1..5 {
        d = decide(&s, Some(&d.status), 5, &obs(t, 1), None);
    }
    assert_eq!((d.status.phase, d.status.current_step_index), (PAUSED, 1));
    let held = decide(&s, Some(&d.status), 5, &obs(10, 1), Some(Command::Pause));
    assert!(held.status.paused_by_request);
    let later = decide(&s, Some(&held.status), 5, &obs(100, 1), None);
    assert_eq!(
        later.status.current_step_index, 1,
        "the 30 s pause is over, but paused by request"
    );
    let resumed = decide(&s, Some(&later.status), 5, &obs(101, 1), Some(Command::Resume));
    assert!(!resumed.status.paused_by_request);
    assert!(resumed.status.current_step_index >= 2, "{:?}", resumed.status);
}

/// The strategy edited while paused by request: the rollout starts over at its first step and
/// stays paused; a measurement taken for the old step is not counted into the new rollout.
#[test]
fn a_strategy_edited_while_paused_by_request_stays_paused() {
    let before = ungated();
    let d = decide(&before, None, 5, &obs(0, 0), None);
    let paused = decide(&before, Some(&d.status), 5, &obs(1, 1), Some(Command::Pause));
    assert!(paused.status.paused_by_request);
    let mut after = before.clone();
    after.steps.insert(
        0,
        CanaryStep {
            set_weight: Some(5),
            pause: None,
            analysis: None,
        },
    );
    let mut o = obs(2, 1);
    o.measurement = bad();
    let restarted = decide(&after, Some(&paused.status), 5, &o, None);
    assert_eq!(restarted.status.phase, PAUSED);
    assert!(restarted.status.paused_by_request);
    assert_eq!(restarted.status.current_step_index, 0);
    assert!(
        restarted.status.metrics.iter().all(|m| m.failures == 0),
        "{:?}",
        restarted.status.metrics
    );
    let still = decide(&after, Some(&restarted.status), 5, &obs(100, 1), None);
    assert_eq!((still.status.phase, still.status.current_step_index), (PAUSED, 0));
}

/// The stable Deployment deleted during a rollout: the spec's revision is deployed as stable
/// (nothing else is known), and that is said, not reported as a first deployment.
#[test]
fn a_stable_deployment_gone_mid_rollout_is_said() {
    let s = ungated();
    let d = decide(&s, None, 5, &obs(0, 0), None);
    let aborted = decide(&s, Some(&d.status), 5, &obs(1, 1), Some(Command::Abort));
    let mut gone = obs(2, 0);
    gone.stable_revision = None;
    let after = decide(&s, Some(&aborted.status), 5, &gone, None);
    assert_eq!(after.stable_template, StableTemplate::Desired);
    assert!(after.events.iter().any(|e| e.warning && e.reason == "StableMissing"));
    let first = decide(&s, None, 5, &gone, None);
    assert!(first.events.is_empty());
}

/// A promote sent while revision "new" waited at a pause, read in the pass the spec moved on to
/// "newer": that rollout starts at its first step, judged like any other; an abort still acts.
#[test]
fn a_promote_meant_for_the_rollout_before_a_new_revision_is_not_applied_to_it() {
    let s = ungated();
    let mut d = decide(&s, None, 5, &obs(0, 0), None);
    for now in 10..13 {
        d = decide(&s, Some(&d.status), 5, &obs(now, 1), None);
    }
    assert_eq!(d.status.current_step_index, 1, "waiting at the pause: {:?}", d.status);
    let newer = obs_at(13, 1, "newer");
    let uncommanded = decide(&s, Some(&d.status), 5, &newer, None);
    for command in [Command::Promote, Command::PromoteFull, Command::Resume, Command::Retry] {
        let n = decide(&s, Some(&d.status), 5, &newer, Some(command));
        assert_eq!(n.status.canary_revision.as_deref(), Some("newer"));
        assert_eq!(n.status, uncommanded.status, "{command:?}");
        assert!(
            n.events.iter().any(|e| e.reason == "CommandIgnored" && e.warning),
            "{command:?}: {:?}",
            n.events
        );
    }
    let aborted = decide(&s, Some(&d.status), 5, &newer, Some(Command::Abort));
    assert_eq!(aborted.status.phase, ABORTED);
    // Sent again once the new rollout runs, it acts.
    let n = decide(&s, Some(&d.status), 5, &newer, None);
    let n = decide(
        &s,
        Some(&n.status),
        5,
        &obs_at(14, 1, "newer"),
        Some(Command::PromoteFull),
    );
    assert_eq!(n.status.phase, PROMOTING);
}

fn obs_at(now: i64, canary_ready: i32, desired: &str) -> Observations {
    Observations {
        desired_revision: desired.into(),
        ..obs(now, canary_ready)
    }
}

/// Where the weights are pushed to the proxies, a weight step is done only once every proxy
/// pod has taken it: a revision nobody's traffic reached is never walked to promotion.
#[test]
fn a_pushed_weight_completes_its_step_only_once_every_proxy_took_it() {
    let s = strategy("steps: [{setWeight: 20}, {pause: {duration: 10s}}, {setWeight: 100}]");
    let pushed = |now, confirmed| Observations {
        weights_confirmed: Some(confirmed),
        ..obs(now, 1)
    };
    let mut d = decide(&s, None, 5, &pushed(0, true), None);
    assert_eq!(
        (d.status.weight, d.status.current_step_index),
        (20, 0),
        "set, not yet taken"
    );
    for now in 1..100 {
        d = decide(&s, Some(&d.status), 5, &pushed(now, false), None);
        assert_eq!(d.status.current_step_index, 0, "moved on with the weight not taken");
        assert_ne!(d.status.phase, PROMOTING);
    }
    d = decide(&s, Some(&d.status), 5, &pushed(100, true), None);
    assert_eq!(d.status.current_step_index, 1, "taken: on to the pause");
}

/// A weight not yet taken by every proxy is not reached (no window judges it) until it is,
/// without a status change every pass; never taken, it aborts at the progress deadline.
#[test]
fn a_pushed_weight_is_reached_when_every_proxy_took_it() {
    let s = strategy("steps: [{setWeight: 20}, {setWeight: 100}]\nanalysis: {interval: 10s, metrics: [{name: errors, errorRate5xx: {max: 5}}]}");
    let pushed = |now, confirmed| Observations {
        weights_confirmed: Some(confirmed),
        progress_deadline: 100,
        ..obs(now, 1)
    };
    let mut d = decide(&s, None, 5, &pushed(0, true), None);
    let waiting = decide(&s, Some(&d.status), 5, &pushed(2, false), None);
    assert_eq!(waiting.status.weight_reached_at, None);
    for now in [4, 6] {
        d = decide(&s, Some(&waiting.status), 5, &pushed(now, false), None);
        assert_eq!(d.status, waiting.status, "a wait writes nothing new");
    }
    d = decide(&s, Some(&d.status), 5, &pushed(8, true), None);
    assert_eq!(d.status.weight_reached_at.as_deref(), Some("1970-01-01T00:00:08Z"));
    let never = decide(&s, Some(&waiting.status), 5, &pushed(101, false), None);
    assert_eq!(never.status.phase, ABORTED);
    assert_eq!(never.canary_replicas, Some(0));
    assert!(never
        .status
        .message
        .as_deref()
        .is_some_and(|m| m.contains("not taken by every proxy pod")));
}

/// A retry read records the object's retry token (a hub's wave rollout reads it to know the
/// retry it asked was taken), also when the rollout started over in that pass, and the token
/// stays through every later status until a newer retry.
#[test]
fn a_retry_records_its_token_and_keeps_it() {
    let s = strategy("steps: [{setWeight: 20}, {pause: {}}]");
    let with_token = |token: &str, o: Observations| Observations {
        retry_token: Some(token.into()),
        ..o
    };
    let d = decide(&s, None, 5, &obs(0, 0), None);
    let aborted = decide(&s, Some(&d.status), 5, &obs(1, 0), Some(Command::Abort));
    assert_eq!(aborted.status.phase, ABORTED);
    let retried = decide(
        &s,
        Some(&aborted.status),
        5,
        &with_token("1/r9", obs(2, 0)),
        Some(Command::Retry),
    );
    assert_ne!(retried.status.phase, ABORTED);
    assert_eq!(retried.status.retry_token.as_deref(), Some("1/r9"));
    let newer = decide(&s, Some(&retried.status), 5, &obs_at(3, 0, "newer"), None);
    assert_eq!(newer.status.canary_revision.as_deref(), Some("newer"));
    assert_eq!(
        newer.status.retry_token.as_deref(),
        Some("1/r9"),
        "kept by a new rollout"
    );
    let again = decide(&s, Some(&newer.status), 5, &obs_at(4, 0, "newer"), Some(Command::Abort));
    let over = decide(
        &s,
        Some(&again.status),
        5,
        &with_token("2/r9", obs_at(5, 0, "newest")),
        Some(Command::Retry),
    );
    assert_eq!(over.status.canary_revision.as_deref(), Some("newest"), "started over");
    assert_eq!(
        over.status.retry_token.as_deref(),
        Some("2/r9"),
        "the retry read is recorded"
    );
}

/// A retry whose token the canary recorded already is not taken twice (a hub that asked again,
/// not seeing its first ask taken); one without a token (by hand) always is.
#[test]
fn a_retry_token_is_taken_once() {
    let s = strategy("steps: [{setWeight: 20}, {pause: {}}]");
    let with_token = |token: &str, o: Observations| Observations {
        retry_token: Some(token.into()),
        ..o
    };
    let d = decide(&s, None, 5, &obs(0, 0), None);
    let aborted = decide(&s, Some(&d.status), 5, &obs(1, 0), Some(Command::Abort));
    let retried = decide(
        &s,
        Some(&aborted.status),
        5,
        &with_token("1/r9", obs(2, 0)),
        Some(Command::Retry),
    );
    assert_ne!(retried.status.phase, ABORTED);
    let again = decide(&s, Some(&retried.status), 5, &obs(3, 0), Some(Command::Abort));
    assert_eq!(again.status.phase, ABORTED);
    let asked_again = decide(
        &s,
        Some(&again.status),
        5,
        &with_token("1/r9", obs(4, 0)),
        Some(Command::Retry),
    );
    assert_eq!(asked_again.status.phase, ABORTED, "the same token restarts nothing");
    assert!(asked_again
        .events
        .iter()
        .any(|e| e.reason == "CommandIgnored" && e.message.contains("1/r9")));
    let by_hand = decide(&s, Some(&asked_again.status), 5, &obs(5, 0), Some(Command::Retry));
    assert_ne!(by_hand.status.phase, ABORTED, "a retry without a token is taken");
    let next = decide(
        &s,
        Some(&again.status),
        5,
        &with_token("2/r9", obs(6, 0)),
        Some(Command::Retry),
    );
    assert_ne!(next.status.phase, ABORTED, "a newer token is taken");
}
