//! Property tests of the wave machine over random fleets of members, waves, batch limits,
//! soak times, timeouts, reachability, member canaries that pass or abort, manual commands,
//! new revisions and operator restarts (the status goes through JSON, as it does through the
//! API server). An oracle checks every decision against what the machine was shown.

use std::collections::HashSet;

use proptest::prelude::*;

use super::spec::{WaveFailurePolicy, WavePhase, WaveStatus};
use super::waves::*;

#[derive(Clone, Debug)]
enum Op {
    /// Time passes; members move on.
    Tick(i64),
    Flip(usize),
    /// A member's fleet stops being Ready for a while (a pod evicted).
    Regress(usize),
    Command(u8),
    NewRevision,
    Restart,
    /// The status write of this pass fails (a 5xx, a lost lease): the shell sends nothing
    /// from a plan that must be saved first, and keeps the status it had.
    LoseWrite,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1i64..40).prop_map(Op::Tick),
        2 => (0usize..6).prop_map(Op::Flip),
        1 => (0usize..6).prop_map(Op::Regress),
        1 => (0u8..4).prop_map(Op::Command),
        1 => Just(Op::NewRevision),
        1 => Just(Op::Restart),
        1 => Just(Op::LoseWrite),
    ]
}

/// A member cluster of the simulated world.
#[derive(Clone, Debug)]
struct World {
    reachable: bool,
    /// Its canary aborts any revision (a bad cluster).
    bad: bool,
    revision: Option<String>,
    progress: Progress,
}

#[derive(Clone, Debug)]
struct Case {
    waves: Vec<Option<u32>>,
    members: Vec<(usize, bool)>,
    soak: i64,
    timeout: i64,
    rollback: bool,
    ops: Vec<Op>,
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..4).prop_flat_map(|n_waves| {
        (
            proptest::collection::vec(proptest::option::of(1u32..3), n_waves),
            proptest::collection::vec((0..n_waves, proptest::bool::weighted(0.2)), 1..6),
            prop_oneof![Just(0i64), 10i64..60],
            60i64..400,
            any::<bool>(),
            proptest::collection::vec(op(), 1..80),
        )
            .prop_map(|(waves, members, soak, timeout, rollback, ops)| Case {
                waves,
                members,
                soak,
                timeout,
                rollback,
                ops,
            })
    })
}

fn observed(c: &Case, world: &[World], revision: &str, now: i64, command: Option<Command>) -> Observed {
    Observed {
        revision: revision.to_string(),
        spec: serde_json::json!({"revision": revision}),
        waves: c.waves.iter().enumerate().map(|(i, l)| (format!("w{i}"), *l)).collect(),
        members: world
            .iter()
            .zip(&c.members)
            .enumerate()
            .map(|(i, (w, (wave, _)))| Member {
                name: format!("m{i}"),
                wave: *wave,
                reachable: w.reachable,
                revision: w.revision.clone(),
                progress: w.progress.clone(),
            })
            .collect(),
        soak_secs: c.soak,
        timeout_secs: c.timeout,
        on_failure: if c.rollback {
            WaveFailurePolicy::Rollback
        } else {
            WaveFailurePolicy::Hold
        },
        command,
        now,
    }
}

fn secs(t: &Option<String>) -> i64 {
    chrono::DateTime::parse_from_rfc3339(t.as_deref().unwrap_or_default())
        .map(|d| d.timestamp())
        .unwrap_or(i64::MIN)
}

/// Done, judged here rather than by the machine's own `done`.
fn truly_done(m: &Member, o: &Observed) -> bool {
    m.reachable && m.revision.as_deref() == Some(o.revision.as_str()) && m.progress == Progress::Done
}

/// What the world did to the current wave, kept by the test: since when it has been whole
/// without a break, and since when it has been given time (its start, or last seen whole).
#[derive(Debug, Default)]
struct Clock {
    key: (String, u32, u32),
    done_since: Option<i64>,
    given_since: i64,
    promoted: bool,
}

impl Clock {
    fn observe(&mut self, prev: Option<&WaveStatus>, o: &Observed) {
        let Some(p) = prev.filter(|p| (p.revision.clone(), p.attempt, p.current_wave) == self.key) else {
            return;
        };
        let wave = p.current_wave as usize;
        if o.members.iter().filter(|m| m.wave <= wave).all(|m| truly_done(m, o)) {
            self.done_since.get_or_insert(o.now);
            self.given_since = o.now;
        } else {
            self.done_since = None;
        }
        if o.command == Some(Command::Promote) && matches!(p.phase, WavePhase::Soaking | WavePhase::Paused) {
            self.promoted = true;
        }
    }

    fn follow(&mut self, s: &WaveStatus, now: i64) {
        let key = (s.revision.clone(), s.attempt, s.current_wave);
        if key != self.key {
            *self = Clock {
                key,
                given_since: now,
                ..Clock::default()
            };
        }
    }
}

/// A cluster new to the revision is sent it only where the status allows.
fn check_sends(o: &Observed, plan: &Plan) -> Result<(), TestCaseError> {
    let s = &plan.status;
    let all_done_through = |wave: usize| o.members.iter().filter(|m| m.wave <= wave).all(|m| done(m, o));
    // A cluster new to the revision is sent it only up to the current wave (an earlier wave's
    // cluster again after a rollback and `resume`), in the current wave only while every
    // earlier wave is done, and never once the rollout aborted.
    for (m, send) in o.members.iter().zip(&plan.send) {
        let new_to_it = m.revision.as_deref() != Some(o.revision.as_str());
        if *send == Send::Revision && new_to_it && s.phase != WavePhase::Completed {
            prop_assert_ne!(
                s.phase,
                WavePhase::Aborted,
                "{} sent the revision after an abort",
                m.name
            );
            prop_assert!(m.wave <= s.current_wave as usize, "{} is in a later wave", m.name);
            if m.wave == s.current_wave as usize {
                prop_assert_eq!(s.phase, WavePhase::Progressing, "{} sent while {:?}", m.name, s.phase);
                prop_assert!(
                    m.wave == 0 || all_done_through(m.wave - 1),
                    "{} sent before earlier waves are done",
                    m.name
                );
            }
        }
        if *send == Send::Stable {
            prop_assert_eq!(s.phase, WavePhase::Aborted);
        }
    }
    Ok(())
}

/// Every safety rule, for one decision.
fn check(
    prev: Option<&WaveStatus>,
    o: &Observed,
    plan: &Plan,
    seen: &mut HashSet<String>,
    clock: &Clock,
) -> Result<(), TestCaseError> {
    let s = &plan.status;
    let same = prev.filter(|p| p.revision == o.revision);
    let all_done_through = |wave: usize| o.members.iter().filter(|m| m.wave <= wave).all(|m| truly_done(m, o));
    check_sends(o, plan)?;
    check_clock(prev, o, plan, clock)?;
    if let Some(p) = same {
        // A wave starts only when the ones before it are done and the soak passed (or promote).
        if s.current_wave > p.current_wave || (s.phase == WavePhase::Completed && p.phase != WavePhase::Completed) {
            prop_assert!(
                all_done_through(p.current_wave as usize),
                "advanced past an unfinished wave"
            );
            let wave_empty = !o.members.iter().any(|m| m.wave == p.current_wave as usize);
            let soaked = o.soak_secs == 0
                || wave_empty
                || o.command == Some(Command::Promote)
                || o.now - secs(&p.soak_started_at) >= o.soak_secs;
            prop_assert!(soaked, "advanced before the soak ended");
        }
        // A failure on the revision is never lost.
        let failed = o
            .members
            .iter()
            .any(|m| m.revision.as_deref() == Some(o.revision.as_str()) && matches!(m.progress, Progress::Failed(_)));
        let active = matches!(p.phase, WavePhase::Progressing | WavePhase::Soaking | WavePhase::Paused);
        if failed && active {
            prop_assert_eq!(s.phase, WavePhase::Aborted, "a member's abort was lost");
        }
        // An abort stays until `resume` or a new revision.
        if p.phase == WavePhase::Aborted && o.command != Some(Command::Resume) {
            prop_assert_eq!(s.phase, WavePhase::Aborted);
        }
        if p.phase == WavePhase::Completed {
            prop_assert_eq!(s.phase, WavePhase::Completed, "a completed revision went back");
        }
        prop_assert!(s.current_wave >= p.current_wave, "a wave went back");
    }
    if s.phase == WavePhase::Completed && same.is_none_or(|p| p.phase != WavePhase::Completed) {
        prop_assert!(o.members.iter().all(|m| done(m, o)), "completed with a member not done");
    }
    // No transition twice (restarts included); a soak starts again only after it broke off.
    if let Some(t) = &plan.transition {
        if matches!(t.reason, "WaveSoakInterrupted" | "WaveRolloutResumed") {
            seen.remove(&format!("{}/{}/WaveSoaking/{}", s.revision, s.attempt, s.current_wave));
        }
        if matches!(
            t.reason,
            "WaveStarted" | "WaveSoaking" | "WaveRolloutCompleted" | "WaveRolloutAborted"
        ) {
            let key = format!("{}/{}/{}/{}", s.revision, s.attempt, t.reason, s.current_wave);
            prop_assert!(seen.insert(key.clone()), "transition repeated: {}", key);
        }
    }
    Ok(())
}

/// A wave moves on only after its whole soak without a break (or `promote`), and times out
/// only after a whole waveTimeout without being seen whole.
fn check_clock(prev: Option<&WaveStatus>, o: &Observed, plan: &Plan, clock: &Clock) -> Result<(), TestCaseError> {
    let s = &plan.status;
    let Some(p) = prev.filter(|p| (p.revision.clone(), p.attempt, p.current_wave) == clock.key) else {
        return Ok(());
    };
    let advanced = s.revision == p.revision
        && (s.current_wave > p.current_wave || (s.phase == WavePhase::Completed && p.phase != WavePhase::Completed));
    let wave_empty = !o.members.iter().any(|m| m.wave == p.current_wave as usize);
    if advanced && o.soak_secs > 0 && !wave_empty && !clock.promoted {
        let since = clock.done_since.unwrap_or(o.now);
        prop_assert!(
            o.now - since > o.soak_secs,
            "wave {} moved on after {}s whole, soak {}s",
            p.current_wave,
            o.now - since,
            o.soak_secs
        );
    }
    let timed_out = s
        .abort_reason
        .as_deref()
        .is_some_and(|r| r.contains("did not finish within"));
    if timed_out && p.phase != WavePhase::Aborted && s.revision == p.revision {
        prop_assert!(
            o.now - clock.given_since >= o.timeout_secs,
            "timed out {}s after the wave was last whole or started, timeout {}s",
            o.now - clock.given_since,
            o.timeout_secs
        );
    }
    Ok(())
}

/// The world answers what it was sent.
fn deliver(world: &mut [World], plan: &Plan, revision: &str, stable: Option<&str>) {
    for (w, send) in world.iter_mut().zip(&plan.send) {
        if !w.reachable {
            continue;
        }
        let to = match send {
            Send::Revision => revision,
            Send::Stable => stable.unwrap_or(revision),
            Send::Nothing => continue,
        };
        if w.revision.as_deref() != Some(to) {
            w.revision = Some(to.to_string());
            w.progress = Progress::Running;
        }
    }
}

fn settle(world: &mut [World], step: usize) {
    for (i, w) in world.iter_mut().enumerate() {
        if w.reachable && w.progress == Progress::Running && (step + i).is_multiple_of(2) {
            w.progress = if w.bad {
                Progress::Failed("canary aborted: 5xx rate".into())
            } else {
                Progress::Done
            };
        }
    }
}

/// Every member of `c` reachable and done on revision r0.
fn world_on_r0(c: &Case) -> Vec<World> {
    c.members
        .iter()
        .map(|(_, bad)| World {
            reachable: true,
            bad: *bad,
            revision: Some("r0".into()),
            progress: Progress::Done,
        })
        .collect()
}

fn run(c: &Case) -> Result<(), TestCaseError> {
    let mut world = world_on_r0(c);
    let (mut revision, mut n, mut now) = ("r1".to_string(), 1, 1_000_000i64);
    let mut status: Option<WaveStatus> = None;
    let mut seen = HashSet::new();
    let mut clock = Clock::default();
    // Members sent the stable spec back, with the revision they were taken off.
    let mut rolled_back: HashSet<(usize, String)> = HashSet::new();
    for (step, op) in c.ops.iter().enumerate() {
        let mut command = None;
        let mut lose = false;
        match op {
            Op::Tick(dt) => {
                now += dt;
                settle(&mut world, step);
            }
            Op::Flip(i) => {
                if let Some(w) = world.get_mut(*i) {
                    w.reachable = !w.reachable;
                }
            }
            Op::Regress(i) => {
                if let Some(w) = world.get_mut(*i).filter(|w| w.progress == Progress::Done) {
                    w.progress = Progress::Running;
                }
            }
            Op::Command(k) => {
                command = Some([Command::Promote, Command::Abort, Command::Pause, Command::Resume][*k as usize])
            }
            Op::NewRevision => {
                n += 1;
                revision = format!("r{n}");
            }
            Op::Restart => {
                let json = serde_json::to_string(&status).map_err(|e| TestCaseError::fail(e.to_string()))?;
                status = serde_json::from_str(&json).map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Op::LoseWrite => lose = true,
        }
        let o = observed(c, &world, &revision, now, command);
        clock.observe(status.as_ref(), &o);
        let plan = decide(status.as_ref(), &o);
        check(status.as_ref(), &o, &plan, &mut seen, &clock)?;
        if lose && must_save_first(&plan, &o) {
            // Nothing sent, nothing announced: the next pass decides it again.
            if let Some(t) = &plan.transition {
                let s = &plan.status;
                seen.remove(&format!("{}/{}/{}/{}", s.revision, s.attempt, t.reason, s.current_wave));
            }
            continue;
        }
        clock.follow(&plan.status, now);
        // Deciding again from what was written, with nothing new, changes nothing.
        let again = decide(Some(&plan.status), &observed(c, &world, &revision, now, None));
        if plan.transition.is_none() {
            prop_assert_eq!(&again.status, &plan.status, "a repeated decision moved");
        }
        check_no_resend(&mut rolled_back, &o, &plan, &world)?;
        deliver(&mut world, &plan, &revision, plan.status.stable_revision.as_deref());
        if !lose {
            status = Some(plan.status);
        }
    }
    Ok(())
}

/// A member sent the stable spec back is not sent the revision it was taken off again, unless
/// `resume` retries it (lost status writes and restarts included).
fn check_no_resend(
    rolled_back: &mut HashSet<(usize, String)>,
    o: &Observed,
    plan: &Plan,
    world: &[World],
) -> Result<(), TestCaseError> {
    if o.command == Some(Command::Resume) {
        rolled_back.clear();
    }
    for (i, (send, w)) in plan.send.iter().zip(world).enumerate() {
        match send {
            Send::Revision => prop_assert!(
                !rolled_back.contains(&(i, o.revision.clone())),
                "m{} sent {} again after it was rolled back",
                i,
                o.revision
            ),
            Send::Stable if w.reachable && w.revision.as_deref() == Some(o.revision.as_str()) => {
                rolled_back.insert((i, o.revision.clone()));
            }
            _ => {}
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn waves_never_skip_lose_an_abort_or_repeat(c in case()) {
        run(&c)?;
    }
}

#[test]
fn a_healthy_revision_walks_the_waves_in_order() {
    let c = Case {
        waves: vec![None, Some(1)],
        members: vec![(0, false), (1, false), (1, false)],
        soak: 30,
        timeout: 600,
        rollback: false,
        ops: Vec::new(),
    };
    let mut world: Vec<World> = (0..3)
        .map(|_| World {
            reachable: true,
            bad: false,
            revision: None,
            progress: Progress::Done,
        })
        .collect();
    let mut status: Option<WaveStatus> = None;
    let mut reasons = Vec::new();
    for t in 0..40 {
        let o = observed(&c, &world, "r1", 1_000 + t * 10, None);
        let plan = decide(status.as_ref(), &o);
        if let Some(tr) = &plan.transition {
            reasons.push(tr.reason);
        }
        deliver(&mut world, &plan, "r1", None);
        settle(&mut world, 0);
        settle(&mut world, 1);
        status = Some(plan.status);
    }
    let s = status.expect("status");
    assert_eq!(s.phase, WavePhase::Completed);
    assert_eq!(
        reasons,
        [
            "WaveRolloutStarted",
            "WaveSoaking",
            "WaveStarted",
            "WaveSoaking",
            "WaveRolloutCompleted"
        ]
    );
    assert_eq!(s.stable_revision.as_deref(), Some("r1"));
}

#[test]
fn an_abort_in_the_first_wave_never_reaches_the_second() {
    let c = Case {
        waves: vec![None, None],
        members: vec![(0, true), (1, false)],
        soak: 0,
        timeout: 600,
        rollback: true,
        ops: Vec::new(),
    };
    let mut world = world_on_r0(&c);
    let mut status = Some(WaveStatus {
        revision: "r0".into(),
        phase: WavePhase::Completed,
        stable_spec: Some(serde_json::json!({"revision": "r0"})),
        ..Default::default()
    });
    for t in 0..10 {
        let plan = decide(status.as_ref(), &observed(&c, &world, "r1", 1_000 + t, None));
        deliver(&mut world, &plan, "r1", Some("r0"));
        settle(&mut world, 0);
        settle(&mut world, 1);
        status = Some(plan.status);
    }
    let s = status.expect("status");
    assert_eq!(s.phase, WavePhase::Aborted);
    assert!(s.abort_reason.as_deref().unwrap_or_default().contains("m0"));
    assert_eq!(world[1].revision.as_deref(), Some("r0"), "wave 2 never got r1");
    assert_eq!(world[0].revision.as_deref(), Some("r0"), "rolled back");
}

#[test]
fn an_unreachable_member_holds_its_wave_then_times_out() {
    let c = Case {
        waves: vec![None, None],
        members: vec![(0, false), (1, false)],
        soak: 0,
        timeout: 100,
        rollback: false,
        ops: Vec::new(),
    };
    let mut world: Vec<World> = (0..2)
        .map(|_| World {
            reachable: true,
            bad: false,
            revision: Some("r0".into()),
            progress: Progress::Done,
        })
        .collect();
    world[0].reachable = false;
    let first = decide(None, &observed(&c, &world, "r1", 1_000, None));
    let held = decide(Some(&first.status), &observed(&c, &world, "r1", 1_050, None));
    assert_eq!(held.status.phase, WavePhase::Progressing);
    assert!(held
        .status
        .message
        .as_deref()
        .unwrap_or_default()
        .contains("m0 (unreachable)"));
    assert_eq!(held.send[1], Send::Nothing);
    let timed_out = decide(Some(&held.status), &observed(&c, &world, "r1", 1_101, None));
    assert_eq!(timed_out.status.phase, WavePhase::Aborted);
    assert!(timed_out
        .status
        .abort_reason
        .as_deref()
        .unwrap_or_default()
        .contains("within 100s"));
}

#[test]
fn a_revision_merged_while_paused_waits_for_resume() {
    let c = Case {
        waves: vec![None, None],
        members: vec![(0, false), (1, false)],
        soak: 0,
        timeout: 600,
        rollback: false,
        ops: Vec::new(),
    };
    let world = world_on_r0(&c);
    let started = decide(None, &observed(&c, &world, "r1", 1_000, None));
    let paused = decide(
        Some(&started.status),
        &observed(&c, &world, "r1", 1_001, Some(Command::Pause)),
    );
    assert_eq!(paused.status.phase, WavePhase::Paused);
    let merged = decide(Some(&paused.status), &observed(&c, &world, "r2", 1_002, None));
    assert_eq!(merged.status.phase, WavePhase::Paused, "{:?}", merged.status.message);
    assert!(
        !merged.send.contains(&Send::Revision),
        "sent while paused: {:?}",
        merged.send
    );
    let resumed = decide(
        Some(&merged.status),
        &observed(&c, &world, "r2", 1_003, Some(Command::Resume)),
    );
    assert_eq!(resumed.status.phase, WavePhase::Progressing);
    assert_eq!(resumed.send[0], Send::Revision);
}

/// The placement's first wave removed mid-rollout: the wave that was current stays current (by
/// name), and its clusters still take the revision within its batch limit, not all at once.
#[test]
fn a_wave_removed_mid_rollout_keeps_the_current_wave_by_name() {
    let c = Case {
        waves: vec![None, Some(1), None],
        members: vec![(0, false), (1, false), (1, false), (2, false)],
        soak: 0,
        timeout: 600,
        rollback: false,
        ops: Vec::new(),
    };
    let mut world = world_on_r0(&c);
    let mut status: Option<WaveStatus> = None;
    for t in 0..6 {
        let plan = decide(status.as_ref(), &observed(&c, &world, "r1", 1_000 + t, None));
        deliver(&mut world, &plan, "r1", None);
        settle(&mut world, 0);
        settle(&mut world, 1);
        status = Some(plan.status);
        if status.as_ref().is_some_and(|s| s.current_wave == 1) {
            break;
        }
    }
    let s = status.expect("status");
    assert_eq!((s.current_wave, s.waves[1].name.as_str()), (1, "w1"), "{s:?}");
    // w0 goes from the placement: w1 is now first, w2 second.
    let mut o = observed(&c, &world, "r1", 2_000, None);
    o.waves.remove(0);
    o.members.remove(0);
    for m in &mut o.members {
        m.wave -= 1;
    }
    for (i, (name, _)) in o.waves.iter_mut().enumerate() {
        *name = format!("w{}", i + 1);
    }
    let plan = decide(Some(&s), &o);
    assert_eq!(plan.status.waves[plan.status.current_wave as usize].name, "w1");
    let sent = plan.send.iter().filter(|s| **s == Send::Revision).count();
    let on_it = o.members.iter().filter(|m| m.revision.as_deref() == Some("r1")).count();
    assert!(
        sent - on_it.min(sent) <= 1,
        "w1's batch limit of 1 held: {:?}",
        plan.send
    );
    assert!(o
        .members
        .iter()
        .zip(&plan.send)
        .all(|(m, s)| m.wave == 0 || *s != Send::Revision || m.revision.as_deref() == Some("r1")));
}

/// With `onFailure: Rollback`, an abort sends the last completed spec to every cluster on a
/// revision that never completed: one a superseded rollout left behind included.
#[test]
fn a_rollback_also_brings_back_clusters_a_superseded_rollout_left() {
    let c = Case {
        waves: vec![None, None],
        members: vec![(0, true), (1, false), (1, false)],
        soak: 0,
        timeout: 600,
        rollback: true,
        ops: Vec::new(),
    };
    let mut world = world_on_r0(&c);
    world[0].revision = Some("r2".into());
    world[0].progress = Progress::Failed("canary aborted".into());
    world[1].revision = Some("r1".into());
    let aborted = WaveStatus {
        revision: "r2".into(),
        phase: WavePhase::Aborted,
        stable_revision: Some("r0".into()),
        stable_spec: Some(serde_json::json!({"revision": "r0"})),
        ..Default::default()
    };
    let plan = decide(Some(&aborted), &observed(&c, &world, "r2", 1_000, None));
    assert_eq!(plan.send, vec![Send::Stable, Send::Stable, Send::Nothing]);
}
