//! The newest version of each object this operator knows: its own last write when the watch
//! cache lags behind it. A decision made from the cached copy would undo the newer write (an
//! abort reverted to the step before it, a rollout started twice) or act on a command annotation
//! it already cleared (a `promote` skipping two steps). Every reconcile starts from the newer of
//! the two. One instance per kind is shared by every controller of that kind, so one controller
//! also sees the other's writes. Once the cache has caught up with a write, the copy is dropped:
//! a quiet operator keeps none (issue 24: 1 000 fleets).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::Resource;

pub struct LatestObject<K> {
    by_uid: Mutex<HashMap<String, (u64, Arc<K>)>>,
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
        let (Some(uid), Some(seen)) = (cached.meta().uid.as_deref(), version(&*cached)) else {
            return cached;
        };
        let Ok(mut m) = self.by_uid.lock() else {
            return cached;
        };
        match m.get(uid) {
            Some((written, object)) if *written > seen => object.clone(),
            Some(_) => {
                m.remove(uid);
                cached
            }
            None => cached,
        }
    }

    /// Records an object as a write returned it (a status apply, an annotation patch); an older
    /// version than one already recorded is ignored.
    pub fn record(&self, written: K) {
        let (Some(uid), Some(rv)) = (written.meta().uid.clone(), version(&written)) else {
            return;
        };
        if let Ok(mut m) = self.by_uid.lock() {
            if m.get(&uid).is_none_or(|(known, _)| *known < rv) {
                m.insert(uid, (rv, Arc::new(written)));
            }
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

    #[derive(Clone, Debug)]
    enum Step {
        /// A write: the server's next version, by this controller or by another of ours.
        Write,
        /// Another client's write (the user, a member status): the server moves on.
        Foreign,
        /// The watch delivers up to this many of the versions the cache has not seen.
        Deliver(u64),
        /// A reconcile reads its object.
        Reconcile,
    }

    proptest! {
        /// Whatever the interleaving of our writes, other writes, watch deliveries and
        /// reconciles, a reconcile never reads a version older than our last write (never
        /// decides on a status one write behind: no step repeated, no command acted on twice),
        /// never one the cache has not reached by other means, and a caught-up cache leaves no
        /// copy behind.
        #[test]
        fn a_reconcile_never_reads_behind_its_own_write(
            steps in proptest::collection::vec(prop_oneof![
                3 => Just(Step::Write),
                1 => Just(Step::Foreign),
                3 => (0u64..4).prop_map(Step::Deliver),
                3 => Just(Step::Reconcile),
            ], 1..80)
        ) {
            let l = LatestObject::default();
            let (mut server, mut cache, mut ours) = (1u64, 1u64, 0u64);
            for step in steps {
                match step {
                    Step::Write => {
                        server += 1;
                        ours = server;
                        l.record(at("u", server));
                    }
                    Step::Foreign => server += 1,
                    Step::Deliver(n) => cache = (cache + n).min(server),
                    Step::Reconcile => {
                        let read = rv(&l.newest(Arc::new(at("u", cache))));
                        prop_assert!(read >= ours, "read {read}, our last write {ours}");
                        prop_assert_eq!(read, cache.max(ours));
                    }
                }
            }
            cache = server;
            let _ = l.newest(Arc::new(at("u", cache)));
            prop_assert_eq!(l.held(), 0);
        }
    }
}
