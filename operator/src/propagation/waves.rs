//! Pure: a rollout across waves of member clusters. Status and observations in, what each
//! cluster is sent and the new status out; no I/O, no clock (`now` is an input).
//!
//! Safety rules (property-tested in `waves_props`):
//! - a wave starts only when every cluster of every earlier wave runs the revision, reports its
//!   own canary done and its fleet Ready, is reachable, and the soak passed;
//! - a member whose canary aborted on the revision aborts the whole rollout: no later cluster
//!   is sent it, and the abort is never lost (only a new revision or `resume` clears it);
//! - `resume` asks each member of the waves so far whose canary aborted on the revision (and
//!   that fails for nothing else) to retry it, once; that member's failure waits only until
//!   its canaries took the retry, and counts as any other after;
//! - an unreachable member never counts as done; a wave that does not finish within its
//!   timeout aborts;
//! - everything lives in the status, so deciding again from the written status repeats no
//!   transition (events come only from transitions).

use super::spec::{WaveEntry, WaveFailurePolicy, WavePhase, WaveStatus};

/// What a member reports about the revision its copy carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Its operator has not caught up, or its canary is still running.
    Running,
    /// Its canary completed (or there was none) and its fleet is Ready.
    Done,
    /// Its canary aborted: the reason.
    Failed(String),
}

/// One selected cluster as this pass saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// Index into `Observed::waves`.
    pub wave: usize,
    pub reachable: bool,
    /// The hub revision its copy carries; `None`: no copy (or not known).
    pub revision: Option<String>,
    pub progress: Progress,
    pub retry: Retry,
}

/// What a member's canaries say of the retry `resume` asks of them (`WaveStatus::retrying`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Retry {
    /// It fails only by canaries (its fleet's, its apps') that aborted on the revision: a retry
    /// can clear that.
    pub aborted: bool,
    /// The serial of the retry last asked of it (`WaveStatus::retry_serial`), on this revision.
    pub asked: Option<u32>,
    /// Every canary asked took that retry: what the member reports now comes after it.
    pub taken: bool,
    /// A canary asked dropped that retry (its command gone, the token not in its status) for
    /// longer than a member takes to record it: it is asked again.
    pub lost: bool,
    /// The tokens of the hub's retries still pending on its canaries (the member has not read
    /// them yet), of any revision.
    pub pending: Vec<String>,
}

/// A manual command from `kubectl proxyfleet` (consumed by the shell once decided).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Skips the rest of a soak or a pause. Never skips an unfinished or failing wave.
    Promote,
    Abort,
    Pause,
    /// Un-pauses, or retries the current wave of an aborted rollout.
    Resume,
}

impl Command {
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "promote" => Some(Self::Promote),
            "abort" => Some(Self::Abort),
            "pause" => Some(Self::Pause),
            "resume" => Some(Self::Resume),
            _ => None,
        }
    }
}

/// Everything a decision needs besides the previous status.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The revision the spec asks for, and the spec itself (kept as the stable one on completion).
    pub revision: String,
    pub spec: serde_json::Value,
    /// Waves in order: (name, at most how many clusters take the revision at once).
    pub waves: Vec<(String, Option<u32>)>,
    pub members: Vec<Member>,
    pub soak_secs: i64,
    pub timeout_secs: i64,
    pub on_failure: WaveFailurePolicy,
    pub command: Option<Command>,
    /// Unix seconds.
    pub now: i64,
}

/// What a cluster is sent this pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Send {
    /// The spec's revision.
    Revision,
    /// The last completed spec (`onFailure: Rollback`).
    Stable,
    /// Nothing: it keeps what it has.
    Nothing,
    /// The spec's revision, and a retry of its aborted canaries (`resume`).
    Retry,
    /// Nothing, and the hub's retries still pending there are taken back (all of them once the
    /// rollout aborted, else those not of its current retry): read later, they would restart a
    /// canary under a hub that no longer waits for it.
    Withdraw,
}

/// One wave transition, for an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub reason: &'static str,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub status: WaveStatus,
    /// Per member, in `Observed::members` order.
    pub send: Vec<Send>,
    pub transition: Option<Transition>,
    /// Seconds until something is due (a soak ends, a timeout); `None`: on change only.
    pub due_in: Option<i64>,
}

fn rfc3339(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn secs(t: &Option<String>) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(t.as_deref()?)
        .ok()
        .map(|d| d.timestamp())
}

fn entries(o: &Observed) -> Vec<WaveEntry> {
    o.waves
        .iter()
        .enumerate()
        .map(|(i, (name, _))| WaveEntry {
            name: name.clone(),
            clusters: o
                .members
                .iter()
                .filter(|m| m.wave == i)
                .map(|m| m.name.clone())
                .collect(),
        })
        .collect()
}

fn on_revision(m: &Member, o: &Observed) -> bool {
    m.revision.as_deref() == Some(o.revision.as_str())
}

/// Done for this rollout: reachable, on the revision, its canary done and fleet Ready.
pub fn done(m: &Member, o: &Observed) -> bool {
    m.reachable && on_revision(m, o) && m.progress == Progress::Done
}

fn wave_done(o: &Observed, wave: usize) -> bool {
    o.members.iter().filter(|m| m.wave == wave).all(|m| done(m, o))
}

/// A new rollout of `o.revision`, after `previous` (if any).
fn start(previous: Option<&WaveStatus>, o: &Observed) -> (WaveStatus, Transition) {
    let (stable_revision, stable_spec) = match previous {
        Some(p) if p.phase == WavePhase::Completed => (Some(p.revision.clone()), p.stable_spec.clone()),
        Some(p) => (p.stable_revision.clone(), p.stable_spec.clone()),
        None => (None, None),
    };
    // A pause holds whatever comes next: a revision merged during an incident waits too.
    let paused = previous.is_some_and(|p| p.phase == WavePhase::Paused);
    let retry_serial = previous.map(|p| p.retry_serial).unwrap_or(0);
    let status = WaveStatus {
        revision: o.revision.clone(),
        stable_revision,
        phase: if paused {
            WavePhase::Paused
        } else {
            WavePhase::Progressing
        },
        current_wave: 0,
        waves: entries(o),
        wave_started_at: Some(rfc3339(o.now)),
        soak_started_at: None,
        attempt: 0,
        retrying: Vec::new(),
        retry_serial,
        message: paused.then(|| format!("paused: revision {} waits for resume", o.revision)),
        abort_reason: None,
        stable_spec,
    };
    let first = o.waves.first().map(|w| w.0.as_str()).unwrap_or("-");
    let transition = Transition {
        reason: "WaveRolloutStarted",
        message: format!("revision {} starts in wave {first}", o.revision),
    };
    (status, transition)
}

/// The first failure among clusters on the revision, if any; a member's failure that waits
/// for the retry `resume` asked of it is not one yet.
fn failure(s: &WaveStatus, o: &Observed) -> Option<String> {
    o.members.iter().find_map(|m| match &m.progress {
        Progress::Failed(why) if on_revision(m, o) && !awaits_retry(s, m) => Some(format!("cluster {}: {why}", m.name)),
        _ => None,
    })
}

/// Whether `m` is one `resume` retries, in the waves so far, and its canaries have not taken
/// the retry: asked and not taken, or not asked yet and still failing only by aborted canaries.
pub fn awaits_retry(s: &WaveStatus, m: &Member) -> bool {
    if !s.retrying.contains(&m.name) || m.wave > s.current_wave as usize {
        return false;
    }
    if m.retry.asked == Some(s.retry_serial) {
        !m.retry.taken
    } else {
        m.retry.aborted
    }
}

/// Whether `m` is sent the retry now: `resume` retries it, only aborted canaries fail it, and
/// it was not asked yet, or it dropped the ask.
fn retry_due(s: &WaveStatus, m: &Member, o: &Observed) -> bool {
    s.phase == WavePhase::Progressing
        && awaits_retry(s, m)
        && on_revision(m, o)
        && (m.retry.asked != Some(s.retry_serial) || m.retry.lost)
}

/// A member seen to have taken its retry leaves `retrying` for good: from then on its failures
/// count, whatever its canaries' statuses say later.
fn retries_taken(s: &mut WaveStatus, o: &Observed) {
    let serial = s.retry_serial;
    let taken = |name: &String| {
        o.members
            .iter()
            .any(|m| &m.name == name && m.retry.asked == Some(serial) && m.retry.taken)
    };
    s.retrying.retain(|name| !taken(name));
}

fn abort(s: &mut WaveStatus, reason: String) -> Transition {
    s.phase = WavePhase::Aborted;
    s.soak_started_at = None;
    s.retrying.clear();
    s.message = Some(format!(
        "aborted: {reason}; no further wave gets revision {}",
        s.revision
    ));
    s.abort_reason = Some(reason.clone());
    Transition {
        reason: "WaveRolloutAborted",
        message: reason,
    }
}

/// Applies a manual command; returns the transition it made.
fn command(s: &mut WaveStatus, o: &Observed) -> Option<Transition> {
    let say = |reason, message: String| Some(Transition { reason, message });
    match (o.command?, s.phase) {
        (Command::Abort, WavePhase::Progressing | WavePhase::Soaking | WavePhase::Paused) => {
            Some(abort(s, "aborted by kubectl proxyfleet abort".into()))
        }
        (Command::Pause, WavePhase::Progressing | WavePhase::Soaking) => {
            s.phase = WavePhase::Paused;
            say(
                "WaveRolloutPaused",
                "paused: no further cluster gets the revision".into(),
            )
        }
        (Command::Resume | Command::Promote, WavePhase::Paused) => {
            // A soak starts over (nobody watched the wave while it was paused), unless told to
            // promote: then it is over, and the wave moves on once it is done.
            s.phase = WavePhase::Progressing;
            s.soak_started_at = None;
            if o.command == Some(Command::Promote) {
                s.phase = WavePhase::Soaking;
                s.soak_started_at = Some(rfc3339(o.now - o.soak_secs - 1));
            }
            s.wave_started_at = Some(rfc3339(o.now));
            say("WaveRolloutResumed", format!("resumed in wave {}", s.current_wave))
        }
        (Command::Resume, WavePhase::Aborted) => {
            s.phase = WavePhase::Progressing;
            s.attempt += 1;
            s.abort_reason = None;
            s.wave_started_at = Some(rfc3339(o.now));
            // Each cluster whose canary aborted on the revision is asked to retry it (else it
            // would abort the rollout again at once); any other failure stands.
            s.retrying = o
                .members
                .iter()
                .filter(|m| m.wave <= s.current_wave as usize && on_revision(m, o))
                .filter(|m| m.retry.aborted && matches!(m.progress, Progress::Failed(_)))
                .map(|m| m.name.clone())
                .collect();
            if !s.retrying.is_empty() {
                // A token never used before, this revision rolled out again included (past any
                // a member carries, should the status have lost its serial).
                let carried = o.members.iter().filter_map(|m| m.retry.asked).max().unwrap_or(0);
                s.retry_serial = s.retry_serial.max(carried) + 1;
            }
            let asked = match s.retrying.as_slice() {
                [] => String::new(),
                names => format!("; canaries retried in {}", names.join(", ")),
            };
            say(
                "WaveRolloutRetried",
                format!("retrying wave {} (attempt {}){asked}", s.current_wave, s.attempt + 1),
            )
        }
        (Command::Promote, WavePhase::Soaking) => {
            // The soak ends now; the wave must still be done (checked by `advance`).
            s.soak_started_at = Some(rfc3339(o.now - o.soak_secs - 1));
            None
        }
        _ => None,
    }
}

/// The wave after `s.current_wave` starts, or the rollout completes.
fn advance(s: &mut WaveStatus, o: &Observed) -> Transition {
    let finished = s.current_wave as usize;
    let name = |i: usize| o.waves.get(i).map(|w| w.0.clone()).unwrap_or_default();
    s.soak_started_at = None;
    // Every cluster retried is done now: the retry is over.
    s.retrying.clear();
    if finished + 1 >= o.waves.len() {
        s.phase = WavePhase::Completed;
        s.stable_revision = Some(o.revision.clone());
        s.stable_spec = Some(o.spec.clone());
        s.message = Some(format!("every wave runs revision {}", o.revision));
        return Transition {
            reason: "WaveRolloutCompleted",
            message: format!("revision {} completed in every wave", o.revision),
        };
    }
    s.current_wave += 1;
    s.phase = WavePhase::Progressing;
    s.wave_started_at = Some(rfc3339(o.now));
    Transition {
        reason: "WaveStarted",
        message: format!(
            "wave {} done; revision {} starts in wave {}",
            name(finished),
            o.revision,
            name(finished + 1)
        ),
    }
}

/// Progressing or soaking: judge the current wave.
fn progress(s: &mut WaveStatus, o: &Observed) -> Option<Transition> {
    let wave = s.current_wave as usize;
    let started = secs(&s.wave_started_at).unwrap_or(o.now);
    if !wave_done(o, wave) || (0..wave).any(|w| !wave_done(o, w)) {
        s.message = Some(hold_reason(s, o, wave));
        if s.phase == WavePhase::Soaking {
            // A soak is time the whole wave ran well: one that loses a cluster (a blip, a new
            // cluster in the wave, a copy deleted) goes back to progressing, with a full
            // waveTimeout to be whole again and a new soak after.
            s.phase = WavePhase::Progressing;
            s.soak_started_at = None;
            s.wave_started_at = Some(rfc3339(o.now));
            return Some(Transition {
                reason: "WaveSoakInterrupted",
                message: format!(
                    "wave {} soaked no more: {}",
                    wave_name(o, wave),
                    hold_reason(s, o, wave)
                ),
            });
        }
        if o.now - started >= o.timeout_secs {
            let why = format!(
                "wave {} did not finish within {}s: {}",
                wave_name(o, wave),
                o.timeout_secs,
                hold_reason(s, o, wave)
            );
            return Some(abort(s, why));
        }
        return None;
    }
    let empty = !o.members.iter().any(|m| m.wave == wave);
    if o.soak_secs > 0 && !empty {
        let soak_from = match secs(&s.soak_started_at) {
            Some(t) => t,
            None => {
                s.phase = WavePhase::Soaking;
                s.soak_started_at = Some(rfc3339(o.now));
                s.message = Some(format!("wave {} done; soaking {}s", wave_name(o, wave), o.soak_secs));
                return Some(Transition {
                    reason: "WaveSoaking",
                    message: format!("wave {} done; soaking {}s", wave_name(o, wave), o.soak_secs),
                });
            }
        };
        // Times are whole seconds: strictly more than the soak, so it is never a second short.
        if o.now - soak_from <= o.soak_secs {
            return None;
        }
    }
    Some(advance(s, o))
}

fn wave_name(o: &Observed, wave: usize) -> String {
    o.waves
        .get(wave)
        .map(|w| w.0.clone())
        .unwrap_or_else(|| wave.to_string())
}

/// Why the wave is not done yet, naming the clusters.
fn hold_reason(s: &WaveStatus, o: &Observed, wave: usize) -> String {
    let waiting: Vec<String> = o
        .members
        .iter()
        .filter(|m| m.wave <= wave && !done(m, o))
        .map(|m| {
            let why = if !m.reachable {
                "unreachable"
            } else if awaits_retry(s, m) {
                "its canary retry not taken yet"
            } else if !on_revision(m, o) {
                "not on the revision yet"
            } else {
                "canary running or fleet not Ready"
            };
            format!("{} ({why})", m.name)
        })
        .collect();
    format!("wave {} waits for {}", wave_name(o, wave), waiting.join(", "))
}

/// What each member is sent, given the (new) status.
fn sends(s: &WaveStatus, o: &Observed) -> Vec<Send> {
    let wave = s.current_wave as usize;
    let limit = o
        .waves
        .get(wave)
        .and_then(|w| w.1)
        .map(|n| n as usize)
        .unwrap_or(usize::MAX);
    let in_wave = |m: &Member| m.wave == wave;
    // A cluster new to the revision is sent it only while every earlier wave is still done.
    let earlier_done = (0..wave).all(|w| wave_done(o, w));
    // Clusters of the current wave taking the revision and not done yet (an unreachable one
    // that was sent it counts: it may hold it).
    let mut busy = o
        .members
        .iter()
        .filter(|m| in_wave(m) && on_revision(m, o) && !done(m, o))
        .count();
    o.members
        .iter()
        .map(|m| match s.phase {
            WavePhase::Completed => Send::Revision,
            // Back to the last completed spec: every cluster on a revision that never completed
            // (this one, or one it superseded mid-way), not only those on this one.
            WavePhase::Aborted
                if m.revision.is_some()
                    && m.revision != s.stable_revision
                    && o.on_failure == WaveFailurePolicy::Rollback
                    && s.stable_spec.is_some() =>
            {
                Send::Stable
            }
            WavePhase::Aborted if !m.retry.pending.is_empty() => Send::Withdraw,
            WavePhase::Aborted => Send::Nothing,
            _ if retry_due(s, m, o) => Send::Retry,
            _ if m.wave < wave || on_revision(m, o) && m.wave <= wave => Send::Revision,
            WavePhase::Progressing if in_wave(m) && earlier_done && busy < limit => {
                busy += 1;
                Send::Revision
            }
            _ if stale_retry(s, m, o) => Send::Withdraw,
            _ => Send::Nothing,
        })
        .collect()
}

/// A retry of the hub's pending on `m` that is not the current one (an earlier revision's, or
/// an earlier `resume`'s): nobody waits for it any more.
fn stale_retry(s: &WaveStatus, m: &Member, o: &Observed) -> bool {
    let current = retry_token(&o.revision, s.retry_serial);
    m.retry.pending.iter().any(|t| *t != current)
}

/// The token of the retry `serial` (`WaveStatus::retry_serial`) of the rollout of `revision`,
/// written beside each retry the hub asks (`wave_retry`).
pub fn retry_token(revision: &str, serial: u32) -> String {
    format!("{serial}/{revision}")
}

/// When to look again without a change: the soak's end or the wave's timeout.
fn due_in(s: &WaveStatus, o: &Observed) -> Option<i64> {
    match s.phase {
        WavePhase::Soaking => secs(&s.soak_started_at).map(|t| (t + o.soak_secs + 1 - o.now).max(1)),
        WavePhase::Progressing => secs(&s.wave_started_at).map(|t| (t + o.timeout_secs - o.now).max(1)),
        _ => None,
    }
}

/// The current wave in today's waves. Unchanged waves keep the index. When the placement's
/// waves changed (one removed, inserted, renamed, reordered), the wave of the same name, but no
/// further than the first wave not done: an index kept as is would point at another wave (a
/// removed first wave would send every cluster of the next one at once, past its batch limit).
fn current_in(s: &WaveStatus, o: &Observed) -> u32 {
    let last = o.waves.len().saturating_sub(1);
    let names_kept = s.waves.len() == o.waves.len() && s.waves.iter().zip(&o.waves).all(|(a, (b, _))| a.name == *b);
    if names_kept {
        return (s.current_wave as usize).min(last) as u32;
    }
    let name = s.waves.get(s.current_wave as usize).map(|w| w.name.as_str());
    let first_unfinished = (0..o.waves.len()).find(|&w| !wave_done(o, w)).unwrap_or(last);
    let by_name = name.and_then(|n| o.waves.iter().position(|(w, _)| w == n));
    by_name.unwrap_or(first_unfinished).min(first_unfinished) as u32
}

/// Whether `plan` moves the rollout (a transition, or a command taken) and so must be saved
/// before anything is sent from it.
pub fn must_save_first(plan: &Plan, o: &Observed) -> bool {
    plan.transition.is_some() || o.command.is_some()
}

/// One decision.
pub fn decide(previous: Option<&WaveStatus>, o: &Observed) -> Plan {
    let (mut status, mut transition) = match previous {
        Some(p) if p.revision == o.revision => (p.clone(), None),
        _ => {
            let (s, t) = start(previous, o);
            (s, Some(t))
        }
    };
    status.current_wave = current_in(&status, o);
    status.waves = entries(o);
    if let Some(t) = command(&mut status, o) {
        transition = Some(t);
    }
    retries_taken(&mut status, o);
    let active = matches!(
        status.phase,
        WavePhase::Progressing | WavePhase::Soaking | WavePhase::Paused
    );
    if active {
        if let Some(why) = failure(&status, o) {
            transition = Some(abort(&mut status, why));
        }
    }
    if matches!(status.phase, WavePhase::Progressing | WavePhase::Soaking) && transition.is_none() {
        transition = progress(&mut status, o);
    }
    let send = sends(&status, o);
    Plan {
        due_in: due_in(&status, o),
        status,
        send,
        transition,
    }
}
