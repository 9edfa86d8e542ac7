//! Members are watched, not only polled: per registered member cluster, one watch on the fleet
//! copies and one on the app copies propagated there (label `proxyfleet.io/hub-uid`), each
//! change waking the hub object the copy names. A member's canary finishing or aborting is seen within a second or two; the slower
//! resync stays for drift. A member that cannot be watched is retried with the watcher's own
//! backoff and never holds anything else up.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc::Sender;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, WatchStreamExt};

use super::clusters::MemberCluster;
use super::placement::{HUB_OBJECT, HUB_UID};
use crate::app::spec::AppRollout;
use crate::context::Context;
use crate::crd::ProxyDeployment;
use crate::task::AbortOnDrop;

/// The hub object a member's copy (of the fleet, or of one of its apps) names (`namespace/name`).
pub fn hub_ref(copy: &kube::api::ObjectMeta) -> Option<ObjectRef<ProxyDeployment>> {
    let (namespace, name) = copy.annotations.as_ref()?.get(HUB_OBJECT)?.split_once('/')?;
    (!namespace.is_empty() && !name.is_empty() && name != "*").then(|| ObjectRef::new(name).within(namespace))
}

async fn watch_one(cluster: MemberCluster, ctx: Arc<Context>, wake: Sender<ObjectRef<ProxyDeployment>>) {
    let client = match ctx.propagation.clients.client(&cluster).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(cluster = %cluster.name, error = %e, "member not watchable");
            return;
        }
    };
    let fleets: Api<ProxyDeployment> = Api::all(client.clone());
    let apps: Api<AppRollout> = Api::all(client);
    let config = || watcher::Config::default().labels(HUB_UID);
    let fleet_events = watcher(fleets, config())
        .default_backoff()
        .touched_objects()
        .map(|e| e.map(|o| o.metadata));
    // An app's canary finishing or aborting there is a wave's verdict too.
    let app_events = watcher(apps, config())
        .default_backoff()
        .touched_objects()
        .map(|e| e.map(|o| o.metadata));
    let mut events = futures::stream::select(fleet_events, app_events).boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(copy) => {
                if let Some(hub) = hub_ref(&copy) {
                    // A full channel means a wake-up is already pending: dropping this one is fine.
                    let _ = wake.clone().try_send(hub);
                }
            }
            Err(e) => tracing::debug!(cluster = %cluster.name, error = %e, "member watch"),
        }
    }
}

/// Keeps one watch per registered member (restarted when its Secret changes) until dropped.
pub async fn run(ctx: Arc<Context>, wake: Sender<ObjectRef<ProxyDeployment>>) {
    let mut watches: HashMap<String, (String, AbortOnDrop<()>)> = HashMap::new();
    loop {
        if let Ok(registered) = super::reconcile::registered(&ctx.propagation) {
            watches.retain(|name, (version, task)| {
                !task.0.is_finished()
                    && registered
                        .iter()
                        .any(|c| &c.name == name && &c.secret_version == version)
            });
            for c in registered {
                if watches.contains_key(&c.name) {
                    continue;
                }
                let task = tokio::spawn(watch_one(c.clone(), ctx.clone(), wake.clone()));
                watches.insert(c.name.clone(), (c.secret_version.clone(), AbortOnDrop(task)));
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_copy_wakes_the_hub_object_it_names() {
        let spec =
            serde_json::from_value(serde_json::json!({"listeners": [], "routes": [], "upstreams": []})).expect("spec");
        let mut copy = ProxyDeployment::new("demo", spec);
        assert_eq!(hub_ref(&copy.metadata), None);
        copy.metadata.annotations = Some(BTreeMap::from([(HUB_OBJECT.to_string(), "team-a/demo".to_string())]));
        assert_eq!(hub_ref(&copy.metadata), Some(ObjectRef::new("demo").within("team-a")));
        // The CA Secret's mark (`ns/*`) names no fleet.
        copy.metadata.annotations = Some(BTreeMap::from([(HUB_OBJECT.to_string(), "team-a/*".to_string())]));
        assert_eq!(hub_ref(&copy.metadata), None);
    }
}
