//! Moving an app rollout's live weights: into the fleet's weights ConfigMap (what a restarted
//! proxy starts with) and to every proxy pod's admin listener. The generation pushed is past
//! every other document a pod or the ConfigMap already holds (`weights::generation_past`): a
//! pass whose status write failed may have pushed one, and a proxy ignores a document whose
//! generation it already has.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use proxyfleet_config::LiveWeights;

use super::measure;
use super::objects::AppOwner;
use super::spec::{AppRollout, AppRolloutStatus};
use super::weights;
use crate::canary::machine::Decision;
use crate::canary::source::PODS_AT_ONCE;
use crate::context::Context;

/// What a move did.
pub struct Moved {
    /// The generation in force.
    pub generation: u64,
    /// Proxy pods that confirmed it, of those found.
    pub confirmed: usize,
    pub pods: usize,
    /// Whether the proxy pods could be listed at all (if not, nothing is known confirmed).
    pub listed: bool,
    /// Why the weights could not be kept in the ConfigMap (for the Ready condition).
    pub problem: Option<KeepError>,
}

impl Moved {
    pub fn all_applied(&self) -> bool {
        self.problem.is_none() && self.pods > 0 && self.confirmed == self.pods
    }
}

/// Why the weights ConfigMap was not written.
#[derive(Debug, thiserror::Error)]
pub enum KeepError {
    #[error("ConfigMap {namespace}/{name} is not the operator's to write ({why}); rename or remove it")]
    NotOurs {
        namespace: String,
        name: String,
        why: &'static str,
    },
    #[error("reading ConfigMap {namespace}/{name} before writing the weights: {source}")]
    Read {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("writing the weights into ConfigMap {namespace}/{name}: {source}")]
    Write {
        namespace: String,
        name: String,
        source: kube::Error,
    },
}

/// A proxy pod and the document it holds for the route (none when its report is unreadable).
struct PodWeights {
    pod: String,
    ip: String,
    holds: Option<LiveWeights>,
}

/// Writes the weights for `decision` into the ConfigMap and pushes them to every proxy pod
/// that does not hold them yet.
pub async fn move_weights(
    ar: &AppRollout,
    owner: &AppOwner,
    ctx: &Context,
    previous: &AppRolloutStatus,
    decision: &Decision,
) -> Moved {
    let weight = weights::canary_weight(Some(&decision.status));
    let forced = weights::canary_running(Some(&decision.status));
    let was_forced = weights::canary_running(previous.canary.as_ref());
    let changed = weight != previous.weight || forced != was_forced || previous.weights_generation == 0;
    let fleet = &ar.spec.route.proxy_deployment;
    let route = &ar.spec.route.name;
    let mut doc = weights::document(
        owner,
        route,
        previous.weights_generation + u64::from(changed),
        weight,
        forced,
    );
    let cached = cached_map(ctx, owner, fleet);
    let kept = cached.as_ref().and_then(|cm| kept_document(cm, owner));
    let found = pod_weights(ctx, owner, fleet, route).await;
    let listed = found.is_some();
    let pods = found.unwrap_or_default();
    doc.generation = weights::generation_past(&doc, kept.iter().chain(pods.iter().filter_map(|p| p.holds.as_ref())));
    let problem = keep(ctx, owner, fleet, &doc, cached.is_some(), kept.as_ref())
        .await
        .err();
    if let Some(p) = &problem {
        tracing::warn!(approllout = %owner.name, error = %p, "the live weights are not kept");
    }
    let confirmed = push(ctx, owner, fleet, &pods, &doc).await;
    if doc.generation != previous.weights_generation {
        tracing::info!(approllout = %owner.name, weight, generation = doc.generation, confirmed, pods = pods.len(), "weights moved");
    }
    Moved {
        generation: doc.generation,
        confirmed,
        pods: pods.len(),
        listed,
        problem,
    }
}

fn cached_map(ctx: &Context, owner: &AppOwner, fleet: &str) -> Option<std::sync::Arc<ConfigMap>> {
    let name = weights::config_map_name(fleet);
    ctx.stores
        .config_maps
        .get(&ObjectRef::new(&name).within(&owner.namespace))
}

/// This rollout's document in the ConfigMap, if it parses.
fn kept_document(cm: &ConfigMap, owner: &AppOwner) -> Option<LiveWeights> {
    let text = cm.data.as_ref()?.get(&format!("{}.json", owner.name))?;
    LiveWeights::from_json(text).ok()
}

/// Writes this rollout's key of the fleet's weights ConfigMap when it differs (a quiet
/// reconcile writes nothing). A map our cache does not hold (only ours are cached) is read
/// first, from etcd, so a forced apply never takes over someone else's ConfigMap of that name.
async fn keep(
    ctx: &Context,
    owner: &AppOwner,
    fleet: &str,
    doc: &LiveWeights,
    cached: bool,
    kept: Option<&LiveWeights>,
) -> Result<(), KeepError> {
    if kept == Some(doc) {
        return Ok(());
    }
    let name = weights::config_map_name(fleet);
    let namespace = owner.namespace.clone();
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
    let cm = weights::config_map(owner, fleet, doc);
    if !cached {
        let existing = cms.get_metadata_opt(&name).await.map_err(|source| KeepError::Read {
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        })?;
        if let Some(why) = existing.and_then(|m| crate::apply::not_ours(&m.metadata, &cm.metadata)) {
            return Err(KeepError::NotOurs { namespace, name, why });
        }
    }
    let params = PatchParams::apply(&super::reconcile::field_manager(owner)).force();
    cms.patch(&name, &params, &Patch::Apply(&cm))
        .await
        .map_err(|source| KeepError::Write {
            namespace,
            name,
            source,
        })?;
    ctx.metrics.api_write("ConfigMap", "apply");
    Ok(())
}

/// The fleet's proxy pods and what each holds for `route`.
async fn pod_weights(ctx: &Context, owner: &AppOwner, fleet: &str, route: &str) -> Option<Vec<PodWeights>> {
    let Ok(pods) = measure::proxy_pods(ctx, &owner.namespace, fleet).await else {
        return None;
    };
    let reads: Vec<_> = pods
        .into_iter()
        .map(|(pod, ip, _)| read_one(ctx, pod, ip, route))
        .collect();
    Some(futures::stream::iter(reads).buffered(PODS_AT_ONCE).collect().await)
}

/// What one proxy pod holds for `route`.
async fn read_one(ctx: &Context, pod: String, ip: String, route: &str) -> PodWeights {
    let admin = crate::resources::config_map::ADMIN_PORT;
    let report = ctx
        .http
        .get(&format!("http://{ip}:{admin}{}", proxyfleet_config::ADMIN_REPORT_PATH))
        .await;
    let holds = report
        .ok()
        .and_then(|t| proxyfleet_config::AdminReport::from_json(&t).ok())
        .and_then(|r| r.live_weights.into_iter().find(|w| w.route == route));
    PodWeights { pod, ip, holds }
}

/// Pushes `doc` to each pod that does not hold it (the admin token read only then); returns
/// how many hold it now.
async fn push(ctx: &Context, owner: &AppOwner, fleet: &str, pods: &[PodWeights], doc: &LiveWeights) -> usize {
    // Past `generation_past`, a pod at this generation or later holds these weights.
    let holds = |p: &PodWeights| p.holds.as_ref().is_some_and(|w| w.generation >= doc.generation);
    let confirmed = pods.iter().filter(|p| holds(p)).count();
    if confirmed == pods.len() {
        return confirmed;
    }
    let Some(token) = super::token::read(ctx, &owner.namespace, fleet).await else {
        return confirmed;
    };
    let mut pushes = Vec::new();
    for p in pods.iter().filter(|p| !holds(p)) {
        pushes.push(push_one(ctx, p, &token, doc));
    }
    let taken: Vec<bool> = futures::stream::iter(pushes)
        .buffer_unordered(PODS_AT_ONCE)
        .collect()
        .await;
    confirmed + taken.into_iter().filter(|t| *t).count()
}

/// Pushes `doc` to one pod; whether it took it.
async fn push_one(ctx: &Context, p: &PodWeights, token: &str, doc: &LiveWeights) -> bool {
    let admin = crate::resources::config_map::ADMIN_PORT;
    let url = format!("http://{}:{admin}{}", p.ip, proxyfleet_config::LIVE_WEIGHTS_PATH);
    match ctx.http.put(&url, token, doc.to_json()).await {
        Ok(()) => true,
        Err(e) => {
            tracing::info!(pod = %p.pod, error = %e, "weights not taken yet");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::objects::fixture::owner;
    use super::*;
    use crate::context::testing::test_context;
    use kube::client::Body;
    use std::time::Duration;

    type Handle = tower_test::mock::Handle<http::Request<Body>, http::Response<Body>>;

    fn mocked() -> (Context, Handle) {
        let (mock, handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        (test_context(kube::Client::new(mock, "default")), handle)
    }

    async fn next(
        handle: &mut Handle,
    ) -> (
        http::Request<Body>,
        tower_test::mock::SendResponse<http::Response<Body>>,
    ) {
        tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("the next request in time")
            .expect("a request")
    }

    fn answer(send: tower_test::mock::SendResponse<http::Response<Body>>, code: u16, body: serde_json::Value) {
        let body = Body::from(serde_json::to_vec(&body).expect("json"));
        send.send_response(http::Response::builder().status(code).body(body).expect("response"));
    }

    fn doc() -> LiveWeights {
        weights::document(&owner(), "web", 3, 20, true)
    }

    /// A team's own ConfigMap named like the weights map is read (not in our cache) and left
    /// alone: no forced apply takes it over, and the reason names it.
    #[tokio::test]
    async fn a_team_config_map_of_that_name_is_not_taken_over() {
        let (ctx, mut handle) = mocked();
        let server = tokio::spawn(async move {
            let (read, send) = next(&mut handle).await;
            assert_eq!(read.method(), http::Method::GET);
            assert!(
                read.uri().path().ends_with("/configmaps/edge-weights"),
                "{}",
                read.uri()
            );
            answer(
                send,
                200,
                serde_json::json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": {"name": "edge-weights", "namespace": "team", "labels": {"app": "theirs"}}}),
            );
            assert!(handle.next_request().await.is_none(), "nothing written");
        });
        let refused = keep(&ctx, &owner(), "edge", &doc(), false, None)
            .await
            .expect_err("not ours");
        assert!(matches!(refused, KeepError::NotOurs { .. }), "{refused}");
        assert!(refused.to_string().contains("team/edge-weights"), "{refused}");
        drop(ctx);
        server.await.expect("mock server");
    }

    /// No such ConfigMap: read, then applied.
    #[tokio::test]
    async fn a_missing_weights_map_is_created() {
        let (ctx, mut handle) = mocked();
        let server = tokio::spawn(async move {
            let (read, send) = next(&mut handle).await;
            assert_eq!(read.method(), http::Method::GET);
            answer(
                send,
                404,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "NotFound", "code": 404}),
            );
            let (apply, send) = next(&mut handle).await;
            assert_eq!(apply.method(), http::Method::PATCH);
            answer(
                send,
                200,
                serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "edge-weights", "namespace": "team"}}),
            );
        });
        keep(&ctx, &owner(), "edge", &doc(), false, None)
            .await
            .expect("written");
        drop(ctx);
        server.await.expect("mock server");
    }

    /// The ConfigMap already holds this document: nothing is written.
    #[tokio::test]
    async fn the_same_document_writes_nothing() {
        let (ctx, mut handle) = mocked();
        let server = tokio::spawn(async move {
            assert!(handle.next_request().await.is_none(), "nothing written");
        });
        keep(&ctx, &owner(), "edge", &doc(), true, Some(&doc()))
            .await
            .expect("kept");
        drop(ctx);
        server.await.expect("mock server");
    }
}
