//! Property tests of the canary machine's safety invariants (docs/canary.md) over random step
//! plans, timings, pod readiness, metric streams and operator restarts. An independent oracle
//! follows the measurements the machine was fed and checks every persisted decision.

use proptest::prelude::*;

use super::analysis::Verdict;
use super::machine::*;
use super::spec::{
    Analysis, AnalysisKind, CanaryStatus, CanaryStep, CanaryStrategy, Metric, MetricSource, OnNoData, Pause, Threshold,
};
use proxyfleet_config::HumanDuration;

const TOTAL: i32 = 5;

#[derive(Clone, Debug)]
enum StepKind {
    Weight,
    Pause(u64),
    Analysis(AnalysisParams),
}

#[derive(Clone, Debug)]
struct AnalysisParams {
    interval: u64,
    window: u64,
    count: i32,
    failure_limit: i32,
    error_limit: i32,
    two_metrics: bool,
}

fn analysis(p: &AnalysisParams) -> Analysis {
    let mut metrics = vec![Metric {
        name: "errors".into(),
        p99_latency_ms: None,
        error_rate5xx: Some(Threshold {
            max: Some(5.0),
            relative_to_stable: None,
        }),
        prometheus: None,
    }];
    if p.two_metrics {
        metrics.push(Metric {
            name: "p99".into(),
            p99_latency_ms: Some(Threshold {
                max: Some(200.0),
                relative_to_stable: None,
            }),
            error_rate5xx: None,
            prometheus: None,
        });
    }
    Analysis {
        interval: HumanDuration::from_secs(p.interval),
        window: HumanDuration::from_secs(p.window),
        count: p.count,
        failure_limit: p.failure_limit,
        consecutive_error_limit: p.error_limit,
        min_requests: 0,
        on_no_data: OnNoData::Inconclusive,
        source: MetricSource::default(),
        metrics,
    }
}

fn params() -> impl Strategy<Value = AnalysisParams> {
    (1u64..20, 1u64..40, 1i32..4, 0i32..3, 0i32..4, any::<bool>()).prop_map(
        |(interval, window, count, failure_limit, error_limit, two_metrics)| AnalysisParams {
            interval,
            window,
            count,
            failure_limit,
            error_limit,
            two_metrics,
        },
    )
}

fn step_kind() -> impl Strategy<Value = StepKind> {
    prop_oneof![
        3 => Just(StepKind::Weight),
        2 => (0u64..40).prop_map(StepKind::Pause),
        2 => params().prop_map(StepKind::Analysis),
    ]
}

/// A valid plan: 1-7 steps, setWeights strictly increasing, optional background analysis.
fn plan() -> impl Strategy<Value = CanaryStrategy> {
    (
        prop::collection::vec(step_kind(), 1..8),
        prop::option::weighted(0.8, params()),
        prop::bool::weighted(0.85),
        prop::collection::vec(1i32..=100, 8),
    )
        .prop_map(|(kinds, background, gate, mut weights)| {
            weights.sort();
            weights.dedup();
            let mut next_weight = weights.into_iter();
            let steps = kinds
                .into_iter()
                .filter_map(|k| {
                    Some(match k {
                        StepKind::Weight => CanaryStep {
                            set_weight: Some(next_weight.next()?),
                            pause: None,
                            analysis: None,
                        },
                        StepKind::Pause(d) => CanaryStep {
                            set_weight: None,
                            pause: Some(Pause {
                                duration: Some(HumanDuration::from_secs(d)),
                            }),
                            analysis: None,
                        },
                        StepKind::Analysis(p) => CanaryStep {
                            set_weight: None,
                            pause: None,
                            analysis: Some(analysis(&p)),
                        },
                    })
                })
                .collect();
            CanaryStrategy {
                steps,
                analysis: background.as_ref().map(analysis),
                gate_on_background_analysis: gate,
            }
        })
}

/// One tick of the world: time passes, pods get ready or not, the measurement (if one is due)
/// comes out some way, and the decision is persisted or lost to a restart.
#[derive(Clone, Debug)]
struct Tick {
    dt: i64,
    ready: i32,
    verdicts: [u8; 2],
    /// How far before `now - window` (or after) the window starts, as a direct scrape can.
    window_skew: i64,
    measured: bool,
    persisted: bool,
    /// A user's command with this tick (`kubectl proxyfleet pause|resume|abort`).
    command: Option<Command>,
}

/// Commands that never promote: the invariants hold whatever the user does with them.
fn command() -> impl Strategy<Value = Option<Command>> {
    prop_oneof![
        100 => Just(None),
        3 => Just(Some(Command::Pause)),
        3 => Just(Some(Command::Resume)),
        1 => Just(Some(Command::Abort)),
    ]
}

fn tick(bad_world: bool) -> impl Strategy<Value = Tick> {
    let verdict = if bad_world {
        // Every conclusive verdict fails; some are inconclusive or errors.
        prop_oneof![6 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)].boxed()
    } else {
        prop_oneof![6 => Just(0u8), 2 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)].boxed()
    };
    (
        1i64..15,
        prop_oneof![3 => Just(TOTAL), 1 => 0..=TOTAL],
        [verdict.clone(), verdict],
        -10i64..10,
        prop::bool::weighted(0.9),
        prop::bool::weighted(0.85),
        command(),
    )
        .prop_map(
            |(dt, ready, verdicts, window_skew, measured, persisted, command)| Tick {
                dt,
                ready,
                verdicts,
                window_skew,
                measured,
                persisted,
                command,
            },
        )
}

fn verdict(code: u8) -> Verdict {
    match code {
        0 => Verdict::Success(1.0),
        1 => Verdict::Failure(50.0),
        2 => Verdict::Inconclusive("few requests".into()),
        _ => Verdict::Error("source unreachable".into()),
    }
}

/// What the oracle knows, from the measurements fed to persisted decisions only.
#[derive(Default)]
struct Oracle {
    /// Time the current weight was reached (seen as a weight change between decisions).
    weight_since: i64,
    /// Whether the latest background measurement entirely at the current weight passed.
    latest_at_weight: Option<bool>,
    /// Background failures per metric since the rollout started.
    background_failures: [i32; 2],
    /// Failures per metric of the current blocking step.
    step_failures: [i32; 2],
    /// Steps whose completion was reported.
    completed_steps: Vec<i32>,
}

impl Oracle {
    /// Folds a measurement in, as counted by nobody but the oracle.
    fn fold(&mut self, prev: &CanaryStatus, active: Option<(&Analysis, AnalysisKind)>, m: Option<&Measurement>) {
        let (Some((a, kind)), Some(m)) = (active, m) else {
            return;
        };
        let fails = m.verdicts.iter().map(|(_, v)| matches!(v, Verdict::Failure(_)));
        for (i, f) in fails.enumerate() {
            match kind {
                AnalysisKind::Background => self.background_failures[i] += f as i32,
                AnalysisKind::Step => self.step_failures[i] += f as i32,
            }
        }
        if kind == AnalysisKind::Background && m.window_start >= self.weight_since && prev.weight > 0 {
            let passed =
                m.verdicts.iter().all(|(_, v)| matches!(v, Verdict::Success(_))) && m.verdicts.len() == a.metrics.len();
            self.latest_at_weight = Some(passed);
        }
    }

    /// Each step completes once across the whole run (restarts included).
    fn each_step_once(&mut self, d: &Decision) -> Result<(), TestCaseError> {
        let done = d
            .events
            .iter()
            .filter(|e| e.reason == "StepCompleted" || e.reason == "AnalysisPassed");
        for e in done {
            let idx: i32 = e
                .message
                .trim_start_matches("step ")
                .split(':')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(-1);
            prop_assert!(!self.completed_steps.contains(&idx), "step {} completed twice", idx);
            self.completed_steps.push(idx);
        }
        Ok(())
    }
}

struct Sim<'a> {
    strategy: &'a CanaryStrategy,
    persisted: Option<CanaryStatus>,
    stable: String,
    stable_rolled_out: bool,
    now: i64,
    oracle: Oracle,
    /// Some persisted decision promoted the canary revision.
    promoted: bool,
}

impl Sim<'_> {
    fn step(&mut self, t: &Tick) -> Result<(), TestCaseError> {
        self.now += t.dt;
        let prev = self.persisted.clone();
        let mut o = Observations {
            desired_revision: "new".into(),
            stable_revision: Some(self.stable.clone()),
            stable_rolled_out: self.stable_rolled_out,
            canary_ready: t.ready,
            now: self.now,
            progress_deadline: 10_000,
            ..Default::default()
        };
        let active = prev.as_ref().and_then(|p| {
            active_analysis(self.strategy, p).filter(|_| t.measured && measurement_due(self.strategy, p, self.now))
        });
        if let Some((a, _)) = active {
            let verdicts = a
                .metrics
                .iter()
                .zip(t.verdicts)
                .map(|(m, c)| (m.name.clone(), verdict(c)))
                .collect();
            let window_start = self.now - a.window.get().as_secs() as i64 + t.window_skew;
            o.measurement = Some(Measurement { window_start, verdicts });
        }
        let d = decide(self.strategy, prev.as_ref(), TOTAL, &o, t.command);
        if !t.persisted {
            return Ok(()); // a restart: this decision never reached the API server
        }
        if let Some(prev) = &prev {
            self.check(prev, &d, active, o.measurement.as_ref())?;
            commands_act(prev, &d.status, t.command)?;
        }
        // The weight's start, from the first persisted decision on (the one that starts the
        // canary sets its first weight too).
        if d.status.weight != prev.as_ref().map_or(0, |p| p.weight) {
            self.oracle.weight_since = self.now;
            self.oracle.latest_at_weight = None;
        }
        if d.stable_template == StableTemplate::Desired && d.status.phase == PROMOTING {
            self.stable = "new".into();
            self.stable_rolled_out = true;
            self.promoted = true;
        }
        self.persisted = Some(d.status);
        Ok(())
    }

    fn check(
        &mut self,
        prev: &CanaryStatus,
        d: &Decision,
        active: Option<(&Analysis, AnalysisKind)>,
        m: Option<&Measurement>,
    ) -> Result<(), TestCaseError> {
        let next = &d.status;
        let o = &mut self.oracle;
        o.fold(prev, active, m);
        let left_step =
            next.current_step_index > prev.current_step_index || (next.phase == PROMOTING && prev.phase != PROMOTING);
        let gating = self.strategy.analysis.is_some() && self.strategy.gate_on_background_analysis;
        // (a) a step with traffic on the canary is left only right after a pass at its weight.
        if gating && left_step && prev.weight > 0 && prev.phase != PROMOTING {
            prop_assert_eq!(
                o.latest_at_weight,
                Some(true),
                "left step {} at weight {} without a pass entirely at it",
                prev.current_step_index,
                prev.weight
            );
        }
        // (b) background failures are all counted, none lost.
        if next.phase != IDLE {
            let counted: Vec<i32> = ["errors", "p99"]
                .iter()
                .map(|n| {
                    next.metrics
                        .iter()
                        .find(|s| s.analysis == AnalysisKind::Background && s.name == *n)
                        .map_or(0, |s| s.failures)
                })
                .collect();
            prop_assert_eq!(&counted[..], &o.background_failures[..], "background failures lost");
        }
        // (c) past failureLimit the rollout is aborted, in the same decision.
        if let Some(bg) = &self.strategy.analysis {
            if o.background_failures.iter().any(|f| *f > bg.failure_limit) {
                prop_assert_eq!(next.phase, ABORTED, "background failures past the limit not aborted");
            }
        }
        if let Some((a, AnalysisKind::Step)) = active {
            if o.step_failures.iter().any(|f| *f > a.failure_limit) {
                prop_assert_eq!(next.phase, ABORTED, "step failures past the limit not aborted");
            }
        }
        // No step repeated or skipped: the index moves forward only, and each step completes once.
        if prev.phase != ABORTED && next.phase != ABORTED && next.phase != COMPLETED {
            prop_assert!(
                next.current_step_index >= prev.current_step_index,
                "a step was repeated"
            );
        }
        o.each_step_once(d)?;
        if next.current_step_index != prev.current_step_index {
            o.step_failures = [0, 0];
        }
        Ok(())
    }
}

/// A command acts in the decision that sees it: an abort aborts; a pause holds the rollout
/// where it is (timed pause steps included) until a resume.
fn commands_act(prev: &CanaryStatus, next: &CanaryStatus, command: Option<Command>) -> Result<(), TestCaseError> {
    if prev.phase == ABORTED || !prev.phase.in_rollout() {
        return Ok(());
    }
    if prev.phase == PROMOTING {
        // Stable already takes the revision: refused, and said (`CommandIgnored`).
        return Ok(());
    }
    match command {
        Some(Command::Abort) => prop_assert_eq!(next.phase, ABORTED, "an abort did not abort"),
        Some(Command::Pause) if next.phase != ABORTED => {
            prop_assert!(next.phase == PAUSED && next.paused_by_request, "a pause did not pause");
        }
        None if prev.paused_by_request && next.phase != ABORTED => {
            prop_assert_eq!(
                next.current_step_index,
                prev.current_step_index,
                "a paused rollout moved on"
            );
            prop_assert!(
                next.paused_by_request && next.weight <= prev.weight,
                "a paused rollout moved on"
            );
        }
        _ => {}
    }
    Ok(())
}

fn run<'a>(strategy: &'a CanaryStrategy, ticks: &[Tick]) -> Result<Sim<'a>, TestCaseError> {
    let mut sim = Sim {
        strategy,
        persisted: None,
        stable: "old".into(),
        stable_rolled_out: true,
        now: 0,
        oracle: Oracle::default(),
        promoted: false,
    };
    for t in ticks {
        sim.step(t)?;
    }
    Ok(sim)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    /// Invariants (a), (b) and no repeated step, over any world.
    #[test]
    fn invariants_hold_in_any_world(s in plan(), ticks in prop::collection::vec(tick(false), 1..120)) {
        run(&s, &ticks)?;
    }

    /// (c) and "never promote a failing revision": when every conclusive measurement fails, a
    /// gated canary is never promoted and aborts after at most failureLimit + 1 of them.
    #[test]
    fn a_failing_canary_is_never_promoted(s in plan(), ticks in prop::collection::vec(tick(true), 1..120)) {
        let sim = run(&s, &ticks)?;
        let gating = s.analysis.is_some() && s.gate_on_background_analysis;
        let carries_traffic = s.steps.iter().any(|st| st.set_weight.is_some());
        if gating && carries_traffic {
            prop_assert!(!sim.promoted, "promoted a canary whose every measurement failed");
        }
        if let Some(bg) = &s.analysis {
            let most = sim.oracle.background_failures.iter().max().copied().unwrap_or(0);
            prop_assert!(most <= bg.failure_limit + 1, "{} failures counted, limit {}", most, bg.failure_limit);
        }
    }
}
