//! How a client connection ends gracefully: on drain (SIGTERM), at `limits.maxConnectionAge`,
//! or after `limits.maxRequestsPerConnection` requests. Each ends it the same way hyper does
//! for a drain: HTTP/1.1 closes after the response in flight, HTTP/2 sends GOAWAY and lets
//! open streams finish. Our own small replacement for hyper-util's `GracefulShutdown`, whose
//! connection trait is sealed: it cannot be told to end one connection early.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::sync::{watch, Notify};

/// The drain signal every connection watches; `drained` completes once all have ended.
pub struct Drain {
    tx: watch::Sender<bool>,
}

impl Default for Drain {
    fn default() -> Self {
        Self {
            tx: watch::channel(false).0,
        }
    }
}

impl Drain {
    /// A handle for one connection; the drain waits for it to be dropped.
    pub fn watcher(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }

    /// Tells every connection to finish, then waits until all have.
    pub async fn drained(&self) {
        let _ = self.tx.send(true);
        self.tx.closed().await;
    }
}

/// One connection's request budget; the service counts, the connection task listens.
#[derive(Default)]
pub struct RequestBudget {
    max: Option<u32>,
    used: AtomicU32,
    spent: Notify,
}

impl RequestBudget {
    pub fn new(max: Option<u32>) -> Self {
        Self {
            max,
            ..Default::default()
        }
    }

    /// Counts one request; when it is the last one allowed, the connection is told to end.
    pub fn count(&self) {
        let Some(max) = self.max else { return };
        if self.used.fetch_add(1, Ordering::Relaxed) + 1 == max {
            self.spent.notify_one();
        }
    }
}

/// When a served connection should begin to end.
pub struct Ending<'a> {
    pub drain: watch::Receiver<bool>,
    pub max_age: Option<Duration>,
    pub budget: &'a RequestBudget,
}

impl Ending<'_> {
    /// Completes at the first reason to end; never, when there is none.
    async fn reached(&mut self) {
        let age = async {
            match self.max_age {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let drain = async {
            while !*self.drain.borrow() {
                if self.drain.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            _ = age => {}
            _ = drain => {}
            _ = self.budget.spent.notified() => {}
        }
    }
}

/// Runs `conn` to its end; at the first reason in `ending`, calls `shutdown` on it (hyper's
/// graceful shutdown) and lets it finish what is in flight.
pub async fn run<C: Future>(conn: C, mut ending: Ending<'_>, shutdown: impl FnOnce(Pin<&mut C>)) {
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = ending.reached() => {}
    }
    shutdown(conn.as_mut());
    let _ = conn.await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    /// A connection that runs until its graceful shutdown is called (as hyper's does once the
    /// request in flight is answered); returns when it ended.
    async fn serve(ending: Ending<'_>) -> Duration {
        let started = Instant::now();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let conn = async move {
            let _ = stop_rx.await;
        };
        run(conn, ending, move |_| {
            let _ = stop_tx.send(());
        })
        .await;
        started.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_allowed_request_ends_the_connection() {
        let drain = Drain::default();
        let budget = RequestBudget::new(Some(2));
        let ending = Ending {
            drain: drain.watcher(),
            max_age: Some(Duration::from_secs(60)),
            budget: &budget,
        };
        let counting = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            budget.count();
            tokio::time::sleep(Duration::from_secs(1)).await;
            budget.count();
        };
        let (took, ()) = tokio::join!(serve(ending), counting);
        assert_eq!(took, Duration::from_secs(2), "ended by the second request, not the age");
    }

    #[tokio::test(start_paused = true)]
    async fn an_old_connection_ends_at_its_age() {
        let drain = Drain::default();
        let budget = RequestBudget::new(None);
        budget.count();
        let ending = Ending {
            drain: drain.watcher(),
            max_age: Some(Duration::from_secs(60)),
            budget: &budget,
        };
        assert_eq!(serve(ending).await, Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn the_drain_ends_every_connection_and_waits_for_them() {
        let drain = Drain::default();
        let budget = RequestBudget::new(None);
        let ending = Ending {
            drain: drain.watcher(),
            max_age: None,
            budget: &budget,
        };
        let draining = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            drain.drained().await;
            Instant::now()
        };
        let (took, drained_at) = tokio::join!(serve(ending), draining);
        assert_eq!(took, Duration::from_secs(5));
        assert!(
            drained_at.elapsed() < Duration::from_millis(1),
            "the drain returned once the connection ended"
        );
    }
}
