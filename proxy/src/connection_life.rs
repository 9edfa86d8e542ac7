//! How a client connection ends gracefully: on drain (SIGTERM), at `limits.maxConnectionAge`,
//! after `limits.maxRequestsPerConnection` requests, or `limits.idleTimeout` after its last
//! request ended with none in flight. Each ends it the same way hyper does
//! for a drain: HTTP/1.1 closes after the response in flight, HTTP/2 sends GOAWAY and lets
//! open streams finish. Our own small replacement for hyper-util's `GracefulShutdown`, whose
//! connection trait is sealed: it cannot be told to end one connection early.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

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

/// One connection's requests: the budget, and what is in flight since when (for the idle
/// timeout). The service counts, the connection task listens.
pub struct RequestBudget {
    max: Option<u32>,
    used: AtomicU32,
    spent: Notify,
    in_flight: AtomicU32,
    /// Milliseconds from `opened` to the end of the last request.
    last_end_ms: AtomicU64,
    opened: Instant,
}

impl RequestBudget {
    pub fn new(max: Option<u32>) -> Self {
        Self {
            max,
            used: AtomicU32::new(0),
            spent: Notify::new(),
            in_flight: AtomicU32::new(0),
            last_end_ms: AtomicU64::new(0),
            opened: Instant::now(),
        }
    }

    /// Counts one request, in flight until the guard drops; when it is the last one allowed,
    /// the connection is told to end.
    pub fn count(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        if let Some(max) = self.max {
            if self.used.fetch_add(1, Ordering::Relaxed) + 1 == max {
                self.spent.notify_one();
            }
        }
        InFlight(self.clone())
    }

    /// When the connection has been idle for `idle`: `None` while a request is in flight.
    fn idle_at(&self, idle: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.opened + Duration::from_millis(self.last_end_ms.load(Ordering::Acquire)) + idle)
    }

    /// Completes once no request has been in flight for `idle`.
    async fn idled(&self, idle: Duration) {
        loop {
            match self.idle_at(idle) {
                Some(at) if at <= Instant::now() => return,
                Some(at) => tokio::time::sleep_until(at).await,
                None => tokio::time::sleep(idle).await,
            }
        }
    }
}

/// A request in flight on its connection (the service future holds it until it answers).
pub struct InFlight(Arc<RequestBudget>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let b = &self.0;
        let ms = b.opened.elapsed().as_millis() as u64;
        b.last_end_ms.fetch_max(ms, Ordering::Release);
        b.in_flight.fetch_sub(1, Ordering::Release);
    }
}

/// When a served connection should begin to end.
pub struct Ending<'a> {
    pub drain: watch::Receiver<bool>,
    pub max_age: Option<Duration>,
    pub budget: &'a RequestBudget,
    /// `limits.idleTimeout`; `None`: never for idleness.
    pub idle: Option<Duration>,
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
        let idle = async {
            match self.idle {
                Some(d) => self.budget.idled(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = age => {}
            _ = drain => {}
            _ = idle => {}
            _ = self.budget.spent.notified() => {}
        }
    }
}

/// Runs `conn` to its end; at the first reason in `ending`, calls `shutdown` on it (hyper's
/// graceful shutdown) and lets it finish what is in flight.
///
/// `ending` is polled first: the last allowed request signals it while `conn` reads that
/// request, and its answer (which needs the upstream, so a later poll) must go out with
/// `Connection: close`. Polled in select!'s random order, `conn` could write that answer
/// before the signal was seen (`connection_limits` failed 5 runs in 400 with both CPUs busy;
/// 0 in 400 polled this way).
pub async fn run<C: Future>(conn: C, mut ending: Ending<'_>, shutdown: impl FnOnce(Pin<&mut C>)) {
    tokio::pin!(conn);
    tokio::select! {
        biased;
        _ = ending.reached() => {}
        _ = conn.as_mut() => return,
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
        let budget = Arc::new(RequestBudget::new(Some(2)));
        let ending = Ending {
            drain: drain.watcher(),
            max_age: Some(Duration::from_secs(60)),
            budget: &budget,
            idle: None,
        };
        let counting = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(budget.count());
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(budget.count());
        };
        let (took, ()) = tokio::join!(serve(ending), counting);
        assert_eq!(took, Duration::from_secs(2), "ended by the second request, not the age");
    }

    #[tokio::test(start_paused = true)]
    async fn an_old_connection_ends_at_its_age() {
        let drain = Drain::default();
        let budget = Arc::new(RequestBudget::new(None));
        drop(budget.count());
        let ending = Ending {
            drain: drain.watcher(),
            max_age: Some(Duration::from_secs(60)),
            budget: &budget,
            idle: None,
        };
        assert_eq!(serve(ending).await, Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn the_drain_ends_every_connection_and_waits_for_them() {
        let drain = Drain::default();
        let budget = Arc::new(RequestBudget::new(None));
        let ending = Ending {
            drain: drain.watcher(),
            max_age: None,
            budget: &budget,
            idle: None,
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

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_ends_after_its_last_request_not_during_one() {
        let drain = Drain::default();
        let budget = Arc::new(RequestBudget::new(None));
        let ending = Ending {
            drain: drain.watcher(),
            max_age: None,
            budget: &budget,
            idle: Some(Duration::from_secs(10)),
        };
        let requests = async {
            tokio::time::sleep(Duration::from_secs(4)).await;
            let slow = budget.count();
            // In flight far longer than the idle timeout: the connection stays.
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(slow);
        };
        let (took, ()) = tokio::join!(serve(ending), requests);
        assert_eq!(
            took,
            Duration::from_secs(44),
            "10 s after the request that ended at 34 s"
        );
    }
}
