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

use crate::cache_trim::Cached;

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
    K: Cached,
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
        .for_each(move |event| {
            if let Ok(event) = event {
                dispatch(&event, &cache, &senders, &mut on_touched);
            }
            futures::future::ready(())
        });
    (reader, triggers, driver)
}

/// What one watch event (already applied to the cache) sends. A list — the first, or a relist
/// after the watch lost its place — reaches the cache whole at `InitDone` (its objects wait in
/// the reflector's buffer until then), so every listed object is sent then, as the cache holds
/// it; a deleted object is sent to no controller, as `Controller::for_stream` with
/// `applied_objects` would not.
fn dispatch<K>(
    event: &watcher::Event<K>,
    cache: &Store<K>,
    senders: &[UnboundedSender<Arc<K>>],
    on_touched: &mut impl FnMut(&K),
) where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let send = |held: Arc<K>| {
        for tx in senders {
            let _ = tx.unbounded_send(held.clone());
        }
    };
    match event {
        watcher::Event::Apply(object) => {
            on_touched(object);
            if let Some(held) = cache.get(&ObjectRef::from_obj(object)) {
                send(held);
            }
        }
        watcher::Event::Delete(object) => on_touched(object),
        watcher::Event::InitDone => {
            for held in cache.state() {
                on_touched(&held);
                send(held);
            }
        }
        watcher::Event::Init | watcher::Event::InitApply(_) => {}
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

    fn channels() -> (Vec<UnboundedSender<Arc<ConfigMap>>>, [Triggers<ConfigMap>; 2]) {
        let (a_tx, a) = unbounded();
        let (b_tx, b) = unbounded();
        (vec![a_tx, b_tx], [a, b])
    }

    /// Applies `event` to the cache, then dispatches it; returns the names `on_touched` saw.
    fn feed(
        writer: &mut reflector::store::Writer<ConfigMap>,
        reader: &Store<ConfigMap>,
        senders: &[UnboundedSender<Arc<ConfigMap>>],
        event: Event<ConfigMap>,
    ) -> Vec<String> {
        writer.apply_watcher_event(&event);
        let mut touched = Vec::new();
        dispatch(&event, reader, senders, &mut |c: &ConfigMap| {
            touched.push(c.metadata.name.clone().unwrap_or_default())
        });
        touched
    }

    #[test]
    fn every_controller_gets_the_cached_copy_and_none_gets_a_deleted_object() {
        let (reader, mut writer) = reflector::store::<ConfigMap>();
        let (senders, [mut a, mut b]) = channels();
        assert_eq!(feed(&mut writer, &reader, &senders, Event::Apply(cm("edge"))), ["edge"]);
        let held = reader.get(&ObjectRef::new("edge").within("team-a")).expect("cached");
        for rx in [&mut a, &mut b] {
            let got = rx.try_recv().expect("a trigger");
            assert!(Arc::ptr_eq(&got, &held), "the cache's own copy, not a clone");
        }
        assert_eq!(
            feed(&mut writer, &reader, &senders, Event::Delete(cm("edge"))),
            ["edge"]
        );
        assert!(
            a.try_recv().is_err() && b.try_recv().is_err(),
            "no trigger for a deleted object"
        );
    }

    #[test]
    fn a_list_is_sent_whole_once_the_cache_holds_it() {
        let (reader, mut writer) = reflector::store::<ConfigMap>();
        let (senders, [mut a, mut b]) = channels();
        feed(&mut writer, &reader, &senders, Event::Init);
        for name in ["one", "two"] {
            let touched = feed(&mut writer, &reader, &senders, Event::InitApply(cm(name)));
            assert!(touched.is_empty(), "the cache does not hold {name} yet");
        }
        assert!(a.try_recv().is_err(), "nothing before the list is complete");
        let mut touched = feed(&mut writer, &reader, &senders, Event::InitDone);
        touched.sort();
        assert_eq!(touched, ["one", "two"]);
        for rx in [&mut a, &mut b] {
            let mut got: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
                .map(|c| c.metadata.name.clone().unwrap_or_default())
                .collect();
            got.sort();
            assert_eq!(got, ["one", "two"], "every listed object reaches every controller");
        }
    }
}
