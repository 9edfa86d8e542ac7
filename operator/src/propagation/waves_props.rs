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
    /// The spec goes back to the revision before (a revert): its members' old retry tokens are
    /// still on them.
    Revert,
    /// This pass's retries reach the canaries but their record on the member is not written.
    LoseAsk,
    /// The members that clear a retry command next stop before they take it (a crash between
    /// clearing the command and writing the status): the retry is dropped.
    DropRetry,
    /// The members that clear a retry command next write the status that takes it only on
    /// their next move: the hub may read them in between.
    LateRetry,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1i64..40).prop_map(Op::Tick),
        2 => (0usize..6).prop_map(Op::Flip),
        1 => (0usize..6).prop_map(Op::Regress),
        2 => (0u8..4).prop_map(Op::Command),
        1 => Just(Op::NewRevision),
        1 => Just(Op::Restart),
        1 => Just(Op::LoseWrite),
        1 => Just(Op::Revert),
        1 => Just(Op::LoseAsk),
        1 => Just(Op::DropRetry),
        1 => Just(Op::LateRetry),
    ]
}

/// How a member of the simulated world takes a revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Health {
    Good,
    /// Its canary aborts any revision, retried or not (a bad cluster).
    Aborts,
    /// Its fleet goes Degraded on any revision (not a canary: nothing to retry).
    Degraded,
    /// Its canary aborts a revision once; retried, it passes.
    Flaky,
}

fn health() -> impl Strategy<Value = Health> {
    prop_oneof![
        8 => Just(Health::Good),
        1 => Just(Health::Aborts),
        1 => Just(Health::Degraded),
        2 => Just(Health::Flaky),
    ]
}

/// A member cluster of the simulated world, with what the hub's retry writes there and what
/// its canary's status records (`wave_retry`).
#[derive(Clone, Debug)]
struct World {
    reachable: bool,
    health: Health,
    revision: Option<String>,
    progress: Progress,
    /// Its canary aborted on `revision` (a failure a retry can restart).
    aborted: bool,
    /// The retry token on its canary's object, and whether the command beside it is pending.
    asked_token: Option<String>,
    command_pending: bool,
    /// The record of the retry asked, on its fleet copy.
    record: Option<String>,
    /// When its canary was asked (beside the token).
    asked_at: i64,
    /// The token its canary's status recorded when a retry restarted it.
    status_token: Option<String>,
    /// Its canary ran a retry on `revision` (a flaky one then passes).
    retried: bool,
    /// It cleared the retry command and writes the status taking it on its next move.
    status_owed: bool,
}

/// How the members that clear a retry command on a move take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Taking {
    /// Cleared and taken together, as a member's pass does.
    Now,
    /// Cleared, then the member stops: dropped.
    Drop,
    /// Cleared, taken on the member's next move.
    Late,
}

impl World {
    fn new(health: Health, revision: Option<&str>) -> Self {
        World {
            reachable: true,
            health,
            revision: revision.map(str::to_string),
            progress: Progress::Done,
            aborted: false,
            asked_token: None,
            command_pending: false,
            record: None,
            asked_at: 0,
            status_token: None,
            retried: false,
            status_owed: false,
        }
    }

    /// The canary was asked `token` `LOST_AFTER` or more before `now`, its command is gone, and
    /// it did not take it (`wave_retry::dropped`).
    fn dropped(&self, token: &str, now: i64) -> bool {
        self.asked_token.as_deref() == Some(token)
            && now - self.asked_at >= super::wave_retry::LOST_AFTER
            && !self.command_pending
            && self.aborted
            && self.status_token.as_deref() != Some(token)
    }

    /// What the shell reads of the retry (`wave_retry::observe`), for the rollout of `revision`.
    fn retry(&self, revision: &str, now: i64) -> Retry {
        if !self.reachable {
            return Retry::default();
        }
        let serial = |t: &String| {
            let (n, r) = t.split_once('/')?;
            (r == revision).then(|| n.parse().ok()).flatten()
        };
        let asked = self.record.as_ref().and_then(serial);
        let record = self.record.as_ref().filter(|_| asked.is_some());
        let pending = record.is_some_and(|r| {
            self.asked_token.as_ref() == Some(r) && self.aborted && self.status_token.as_ref() != Some(r)
        });
        Retry {
            aborted: self.aborted,
            asked,
            taken: record.is_some() && !pending,
            lost: record.is_some_and(|r| self.dropped(r, now)),
            pending: self
                .asked_token
                .clone()
                .filter(|_| self.command_pending)
                .into_iter()
                .collect(),
        }
    }
}

#[derive(Clone, Debug)]
struct Case {
    waves: Vec<Option<u32>>,
    members: Vec<(usize, Health)>,
    soak: i64,
    timeout: i64,
    rollback: bool,
    ops: Vec<Op>,
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..4).prop_flat_map(|n_waves| {
        (
            proptest::collection::vec(proptest::option::of(1u32..3), n_waves),
            proptest::collection::vec((0..n_waves, health()), 1..6),
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
                retry: w.retry(revision, now),
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

/// What the test itself knows of `resume`'s retries, from what it did to the world.
#[derive(Debug, Default)]
struct Retries {
    /// Members whose canary aborted on the revision when the last `resume` was taken.
    set: Vec<usize>,
    /// The token each of them was sent since.
    delivered: std::collections::HashMap<usize, String>,
    /// Retries a canary took: (member, token).
    restarted: HashSet<(usize, String)>,
}

impl Retries {
    /// Whether member `i`'s failure may wait: `resume` retries it, only its aborted canary fails
    /// it, and the hub cannot see yet that its canary took the retry sent to it.
    fn excused(&self, i: usize, w: &World) -> bool {
        let token = self.delivered.get(&i);
        let seen_taken = token.is_some_and(|t| w.status_token.as_ref() == Some(t) && w.record.as_ref() == Some(t));
        self.set.contains(&i) && w.aborted && !seen_taken
    }

    /// Records the retries a plan sends (to members that can take one).
    fn sent(&mut self, plan: &Plan, world: &[World], revision: &str) {
        for (i, (send, w)) in plan.send.iter().zip(world).enumerate() {
            if *send == Send::Retry && w.reachable && w.aborted {
                let token = super::wave_retry::token(revision, plan.status.retry_serial);
                self.delivered.insert(i, token);
            }
        }
    }

    /// Follows a decision: a `resume` taken fixes the set; an abort or a new revision ends it.
    fn follow(&mut self, prev: Option<&WaveStatus>, o: &Observed, plan: &Plan, world: &[World]) {
        let s = &plan.status;
        let resumed = prev.is_some_and(|p| p.revision == o.revision && p.phase == WavePhase::Aborted)
            && o.command == Some(Command::Resume);
        if resumed && s.phase == WavePhase::Progressing {
            self.set = (0..world.len())
                .filter(|&i| {
                    let w = &world[i];
                    w.reachable
                        && w.aborted
                        && w.revision.as_deref() == Some(o.revision.as_str())
                        && matches!(w.progress, Progress::Failed(_))
                        && o.members[i].wave <= s.current_wave as usize
                })
                .collect();
            self.delivered.clear();
        }
        if s.phase == WavePhase::Aborted || prev.is_none_or(|p| p.revision != o.revision) {
            self.set.clear();
        }
    }
}

/// `resume` retries exactly the clusters whose canary aborted on the revision when it was
/// taken; each is sent the retry while the hub has no record of it, and nobody else is.
fn check_retries(o: &Observed, plan: &Plan, world: &[World], retries: &Retries) -> Result<(), TestCaseError> {
    let s = &plan.status;
    let names: Vec<String> = retries.set.iter().map(|i| o.members[*i].name.clone()).collect();
    let kept: Vec<&String> = s.retrying.iter().filter(|n| names.contains(n)).collect();
    prop_assert_eq!(
        kept.len(),
        s.retrying.len(),
        "retrying {:?}, resumed {:?}",
        s.retrying,
        names
    );
    for (i, (send, w)) in plan.send.iter().zip(world).enumerate() {
        if *send == Send::Retry {
            prop_assert!(retries.set.contains(&i), "m{} sent a retry resume did not ask", i);
        }
        let on_it = w.revision.as_deref() == Some(o.revision.as_str());
        let unrecorded = w.record.as_ref() != retries.delivered.get(&i);
        let due = s.phase == WavePhase::Progressing && retries.set.contains(&i) && w.reachable && w.aborted && on_it;
        if due && unrecorded {
            prop_assert_eq!(*send, Send::Retry, "m{} is owed its retry", i);
        }
        let dropped = retries
            .delivered
            .get(&i)
            .is_some_and(|t| w.record.as_ref() == Some(t) && w.dropped(t, o.now));
        if due && dropped {
            prop_assert_eq!(*send, Send::Retry, "m{} dropped its retry and is asked again", i);
        }
    }
    Ok(())
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
    (clock, world, retries): (&Clock, &[World], &Retries),
) -> Result<(), TestCaseError> {
    let s = &plan.status;
    let same = prev.filter(|p| p.revision == o.revision);
    let all_done_through = |wave: usize| o.members.iter().filter(|m| m.wave <= wave).all(|m| truly_done(m, o));
    check_sends(o, plan)?;
    check_retries(o, plan, world, retries)?;
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
        // A failure on the revision is never lost: only a canary `resume` retries waits, and
        // only until the hub can see it took the retry (the world says so, not the machine).
        let failed = o.members.iter().enumerate().any(|(i, m)| {
            let failing =
                m.revision.as_deref() == Some(o.revision.as_str()) && matches!(m.progress, Progress::Failed(_));
            failing && !retries.excused(i, &world[i])
        });
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
    // A revision rolled out again (a revert) is a new rollout, with its transitions anew.
    if same.is_none() {
        seen.retain(|k| !k.starts_with(&format!("{}/", s.revision)));
    }
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

/// The world answers what it was sent; a retry is written as the shell writes it (a canary
/// already asked with the token is not asked again), its record lost with `lose_ask`.
fn deliver(world: &mut [World], plan: &Plan, (revision, stable): (&str, Option<&str>), lose_ask: bool, now: i64) {
    for (w, send) in world.iter_mut().zip(&plan.send) {
        if !w.reachable {
            continue;
        }
        if *send != Send::Nothing {
            // Taken back: all but the current retry; all of them once aborted.
            let current = super::wave_retry::token(revision, plan.status.retry_serial);
            let keep = (plan.status.phase != WavePhase::Aborted).then_some(&current);
            w.command_pending &= w.asked_token.as_ref() == keep;
        }
        let to = match send {
            Send::Revision | Send::Retry => revision,
            Send::Stable => stable.unwrap_or(revision),
            Send::Nothing => continue,
            Send::Withdraw => continue,
        };
        if w.revision.as_deref() != Some(to) {
            w.revision = Some(to.to_string());
            w.progress = Progress::Running;
            w.aborted = false;
            w.retried = false;
            w.status_owed = false;
        }
        if *send == Send::Retry && w.aborted {
            let token = super::wave_retry::token(revision, plan.status.retry_serial);
            let already = w.asked_token.as_ref() == Some(&token) && !w.dropped(&token, now);
            if !already && w.command_pending {
                continue; // another command pending: not asked this pass
            }
            if !already {
                (w.asked_token, w.asked_at) = (Some(token.clone()), now);
                w.command_pending = true;
            }
            if !lose_ask {
                w.record = Some(token);
            }
        }
    }
}

/// An aborted canary starts over and records the token it took.
fn restart(w: &mut World, i: usize, restarts: &mut Vec<(usize, String)>) {
    (w.aborted, w.retried, w.progress) = (false, true, Progress::Running);
    w.status_token = w.asked_token.clone();
    restarts.extend(w.asked_token.clone().map(|t| (i, t)));
}

/// Members move on (those that clear a retry take it as `taking` says); returns the retries
/// their canaries took (member, token).
fn settle(world: &mut [World], step: usize, taking: Taking) -> Vec<(usize, String)> {
    settle_reading(world, step, taking).0
}

/// Retries (member, token).
type Retried = Vec<(usize, String)>;

/// `settle`, and the retries members read (cleared the command of) on an aborted canary.
fn settle_reading(world: &mut [World], step: usize, taking: Taking) -> (Retried, Retried) {
    let (mut restarts, mut reads) = (Vec::new(), Vec::new());
    for (i, w) in world.iter_mut().enumerate() {
        if !w.reachable || !(step + i).is_multiple_of(2) {
            continue;
        }
        if std::mem::take(&mut w.status_owed) {
            restart(w, i, &mut restarts);
            continue;
        }
        // A retry asked is taken: an aborted canary starts over and records the token, once per
        // token (`canary::machine`).
        if w.command_pending {
            w.command_pending = false;
            let taken_before = w.asked_token.is_some() && w.asked_token == w.status_token;
            if w.aborted && !taken_before {
                reads.extend(w.asked_token.clone().map(|t| (i, t)));
                match taking {
                    Taking::Now => restart(w, i, &mut restarts),
                    Taking::Late => w.status_owed = true,
                    Taking::Drop => {}
                }
            }
            continue;
        }
        if w.progress == Progress::Running {
            (w.aborted, w.progress) = match w.health {
                Health::Aborts => (true, Progress::Failed("canary aborted: 5xx rate".into())),
                Health::Flaky if !w.retried => (true, Progress::Failed("canary aborted: P99".into())),
                Health::Degraded => (false, Progress::Failed("fleet degraded: Secret missing".into())),
                _ => (false, Progress::Done),
            };
        }
    }
    (restarts, reads)
}

/// Every member of `c` reachable and done on revision r0.
fn world_on_r0(c: &Case) -> Vec<World> {
    c.members
        .iter()
        .map(|(_, health)| World::new(*health, Some("r0")))
        .collect()
}

/// A member becomes (un)reachable, or its fleet stops being Ready for a while.
fn disturb(world: &mut [World], op: &Op) {
    match *op {
        Op::Flip(i) => {
            if let Some(w) = world.get_mut(i) {
                w.reachable = !w.reachable;
            }
        }
        Op::Regress(i) => {
            if let Some(w) = world.get_mut(i).filter(|w| w.progress == Progress::Done) {
                w.progress = Progress::Running;
            }
        }
        _ => {}
    }
}

/// What members did on a move: a retry read after the hub aborted the rollout that asked it,
/// or moved on to another revision, was not taken back; no canary took a retry twice.
fn check_members_moves(
    (restarts, reads): (Retried, Retried),
    status: Option<&WaveStatus>,
    retries: &mut Retries,
) -> Result<(), TestCaseError> {
    for read in reads {
        let of_it = |s: &WaveStatus| read.1.ends_with(&format!("/{}", s.revision));
        let aborted = status.is_some_and(|s| s.phase == WavePhase::Aborted && of_it(s));
        let stale = status.is_some_and(|s| !of_it(s));
        prop_assert!(!aborted, "a retry read after the hub aborted: {:?}", read);
        prop_assert!(!stale, "a retry of another revision read: {:?}", read);
    }
    for taken in restarts {
        prop_assert!(
            retries.restarted.insert(taken.clone()),
            "a canary retried twice: {:?}",
            taken
        );
    }
    Ok(())
}

fn run(c: &Case) -> Result<(), TestCaseError> {
    let mut world = world_on_r0(c);
    let (mut revision, mut n, mut now) = ("r1".to_string(), 1, 1_000_000i64);
    let mut status: Option<WaveStatus> = None;
    let mut seen = HashSet::new();
    let mut clock = Clock::default();
    // Members sent the stable spec back, with the revision they were taken off.
    let mut rolled_back: HashSet<(usize, String)> = HashSet::new();
    let mut retries = Retries::default();
    let mut taking = Taking::Now;
    for (step, op) in c.ops.iter().enumerate() {
        let mut command = None;
        let (mut lose, mut lose_ask) = (false, false);
        match op {
            Op::Tick(dt) => {
                now += dt;
                let moved = settle_reading(&mut world, step, std::mem::replace(&mut taking, Taking::Now));
                check_members_moves(moved, status.as_ref(), &mut retries)?;
            }
            Op::Flip(_) | Op::Regress(_) => disturb(&mut world, op),
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
            Op::Revert if n > 1 => {
                n -= 1;
                revision = format!("r{n}");
            }
            Op::Revert => {}
            Op::LoseAsk => lose_ask = true,
            Op::DropRetry => taking = Taking::Drop,
            Op::LateRetry => taking = Taking::Late,
        }
        let o = observed(c, &world, &revision, now, command);
        clock.observe(status.as_ref(), &o);
        let plan = decide(status.as_ref(), &o);
        retries.follow(status.as_ref(), &o, &plan, &world);
        check(status.as_ref(), &o, &plan, &mut seen, (&clock, &world, &retries))?;
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
        check_no_resend(&mut rolled_back, status.as_ref(), &o, &plan, &world)?;
        retries.sent(&plan, &world, &revision);
        let to = (revision.as_str(), plan.status.stable_revision.as_deref());
        deliver(&mut world, &plan, to, lose_ask, now);
        if !lose {
            status = Some(plan.status);
        }
    }
    Ok(())
}

/// A member sent the stable spec back is not sent the revision it was taken off again, unless
/// `resume` retries it or the revision is rolled out anew (lost status writes and restarts
/// included).
fn check_no_resend(
    rolled_back: &mut HashSet<(usize, String)>,
    prev: Option<&WaveStatus>,
    o: &Observed,
    plan: &Plan,
    world: &[World],
) -> Result<(), TestCaseError> {
    if prev.is_none_or(|p| p.revision != o.revision) {
        // The revision rolled out anew (a revert back to it): a new rollout may send it.
        rolled_back.retain(|(_, r)| *r != o.revision);
    }
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
        members: vec![(0, Health::Good), (1, Health::Good), (1, Health::Good)],
        soak: 30,
        timeout: 600,
        rollback: false,
        ops: Vec::new(),
    };
    let mut world: Vec<World> = (0..3).map(|_| World::new(Health::Good, None)).collect();
    let mut status: Option<WaveStatus> = None;
    let mut reasons = Vec::new();
    for t in 0..40 {
        let o = observed(&c, &world, "r1", 1_000 + t * 10, None);
        let plan = decide(status.as_ref(), &o);
        if let Some(tr) = &plan.transition {
            reasons.push(tr.reason);
        }
        deliver(&mut world, &plan, ("r1", None), false, 0);
        settle(&mut world, 0, Taking::Now);
        settle(&mut world, 1, Taking::Now);
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
        members: vec![(0, Health::Aborts), (1, Health::Good)],
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
        deliver(&mut world, &plan, ("r1", Some("r0")), false, 0);
        settle(&mut world, 0, Taking::Now);
        settle(&mut world, 1, Taking::Now);
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
        members: vec![(0, Health::Good), (1, Health::Good)],
        soak: 0,
        timeout: 100,
        rollback: false,
        ops: Vec::new(),
    };
    let mut world: Vec<World> = (0..2).map(|_| World::new(Health::Good, Some("r0"))).collect();
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
        members: vec![(0, Health::Good), (1, Health::Good)],
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
        members: vec![
            (0, Health::Good),
            (1, Health::Good),
            (1, Health::Good),
            (2, Health::Good),
        ],
        soak: 0,
        timeout: 600,
        rollback: false,
        ops: Vec::new(),
    };
    let mut world = world_on_r0(&c);
    let mut status: Option<WaveStatus> = None;
    for t in 0..6 {
        let plan = decide(status.as_ref(), &observed(&c, &world, "r1", 1_000 + t, None));
        deliver(&mut world, &plan, ("r1", None), false, 0);
        settle(&mut world, 0, Taking::Now);
        settle(&mut world, 1, Taking::Now);
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
        members: vec![(0, Health::Aborts), (1, Health::Good), (1, Health::Good)],
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

/// After a member's canary aborted (`onFailure: Hold`), `resume` asks it to retry once: the
/// abort it still shows until the retry is taken does not abort the rollout again, and once
/// retried and passed, the rollout goes on. A member that fails otherwise (its fleet degraded)
/// aborts the resumed rollout at once: there is nothing to retry.
#[test]
fn resume_retries_an_aborted_canary_once_and_judges_what_follows() {
    let c = Case {
        waves: vec![None, None],
        members: vec![(0, Health::Flaky), (1, Health::Good)],
        soak: 0,
        timeout: 600,
        rollback: false,
        ops: Vec::new(),
    };
    let mut world = world_on_r0(&c);
    let mut status = None;
    let mut t = 1_000;
    let mut pass = |status: &mut Option<WaveStatus>, world: &mut Vec<World>, command| {
        t += 1;
        let plan = decide(status.as_ref(), &observed(&c, world, "r1", t, command));
        deliver(world, &plan, ("r1", None), false, t);
        *status = Some(plan.status.clone());
        plan
    };
    pass(&mut status, &mut world, None);
    settle(&mut world, 0, Taking::Now);
    let aborted = pass(&mut status, &mut world, None);
    assert_eq!(aborted.status.phase, WavePhase::Aborted, "{:?}", aborted.status);
    let resumed = pass(&mut status, &mut world, Some(Command::Resume));
    assert_eq!(resumed.status.phase, WavePhase::Progressing);
    assert_eq!(resumed.status.retrying, vec!["m0".to_string()]);
    assert_eq!(resumed.send[0], Send::Retry);
    let waiting = pass(&mut status, &mut world, None);
    assert_eq!(waiting.status.phase, WavePhase::Progressing, "not taken yet: no abort");
    assert_eq!(waiting.send[0], Send::Revision, "asked once");
    assert!(waiting.status.message.unwrap_or_default().contains("retry not taken"));
    for step in 0..6 {
        settle(&mut world, step, Taking::Now);
        pass(&mut status, &mut world, None);
    }
    let s = status.clone().expect("status");
    assert_eq!(s.phase, WavePhase::Completed, "{s:?}");

    let c = Case {
        members: vec![(0, Health::Degraded), (1, Health::Good)],
        ..c
    };
    let mut world = world_on_r0(&c);
    world[0].revision = Some("r1".into());
    world[0].progress = Progress::Failed("fleet degraded".into());
    let aborted = WaveStatus {
        revision: "r1".into(),
        phase: WavePhase::Aborted,
        ..Default::default()
    };
    let again = decide(
        Some(&aborted),
        &observed(&c, &world, "r1", 2_000, Some(Command::Resume)),
    );
    assert_eq!(again.status.phase, WavePhase::Aborted, "nothing to retry");
    assert_eq!(again.send[0], Send::Nothing);
}

/// A member that drops its retry (clears the command, stops before taking it) is asked again,
/// once a member would have recorded it; it then takes it, and the rollout goes on.
#[test]
fn a_dropped_retry_is_asked_again_after_a_while() {
    let c = Case {
        waves: vec![None],
        members: vec![(0, Health::Flaky)],
        soak: 0,
        timeout: 3_600,
        rollback: false,
        ops: Vec::new(),
    };
    let mut world = world_on_r0(&c);
    let mut status: Option<WaveStatus> = None;
    let pass = |status: &mut Option<WaveStatus>, world: &mut Vec<World>, t: i64, command| {
        let plan = decide(status.as_ref(), &observed(&c, world, "r1", t, command));
        deliver(world, &plan, ("r1", None), false, t);
        *status = Some(plan.status.clone());
        plan
    };
    pass(&mut status, &mut world, 1_000, None);
    settle(&mut world, 0, Taking::Now);
    assert_eq!(
        pass(&mut status, &mut world, 1_001, None).status.phase,
        WavePhase::Aborted
    );
    let resumed = pass(&mut status, &mut world, 1_002, Some(Command::Resume));
    assert_eq!(resumed.send[0], Send::Retry);
    assert!(settle(&mut world, 0, Taking::Drop).is_empty(), "dropped");
    let early = pass(&mut status, &mut world, 1_010, None);
    assert_eq!(
        early.send[0],
        Send::Revision,
        "not yet: the member may be writing its status"
    );
    assert_eq!(early.status.phase, WavePhase::Progressing);
    let late = pass(&mut status, &mut world, 1_002 + super::wave_retry::LOST_AFTER, None);
    assert_eq!(late.send[0], Send::Retry, "asked again");
    assert_eq!(settle(&mut world, 0, Taking::Now), vec![(0, "1/r1".to_string())]);
    pass(&mut status, &mut world, 1_070, None);
    settle(&mut world, 0, Taking::Now);
    let done = pass(&mut status, &mut world, 1_080, None);
    assert_eq!(done.status.phase, WavePhase::Completed, "{:?}", done.status);
}
