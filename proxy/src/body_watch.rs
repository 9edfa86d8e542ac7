//! Where a streamed request body is, shared between the body (`UpstreamBody` in body.rs) and
//! those that judge by it: the attempt's blame and route timeout (handler.rs), and the
//! response's idle timer (upstream/response.rs).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What became of a watched request body (`UpstreamBody::watched`), as far as it was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum BodyState {
    /// Waiting for the client's next part.
    Sending = 0,
    Ended = 1,
    TooLarge = 2,
    TimedOut = 3,
    Broken = 4,
    /// A part was read and handed on: the next waits for the upstream to take it.
    Held = 5,
    /// Not asked for yet: the upstream has not begun to take it.
    Unread = 6,
}

/// Where a watched body is, shared between the body and its `BodyWatch`.
pub struct Watched {
    state: AtomicU8,
    since: Instant,
    /// Microseconds from `since` to the last part read (or the end); 0 before the first.
    progressed: AtomicU64,
}

impl Watched {
    /// A body not read yet, made now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            state: AtomicU8::new(BodyState::Unread as u8),
            since: Instant::now(),
            progressed: AtomicU64::new(0),
        })
    }
}

/// Shared with the body it watches: an HTTP/2 upstream connection only logs a body's error and
/// resets the stream, so the response's error cannot say whose fault it was; and the route's
/// timeout counts from the body's last part (`last_progress`), not from the request's start.
pub struct BodyWatch(Arc<Watched>);

impl BodyWatch {
    pub fn of(watched: &Arc<Watched>) -> Self {
        Self(watched.clone())
    }

    pub fn get(&self) -> BodyState {
        // Acquire: pairs with `progressed`'s Release, so a part's time is seen with its state.
        match self.0.state.load(Ordering::Acquire) {
            0 => BodyState::Sending,
            1 => BodyState::Ended,
            2 => BodyState::TooLarge,
            3 => BodyState::TimedOut,
            5 => BodyState::Held,
            6 => BodyState::Unread,
            _ => BodyState::Broken,
        }
    }

    /// When a part of the body was last read from the client, or it ended; before the first,
    /// when the body was made (a body read whole before, a transcoded one, starts there).
    pub fn last_progress(&self) -> Instant {
        self.0.since + Duration::from_micros(self.0.progressed.load(Ordering::Relaxed))
    }
}

pub fn mark(watch: &Option<Arc<Watched>>, state: BodyState) {
    if let Some(w) = watch {
        w.state.store(state as u8, Ordering::Relaxed);
    }
}

/// A part was read (or the end): the clock is read only for a watched body.
pub fn progressed(watch: &Option<Arc<Watched>>, state: BodyState) {
    if let Some(w) = watch {
        let us = u64::try_from(w.since.elapsed().as_micros()).unwrap_or(u64::MAX);
        w.progressed.store(us, Ordering::Relaxed);
        w.state.store(state as u8, Ordering::Release);
    }
}
