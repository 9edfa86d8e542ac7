//! The ACME orders in flight, one per fleet at most. Only the leader reconciles fleets, so
//! one registry in its memory is enough for "one order per fleet whatever the number of
//! operator replicas"; a new leader starts from the status (the backoff is recorded there)
//! and places a new order, which the ACME server handles as any client retry. Orders end with
//! the controllers that started them ([`Orders::stop_on_drop`]): a replica that stopped
//! leading (shutdown, a lost lease) keeps none running beside the new leader's.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

/// What a finished order hands back.
pub struct Issued {
    pub chain_pem: String,
    pub key_pem: String,
}

#[derive(Debug, Clone)]
pub struct Failure {
    pub message: String,
    /// When the server allows the next attempt (unix seconds), if it said.
    pub retry_after: Option<i64>,
}

/// Both outcomes carry the account's credentials when this order created the account, so the
/// reconcile stores them whatever happened next.
pub struct Outcome {
    pub result: Result<Issued, Failure>,
    pub new_credentials: Option<String>,
    pub account: Option<String>,
}

enum Slot {
    Running(tokio::task::AbortHandle),
    Done(Outcome),
}

#[derive(Default)]
pub struct Orders(Arc<Mutex<HashMap<String, Slot>>>);

impl Orders {
    /// Whether an order runs for the fleet.
    pub fn in_flight(&self, uid: &str) -> bool {
        self.0
            .lock()
            .is_ok_and(|m| matches!(m.get(uid), Some(Slot::Running(_))))
    }

    /// The finished order's outcome, once.
    pub fn take_finished(&self, uid: &str) -> Option<Outcome> {
        let mut m = self.0.lock().ok()?;
        if !matches!(m.get(uid), Some(Slot::Done(_))) {
            return None;
        }
        match m.remove(uid) {
            Some(Slot::Done(o)) => Some(o),
            _ => None,
        }
    }

    /// Starts an order unless one is there already (running or not yet collected).
    pub fn start(&self, uid: &str, order: impl Future<Output = Outcome> + Send + 'static) -> bool {
        let Ok(mut m) = self.0.lock() else { return false };
        if m.contains_key(uid) {
            return false;
        }
        let slots = self.0.clone();
        let key = uid.to_string();
        let task = tokio::spawn(async move {
            let outcome = order.await;
            if let Ok(mut m) = slots.lock() {
                // Forgotten meanwhile (the fleet left ACME or was deleted): drop the result.
                if m.contains_key(&key) {
                    m.insert(key, Slot::Done(outcome));
                }
            }
        });
        m.insert(uid.to_string(), Slot::Running(task.abort_handle()));
        true
    }

    /// Stops and forgets the fleet's order (the fleet no longer uses ACME, or is gone).
    pub fn forget(&self, uid: &str) {
        if let Some(Slot::Running(task)) = self.0.lock().ok().and_then(|mut m| m.remove(uid)) {
            task.abort();
        }
    }

    /// A guard that aborts every running order when dropped (the controllers' run ends or is
    /// aborted). Orders hold the context, so the registry alone would outlive the controllers.
    pub fn stop_on_drop(&self) -> StopOnDrop {
        StopOnDrop(self.0.clone())
    }
}

/// See [`Orders::stop_on_drop`].
pub struct StopOnDrop(Arc<Mutex<HashMap<String, Slot>>>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let Ok(mut slots) = self.0.lock() else { return };
        for (_, slot) in slots.drain() {
            if let Slot::Running(task) = slot {
                task.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn orders_end_with_the_controllers_that_started_them() {
        let orders = Orders::default();
        let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<()>();
        let order = async move {
            let _noticed = dropped_tx; // dropped with the order's future
            std::future::pending::<Outcome>().await
        };
        assert!(orders.start("u1", order));
        assert!(orders.in_flight("u1"));
        drop(orders.stop_on_drop());
        assert!(!orders.in_flight("u1"));
        assert!(dropped_rx.await.is_err(), "the order's task was aborted");
    }
}
