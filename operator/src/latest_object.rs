//! The newest version of each object this operator knows: its own last write when the watch
//! cache lags behind it. A decision made from the cached copy would undo the newer write (an
//! abort reverted to the step before it, a rollout started twice) or act on a command annotation
//! it already cleared (a `promote` skipping two steps). Every reconcile starts from the newer of
//! the two. One instance per kind is shared by every controller of that kind, so one controller
//! also sees the other's writes. Once the cache has caught up with a write the copy is dropped,
//! and none is kept past `MAX_LAG`: a quiet operator keeps none (issue 24: 1 000 fleets).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Resource;

/// How long a write may be preferred over the cache: longer than a silently dead watch goes
/// unnoticed (kube-runtime restarts a watch that received nothing for 290 s + 5 s, then
/// relists), so a copy never expires while the cache is merely stuck. The bound lets go of
/// objects deleted before a pass saw the cache catch up (nothing reconciles an object that is
/// gone) and of versions from before an etcd restore.
const MAX_LAG: Duration = Duration::from_secs(600);

struct Written<K> {
    version: u64,
    at: Instant,
    object: Arc<K>,
}

pub struct LatestObject<K> {
    by_uid: Mutex<HashMap<String, Written<K>>>,
}

impl<K> Default for LatestObject<K> {
    fn default() -> Self {
        Self {
            by_uid: Mutex::new(HashMap::new()),
        }
    }
}

fn version<K: Resource>(k: &K) -> Option<u64> {
    k.meta().resource_version.as_deref()?.parse().ok()
}

impl<K: Resource> LatestObject<K> {
    /// The newer of `cached` and our last write of it; a write the cache already holds is
    /// forgotten.
    pub fn newest(&self, cached: Arc<K>) -> Arc<K> {
        self.newest_at(cached, Instant::now())
    }

    fn newest_at(&self, cached: Arc<K>, now: Instant) -> Arc<K> {
        let (Some(uid), Some(seen)) = (cached.meta().uid.as_deref(), version(&*cached)) else {
            return cached;
        };
        let Ok(mut m) = self.by_uid.lock() else {
            return cached;
        };
        m.retain(|_, w| now.duration_since(w.at) < MAX_LAG);
        match m.get(uid) {
            Some(w) if w.version > seen && now.duration_since(w.at) < MAX_LAG => w.object.clone(),
            Some(_) => {
                m.remove(uid);
                cached
            }
            None => cached,
        }
    }

    /// Records an object as a write returned it (a status apply, an annotation or finalizer
    /// patch), trimmed as the cache trims it; an older version than one already recorded is
    /// ignored. Copies past `MAX_LAG` are let go here and on every read.
    pub fn record(&self, written: K) {
        self.record_at(written, Instant::now())
    }

    fn record_at(&self, mut written: K, now: Instant) {
        let (Some(uid), Some(version)) = (written.meta().uid.clone(), version(&written)) else {
            return;
        };
        crate::cache_trim::trim_meta(&mut written);
        let Ok(mut m) = self.by_uid.lock() else { return };
        m.retain(|_, w| now.duration_since(w.at) < MAX_LAG);
        if m.get(&uid).is_none_or(|w| w.version < version) {
            let object = Arc::new(written);
            m.insert(
                uid,
                Written {
                    version,
                    at: now,
                    object,
                },
            );
        }
    }

    pub fn forget(&self, uid: &str) {
        if let Ok(mut m) = self.by_uid.lock() {
            m.remove(uid);
        }
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.by_uid.lock().map(|m| m.len()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use proptest::prelude::*;

    fn at(uid: &str, rv: u64) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.uid = Some(uid.into());
        c.metadata.resource_version = Some(rv.to_string());
        c
    }

    fn rv(c: &ConfigMap) -> u64 {
        version(c).expect("a version")
    }

    #[test]
    fn only_a_newer_write_wins_over_the_cache() {
        let l = LatestObject::default();
        l.record(at("u", 10));
        assert_eq!(rv(&l.newest(Arc::new(at("u", 9)))), 10);
        assert_eq!(rv(&l.newest(Arc::new(at("u", 10)))), 10, "the cache holds the write");
        assert_eq!(rv(&l.newest(Arc::new(at("u", 9)))), 9, "and the copy was let go");
        assert_eq!(rv(&l.newest(Arc::new(at("other", 1)))), 1);
        l.record(at("u", 12));
        l.record(at("u", 11));
        assert_eq!(
            rv(&l.newest(Arc::new(at("u", 9)))),
            12,
            "an older write never replaces a newer"
        );
        l.forget("u");
        assert_eq!(rv(&l.newest(Arc::new(at("u", 9)))), 9);
    }

    #[test]
    fn a_copy_is_let_go_after_the_longest_lag_and_keeps_no_managed_fields() {
        let (l, start) = (LatestObject::default(), Instant::now());
        let mut written = at("gone", 10);
        written.metadata.managed_fields = Some(vec![Default::default()]);
        l.record_at(written, start);
        let held = l.newest_at(Arc::new(at("gone", 9)), start);
        assert!(held.metadata.managed_fields.is_none());
        // Deleted meanwhile: nothing reads it again, the next write elsewhere lets it go.
        l.record_at(at("other", 3), start + MAX_LAG);
        assert_eq!(l.held(), 1);
        let late = l.newest_at(Arc::new(at("other", 2)), start + MAX_LAG * 2);
        assert_eq!(rv(&late), 2, "past the longest lag the cache wins");
        assert_eq!(l.held(), 0);
    }

    #[derive(Clone, Debug)]
    enum Step {
        /// A write to object `.0`: the server's next version, by this controller or by another
        /// of ours; its response may be recorded after a later one (`.1`).
        Write(usize, bool),
        /// Another client's write to object `.0` (the user, a member's status).
        Foreign(usize),
        /// The watch delivers up to this many of the versions the cache has not seen.
        Deliver(u64),
        /// A reconcile of object `.0` reads it.
        Reconcile(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (0usize..3, any::<bool>()).prop_map(|(o, late)| Step::Write(o, late)),
            1 => (0usize..3).prop_map(Step::Foreign),
            3 => (0u64..4).prop_map(Step::Deliver),
            3 => (0usize..3).prop_map(Step::Reconcile),
        ]
    }

    proptest! {
        /// Whatever the interleaving of our writes (their responses recorded in or out of
        /// order), other writes, watch deliveries and reconciles over three objects, a reconcile
        /// never reads a version older than our last write of its object (never decides on a
        /// status one write behind: no step repeated, no command acted on twice) nor older than
        /// its cache, and a caught-up cache leaves no copy behind.
        #[test]
        fn a_reconcile_never_reads_behind_its_own_write(steps in proptest::collection::vec(step(), 1..120)) {
            let l = LatestObject::default();
            let uid = |o: usize| format!("u{o}");
            // One etcd: versions are global; per object, what the server and the cache hold.
            let (mut etcd, mut server, mut cache, mut ours) = (1u64, [1u64; 3], [1u64; 3], [0u64; 3]);
            let mut late: Option<(usize, u64)> = None;
            let mut log: Vec<(usize, u64)> = vec![(0, 1), (1, 1), (2, 1)];
            for step in steps {
                match step {
                    Step::Write(o, delayed) => {
                        etcd += 1;
                        server[o] = etcd;
                        ours[o] = etcd;
                        log.push((o, etcd));
                        // A held-back response lands after this newer one: out of order.
                        let held_back = late.take();
                        if delayed {
                            late = Some((o, etcd));
                        } else {
                            l.record(at(&uid(o), etcd));
                        }
                        if let Some((lo, lv)) = held_back {
                            l.record(at(&uid(lo), lv));
                        }
                    }
                    Step::Foreign(o) => {
                        etcd += 1;
                        server[o] = etcd;
                        log.push((o, etcd));
                    }
                    Step::Deliver(n) => {
                        for _ in 0..n {
                            let next = log.iter().find(|(o, v)| *v > cache[*o]).copied();
                            if let Some((o, v)) = next {
                                cache[o] = v;
                            }
                        }
                    }
                    Step::Reconcile(o) => {
                        // A write whose response is not yet recorded is still in flight: the
                        // pass that made it has not ended, and another controller's pass may
                        // read the version before it (each owns its own part of the status).
                        if late.is_some_and(|(lo, _)| lo == o) {
                            continue;
                        }
                        let read = rv(&l.newest(Arc::new(at(&uid(o), cache[o]))));
                        prop_assert!(read >= ours[o], "object {o}: read {read}, our last write {}", ours[o]);
                        prop_assert!(read >= cache[o]);
                        prop_assert!(read <= server[o]);
                    }
                }
            }
            if let Some((lo, lv)) = late.take() {
                l.record(at(&uid(lo), lv));
            }
            for (o, v) in server.iter().enumerate() {
                let _ = l.newest(Arc::new(at(&uid(o), *v)));
            }
            prop_assert_eq!(l.held(), 0);
        }
    }
}
