//! One watch of a kind, feeding one cache and every controller that reconciles that kind
//! (`Controller::for_shared_stream`). The fleet and the propagation controllers both reconcile
//! ProxyDeployments; with a watch each they kept two caches of every fleet (issue 24: the
//! operator's memory at 1 000 fleets).
//!
//! kube-runtime's own shared reflector (`reflect_shared`) was not used: its subscriber returns
//! `Pending` without a wake-up when an object is deleted between the broadcast and the read,
//! and a quiet controller then sees no trigger until something else wakes its task. Here the
//! watch sends each applied object, as the cache holds it, to one unbounded channel per
//! controller: a trigger is never held back, and a slow controller never stalls the watch.

use std::sync::Arc;

use futures::channel::mpsc::{unbounded, UnboundedReceiver, UnboundedSender};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use serde::de::DeserializeOwned;

use crate::cache_trim::Trim;

/// The changes one controller reconciles: each object as the shared cache holds it.
pub type Triggers<K> = UnboundedReceiver<Arc<K>>;

/// A cache of what `api` and `config` select, trimmed ([`Trim`]), with `N` trigger streams
/// (one per controller) and the future that keeps both; `on_touched` sees every object
/// (deleted ones too) after the cache holds the change.
pub fn shared_input<K, const N: usize>(
    api: Api<K>,
    config: watcher::Config,
    mut on_touched: impl FnMut(&K) + Send + 'static,
) -> (Store<K>, [Triggers<K>; N], impl std::future::Future<Output = ()>)
where
    K: Trim + Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let mut senders = Vec::with_capacity(N);
    let triggers: [Triggers<K>; N] = std::array::from_fn(|_| {
        let (tx, rx) = unbounded();
        senders.push(tx);
        rx
    });
    let cache = reader.clone();
    let trimmed = watcher(api, config).modify(K::trim);
    let driver = reflector::reflector(writer, trimmed)
        .default_backoff()
        .touched_objects()
        .for_each(move |object| {
            if let Ok(object) = object {
                on_touched(&object);
                fan_out(&cache, &object, &senders);
            }
            futures::future::ready(())
        });
    (reader, triggers, driver)
}

/// Sends the cache's copy of `object` to every controller; a deleted object (gone from the
/// cache) is sent to none, as `Controller::for_stream` with `applied_objects` would not.
fn fan_out<K>(cache: &Store<K>, object: &K, senders: &[UnboundedSender<Arc<K>>])
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let Some(held) = cache.get(&ObjectRef::from_obj(object)) else {
        return;
    };
    for tx in senders {
        let _ = tx.unbounded_send(held.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher::Event;

    fn cm(name: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("team-a".into());
        c
    }

    #[test]
    fn every_controller_gets_the_cached_copy_and_none_gets_a_deleted_object() {
        let (reader, mut writer) = reflector::store::<ConfigMap>();
        let (a_tx, mut a) = unbounded();
        let (b_tx, mut b) = unbounded();
        let senders = [a_tx, b_tx];
        writer.apply_watcher_event(&Event::Apply(cm("edge")));
        fan_out(&reader, &cm("edge"), &senders);
        let held = reader.get(&ObjectRef::new("edge").within("team-a")).expect("cached");
        for rx in [&mut a, &mut b] {
            let got = rx.try_recv().expect("a trigger");
            assert!(Arc::ptr_eq(&got, &held), "the cache's own copy, not a clone");
        }
        writer.apply_watcher_event(&Event::Delete(cm("edge")));
        fan_out(&reader, &cm("edge"), &senders);
        assert!(
            a.try_recv().is_err() && b.try_recv().is_err(),
            "no trigger for a deleted object"
        );
    }
}
