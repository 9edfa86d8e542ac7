//! The canary state machine: a pure function from (spec, status, observations, command, now)
//! to (new status, what to run, events). Everything needed to resume lives in the status, so
//! an operator restart continues exactly where it stopped: no step repeated or skipped.
//!
//! Safety invariants (docs/canary.md; property-tested in `machine_props`):
//! (a) with background analysis gating steps, no step is left and no revision promoted while
//!     the canary carries traffic unless the latest measurement taken entirely at the current
//!     weight passed every metric; every measurement is counted in the same decision;
//! (b) background failures are never reset inside a rollout (steps, restarts, leader changes);
//! (c) an analysis whose every conclusive measurement fails aborts after failureLimit + 1.

use super::analysis::Verdict;
use super::spec::{Analysis, AnalysisKind, CanaryPhase, CanaryStatus, CanaryStep, CanaryStrategy, MetricStatus};

pub const IDLE: CanaryPhase = CanaryPhase::Idle;
pub const PROGRESSING: CanaryPhase = CanaryPhase::Progressing;
pub const PAUSED: CanaryPhase = CanaryPhase::Paused;
pub const ANALYZING: CanaryPhase = CanaryPhase::Analyzing;
pub const PROMOTING: CanaryPhase = CanaryPhase::Promoting;
pub const COMPLETED: CanaryPhase = CanaryPhase::Completed;
pub const ABORTED: CanaryPhase = CanaryPhase::Aborted;

/// Default seconds a canary step may wait for its pods (Deployment's progressDeadlineSeconds).
pub const DEFAULT_PROGRESS_DEADLINE: i64 = 600;

/// A manual command (from an annotation or the kubectl plugin).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Finish the current step now (skips a pause, a blocking analysis or a weight's judgement).
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

/// One measurement of the analysis active in the status the shell read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measurement {
    /// Start of the window the numbers cover (unix seconds).
    pub window_start: i64,
    /// (metric name, verdict).
    pub verdicts: Vec<(String, Verdict)>,
}

/// What the reconciler observed this time.
#[derive(Clone, Debug)]
pub struct Observations {
    /// Revision the spec asks for now.
    pub desired_revision: String,
    /// Revision of the running stable Deployment (None before the first deploy).
    pub stable_revision: Option<String>,
    /// Stable Deployment has all its pods on its current template and ready.
    pub stable_rolled_out: bool,
    /// Ready pods on the canary Deployment's current template (0 when there is none).
    pub canary_ready: i32,
    /// A measurement taken this reconcile, of the analysis `active_analysis` named.
    pub measurement: Option<Measurement>,
    /// Seconds a setWeight step may wait for its canary pods before the rollout aborts.
    pub progress_deadline: i64,
    /// Why canary pods are not ready (pod reason and the proxy's last words), when known.
    pub canary_problem: Option<String>,
    /// Where the weights are pushed to the proxies (AppRollouts): whether every proxy pod has
    /// confirmed the weight the status holds. None where pod counts carry the weight (fleets).
    pub weights_confirmed: Option<bool>,
    /// The object's `proxyfleet.io/retry-token` annotation: recorded by a retry it takes.
    pub retry_token: Option<String>,
    pub now: i64,
}

impl Default for Observations {
    fn default() -> Self {
        Self {
            desired_revision: String::new(),
            stable_revision: None,
            stable_rolled_out: false,
            canary_ready: 0,
            measurement: None,
            progress_deadline: DEFAULT_PROGRESS_DEADLINE,
            canary_problem: None,
            weights_confirmed: None,
            retry_token: None,
            now: 0,
        }
    }
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

/// When the current step started (unix seconds).
pub fn started_at(status: &CanaryStatus) -> Option<i64> {
    parse_time(&status.step_started_at)
}

fn parse_time(s: &Option<String>) -> Option<i64> {
    let t = s.as_deref()?;
    time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp())
}

/// The analysis that runs at this point: the blocking one of an analysis step, else the
/// background one once the canary carries traffic.
pub fn active_analysis<'a>(
    strategy: &'a CanaryStrategy,
    status: &CanaryStatus,
) -> Option<(&'a Analysis, AnalysisKind)> {
    if !matches!(status.phase, PROGRESSING | ANALYZING | PAUSED) {
        return None;
    }
    if let Some(CanaryStep { analysis: Some(a), .. }) = strategy.steps.get(status.current_step_index as usize) {
        return Some((a, AnalysisKind::Step));
    }
    match &strategy.analysis {
        Some(a) if status.weight > 0 => Some((a, AnalysisKind::Background)),
        _ => None,
    }
}

fn last_measured(status: &CanaryStatus, kind: AnalysisKind) -> Option<i64> {
    status
        .metrics
        .iter()
        .filter(|m| m.analysis == kind)
        .filter_map(|m| parse_time(&m.last_measured_at))
        .max()
}

/// Whether a measurement is due now (the shell measures, then calls `decide`).
pub fn measurement_due(strategy: &CanaryStrategy, status: &CanaryStatus, now: i64) -> bool {
    let Some((analysis, kind)) = active_analysis(strategy, status) else {
        return false;
    };
    let interval = analysis.interval.get().as_secs() as i64;
    let last = last_measured(status, kind);
    match kind {
        // A step's first measurement comes one interval into the step, like every later one.
        AnalysisKind::Step => {
            let since = last.or_else(|| parse_time(&status.step_started_at));
            since.is_none_or(|t| now - t >= interval)
        }
        AnalysisKind::Background => {
            // Measure as soon as a window fits entirely at the current weight, then per interval.
            let first_full = first_full_window(analysis, status);
            let awaiting = gate_pending(status) && first_full.is_some_and(|f| now >= f && last.is_none_or(|l| l < f));
            awaiting || last.is_none_or(|t| now - t >= interval)
        }
    }
}

/// When a window of `analysis` first lies entirely at the current weight.
fn first_full_window(analysis: &Analysis, status: &CanaryStatus) -> Option<i64> {
    parse_time(&status.weight_reached_at).map(|t| t + analysis.window.get().as_secs() as i64)
}

fn gate_pending(status: &CanaryStatus) -> bool {
    status.weight > 0 && !status.weight_verified
}

fn fresh_status(desired: &str, stable: Option<&str>, now: i64) -> CanaryStatus {
    CanaryStatus {
        phase: PROGRESSING,
        stable_revision: stable.map(str::to_string),
        canary_revision: Some(desired.to_string()),
        step_started_at: Some(rfc(now)),
        message: Some("rollout started".into()),
        ..Default::default()
    }
}

/// Why an analysis aborts the rollout, if it does: its failure or error limits are exceeded.
fn exceeded(analysis: &Analysis, kind: AnalysisKind, metrics: &[MetricStatus]) -> Option<String> {
    let ours = metrics
        .iter()
        .filter(|m| m.analysis == kind && analysis.metrics.iter().any(|a| a.name == m.name));
    for m in ours {
        let last = m.last_value.as_deref().unwrap_or_default();
        if m.failures > analysis.failure_limit {
            let (n, limit) = (m.failures, analysis.failure_limit);
            return Some(format!(
                "metric {} failed {n} times (failureLimit {limit}), last value {last}",
                m.name
            ));
        }
        if m.consecutive_errors > analysis.consecutive_error_limit {
            let (n, limit) = (m.consecutive_errors, analysis.consecutive_error_limit);
            return Some(format!(
                "metric {} errored {n} times in a row (consecutiveErrorLimit {limit}): {last}",
                m.name
            ));
        }
    }
    None
}

/// Every metric of a blocking analysis has `count` successes.
fn step_passed(analysis: &Analysis, metrics: &[MetricStatus]) -> bool {
    analysis.metrics.iter().all(|a| {
        metrics
            .iter()
            .any(|m| m.analysis == AnalysisKind::Step && m.name == a.name && m.successes >= analysis.count)
    })
}

fn count_verdict(m: &mut MetricStatus, v: &Verdict, now: i64) {
    m.last_measured_at = Some(rfc(now));
    if !matches!(v, Verdict::Error(_)) {
        m.consecutive_errors = 0;
    }
    match v {
        Verdict::Success(x) => {
            m.successes += 1;
            m.last_value = Some(format!("{x:.3}"));
        }
        Verdict::Failure(x) => {
            m.failures += 1;
            m.last_value = Some(if x.is_nan() {
                "no data".into()
            } else {
                format!("{x:.3}")
            });
        }
        Verdict::Inconclusive(why) => {
            m.inconclusive += 1;
            m.last_value = Some(format!("inconclusive: {why}"));
        }
        Verdict::Error(why) => {
            m.errors += 1;
            m.consecutive_errors += 1;
            m.last_value = Some(format!("error: {why}"));
        }
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
        self.status.phase = ABORTED;
        self.status.weight = 0;
        self.status.weight_verified = false;
        self.status.abort_reason = Some(reason.to_string());
        self.status.message = Some(message.clone());
        self.aborted = Some(reason.to_string());
        self.event(true, "RolloutAborted", message);
    }

    fn next_step(&mut self, now: i64) {
        self.status.current_step_index += 1;
        self.status.step_started_at = Some(rfc(now));
        self.status.pause_started_at = None;
        // A step's blocking analysis ends with it; background counters carry on.
        self.status.metrics.retain(|m| m.analysis == AnalysisKind::Background);
    }

    fn set_weight(&mut self, weight: i32, now: i64) {
        self.status.weight = weight;
        self.status.weight_reached_at = Some(rfc(now));
        self.status.weight_verified = false;
    }

    /// Folds a measurement into the counters of `kind`.
    fn record(&mut self, kind: AnalysisKind, m: &Measurement, now: i64) {
        for (name, v) in &m.verdicts {
            let pos = self
                .status
                .metrics
                .iter()
                .position(|s| s.analysis == kind && &s.name == name);
            let idx = pos.unwrap_or_else(|| {
                self.status.metrics.push(MetricStatus {
                    name: name.clone(),
                    analysis: kind,
                    ..Default::default()
                });
                self.status.metrics.len() - 1
            });
            count_verdict(&mut self.status.metrics[idx], v, now);
        }
    }

    /// Counts a background measurement and judges the current weight by it; aborts past limits.
    fn record_background(&mut self, analysis: &Analysis, m: &Measurement, now: i64) {
        self.record(AnalysisKind::Background, m, now);
        let at_weight = parse_time(&self.status.weight_reached_at).is_some_and(|t| m.window_start >= t);
        if at_weight {
            let all_passed = analysis.metrics.iter().all(|a| {
                m.verdicts
                    .iter()
                    .any(|(n, v)| n == &a.name && matches!(v, Verdict::Success(_)))
            });
            self.status.weight_verified = all_passed;
        }
        if let Some(why) = exceeded(analysis, AnalysisKind::Background, &self.status.metrics) {
            self.abort("AnalysisFailed", why);
        }
    }

    /// Counts a measurement of the current step's blocking analysis; aborts past its limits.
    fn record_step(&mut self, analysis: &Analysis, m: &Measurement, now: i64) {
        self.record(AnalysisKind::Step, m, now);
        if let Some(why) = exceeded(analysis, AnalysisKind::Step, &self.status.metrics) {
            self.abort("AnalysisFailed", why);
        }
    }
}

/// The decision when nothing should run but the spec's revision on stable.
fn plain(status: CanaryStatus, events: Vec<Event>, total: i32) -> Decision {
    Decision {
        status,
        stable_template: StableTemplate::Desired,
        stable_replicas: total,
        canary_replicas: None,
        events,
        requeue_after: 300,
        aborted: None,
    }
}

/// No stable Deployment: a first deployment, or one deleted (by hand) during a rollout. The
/// spec's revision is deployed as stable either way (nothing else is known to run), but the
/// latter is said loudly: a rollout in progress or aborted ends there, its revision unjudged.
fn no_stable(previous: Option<&CanaryStatus>, total: i32, obs: &Observations) -> Decision {
    let Some(p) = previous.filter(|p| p.phase.in_rollout()) else {
        return plain(idle(None, "first deployment"), vec![], total);
    };
    let message = format!(
        "the stable Deployment is gone during the {} rollout of {}: revision {} is deployed as stable, unjudged",
        p.phase,
        p.canary_revision.as_deref().unwrap_or("?"),
        obs.desired_revision
    );
    let event = Event {
        warning: true,
        reason: "StableMissing",
        message: message.clone(),
    };
    plain(idle(None, &message), vec![event], total)
}

fn idle(stable: Option<String>, message: &str) -> CanaryStatus {
    CanaryStatus {
        phase: IDLE,
        stable_revision: stable,
        message: Some(message.to_string()),
        ..Default::default()
    }
}

/// One step of the machine. A retry token once recorded stays in the status whatever the
/// status becomes after (a new rollout, idle, completed), until a newer retry replaces it: a
/// hub reading it must never take a later abort for one before its retry.
pub fn decide(
    strategy: &CanaryStrategy,
    previous: Option<&CanaryStatus>,
    total: i32,
    obs: &Observations,
    command: Option<Command>,
) -> Decision {
    let mut decision = decide_pass(strategy, previous, total, obs, command);
    // A retry read is done whatever the pass made of it (restarted, or started over anyway).
    let retried = obs.retry_token.clone().filter(|_| command == Some(Command::Retry));
    decision.status.retry_token = retried.or_else(|| {
        let kept = decision.status.retry_token.take();
        kept.or_else(|| previous.and_then(|p| p.retry_token.clone()))
    });
    decision
}

fn decide_pass(
    strategy: &CanaryStrategy,
    previous: Option<&CanaryStatus>,
    total: i32,
    obs: &Observations,
    command: Option<Command>,
) -> Decision {
    // First deploy: nothing to compare against.
    let Some(stable_rev) = obs.stable_revision.clone() else {
        return no_stable(previous, total, obs);
    };
    let mut run = Run {
        status: previous
            .cloned()
            .unwrap_or_else(|| idle(obs.stable_revision.clone(), "")),
        events: Vec::new(),
        aborted: None,
    };
    if stable_rev == obs.desired_revision {
        if run.status.phase == PROMOTING {
            refuse_while_promoting(&mut run, command);
        }
        return settle(run, &stable_rev, total, obs);
    }
    let started = start_or_supersede(&mut run, &stable_rev, obs);
    let restarted = restart_on_new_strategy(&mut run, &strategy_hash(strategy), &stable_rev, obs);
    // Every measurement is counted before anything moves, whatever the step or a command does
    // (an abort by request in the same pass included); one taken for a rollout that just
    // started over belongs to no step of it.
    let measurement = obs.measurement.as_ref().filter(|_| !started && !restarted);
    let command = for_this_rollout(&mut run, command, started || restarted);
    match (active_analysis(strategy, &run.status), measurement) {
        (Some((analysis, AnalysisKind::Background)), Some(m)) => run.record_background(analysis, m, obs.now),
        (Some((analysis, AnalysisKind::Step)), Some(m)) => run.record_step(analysis, m, obs.now),
        _ => {}
    }
    apply_command(&mut run, command, &stable_rev, obs);
    if run.status.phase != ABORTED {
        check_progress_deadline(&mut run, strategy, total, obs);
    }
    if run.status.phase == ABORTED {
        return run.into_aborted(total);
    }
    walk_steps(run, strategy, total, obs, command)
}

/// Stable already runs the spec's revision: finish a promotion, or leave the machine idle.
fn settle(mut run: Run, stable_rev: &str, total: i32, obs: &Observations) -> Decision {
    let in_rollout = run.status.phase.in_rollout();
    // Stable runs the canary revision: we promoted it (even if the status we were handed
    // predates that write).
    if in_rollout && run.status.phase != ABORTED && run.status.canary_revision.as_deref() == Some(stable_rev) {
        run.status.phase = PROMOTING;
    }
    // A promotion of another revision than stable now runs (the spec went back while stable
    // was still rolling to the canary's) is cancelled too, not reported as promoting this one.
    let promoting_this = run.status.phase == PROMOTING && run.status.canary_revision.as_deref() == Some(stable_rev);
    if in_rollout && !promoting_this {
        let s = idle(
            Some(stable_rev.to_string()),
            "spec returned to the stable revision; rollout cancelled",
        );
        let cancelled = Event {
            warning: false,
            reason: "RolloutCancelled",
            message: "spec returned to the stable revision".into(),
        };
        return plain(s, vec![cancelled], total);
    }
    if run.status.phase != PROMOTING {
        let status = if run.status.phase == COMPLETED {
            run.status
        } else {
            idle(obs.stable_revision.clone(), "stable runs the spec's revision")
        };
        return plain(status, vec![], total);
    }
    if !obs.stable_rolled_out {
        // Stable rolls to the new revision; the canary pods serve until it is there.
        return Decision {
            canary_replicas: Some(obs.canary_ready.max(0)),
            requeue_after: 2,
            ..plain(run.status, run.events, total)
        };
    }
    run.status.phase = COMPLETED;
    run.status.weight = 100;
    run.status.stable_revision = Some(stable_rev.to_string());
    run.status.message = Some(format!("revision {stable_rev} promoted to stable"));
    run.event(false, "RolloutCompleted", format!("revision {stable_rev} is stable"));
    plain(run.status, run.events, total)
}

/// A new revision: start, or supersede a rollout of another revision. Whether it started.
fn start_or_supersede(run: &mut Run, stable_rev: &str, obs: &Observations) -> bool {
    // The same revision's rollout goes on; one that ended (completed, then the spec went
    // elsewhere and came back) starts again from its first step, never at its last.
    let ongoing = run.status.phase.in_rollout();
    if ongoing && run.status.canary_revision.as_deref() == Some(obs.desired_revision.as_str()) {
        return false;
    }
    let superseded = run.status.phase.in_rollout() && run.status.phase != ABORTED;
    run.status = fresh_status(&obs.desired_revision, Some(stable_rev), obs.now);
    if superseded {
        let msg = format!(
            "a newer revision {} replaces the rollout in progress",
            obs.desired_revision
        );
        run.event(false, "RolloutSuperseded", msg);
    }
    let msg = format!("canary revision {} (stable {stable_rev})", obs.desired_revision);
    run.event(false, "RolloutStarted", msg);
    true
}

/// A short hash of the strategy as written (steps, analyses, thresholds, limits).
pub fn strategy_hash(strategy: &CanaryStrategy) -> String {
    crate::desired::short_hash(strategy, 6)
}

/// A strategy edited during a rollout starts it again from its first step, with fresh counts:
/// steps, thresholds and limits judged under another strategy say nothing of this one (a step
/// index kept across an edit could land past a blocking analysis). An aborted rollout stays
/// aborted; a status written before the hash existed adopts it without a restart.
fn restart_on_new_strategy(run: &mut Run, hash: &str, stable_rev: &str, obs: &Observations) -> bool {
    let known = run.status.strategy_hash.replace(hash.to_string());
    let running = run.status.phase.in_rollout() && run.status.phase != ABORTED;
    if !running || known.is_none_or(|k| k == hash) {
        return false;
    }
    let paused = run.status.paused_by_request;
    run.status = fresh_status(&obs.desired_revision, Some(stable_rev), obs.now);
    run.status.strategy_hash = Some(hash.to_string());
    if paused {
        // Paused by request it stays, at its first step, until resumed.
        pause_by_request(&mut run.status, obs.now);
    }
    run.event(
        false,
        "RolloutRestarted",
        "the canary strategy changed during the rollout; it starts again from its first step".into(),
    );
    true
}

/// Held by `kubectl proxyfleet pause` until resumed or promoted (a pause step's start kept).
fn pause_by_request(status: &mut CanaryStatus, now: i64) {
    status.paused_by_request = true;
    status.phase = PAUSED;
    status.pause_started_at.get_or_insert_with(|| rfc(now));
    status.message = Some("paused by request".into());
}

/// Stable already takes the canary's revision: an abort or a pause can no longer stop it (the
/// old template is gone from the stable Deployment). Said, not swallowed; `kubectl proxyfleet
/// undo` is the way back.
fn refuse_while_promoting(run: &mut Run, command: Option<Command>) {
    if let Some(c @ (Command::Abort | Command::Pause)) = command {
        let message = format!(
            "{c:?} not done: revision {} is already being promoted to stable; use `kubectl proxyfleet undo` to go back",
            run.status.canary_revision.as_deref().unwrap_or("?")
        );
        run.event(true, "CommandIgnored", message);
    }
}

/// A command that moves a rollout forward (promote, promote-full, resume, retry), read in the
/// pass its rollout started over (a new revision, a new strategy), was meant for the rollout
/// before: it is not applied to this one, which nobody has looked at yet. Abort and pause still
/// are (they only hold traffic back).
fn for_this_rollout(run: &mut Run, command: Option<Command>, started_over: bool) -> Option<Command> {
    match command {
        Some(c @ (Command::Promote | Command::PromoteFull | Command::Resume | Command::Retry)) if started_over => {
            let message = format!(
                "{c:?} not done: it was sent before the rollout of revision {} started over; send it again if it is meant for this one",
                run.status.canary_revision.as_deref().unwrap_or("?")
            );
            run.event(true, "CommandIgnored", message);
            None
        }
        other => other,
    }
}

fn apply_command(run: &mut Run, command: Option<Command>, stable_rev: &str, obs: &Observations) {
    if run.status.phase == PROMOTING {
        return refuse_while_promoting(run, command);
    }
    match command {
        Some(Command::Abort) if run.status.phase != ABORTED => run.abort("ManualAbort", "aborted by request".into()),
        Some(Command::Retry) if taken_before(&run.status, obs) => {
            let message = format!(
                "Retry not done: retry {} was taken already (status.canary.retryToken); to retry by hand, send it with `kubectl proxyfleet retry`, which drops the token",
                obs.retry_token.as_deref().unwrap_or_default()
            );
            run.event(true, "CommandIgnored", message);
        }
        Some(Command::Retry) if run.status.phase == ABORTED => {
            run.status = fresh_status(&obs.desired_revision, Some(stable_rev), obs.now);
            run.status.retry_token = obs.retry_token.clone();
            run.event(false, "RolloutRetried", "rollout restarted from the first step".into());
        }
        // The step's clock restarts: the time spent paused is not the pods' to be late by (its
        // progress deadline would otherwise abort a step resumed after a long pause).
        Some(Command::Resume) if run.status.phase == PAUSED => {
            run.status.step_started_at = Some(rfc(obs.now));
            run.status.paused_by_request = false;
        }
        Some(Command::Promote | Command::PromoteFull) => run.status.paused_by_request = false,
        Some(Command::Pause) if run.status.phase != ABORTED => pause_by_request(&mut run.status, obs.now),
        _ => {}
    }
}

/// A retry carrying a token (a hub's wave retry) that this canary recorded already: a hub that
/// asked again, not knowing it was taken, must not restart the canary a second time.
fn taken_before(status: &CanaryStatus, obs: &Observations) -> bool {
    obs.retry_token.is_some() && obs.retry_token == status.retry_token
}

/// A setWeight step whose canary pods are not ready within the progress deadline aborts.
fn check_progress_deadline(run: &mut Run, strategy: &CanaryStrategy, total: i32, obs: &Observations) {
    let idx = run.status.current_step_index as usize;
    let Some(w) = strategy.steps.get(idx).and_then(|s| s.set_weight) else {
        return;
    };
    let target = canary_replicas(total, w);
    let waiting = run.status.weight != w && obs.canary_ready < target;
    let started = parse_time(&run.status.step_started_at).unwrap_or(obs.now);
    if waiting && run.status.phase != PAUSED && obs.now - started >= obs.progress_deadline {
        let why = obs.canary_problem.as_deref().unwrap_or("no pod reported a reason");
        let msg = format!(
            "step {idx}: {} of {target} canary pod(s) ready after {}s (progressDeadline {}s): {why}",
            obs.canary_ready,
            obs.now - started,
            obs.progress_deadline
        );
        run.abort("ProgressDeadlineExceeded", msg);
    }
}

/// Whether the current step may be left: with gating background analysis and traffic on the
/// canary, only right after a passing measurement taken entirely at the current weight.
fn may_leave(strategy: &CanaryStrategy, status: &CanaryStatus) -> bool {
    let gating = strategy.analysis.is_some() && strategy.gate_on_background_analysis;
    !gating || !gate_pending(status)
}

/// How a pass through one step ended.
enum StepOutcome {
    /// The step is done; look at the next one in the same decision.
    Next,
    /// Wait; re-decide after this many seconds at the latest.
    Wait(u64),
}

/// Walk through steps that complete at once, at most one weight change per call.
fn walk_steps(
    mut run: Run,
    strategy: &CanaryStrategy,
    total: i32,
    obs: &Observations,
    command: Option<Command>,
) -> Decision {
    let on_pause_step = strategy
        .steps
        .get(run.status.current_step_index as usize)
        .is_some_and(|s| s.pause.is_some());
    let manual_pause = run.status.phase == PAUSED
        && (run.status.paused_by_request || !on_pause_step)
        && !matches!(command, Some(Command::Resume | Command::Promote | Command::PromoteFull));
    if command == Some(Command::PromoteFull) {
        run.status.current_step_index = strategy.steps.len() as i32;
        run.event(false, "PromotedFull", "all remaining steps skipped by request".into());
    }
    let mut promote_now = command == Some(Command::Promote);
    let mut requeue = if manual_pause { 300 } else { 2 };
    let mut target_weight = run.status.weight;
    for _ in 0..strategy.steps.len() + 1 {
        if manual_pause {
            break;
        }
        let idx = run.status.current_step_index as usize;
        let Some(step) = strategy.steps.get(idx) else {
            if promote_now || command == Some(Command::PromoteFull) || may_leave(strategy, &run.status) {
                return promote(run, total, obs);
            }
            run.status.phase = PROGRESSING;
            run.status.message = Some(awaiting_verdict(&run.status, "promotion"));
            requeue = until_judged(strategy, &run.status, obs.now);
            break;
        };
        let outcome = if let Some(w) = step.set_weight {
            weight_step(&mut run, strategy, total, obs, w, promote_now, &mut target_weight)
        } else if let Some(p) = &step.pause {
            pause_step(
                &mut run,
                strategy,
                obs,
                p.duration.map(|d| d.get().as_secs() as i64),
                promote_now,
            )
        } else if let Some(a) = &step.analysis {
            analysis_step(&mut run, strategy, obs, a, promote_now)
        } else {
            run.next_step(obs.now);
            StepOutcome::Next
        };
        // A promote finishes exactly one step.
        promote_now = false;
        match outcome {
            StepOutcome::Next => continue,
            StepOutcome::Wait(s) => {
                requeue = s;
                break;
            }
        }
    }
    if run.status.phase == ABORTED {
        return run.into_aborted(total);
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

/// Seconds until the current weight can next be judged (its first full window, else an interval).
fn until_judged(strategy: &CanaryStrategy, status: &CanaryStatus, now: i64) -> u64 {
    let Some(a) = &strategy.analysis else { return 2 };
    let interval = a.interval.get().as_secs().max(1);
    match first_full_window(a, status) {
        Some(t) if t > now => ((t - now) as u64).clamp(1, interval),
        _ => interval,
    }
}

fn awaiting_verdict(status: &CanaryStatus, what: &str) -> String {
    let last = status
        .metrics
        .iter()
        .filter(|m| m.analysis == AnalysisKind::Background)
        .filter_map(|m| m.last_value.as_ref().map(|v| format!("{} {v}", m.name)))
        .collect::<Vec<_>>()
        .join(", ");
    let last = if last.is_empty() { "none yet".to_string() } else { last };
    format!(
        "weight {}%: {what} waits for a passing measurement taken entirely at this weight (last: {last})",
        status.weight
    )
}

fn promote(mut run: Run, total: i32, obs: &Observations) -> Decision {
    run.status.phase = PROMOTING;
    run.status.message = Some("promoting: stable rolls to the canary revision".into());
    Decision {
        canary_replicas: Some(obs.canary_ready.max(0)),
        requeue_after: 2,
        ..plain(run.status, run.events, total)
    }
}

fn weight_step(
    run: &mut Run,
    strategy: &CanaryStrategy,
    total: i32,
    obs: &Observations,
    w: i32,
    promote_now: bool,
    target_weight: &mut i32,
) -> StepOutcome {
    let idx = run.status.current_step_index;
    run.status.phase = PROGRESSING;
    if run.status.weight != w {
        let target = canary_replicas(total, w);
        if obs.canary_ready < target && !promote_now {
            // Scale towards the step's weight; status.weight changes once it is reached.
            *target_weight = w;
            let ready = obs.canary_ready;
            run.status.message = Some(format!(
                "step {idx}: waiting for {target} canary pod(s) ready ({ready} now)"
            ));
            return StepOutcome::Wait(2);
        }
        run.set_weight(w, obs.now);
        run.status.message = Some(format!("step {idx}: weight {w}% reached ({target} canary pod(s))"));
        if obs.weights_confirmed.is_some() && !promote_now {
            // Pushed after this decision: reached, and the step done, once every proxy pod has
            // taken it.
            run.status.weight_reached_at = None;
            return StepOutcome::Wait(2);
        }
        if !promote_now && !may_leave(strategy, &run.status) {
            return StepOutcome::Wait(until_judged(strategy, &run.status, obs.now));
        }
        run.event(false, "StepCompleted", format!("step {idx}: weight {w}%"));
        run.next_step(obs.now);
        // Give the new weight time to carry traffic before anything else happens.
        return StepOutcome::Wait(2);
    }
    match obs.weights_confirmed {
        Some(false) if !promote_now => return wait_for_weights(run, obs, w),
        // Reached from when every proxy has it: a window that began while some still sent the
        // weight before is not a window at this weight.
        Some(true) if run.status.weight_reached_at.is_none() => run.set_weight(w, obs.now),
        _ => {}
    }
    if promote_now || may_leave(strategy, &run.status) {
        run.event(false, "StepCompleted", format!("step {idx}: weight {w}% judged"));
        run.next_step(obs.now);
        return StepOutcome::Next;
    }
    run.status.message = Some(format!(
        "step {idx}: {}",
        awaiting_verdict(&run.status, "the next step")
    ));
    StepOutcome::Wait(until_judged(strategy, &run.status, obs.now))
}

/// A weight pushed to the proxies that not all have taken: not yet reached (no window judges
/// it), and given up at the step's progress deadline (a proxy pod that refuses it for good would
/// otherwise hold the rollout forever).
fn wait_for_weights(run: &mut Run, obs: &Observations, w: i32) -> StepOutcome {
    let idx = run.status.current_step_index;
    run.status.weight_reached_at = None;
    run.status.weight_verified = false;
    let started = parse_time(&run.status.step_started_at).unwrap_or(obs.now);
    if obs.now - started >= obs.progress_deadline {
        let msg = format!(
            "step {idx}: weight {w}% not taken by every proxy pod after {}s (progressDeadline {}s)",
            obs.now - started,
            obs.progress_deadline
        );
        run.abort("ProgressDeadlineExceeded", msg);
        return StepOutcome::Wait(2);
    }
    run.status.message = Some(format!(
        "step {idx}: weight {w}% set; waiting for every proxy pod to take it"
    ));
    StepOutcome::Wait(2)
}

fn pause_step(
    run: &mut Run,
    strategy: &CanaryStrategy,
    obs: &Observations,
    duration: Option<i64>,
    promote_now: bool,
) -> StepOutcome {
    let (idx, now) = (run.status.current_step_index, obs.now);
    run.status.phase = PAUSED;
    let started = parse_time(&run.status.pause_started_at).unwrap_or(now);
    run.status.pause_started_at = Some(rfc(started));
    let over = duration.is_some_and(|d| now - started >= d);
    if promote_now || (over && may_leave(strategy, &run.status)) {
        run.event(false, "StepCompleted", format!("step {idx}: pause over"));
        run.next_step(now);
        return StepOutcome::Next;
    }
    run.status.message = Some(match duration {
        Some(_) if over => format!(
            "step {idx}: pause over; {}",
            awaiting_verdict(&run.status, "the next step")
        ),
        Some(d) => format!("step {idx}: paused for {d}s"),
        None => format!("step {idx}: paused until promoted"),
    });
    StepOutcome::Wait(match duration {
        Some(d) => (started + d - now).clamp(1, 300) as u64,
        None => 300,
    })
}

fn analysis_step(
    run: &mut Run,
    strategy: &CanaryStrategy,
    obs: &Observations,
    a: &Analysis,
    promote_now: bool,
) -> StepOutcome {
    let idx = run.status.current_step_index;
    run.status.phase = ANALYZING;
    if promote_now {
        run.event(
            false,
            "StepCompleted",
            format!("step {idx}: analysis skipped by request"),
        );
        run.next_step(obs.now);
        return StepOutcome::Next;
    }
    if step_passed(a, &run.status.metrics) && may_leave(strategy, &run.status) {
        run.event(false, "AnalysisPassed", format!("step {idx}: analysis passed"));
        run.next_step(obs.now);
        return StepOutcome::Next;
    }
    run.status.message = Some(format!("step {idx}: analysing (every {})", a.interval));
    StepOutcome::Wait(a.interval.get().as_secs().max(1))
}
