//! CA rotation as a pure state machine: the CA Secret's rotation state + what the cluster shows
//! → the next state and what to write. Each phase waits for observed convergence:
//!
//! ```text
//!  Stable ──(CA renewal time, or proxyfleet.io/rotate-ca)──► PublishingBundle
//!    ▲        new CA generated; trust bundle = old + new
//!    │                         │ every leaf Secret carries the new bundle
//!    │                         ▼
//!    │                  WaitingForBundle
//!    │                         │ every proxy pod reports the new bundle's SHA-256 loaded
//!    │                         ▼
//!    │                     Reissuing      new CA signs; leaves reissued
//!    │                         │ every leaf Secret issued by the new CA, and served by every pod
//!    │                         ▼
//!    └──(overlap elapsed)── Overlap       bundle still old + new
//!         bundle = new only
//! ```

use std::time::Duration;

pub use super::spec::RotationPhase;

pub const STABLE: RotationPhase = RotationPhase::Stable;
pub const PUBLISHING_BUNDLE: RotationPhase = RotationPhase::PublishingBundle;
pub const WAITING_FOR_BUNDLE: RotationPhase = RotationPhase::WaitingForBundle;
pub const REISSUING: RotationPhase = RotationPhase::Reissuing;
pub const OVERLAP: RotationPhase = RotationPhase::Overlap;

/// Annotation on the CA Secret asking for a rotation now (any value; removed when it starts).
pub const ROTATE_ANNOTATION: &str = "proxyfleet.io/rotate-ca";
/// Annotation on the CA Secret: how long old and new CA are both trusted after reissuing.
pub const OVERLAP_ANNOTATION: &str = "proxyfleet.io/ca-rotation-overlap";
/// Annotations on the CA Secret recording the machine's state.
pub const PHASE_ANNOTATION: &str = "proxyfleet.io/ca-rotation-phase";
pub const SINCE_ANNOTATION: &str = "proxyfleet.io/ca-rotation-since";
/// Annotation on the CA Secret: the rotation's progress in words, as the CA controller last
/// decided it; every fleet of the namespace shows it in `status.caRotation.message`.
pub const MESSAGE_ANNOTATION: &str = "proxyfleet.io/ca-rotation-message";

/// Default overlap when the CA Secret names none.
pub const DEFAULT_OVERLAP: Duration = Duration::from_secs(24 * 3600);

/// The rotation state, as recorded on the CA Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RotationState {
    pub phase: RotationPhase,
    /// Unix seconds when the phase began.
    pub since: i64,
    pub has_next: bool,
    pub has_previous: bool,
}

/// What the cluster shows, gathered by the shell (only what the current phase needs).
#[derive(Clone, Debug, Default)]
pub struct Observations {
    pub now: i64,
    /// When the current CA is due for renewal (notAfter − a third of its lifetime).
    pub ca_renewal_time: i64,
    pub rotation_requested: bool,
    pub overlap: Duration,
    /// Leaf Secrets in the namespace, and how many carry the wanted bundle.
    pub leaves_total: usize,
    pub leaves_with_bundle: usize,
    /// Leaf Secrets issued by the current signing CA.
    pub leaves_on_current_ca: usize,
    /// Proxy pods in the namespace, and how many report the wanted bundle loaded.
    pub pods_total: usize,
    pub pods_with_bundle: usize,
    /// Proxy pods serving only leaves issued by the current signing CA.
    pub pods_on_current_ca: usize,
    /// The leaf Secrets a phase waits for, named in its message (a fleet the platform policy
    /// holds, or whose apply keeps failing, holds the namespace's rotation: say which).
    pub leaves_without_bundle: Vec<String>,
    pub leaves_not_reissued: Vec<String>,
}

/// "; waiting for a-tls, b-tls" (at most five named), or nothing.
fn waiting_for(names: &[String]) -> String {
    match names.len() {
        0 => String::new(),
        n if n <= 5 => format!("; waiting for {}", names.join(", ")),
        n => format!("; waiting for {} and {} more", names[..5].join(", "), n - 5),
    }
}

/// What the shell writes to the CA Secret (one compare-and-swap write).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Generate the next CA; bundle = current + next; clear the request annotation.
    StartRotation,
    /// next → signing CA, old signing CA kept as previous; bundle unchanged.
    SwapToNext,
    /// Drop the previous CA; bundle = current only.
    DropPrevious,
    /// Only the phase annotation changes.
    Phase,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub write: Option<Write>,
    pub state: RotationState,
    /// Human-readable progress, shown in the ProxyDeployments' status.
    pub message: String,
    /// When to look again.
    pub requeue: Duration,
}

fn moved(state: &RotationState, phase: RotationPhase, now: i64, write: Write, message: String) -> Step {
    let (has_next, has_previous) = match write {
        Write::StartRotation => (true, false),
        Write::SwapToNext => (false, true),
        Write::DropPrevious => (false, false),
        Write::Phase => (state.has_next, state.has_previous),
    };
    Step {
        write: Some(write),
        state: RotationState {
            phase,
            since: now,
            has_next,
            has_previous,
        },
        message,
        requeue: Duration::from_secs(2),
    }
}

fn stay(state: &RotationState, message: String, requeue: Duration) -> Step {
    Step {
        write: None,
        state: state.clone(),
        message,
        requeue,
    }
}

pub fn decide(state: &RotationState, o: &Observations) -> Step {
    match state.phase {
        PUBLISHING_BUNDLE => publishing_bundle(state, o),
        WAITING_FOR_BUNDLE => waiting_for_bundle(state, o),
        REISSUING => reissuing(state, o),
        OVERLAP => overlap(state, o),
        // An unknown annotation value parses as Stable: a hand-edited phase never wedges us.
        RotationPhase::Stable => stable(state, o),
    }
}

/// How long a phase waits before looking again.
const WAITING: Duration = Duration::from_secs(5);

/// The bundle (old + new CA) reaches every leaf Secret.
fn publishing_bundle(state: &RotationState, o: &Observations) -> Step {
    if o.leaves_with_bundle >= o.leaves_total {
        moved(
            state,
            WAITING_FOR_BUNDLE,
            o.now,
            Write::Phase,
            format!(
                "bundle in all {} leaf Secret(s); waiting for proxies to load it",
                o.leaves_total
            ),
        )
    } else {
        stay(
            state,
            format!(
                "bundle in {}/{} leaf Secret(s){}",
                o.leaves_with_bundle,
                o.leaves_total,
                waiting_for(&o.leaves_without_bundle)
            ),
            WAITING,
        )
    }
}

/// Every proxy pod loads the bundle before any leaf changes issuer.
fn waiting_for_bundle(state: &RotationState, o: &Observations) -> Step {
    if o.pods_with_bundle >= o.pods_total && o.leaves_with_bundle >= o.leaves_total {
        moved(
            state,
            REISSUING,
            o.now,
            Write::SwapToNext,
            format!(
                "all {} proxy pod(s) trust old + new CA; reissuing leaves from the new CA",
                o.pods_total
            ),
        )
    } else {
        stay(
            state,
            format!(
                "{}/{} proxy pod(s) loaded the new bundle",
                o.pods_with_bundle, o.pods_total
            ),
            WAITING,
        )
    }
}

/// Leaves reissued by the new CA, and served.
fn reissuing(state: &RotationState, o: &Observations) -> Step {
    if o.leaves_on_current_ca >= o.leaves_total && o.pods_on_current_ca >= o.pods_total {
        moved(
            state,
            OVERLAP,
            o.now,
            Write::Phase,
            format!(
                "all leaves issued by the new CA; old CA trusted for {:?} more",
                o.overlap
            ),
        )
    } else {
        stay(
            state,
            format!(
                "{}/{} leaf Secret(s) reissued, {}/{} proxy pod(s) serving them{}",
                o.leaves_on_current_ca,
                o.leaves_total,
                o.pods_on_current_ca,
                o.pods_total,
                waiting_for(&o.leaves_not_reissued)
            ),
            WAITING,
        )
    }
}

fn rfc3339(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| format!("{secs} (Unix time)"))
}

/// The old CA stays trusted for the overlap.
fn overlap(state: &RotationState, o: &Observations) -> Step {
    let ends = state.since + o.overlap.as_secs() as i64;
    if o.now >= ends {
        moved(
            state,
            STABLE,
            o.now,
            Write::DropPrevious,
            "rotation complete; old CA dropped".into(),
        )
    } else {
        stay(
            state,
            // A time, not a countdown: the message is written to the CA Secret and every
            // fleet's status only when it changes.
            format!("old CA trusted until {}", rfc3339(ends)),
            Duration::from_secs((ends - o.now).clamp(1, 300) as u64),
        )
    }
}

/// Stable until a rotation is requested or the CA's renewal time.
fn stable(state: &RotationState, o: &Observations) -> Step {
    if o.rotation_requested || o.now >= o.ca_renewal_time {
        let why = if o.rotation_requested {
            "requested"
        } else {
            "CA renewal time reached"
        };
        moved(
            state,
            PUBLISHING_BUNDLE,
            o.now,
            Write::StartRotation,
            format!("rotation started ({why}); publishing old + new CA"),
        )
    } else {
        stay(
            state,
            "stable".into(),
            Duration::from_secs((o.ca_renewal_time - o.now).clamp(1, 3600) as u64),
        )
    }
}

/// When a CA of this lifetime is renewed: two thirds into it (as leaves by default).
pub fn ca_renewal_time(not_before: i64, not_after: i64) -> i64 {
    not_after - (not_after - not_before) / 3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(phase: RotationPhase, since: i64) -> RotationState {
        RotationState {
            phase,
            since,
            has_next: false,
            has_previous: false,
        }
    }

    fn obs() -> Observations {
        Observations {
            now: 1000,
            ca_renewal_time: 10_000,
            overlap: Duration::from_secs(60),
            leaves_total: 2,
            pods_total: 3,
            ..Default::default()
        }
    }

    #[test]
    fn stable_until_requested_or_due() {
        let s = decide(&state(STABLE, 0), &obs());
        assert_eq!(s.write, None);
        assert_eq!(s.requeue, Duration::from_secs(3600));
        let requested = decide(
            &state(STABLE, 0),
            &Observations {
                rotation_requested: true,
                ..obs()
            },
        );
        assert_eq!(requested.write, Some(Write::StartRotation));
        assert_eq!(requested.state.phase, PUBLISHING_BUNDLE);
        assert!(requested.state.has_next);
        let due = decide(&state(STABLE, 0), &Observations { now: 10_000, ..obs() });
        assert_eq!(due.write, Some(Write::StartRotation));
        assert!(due.message.contains("renewal time"));
    }

    #[test]
    fn each_phase_waits_for_convergence() {
        let p = decide(
            &state(PUBLISHING_BUNDLE, 900),
            &Observations {
                leaves_with_bundle: 1,
                ..obs()
            },
        );
        assert_eq!((p.write, p.state.phase), (None, PUBLISHING_BUNDLE));
        let p = decide(
            &state(PUBLISHING_BUNDLE, 900),
            &Observations {
                leaves_with_bundle: 2,
                ..obs()
            },
        );
        assert_eq!((p.write, p.state.phase), (Some(Write::Phase), WAITING_FOR_BUNDLE));

        let w = decide(
            &state(WAITING_FOR_BUNDLE, 900),
            &Observations {
                leaves_with_bundle: 2,
                pods_with_bundle: 2,
                ..obs()
            },
        );
        assert_eq!(w.write, None);
        assert!(w.message.contains("2/3"));
        let w = decide(
            &state(WAITING_FOR_BUNDLE, 900),
            &Observations {
                leaves_with_bundle: 2,
                pods_with_bundle: 3,
                ..obs()
            },
        );
        assert_eq!((w.write, w.state.phase), (Some(Write::SwapToNext), REISSUING));
        assert!(w.state.has_previous && !w.state.has_next);

        let r = decide(
            &state(REISSUING, 900),
            &Observations {
                leaves_on_current_ca: 1,
                ..obs()
            },
        );
        assert_eq!(r.write, None);
        let r = decide(
            &state(REISSUING, 900),
            &Observations {
                leaves_on_current_ca: 2,
                pods_on_current_ca: 2,
                ..obs()
            },
        );
        assert_eq!(r.write, None, "a pod still serves an old leaf");
        let r = decide(
            &state(REISSUING, 900),
            &Observations {
                leaves_on_current_ca: 2,
                pods_on_current_ca: 3,
                ..obs()
            },
        );
        assert_eq!(
            (r.write, r.state.phase, r.state.since),
            (Some(Write::Phase), OVERLAP, 1000)
        );
    }

    #[test]
    fn overlap_ends_after_its_duration_and_drops_the_old_ca() {
        let o = decide(&state(OVERLAP, 990), &obs());
        assert_eq!(o.write, None);
        assert_eq!(o.requeue, Duration::from_secs(50));
        // Its message names a time, the same at every look (it is written only when it changes).
        let later = decide(
            &state(OVERLAP, 990),
            &Observations {
                now: obs().now + 7,
                ..obs()
            },
        );
        assert_eq!(o.message, later.message);
        assert!(o.message.contains("1970-01-01T00:17:30Z"), "{}", o.message);
        let o = decide(&state(OVERLAP, 900), &obs());
        assert_eq!((o.write, o.state.phase), (Some(Write::DropPrevious), STABLE));
        assert!(!o.state.has_previous);
    }

    /// A phase that waits names the leaf Secrets it waits for (a fleet held by the platform
    /// policy keeps its leaf as it is and would hold the rotation without a word).
    #[test]
    fn a_waiting_phase_names_the_leaves_it_waits_for() {
        let o = Observations {
            leaves_with_bundle: 1,
            leaves_without_bundle: vec!["held-tls".into()],
            ..obs()
        };
        let step = decide(&state(PUBLISHING_BUNDLE, 990), &o);
        assert_eq!(step.message, "bundle in 1/2 leaf Secret(s); waiting for held-tls");
        let many: Vec<String> = (0..7).map(|i| format!("f{i}-tls")).collect();
        assert!(waiting_for(&many).ends_with("f4-tls and 2 more"));
    }

    #[test]
    fn an_unknown_phase_is_treated_as_stable() {
        assert_eq!(RotationPhase::parse("Bogus"), STABLE);
        assert_eq!(decide(&state(RotationPhase::parse("Bogus"), 0), &obs()).write, None);
        assert_eq!(RotationPhase::parse("Reissuing"), REISSUING);
    }

    #[test]
    fn ca_renews_two_thirds_into_its_life() {
        assert_eq!(ca_renewal_time(0, 300), 200);
    }
}
