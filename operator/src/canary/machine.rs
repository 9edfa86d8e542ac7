//! The canary state machine: a pure function from (spec, status, observations, command, now)
//! to (new status, what to run, events). Everything needed to resume lives in the status, so
//! an operator restart continues exactly where it stopped: no step repeated or skipped.

use super::analysis::Verdict;
use super::spec::{Analysis, CanaryStatus, CanaryStep, CanaryStrategy, MetricStatus};

pub const IDLE: &str = "Idle";
pub const PROGRESSING: &str = "Progressing";
pub const PAUSED: &str = "Paused";
pub const ANALYZING: &str = "Analyzing";
pub const PROMOTING: &str = "Promoting";
pub const COMPLETED: &str = "Completed";
pub const ABORTED: &str = "Aborted";

/// A manual command (from an annotation or the kubectl plugin).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Finish the current step now (skips a pause or a blocking analysis).
    Promote,
    /// Skip every remaining step.
    PromoteFull,
    Abort,
    /// Start an aborted rollout again from the first step.
    Retry,
    Pause,
    Resume,
}

impl Command {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "promote" => Self::Promote,
            "promote-full" => Self::PromoteFull,
            "abort" => Self::Abort,
            "retry" => Self::Retry,
            "pause" => Self::Pause,
            "resume" => Self::Resume,
            _ => return None,
        })
    }
}

/// What the reconciler observed this time.
#[derive(Clone, Debug, Default)]
pub struct Observations {
    /// Revision the spec asks for now.
    pub desired_revision: String,
    /// Revision of the running stable Deployment (None before the first deploy).
    pub stable_revision: Option<String>,
    /// Stable Deployment has all its pods on its current template and ready.
    pub stable_rolled_out: bool,
    /// Ready pods on the canary Deployment's current template (0 when there is none).
    pub canary_ready: i32,
    /// Verdicts of a measurement taken this reconcile: (metric name, verdict).
    pub measurement: Option<Vec<(String, Verdict)>>,
    pub now: i64,
}

/// Which template the stable Deployment runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StableTemplate {
    /// Keep what it runs (during a rollout, or after an abort).
    Current,
    /// The spec's revision (first deploy, no canary strategy, or promotion).
    Desired,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub status: CanaryStatus,
    pub stable_template: StableTemplate,
    pub stable_replicas: i32,
    /// Canary Deployment replicas; None: no canary Deployment should exist.
    pub canary_replicas: Option<i32>,
    pub events: Vec<Event>,
    /// Seconds until something time-based is due.
    pub requeue_after: u64,
    /// Set when this decision aborted the rollout.
    pub aborted: Option<String>,
}

/// Canary pods for a weight: at least one while the weight is above zero.
pub fn canary_replicas(total: i32, weight: i32) -> i32 {
    if weight <= 0 || total <= 0 {
        return 0;
    }
    (((total as i64) * (weight as i64) + 99) / 100).clamp(1, total as i64) as i32
}

fn rfc(now: i64) -> String {
    crate::certs::issue::rfc3339(now)
}

fn parse_time(s: &Option<String>) -> Option<i64> {
    let t = s.as_deref()?;
    time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp())
}

/// The analysis that runs at this point: the blocking one of an analysis step, else the
/// background one once the canary carries traffic.
pub fn active_analysis<'a>(strategy: &'a CanaryStrategy, status: &CanaryStatus) -> Option<(&'a Analysis, bool)> {
    if !matches!(status.phase.as_str(), PROGRESSING | ANALYZING | PAUSED) {
        return None;
    }
    if let Some(CanaryStep { analysis: Some(a), .. }) = strategy.steps.get(status.current_step_index as usize) {
        return Some((a, true));
    }
    match &strategy.analysis {
        Some(a) if status.weight > 0 => Some((a, false)),
        _ => None,
    }
}

/// Whether a measurement is due now (the shell measures, then calls `decide`).
pub fn measurement_due(strategy: &CanaryStrategy, status: &CanaryStatus, now: i64) -> bool {
    let Some((analysis, _)) = active_analysis(strategy, status) else {
        return false;
    };
    let last = status
        .metrics
        .iter()
        .filter_map(|m| parse_time(&m.last_measured_at))
        .max();
    last.is_none_or(|t| now - t >= analysis.interval.get().as_secs() as i64)
}

fn fresh_status(desired: &str, stable: Option<&str>, now: i64) -> CanaryStatus {
    CanaryStatus {
        phase: PROGRESSING.into(),
        current_step_index: 0,
        weight: 0,
        stable_revision: stable.map(str::to_string),
        canary_revision: Some(desired.to_string()),
        step_started_at: Some(rfc(now)),
        pause_started_at: None,
        metrics: Vec::new(),
        message: Some("rollout started".into()),
        abort_reason: None,
    }
}

struct Run {
    status: CanaryStatus,
    events: Vec<Event>,
    aborted: Option<String>,
}

impl Run {
    /// All traffic on stable, the canary scaled to zero.
    fn into_aborted(self, total: i32) -> Decision {
        Decision {
            status: self.status,
            stable_template: StableTemplate::Current,
            stable_replicas: total,
            canary_replicas: Some(0),
            events: self.events,
            requeue_after: 300,
            aborted: self.aborted,
        }
    }

    fn event(&mut self, warning: bool, reason: &'static str, message: String) {
        self.events.push(Event {
            warning,
            reason,
            message,
        });
    }

    fn abort(&mut self, reason: &str, message: String) {
        self.status.phase = ABORTED.into();
        self.status.weight = 0;
        self.status.abort_reason = Some(reason.to_string());
        self.status.message = Some(message.clone());
        self.aborted = Some(reason.to_string());
        self.event(true, "RolloutAborted", message);
    }

    fn next_step(&mut self, now: i64) {
        self.status.current_step_index += 1;
        self.status.step_started_at = Some(rfc(now));
        self.status.pause_started_at = None;
        // Blocking-analysis counters restart per step; background ones carry on.
        for m in &mut self.status.metrics {
            m.successes = 0;
            m.failures = 0;
            m.inconclusive = 0;
        }
    }

    /// Folds a measurement into the metric counters; returns (passed, failed) for this analysis.
    fn record(&mut self, analysis: &Analysis, verdicts: &[(String, Verdict)], now: i64) -> (bool, Option<String>) {
        for (name, v) in verdicts {
            let idx = match self.status.metrics.iter().position(|m| &m.name == name) {
                Some(i) => i,
                None => {
                    self.status.metrics.push(MetricStatus {
                        name: name.clone(),
                        ..Default::default()
                    });
                    self.status.metrics.len() - 1
                }
            };
            let m = &mut self.status.metrics[idx];
            m.last_measured_at = Some(rfc(now));
            match v {
                Verdict::Success(x) => {
                    m.successes += 1;
                    m.consecutive_errors = 0;
                    m.last_value = Some(format!("{x:.3}"));
                }
                Verdict::Failure(x) => {
                    m.failures += 1;
                    m.consecutive_errors = 0;
                    m.last_value = Some(if x.is_nan() {
                        "no data".into()
                    } else {
                        format!("{x:.3}")
                    });
                }
                Verdict::Inconclusive(why) => {
                    m.inconclusive += 1;
                    m.consecutive_errors = 0;
                    m.last_value = Some(format!("inconclusive: {why}"));
                }
                Verdict::Error(why) => {
                    m.errors += 1;
                    m.consecutive_errors += 1;
                    m.last_value = Some(format!("error: {why}"));
                }
            }
        }
        let names: Vec<&str> = analysis.metrics.iter().map(|m| m.name.as_str()).collect();
        let ours = self.status.metrics.iter().filter(|m| names.contains(&m.name.as_str()));
        let mut passed = true;
        for m in ours {
            if m.failures > analysis.failure_limit {
                return (
                    false,
                    Some(format!(
                        "metric {} failed {} times (failureLimit {}), last value {}",
                        m.name,
                        m.failures,
                        analysis.failure_limit,
                        m.last_value.clone().unwrap_or_default()
                    )),
                );
            }
            if m.consecutive_errors > analysis.consecutive_error_limit {
                return (
                    false,
                    Some(format!(
                        "metric {} errored {} times in a row (consecutiveErrorLimit {}): {}",
                        m.name,
                        m.consecutive_errors,
                        analysis.consecutive_error_limit,
                        m.last_value.clone().unwrap_or_default()
                    )),
                );
            }
            if m.successes < analysis.count {
                passed = false;
            }
        }
        (
            passed && names.iter().all(|n| self.status.metrics.iter().any(|m| &m.name == n)),
            None,
        )
    }
}

/// One step of the machine.
pub fn decide(
    strategy: &CanaryStrategy,
    previous: Option<&CanaryStatus>,
    total: i32,
    obs: &Observations,
    command: Option<Command>,
) -> Decision {
    let now = obs.now;
    let plain = |status: CanaryStatus, events: Vec<Event>| Decision {
        status,
        stable_template: StableTemplate::Desired,
        stable_replicas: total,
        canary_replicas: None,
        events,
        requeue_after: 300,
        aborted: None,
    };
    let idle = |message: &str| CanaryStatus {
        phase: IDLE.into(),
        stable_revision: obs.stable_revision.clone(),
        message: Some(message.to_string()),
        ..Default::default()
    };

    // First deploy: nothing to compare against.
    let Some(stable_rev) = obs.stable_revision.clone() else {
        return plain(idle("first deployment"), vec![]);
    };
    let mut run = Run {
        status: previous.cloned().unwrap_or_else(|| idle("")),
        events: Vec::new(),
        aborted: None,
    };
    let in_rollout = matches!(
        run.status.phase.as_str(),
        PROGRESSING | PAUSED | ANALYZING | PROMOTING | ABORTED
    );

    if stable_rev == obs.desired_revision {
        // Stable already runs the canary revision: we promoted it (even if the status we were
        // handed predates that write).
        if in_rollout
            && run.status.phase != ABORTED
            && run.status.canary_revision.as_deref() == Some(stable_rev.as_str())
        {
            run.status.phase = PROMOTING.into();
        }
        if in_rollout && run.status.phase != PROMOTING {
            // The spec went back to what stable runs: the rollout is moot.
            let mut s = idle("spec returned to the stable revision; rollout cancelled");
            s.stable_revision = Some(stable_rev);
            return plain(
                s,
                vec![Event {
                    warning: false,
                    reason: "RolloutCancelled",
                    message: "spec returned to the stable revision".into(),
                }],
            );
        }
        if run.status.phase == PROMOTING {
            // Stable now runs the new revision; finish once its pods are all there.
            if obs.stable_rolled_out {
                run.status.phase = COMPLETED.into();
                run.status.weight = 100;
                run.status.stable_revision = Some(stable_rev.clone());
                run.status.message = Some(format!("revision {stable_rev} promoted to stable"));
                run.event(false, "RolloutCompleted", format!("revision {stable_rev} is stable"));
                return Decision {
                    status: run.status,
                    stable_template: StableTemplate::Desired,
                    stable_replicas: total,
                    canary_replicas: None,
                    events: run.events,
                    requeue_after: 300,
                    aborted: None,
                };
            }
            return Decision {
                status: run.status,
                stable_template: StableTemplate::Desired,
                stable_replicas: total,
                canary_replicas: Some(obs.canary_ready.max(0)),
                events: run.events,
                requeue_after: 2,
                aborted: None,
            };
        }
        let status = if run.status.phase == COMPLETED {
            run.status
        } else {
            idle("stable runs the spec's revision")
        };
        return plain(status, vec![]);
    }

    // A new revision: start, or supersede a rollout of another revision.
    if run.status.canary_revision.as_deref() != Some(obs.desired_revision.as_str()) {
        let superseded = in_rollout && run.status.phase != ABORTED;
        run.status = fresh_status(&obs.desired_revision, Some(&stable_rev), now);
        if superseded {
            run.event(
                false,
                "RolloutSuperseded",
                format!(
                    "a newer revision {} replaces the rollout in progress",
                    obs.desired_revision
                ),
            );
        }
        run.event(
            false,
            "RolloutStarted",
            format!("canary revision {} (stable {stable_rev})", obs.desired_revision),
        );
    }

    match command {
        Some(Command::Abort) if run.status.phase != ABORTED => run.abort("ManualAbort", "aborted by request".into()),
        Some(Command::Retry) if run.status.phase == ABORTED => {
            run.status = fresh_status(&obs.desired_revision, Some(&stable_rev), now);
            run.event(false, "RolloutRetried", "rollout restarted from the first step".into());
        }
        Some(Command::Pause) if run.status.phase != ABORTED => {
            run.status.phase = PAUSED.into();
            run.status.pause_started_at.get_or_insert_with(|| rfc(now));
            run.status.message = Some("paused by request".into());
        }
        _ => {}
    }

    if run.status.phase == ABORTED {
        return run.into_aborted(total);
    }

    // Background analysis judges every step once the canary carries traffic.
    if let (Some(verdicts), Some((analysis, false))) = (&obs.measurement, active_analysis(strategy, &run.status)) {
        let (_, failed) = run.record(analysis, verdicts, now);
        if let Some(why) = failed {
            run.abort("AnalysisFailed", why);
            return run.into_aborted(total);
        }
    }

    let manual_pause = run.status.phase == PAUSED
        && command != Some(Command::Resume)
        && command != Some(Command::Promote)
        && command != Some(Command::PromoteFull)
        && strategy
            .steps
            .get(run.status.current_step_index as usize)
            .is_none_or(|s| s.pause.is_none());
    if command == Some(Command::PromoteFull) {
        run.status.current_step_index = strategy.steps.len() as i32;
        run.event(false, "PromotedFull", "all remaining steps skipped by request".into());
    }
    let mut requeue = 2u64;
    let mut promote_pending = command == Some(Command::Promote);
    let mut target_weight = run.status.weight;
    // Walk through steps that complete immediately, but at most one weight change per call.
    for _ in 0..strategy.steps.len() + 1 {
        if manual_pause {
            requeue = 300;
            break;
        }
        let idx = run.status.current_step_index as usize;
        let Some(step) = strategy.steps.get(idx) else {
            run.status.phase = PROMOTING.into();
            run.status.message = Some("promoting: stable rolls to the canary revision".into());
            return Decision {
                status: run.status,
                stable_template: StableTemplate::Desired,
                stable_replicas: total,
                canary_replicas: Some(obs.canary_ready.max(canary_replicas(total, 0))),
                events: run.events,
                requeue_after: 2,
                aborted: None,
            };
        };
        // A promote finishes exactly one step.
        let promote_now = std::mem::take(&mut promote_pending);
        if let Some(w) = step.set_weight {
            run.status.phase = PROGRESSING.into();
            let target = canary_replicas(total, w);
            if obs.canary_ready >= target || promote_now {
                run.status.weight = w;
                run.status.message = Some(format!("step {idx}: weight {w}% reached ({target} canary pod(s))"));
                run.event(false, "StepCompleted", format!("step {idx}: weight {w}%"));
                run.next_step(now);
                // Give the new weight time to carry traffic before anything else happens.
                break;
            }
            // Scale towards the step's weight; status.weight changes once it is reached.
            target_weight = w;
            run.status.message = Some(format!(
                "step {idx}: waiting for {target} canary pod(s) ready ({} now)",
                obs.canary_ready
            ));
            break;
        } else if let Some(p) = &step.pause {
            run.status.phase = PAUSED.into();
            let started = parse_time(&run.status.pause_started_at).unwrap_or(now);
            run.status.pause_started_at = Some(rfc(started));
            let done = match p.duration {
                Some(d) => now - started >= d.get().as_secs() as i64,
                None => false,
            };
            if done || promote_now {
                run.event(false, "StepCompleted", format!("step {idx}: pause over"));
                run.next_step(now);
                continue;
            }
            run.status.message = Some(match p.duration {
                Some(d) => format!("step {idx}: paused for {d}"),
                None => format!("step {idx}: paused until promoted"),
            });
            requeue = p
                .duration
                .map(|d| (started + d.get().as_secs() as i64 - now).clamp(1, 300) as u64)
                .unwrap_or(300);
            break;
        } else if let Some(a) = &step.analysis {
            run.status.phase = ANALYZING.into();
            if promote_now {
                run.event(
                    false,
                    "StepCompleted",
                    format!("step {idx}: analysis skipped by request"),
                );
                run.next_step(now);
                continue;
            }
            if let Some(verdicts) = &obs.measurement {
                let (passed, failed) = run.record(a, verdicts, now);
                if let Some(why) = failed {
                    run.abort("AnalysisFailed", why);
                    return run.into_aborted(total);
                }
                if passed {
                    run.event(false, "AnalysisPassed", format!("step {idx}: analysis passed"));
                    run.next_step(now);
                    continue;
                }
            }
            run.status.message = Some(format!("step {idx}: analysing (every {})", a.interval));
            requeue = a.interval.get().as_secs().max(1);
            break;
        } else {
            run.next_step(now);
        }
    }
    if let Some((a, _)) = active_analysis(strategy, &run.status) {
        requeue = requeue.min(a.interval.get().as_secs().max(1));
    }
    let canary = canary_replicas(total, target_weight.max(run.status.weight));
    Decision {
        status: run.status,
        stable_template: StableTemplate::Current,
        stable_replicas: (total - canary).max(0),
        canary_replicas: Some(canary),
        events: run.events,
        requeue_after: requeue,
        aborted: run.aborted,
    }
}
