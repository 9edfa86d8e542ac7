//! The status this operator last wrote, per object. The watch cache can lag behind our own
//! write; a decision made from the older status would undo the newer one (an abort reverted to
//! the step before it). Reconciles read the newer of the two. Once the cache has caught up with
//! a write, the copy is dropped: a quiet operator keeps none (issue 24: 1 000 fleets' statuses).

use std::collections::HashMap;
use std::sync::Mutex;

pub struct LatestStatus<S> {
    by_uid: Mutex<HashMap<String, (u64, S)>>,
}

impl<S> Default for LatestStatus<S> {
    fn default() -> Self {
        Self {
            by_uid: Mutex::new(HashMap::new()),
        }
    }
}

impl<S: Clone> LatestStatus<S> {
    /// Our last written status of `uid`, when it is newer than the cached object's version;
    /// a write the cache already holds is forgotten.
    pub fn newer_than(&self, uid: &str, cached_resource_version: Option<&str>) -> Option<S> {
        let cached = cached_resource_version?.parse::<u64>().ok()?;
        let mut m = self.by_uid.lock().ok()?;
        match m.get(uid) {
            Some((written, status)) if *written > cached => Some(status.clone()),
            Some(_) => {
                m.remove(uid);
                None
            }
            None => None,
        }
    }

    /// Records a status written at `resource_version`.
    pub fn record(&self, uid: &str, resource_version: Option<&str>, status: S) {
        let Some(rv) = resource_version.and_then(|r| r.parse::<u64>().ok()) else {
            return;
        };
        if let Ok(mut m) = self.by_uid.lock() {
            m.insert(uid.to_string(), (rv, status));
        }
    }

    pub fn forget(&self, uid: &str) {
        if let Ok(mut m) = self.by_uid.lock() {
            m.remove(uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_newer_write_wins_over_the_cache() {
        let l = LatestStatus::default();
        l.record("u", Some("10"), "aborted");
        assert_eq!(l.newer_than("u", Some("9")), Some("aborted"));
        assert_eq!(l.newer_than("u", Some("10")), None, "the cache holds the write");
        assert_eq!(l.newer_than("u", Some("9")), None, "and the copy was let go");
        assert_eq!(l.newer_than("other", Some("1")), None);
        l.forget("u");
        assert_eq!(l.newer_than("u", Some("9")), None);
    }
}
