//! A short, adaptive spin before a runtime thread sleeps.
//!
//! When a worker runs out of work it blocks in `epoll_wait`. The next packet for it then has to
//! wake a sleeping thread, and the one who pays is the sender: on a virtual machine waking a
//! halted CPU is an inter-processor interrupt and a VM exit, charged to whoever wrote the bytes —
//! the client, or the upstream on the same host. Measured on this machine at ¾ of nginx's max
//! (docs/performance.md, session 26) our front slept ~8 000 times a second against HAProxy's
//! ~1 400, and the CPU running the load generator and the upstream spent the difference waking
//! us. A thread that spins a few microseconds before sleeping is still running when the bytes
//! arrive: the kernel only marks the socket ready, and the `epoll_wait` after the spin returns at
//! once.
//!
//! The spin is adaptive, so an idle or lightly loaded proxy never burns CPU: a thread spins only
//! while it was awake for at least half of the last 10 ms and its recent sleeps were short (no
//! longer than twice the spin), i.e. when the machine is busy and work arrives often enough for a
//! spin to catch it. Go's scheduler spins before parking for a similar reason; HAProxy's
//! `busy-polling` is the unbounded form. Every worker runs one current-thread runtime (`workers`),
//! and each spins, by default not under a CPU quota; `idleSpinMicros` overrides (0 turns it off).
//!
//! The cost: a busy thread's reported CPU rises by the time it spins (at most the rest of the
//! time it would have slept), which a CPU-based autoscaler sees; set `idleSpinMicros: 0` where
//! that matters more than the latency.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// The spin when the configuration names none and no CPU quota caps the process.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(20);

/// The spin each worker's runtime gets (every worker is a one-worker, current-thread runtime:
/// in tokio's multi-thread runtime the park hook runs while the worker still counts as searching
/// for work, so a spin there would delay work other workers hand to a sleeper). Unless
/// configured, none under a CPU quota (a Kubernetes CPU limit), where the spin would spend the
/// quota the requests need — measured: 0.954 × the req/s of the same build without it in
/// bench/paired.sh's 25 % cgroups — and [`DEFAULT_SPIN`] otherwise.
pub fn spin_for(configured_micros: Option<u16>, under_cpu_quota: impl FnOnce() -> bool) -> Duration {
    match configured_micros {
        Some(us) => Duration::from_micros(us.into()),
        None if under_cpu_quota() => Duration::ZERO,
        None => DEFAULT_SPIN,
    }
}

/// The stretch of time over which a thread's busy share is judged.
const WINDOW: Duration = Duration::from_millis(10);

/// A thread's recent load: time awake and time asleep in the window being filled, and whether the
/// last full window was mostly awake.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Load {
    awake: Duration,
    asleep: Duration,
    busy: bool,
}

impl Load {
    /// Nothing recorded yet.
    const NONE: Load = Load {
        awake: Duration::ZERO,
        asleep: Duration::ZERO,
        busy: false,
    };

    /// Adds one stretch awake and the sleep after it; a window spanning [`WINDOW`] is closed and
    /// judged busy when the thread was awake for at least half of it.
    fn record(self, awake: Duration, asleep: Duration) -> Load {
        let (awake, asleep) = (self.awake + awake, self.asleep + asleep);
        if awake + asleep < WINDOW {
            return Load {
                awake,
                asleep,
                busy: self.busy,
            };
        }
        Load {
            awake: Duration::ZERO,
            asleep: Duration::ZERO,
            busy: awake >= asleep,
        }
    }
}

/// Whether the next idle moment should spin: only on a busy thread (mostly awake lately), where
/// a sleep costs its senders a wake-up they can least afford, and only while work came back
/// within twice the spin, so that a spin is likely to catch it.
fn spin_next(load: Load, last_park: Duration, spin: Duration) -> bool {
    load.busy && last_park <= spin.saturating_mul(2)
}

/// One thread's bookkeeping between the park and unpark hooks.
#[derive(Clone, Copy)]
struct State {
    unparked: Option<Instant>,
    parked: Option<(Instant, Duration)>,
    load: Load,
    spin: bool,
}

thread_local! {
    static STATE: Cell<State> = const {
        Cell::new(State { unparked: None, parked: None, load: Load::NONE, spin: false })
    };
}

/// Adds the spin to a runtime being built; a zero spin adds nothing.
pub fn install(builder: &mut tokio::runtime::Builder, spin: Duration) {
    if spin.is_zero() {
        return;
    }
    builder
        .on_thread_park(move || before_park(spin))
        .on_thread_unpark(move || after_unpark(spin));
}

fn before_park(spin: Duration) {
    let now = Instant::now();
    let mut state = STATE.get();
    let awake = state
        .unparked
        .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
    state.parked = Some((now, awake));
    STATE.set(state);
    if state.spin {
        while now.elapsed() < spin {
            std::hint::spin_loop();
        }
    }
}

fn after_unpark(spin: Duration) {
    let now = Instant::now();
    let mut state = STATE.get();
    if let Some((start, awake)) = state.parked.take() {
        let asleep = now.saturating_duration_since(start);
        state.load = state.load.record(awake, asleep);
        state.spin = spin_next(state.load, asleep, spin);
    }
    state.unparked = Some(now);
    STATE.set(state);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// The load after `n` equal stretches awake and asleep.
    fn load(n: usize, awake: Duration, asleep: Duration) -> Load {
        (0..n).fold(Load::NONE, |l, _| l.record(awake, asleep))
    }

    #[test]
    fn a_busy_thread_spins_while_its_sleeps_are_short() {
        let busy = load(200, us(70), us(30));
        assert!(spin_next(busy, us(5), us(20)));
        assert!(spin_next(busy, us(40), us(20)));
        assert!(!spin_next(busy, us(41), us(20)));
        assert!(!spin_next(busy, Duration::from_millis(10), us(20)));
    }

    #[test]
    fn a_lightly_loaded_thread_never_spins() {
        assert!(!spin_next(load(200, us(30), us(70)), us(5), us(20)));
        assert!(!spin_next(Load::NONE, us(5), us(20)));
        // One long sleep ends a busy spell at once.
        let after = load(200, us(70), us(30)).record(us(70), Duration::from_millis(50));
        assert!(!spin_next(after, us(5), us(20)));
    }

    #[test]
    fn the_judgement_waits_for_a_full_window() {
        let busy = load(200, us(70), us(30));
        let partly = load(50, us(30), us(70)).record(Duration::ZERO, Duration::ZERO);
        assert!(!partly.busy);
        let mixed = (0..50).fold(busy, |l, _| l.record(us(30), us(70)));
        assert!(
            mixed.busy,
            "half a window of light load does not undo the last judgement"
        );
    }

    #[test]
    fn a_worker_spins_by_default_but_not_under_a_quota_unless_configured() {
        assert_eq!(spin_for(None, || false), DEFAULT_SPIN);
        assert_eq!(spin_for(None, || true), Duration::ZERO);
        assert_eq!(spin_for(Some(50), || true), us(50));
        assert_eq!(spin_for(Some(0), || false), Duration::ZERO);
    }

    #[test]
    fn a_runtime_with_the_spin_runs_and_sleeps() {
        let mut b = tokio::runtime::Builder::new_current_thread();
        install(&mut b, DEFAULT_SPIN);
        let rt = b.enable_all().build().unwrap();
        let n = rt.block_on(async {
            let mut n = 0;
            for _ in 0..50 {
                tokio::time::sleep(Duration::from_micros(10)).await;
                n += 1;
            }
            n
        });
        assert_eq!(n, 50);
    }
}
