//! The wait behind `kubectl proxyfleet status`, for fleets and AppRollouts alike: read, judge
//! (`verdict`), and print the verdict, until there is one or the time is up. Exit 0 on Ready,
//! 1 on Failed or on an object that is not there or not ours to read, 2 on timeout.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use tokio::time::Instant;

use crate::verdict::Verdict;

/// How often the object is read again.
const EVERY: Duration = Duration::from_secs(2);

/// Waits on `read` (one read and its verdict) for up to `timeout`; `label` names the object in
/// what is printed.
pub async fn wait<F, Fut>(label: &str, timeout: Duration, mut read: F) -> ExitCode
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Verdict, kube::Error>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match read().await {
            Ok(Verdict::Ready(m)) => {
                println!("{label}: {m}");
                return ExitCode::SUCCESS;
            }
            Ok(Verdict::Failed(m)) => {
                println!("{label}: {m}");
                return ExitCode::from(1);
            }
            Ok(Verdict::Pending) => {}
            // Not there, or not ours to read: no wait changes that.
            Err(kube::Error::Api(e)) if matches!(e.code, 401 | 403 | 404) => {
                eprintln!("{label}: {e}");
                return ExitCode::from(1);
            }
            Err(e) => eprintln!("{label}: {e}"),
        }
        if Instant::now() > deadline {
            println!("{label}: timed out");
            return ExitCode::from(2);
        }
        tokio::time::sleep(EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn not_found() -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("not found", "NotFound").with_code(404),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn it_waits_through_pending_and_passing_errors_and_ends_on_a_verdict() {
        let reads = Cell::new(0);
        let code = wait("web", Duration::from_secs(60), || {
            reads.set(reads.get() + 1);
            let n = reads.get();
            async move {
                match n {
                    1 => Ok(Verdict::Pending),
                    2 => Err(kube::Error::LinesCodecMaxLineLengthExceeded),
                    _ => Ok(Verdict::Ready("Ready".into())),
                }
            }
        })
        .await;
        assert_eq!(code, ExitCode::SUCCESS);
        assert_eq!(reads.get(), 3);
        let failed = wait("web", Duration::from_secs(60), || async {
            Ok(Verdict::Failed("no".into()))
        })
        .await;
        assert_eq!(failed, ExitCode::from(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_object_fails_at_once_and_a_pending_one_times_out() {
        assert_eq!(
            wait("web", Duration::from_secs(60), || async { Err(not_found()) }).await,
            ExitCode::from(1)
        );
        let started = Instant::now();
        let code = wait("web", Duration::from_secs(10), || async { Ok(Verdict::Pending) }).await;
        assert_eq!(code, ExitCode::from(2));
        assert!(started.elapsed() >= Duration::from_secs(10));
    }
}
