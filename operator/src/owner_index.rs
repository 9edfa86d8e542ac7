//! The cached objects each fleet controls, by the controller's uid, so a reconcile finds its own
//! among thousands without reading them all. Scanning every cached ConfigMap, Deployment,
//! Service, PodDisruptionBudget and ControllerRevision on each pass (to find orphans and the
//! revision history) was about two thirds of the operator's CPU at 1 000 fleets (issue 24):
//! quadratic in the number of fleets.
//!
//! The index is a superset, checked on every read: a name is noted whenever the watch sees its
//! object, and dropped when a read or the periodic sweep finds it gone from the cache (deleted,
//! or gone in a relist) or no longer controlled by that owner. What a read returns is always
//! what the cache holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Resource;

use crate::labels;

/// An object's namespace and name.
type Key = (String, String);

/// Owner uid → the objects of one kind it controls: a handful each (its ConfigMaps, a
/// Deployment per track, its revisions), so a list is searched faster than a set is hashed,
/// and a watch event for a name already noted allocates nothing.
#[derive(Clone, Default)]
pub struct OwnerIndex {
    by_owner: Arc<Mutex<HashMap<String, Vec<Key>>>>,
}

fn cached<K: Resource<DynamicType = ()> + Clone + 'static>(
    cache: &Store<K>,
    (namespace, name): &Key,
) -> Option<Arc<K>> {
    cache.get(&ObjectRef::new(name).within(namespace))
}

/// The uid of the object's controller, if it has one.
fn controller_uid<K: Resource>(object: &K) -> Option<&str> {
    meta_controller_uid(object.meta())
}

/// The uid of the controller named in `meta`, if any.
pub fn meta_controller_uid(meta: &ObjectMeta) -> Option<&str> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.as_str())
}

/// The object of kind `O` that controls an object with metadata `meta`, if one does.
pub fn controller_of<O: Resource<DynamicType = ()>>(meta: &ObjectMeta) -> Option<ObjectRef<O>> {
    let owner = meta
        .owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true) && r.kind == O::kind(&()) && r.api_version == O::api_version(&()))?;
    Some(ObjectRef::new(&owner.name).within(meta.namespace.as_deref()?))
}

impl OwnerIndex {
    /// Notes an object the watch saw (applied or deleted; a read tells them apart).
    pub fn note<K: Resource>(&self, object: &K) {
        let meta = object.meta();
        let (Some(uid), Some(namespace), Some(name)) = (controller_uid(object), &meta.namespace, &meta.name) else {
            return;
        };
        let Ok(mut m) = self.by_owner.lock() else { return };
        match m.get_mut(uid) {
            Some(keys) if keys.iter().any(|(ns, n)| ns == namespace && n == name) => {}
            Some(keys) => keys.push((namespace.clone(), name.clone())),
            None => {
                m.insert(uid.to_string(), vec![(namespace.clone(), name.clone())]);
            }
        }
    }

    /// The objects in `cache` that `owner_uid` controls in `namespace` (ours by label and
    /// controller reference, see `is_owned_by`); names whose object is gone are forgotten.
    pub fn owned<K>(&self, cache: &Store<K>, namespace: &str, owner_uid: &str) -> Vec<Arc<K>>
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        let Ok(mut m) = self.by_owner.lock() else {
            return Vec::new();
        };
        let Some(keys) = m.get_mut(owner_uid) else {
            return Vec::new();
        };
        let mut found = Vec::with_capacity(keys.len());
        keys.retain(|key| match cached(cache, key) {
            Some(object) if is_owned_by(object.as_ref(), owner_uid) => {
                if key.0 == namespace {
                    found.push(object);
                }
                true
            }
            _ => false,
        });
        if keys.is_empty() {
            m.remove(owner_uid);
        }
        found
    }

    /// Forgets every object `cache` no longer holds under that owner (objects of
    /// deleted fleets, which no read asks for again). Returns how many names are left.
    pub fn sweep<K>(&self, cache: &Store<K>) -> usize
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        let Ok(mut m) = self.by_owner.lock() else { return 0 };
        m.retain(|uid, keys| {
            keys.retain(|key| cached(cache, key).is_some_and(|o| controller_uid(o.as_ref()) == Some(uid.as_str())));
            !keys.is_empty()
        });
        m.values().map(Vec::len).sum()
    }
}

/// Ours: our managed-by label and a controller owner reference to this exact object.
pub fn is_owned_by<K: Resource>(obj: &K, owner_uid: &str) -> bool {
    let m = obj.meta();
    m.labels
        .as_ref()
        .and_then(|l| l.get(labels::MANAGED_BY))
        .map(String::as_str)
        == Some(labels::MANAGER)
        && m.owner_references
            .as_ref()
            .is_some_and(|refs| refs.iter().any(|r| r.uid == owner_uid && r.controller == Some(true)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;

    fn cm(name: &str, namespace: &str, owner: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some(namespace.into());
        c.metadata.labels = Some(crate::labels::owned("edge"));
        c.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "proxyfleet.io/v1alpha1".into(),
            kind: "ProxyDeployment".into(),
            name: "edge".into(),
            uid: owner.into(),
            controller: Some(true),
            ..Default::default()
        }]);
        c
    }

    fn seen(writer: &mut Writer<ConfigMap>, index: &OwnerIndex, event: Event<ConfigMap>) {
        writer.apply_watcher_event(&event);
        match &event {
            Event::Apply(o) | Event::Delete(o) => index.note(o),
            _ => {}
        }
    }

    fn names(found: Vec<Arc<ConfigMap>>) -> Vec<String> {
        let mut n: Vec<String> = found.iter().filter_map(|o| o.metadata.name.clone()).collect();
        n.sort();
        n
    }

    #[test]
    fn ownership_needs_both_label_and_controller_reference() {
        let mut bare = cm("x", "team-a", "u1");
        bare.metadata.labels = None;
        assert!(is_owned_by(&cm("x", "team-a", "u1"), "u1"));
        assert!(!is_owned_by(&bare, "u1"));
        assert!(!is_owned_by(&cm("x", "team-a", "u2"), "u1"));
    }

    /// A fleet reads exactly the objects it controls in its namespace, as the cache holds them:
    /// not another fleet's, not a deleted one's, not one that changed hands.
    #[test]
    fn a_fleet_reads_only_what_it_controls_now() {
        let (cache, mut writer) = kube::runtime::reflector::store::<ConfigMap>();
        let index = OwnerIndex::default();
        seen(&mut writer, &index, Event::Apply(cm("edge-config-1", "team-a", "u1")));
        seen(&mut writer, &index, Event::Apply(cm("edge-config-2", "team-a", "u1")));
        // Every update of an object is a watch event: still one entry.
        seen(&mut writer, &index, Event::Apply(cm("edge-config-2", "team-a", "u1")));
        seen(&mut writer, &index, Event::Apply(cm("other-config", "team-a", "u2")));
        // The same owner uid on an object of another namespace (owner references never cross
        // namespaces): not this fleet's.
        seen(&mut writer, &index, Event::Apply(cm("edge-config-1", "team-b", "u1")));
        assert_eq!(
            names(index.owned(&cache, "team-a", "u1")),
            ["edge-config-1", "edge-config-2"]
        );
        assert_eq!(names(index.owned(&cache, "team-a", "u2")), ["other-config"]);
        assert!(index.owned(&cache, "team-a", "u9").is_empty());
        assert_eq!(index.sweep(&cache), 4);

        seen(&mut writer, &index, Event::Delete(cm("edge-config-1", "team-a", "u1")));
        assert_eq!(names(index.owned(&cache, "team-a", "u1")), ["edge-config-2"]);
        // Taken over by another owner: no longer the first one's.
        seen(&mut writer, &index, Event::Apply(cm("edge-config-2", "team-a", "u2")));
        assert!(index.owned(&cache, "team-a", "u1").is_empty());
        assert_eq!(
            names(index.owned(&cache, "team-a", "u2")),
            ["edge-config-2", "other-config"]
        );
    }

    /// Objects that vanish in a relist, and a deleted fleet's objects that nobody reads again,
    /// are let go by the sweep.
    #[test]
    fn the_sweep_lets_go_of_what_the_cache_no_longer_holds() {
        let (cache, mut writer) = kube::runtime::reflector::store::<ConfigMap>();
        let index = OwnerIndex::default();
        seen(&mut writer, &index, Event::Apply(cm("gone-config", "team-a", "u1")));
        seen(&mut writer, &index, Event::Apply(cm("kept-config", "team-a", "u2")));
        // A relist without gone-config: the cache drops it, no Delete is seen.
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(cm("kept-config", "team-a", "u2")));
        writer.apply_watcher_event(&Event::InitDone);
        assert_eq!(index.sweep(&cache), 1);
        assert!(index.owned(&cache, "team-a", "u1").is_empty());
        assert_eq!(names(index.owned(&cache, "team-a", "u2")), ["kept-config"]);
    }

    fn owned_by(kind: &str, api_version: &str, controller: bool) -> ObjectMeta {
        ObjectMeta {
            namespace: Some("team-a".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "edge".into(),
                uid: "u1".into(),
                controller: Some(controller),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn the_controlling_owner_of_the_right_kind_is_found() {
        use crate::{app::spec::AppRollout, crd::ProxyDeployment};
        let meta = owned_by("ProxyDeployment", "proxyfleet.io/v1alpha1", true);
        assert_eq!(
            controller_of::<ProxyDeployment>(&meta),
            Some(ObjectRef::new("edge").within("team-a"))
        );
        assert_eq!(controller_of::<AppRollout>(&meta), None);
    }

    #[test]
    fn owners_that_do_not_control_or_are_of_another_group_are_not() {
        use crate::crd::ProxyDeployment;
        let not_controller = owned_by("ProxyDeployment", "proxyfleet.io/v1alpha1", false);
        assert_eq!(controller_of::<ProxyDeployment>(&not_controller), None);
        let other_group = owned_by("ProxyDeployment", "example.com/v1", true);
        assert_eq!(controller_of::<ProxyDeployment>(&other_group), None);
    }
}
