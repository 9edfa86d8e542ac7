//! A timer for "waited too long for the peer": armed only while an I/O poll is pending, so
//! data that arrives (or leaves) without waiting costs no timer; one that waits allocates it
//! once and re-arms it after. Used for `limits.clientBodyTimeout` and `limits.sendTimeout`.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

/// One waiting timer.
#[derive(Default)]
pub struct Wait {
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    armed: bool,
}

impl Wait {
    /// After a poll returned `Pending`: true once it has waited `limit` since it began waiting.
    pub fn expired(&mut self, cx: &mut Context<'_>, limit: Duration) -> bool {
        if !self.armed {
            let deadline = tokio::time::Instant::now() + limit;
            match &mut self.timer {
                Some(t) => t.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            self.armed = true;
        }
        self.timer.as_mut().is_some_and(|t| t.as_mut().poll(cx).is_ready())
    }

    /// After a poll made progress.
    pub fn progressed(&mut self) {
        self.armed = false;
    }

    /// After `expired` said true while the other side moved at `at`: waits `limit` from
    /// there instead; false once that has passed too.
    pub fn moved_at(&mut self, cx: &mut Context<'_>, at: std::time::Instant, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::from_std(at) + limit;
        if deadline <= tokio::time::Instant::now() {
            return false;
        }
        if let Some(t) = &mut self.timer {
            t.as_mut().reset(deadline);
            // Registers the waker; a deadline still ahead is pending.
            let _ = t.as_mut().poll(cx);
        }
        true
    }
}
