//! kube-runtime's event [`Recorder`], let go of when idle. A Recorder keeps every event it
//! published for six minutes, to count repeats as one series, and forgets old ones only on its
//! next publish: after a busy spell a quiet operator held every event of it (5.9 MiB at 1 000
//! fleets, issue 24). A recorder idle for longer than that window holds nothing a new event
//! could join, so it is dropped, and the next event starts a fresh one.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::Client;

/// How long kube-runtime's Recorder counts a repeated event into the same series.
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

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
    let mut tick = tokio::time::interval(SERIES_WINDOW / 6);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(held) = slot.upgrade() else { return };
        let Ok(mut recorder) = held.lock() else { return };
        forget_if_idle(&mut recorder, Instant::now());
    }
}

/// Drops the recorder when its last event is older than the series window.
fn forget_if_idle<R>(slot: &mut Option<(R, Instant)>, now: Instant) {
    if slot
        .as_ref()
        .is_some_and(|(_, last)| now.duration_since(*last) > SERIES_WINDOW)
    {
        *slot = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorder_is_dropped_only_after_the_series_window() {
        let start = Instant::now();
        let mut slot = Some(((), start));
        forget_if_idle(&mut slot, start + SERIES_WINDOW);
        assert!(slot.is_some(), "an event may still join its series");
        forget_if_idle(&mut slot, start + SERIES_WINDOW + Duration::from_secs(1));
        assert!(slot.is_none());
        let mut empty: Option<((), Instant)> = None;
        forget_if_idle(&mut empty, start);
        assert!(empty.is_none());
    }
}
