//! Per-object retry backoff: a fleet that keeps failing is retried after 5 s, 10 s, 20 s, …
//! up to 5 min, instead of every few seconds forever; one success resets it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

const FIRST: Duration = Duration::from_secs(5);
const MAX: Duration = Duration::from_secs(300);

/// Whether failure number `failures` in a row is one to tell the user about: the third (after
/// about 15 s of retries), then every eighth (about every 40 min at the longest delay).
pub fn worth_telling(failures: u32) -> bool {
    failures >= 3 && failures % 8 == 3
}

/// The delay before retry number `failures` (1 = after the first failure).
pub fn delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST.saturating_mul(1 << doublings).min(MAX)
}

#[derive(Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    /// Records one more failure of `key`; returns how long to wait before the next try.
    pub fn failed(&self, key: &str) -> Duration {
        delay(self.count_failure(key))
    }

    /// Records one more failure of `key`; returns how many in a row it has now.
    pub fn count_failure(&self, key: &str) -> u32 {
        let Ok(mut m) = self.failures.lock() else {
            return u32::MAX;
        };
        let n = m.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    pub fn succeeded(&self, key: &str) {
        if let Ok(mut m) = self.failures.lock() {
            m.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_five_seconds_to_five_minutes_and_resets() {
        let b = Backoff::default();
        let waits: Vec<u64> = (0..9).map(|_| b.failed("ns/a").as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(b.failed("ns/b").as_secs(), 5, "per object");
        b.succeeded("ns/a");
        assert_eq!(b.failed("ns/a").as_secs(), 5);
    }

    #[test]
    fn a_persisting_failure_is_told_at_the_third_then_every_eighth() {
        let told: Vec<u32> = (1..=30).filter(|&n| worth_telling(n)).collect();
        assert_eq!(told, [3, 11, 19, 27]);
    }
}
