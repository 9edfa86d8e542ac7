//! Worker threads, the model of nginx, HAProxy and Envoy: each worker is one thread with its own
//! current-thread runtime, its own listening socket per listener (`SO_REUSEPORT`: the kernel
//! spreads new connections across the workers' sockets) and its own idle upstream connections.
//! A client connection lives on the worker that accepted it, with the upstream connections it
//! uses, so a request crosses no thread. The thread that calls `run` is worker 0 and also
//! runs the admin endpoint, reloads and health checks; `Workers` starts the others.
//!
//! Why not tokio's multi-thread runtime (docs/performance.md, session 27): with two workers its
//! work stealing and the wake-ups it hands between threads cost CPU per request (18.5 → 23.5 µs,
//! profiled), and its park hook cannot take the idle spin (`idle_spin`).

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;

/// How many workers the process runs; per-worker lists are this long.
static COUNT: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// This thread's worker number; 0 on any thread that is not a worker.
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The worker this thread is, for per-worker state (0 outside the workers).
pub fn index() -> usize {
    INDEX.get()
}

/// How many workers run (1 until `Workers::start` starts more).
pub fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
}

/// One `T` per worker (idle upstream connections and the like): what a worker opens is registered
/// with its own I/O driver, so it stays with that worker's requests and crosses no thread.
pub struct PerWorker<T>(Box<[T]>);

impl<T: Default> Default for PerWorker<T> {
    fn default() -> Self {
        Self((0..count()).map(|_| T::default()).collect())
    }
}

impl<T> PerWorker<T> {
    /// The calling worker's (worker 0's on a thread that is not a worker).
    pub fn mine(&self) -> &T {
        &self.0[index() % self.0.len()]
    }

    /// Every worker's.
    pub fn all(&self) -> impl Iterator<Item = &T> {
        self.0.iter()
    }
}

/// The workers beside the calling thread's, running until `stop`.
pub struct Workers {
    handles: Vec<Handle>,
    stop: watch::Sender<bool>,
}

#[derive(Debug, thiserror::Error)]
#[error("starting worker {index}: {source}")]
pub struct WorkerError {
    index: usize,
    source: std::io::Error,
}

impl Workers {
    /// No workers beside the caller's.
    pub fn none() -> Self {
        Self {
            handles: Vec::new(),
            stop: watch::channel(false).0,
        }
    }

    /// Starts `total - 1` worker threads (the caller is worker 0), each with the idle `spin`.
    /// Call before the proxy's state is built: per-worker lists are sized by `count`.
    pub fn start(total: usize, spin: Duration) -> Result<Self, WorkerError> {
        let mut workers = Self::none();
        COUNT.store(total.max(1), Ordering::Relaxed);
        for index in 1..total {
            let handle =
                start_one(index, spin, workers.stop.subscribe()).map_err(|source| WorkerError { index, source })?;
            workers.handles.push(handle);
        }
        Ok(workers)
    }

    /// The runtimes of the workers beside the caller's, worker 1 first.
    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }

    /// Ends the workers' runtimes (and any task still on them): after the drain.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One worker thread: its runtime runs until `stop` turns true or its sender goes away.
fn start_one(index: usize, spin: Duration, mut stop: watch::Receiver<bool>) -> std::io::Result<Handle> {
    let (handle_tx, handle_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("proxyfleet-worker-{index}"))
        .spawn(move || {
            INDEX.set(index);
            let mut builder = tokio::runtime::Builder::new_current_thread();
            crate::idle_spin::install(&mut builder, spin);
            let runtime = match builder.enable_all().build() {
                Ok(r) => r,
                Err(e) => {
                    let _ = handle_tx.send(Err(e));
                    return;
                }
            };
            let _ = handle_tx.send(Ok(runtime.handle().clone()));
            runtime.block_on(async move {
                while !*stop.borrow_and_update() {
                    if stop.changed().await.is_err() {
                        break;
                    }
                }
            });
        })?;
    handle_rx
        .recv()
        .map_err(|_| std::io::Error::other("the worker thread ended before its runtime started"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_worker_runs_tasks_on_its_own_thread_knows_its_number_and_stops() {
        let workers = Workers::start(3, Duration::ZERO).unwrap();
        assert_eq!(count(), 3);
        assert_eq!(index(), 0);
        let caller = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let seen: Vec<_> = workers
            .handles()
            .iter()
            .map(|h| {
                caller
                    .block_on(h.spawn(async { (index(), std::thread::current().id()) }))
                    .unwrap()
            })
            .collect();
        assert_eq!((seen[0].0, seen[1].0), (1, 2));
        assert_ne!(seen[0].1, seen[1].1);
        assert_ne!(seen[0].1, std::thread::current().id());

        let handle = workers.handles()[0].clone();
        workers.stop();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        // A runtime that has shut down cancels what is spawned on it.
        while caller.block_on(handle.spawn(async {})).is_ok() {
            assert!(std::time::Instant::now() < deadline, "the worker's runtime still runs");
            std::thread::sleep(Duration::from_millis(10));
        }
        COUNT.store(1, Ordering::Relaxed);
    }
}
