//! A spawned task that ends with its owner: when the future holding it is dropped (the leader
//! lost its lease and the controller was aborted), the task is aborted too. Watches and
//! controllers a leader started must never outlive its leadership.

use tokio::task::JoinHandle;

pub struct AbortOnDrop<T>(pub JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    /// Waits for the task to finish by itself.
    pub async fn join(&mut self) {
        let _ = (&mut self.0).await;
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dropping_the_owner_aborts_the_task() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let guard = AbortOnDrop(tokio::spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        }));
        drop(guard);
        assert!(rx.await.is_err(), "the task (and the sender it held) was dropped");
    }
}
