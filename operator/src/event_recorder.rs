//! kube-runtime's event [`Recorder`], let go of when idle. A Recorder keeps every event it
//! published for six minutes, to count repeats as one series, and forgets old ones only on its
//! next publish: after a busy spell a quiet operator held every event of it (5.9 MiB at 1 000
//! fleets, issue 24). A recorder idle for a minute is dropped, and the next event starts a
//! fresh one. What that changes: an event repeated after a minute of total quiet becomes a new
//! Event object instead of a count on the old one's series — one API write either way (a create
//! instead of a patch); the API server expires both alike. During any busy spell (a rollout, a
//! burst of fleets) the recorder lives on and series count as before.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::Client;

/// How long the recorder may sit idle before it is dropped (kube-runtime's own series window,
/// beyond which it would have forgotten an event anyway, is six minutes).
const IDLE: Duration = Duration::from_secs(60);

type Slot = Mutex<Option<(Recorder, Instant)>>;

pub struct Events {
    client: Client,
    reporter: Reporter,
    slot: Arc<Slot>,
}

impl Events {
    /// A publisher, and a task that drops its recorder once idle (it ends with the publisher).
    pub fn new(client: Client, reporter: Reporter) -> Self {
        let slot: Arc<Slot> = Arc::default();
        tokio::spawn(forget_when_idle(Arc::downgrade(&slot)));
        Self { client, reporter, slot }
    }

    pub async fn publish(&self, ev: &Event, reference: &ObjectReference) -> Result<(), kube::Error> {
        let recorder = {
            let Ok(mut slot) = self.slot.lock() else {
                return Ok(());
            };
            let (recorder, last) = slot.get_or_insert_with(|| {
                (
                    Recorder::new(self.client.clone(), self.reporter.clone()),
                    Instant::now(),
                )
            });
            *last = Instant::now();
            recorder.clone()
        };
        recorder.publish(ev, reference).await
    }
}

async fn forget_when_idle(slot: Weak<Slot>) {
    let mut tick = tokio::time::interval(IDLE / 6);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(held) = slot.upgrade() else { return };
        let Ok(mut recorder) = held.lock() else { return };
        forget_if_idle(&mut recorder, Instant::now());
    }
}

/// Drops the recorder when its last event is older than [`IDLE`].
fn forget_if_idle<R>(slot: &mut Option<(R, Instant)>, now: Instant) {
    if slot.as_ref().is_some_and(|(_, last)| now.duration_since(*last) > IDLE) {
        *slot = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorder_is_dropped_only_after_a_minute_idle() {
        let start = Instant::now();
        let mut slot = Some(((), start));
        forget_if_idle(&mut slot, start + IDLE);
        assert!(slot.is_some(), "busy enough: an event may still join its series");
        forget_if_idle(&mut slot, start + IDLE + Duration::from_secs(1));
        assert!(slot.is_none());
        let mut empty: Option<((), Instant)> = None;
        forget_if_idle(&mut empty, start);
        assert!(empty.is_none());
    }
}
