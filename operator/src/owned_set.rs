//! Everything a fleet owns, applied and collected in one place: the desired set (`desired`)
//! goes to the API server through the applier, and whatever the fleet owns that the set no
//! longer names is deleted.

use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::reflector::Store;

use crate::apply::{ApplyError, Outcome};
use crate::context::Context;
use crate::labels::Track;
use crate::resources::Owner;
use crate::status;

/// Applies every object of the fleet's desired set, then deletes what it no longer contains:
/// old ConfigMaps, a PDB after scaling to one, the headless Service when turned off, a
/// finished canary. Returns what changed and the stable Deployment as written. The pods'
/// ServiceAccount and ConfigMaps go before their Deployment (a pod created before its
/// ServiceAccount exists is refused, and the ReplicaSet controller backs off); a refused
/// object stops the pass.
pub async fn apply_owned_set(
    ctx: &Context,
    owner: &Owner,
    desired: &crate::desired::DesiredObjects,
    keep_config_maps: &[String],
) -> Result<(Vec<String>, Option<Deployment>), ApplyError> {
    let s = &ctx.stores;
    let mut changes = apply_each(
        ctx,
        "ServiceAccount",
        desired.service_account.clone(),
        &s.service_accounts,
    )
    .await?;
    changes.extend(apply_each(ctx, "ConfigMap", desired.config_maps.iter().cloned(), &s.config_maps).await?);
    let mut written_stable = None;
    let mut rolled = false;
    for d in desired.deployments.iter().cloned() {
        let is_stable = status::track_of(&d) == Some(Track::Stable);
        let (outcome, written) = ctx.applier.apply(d, &s.deployments).await?;
        if is_stable {
            written_stable = written;
        }
        rolled |= outcome != Outcome::Unchanged;
        note(&mut changes, "Deployment", outcome);
    }
    changes.extend(apply_each(ctx, "Service", desired.services.iter().cloned(), &s.services).await?);
    changes.extend(apply_each(ctx, "PodDisruptionBudget", desired.pdb.clone(), &s.pdbs).await?);
    changes.extend(
        apply_each(
            ctx,
            "NetworkPolicy",
            desired.network_policy.clone(),
            &s.network_policies,
        )
        .await?,
    );
    // Old pods mount their ConfigMap until the rollout that replaces them is done.
    let rolling = rolled
        || ctx
            .stores
            .by_owner
            .deployments
            .owned(&s.deployments, &owner.namespace, &owner.reference.uid)
            .iter()
            .any(|d| !rollout_done(d));
    let deleted = delete_orphans(ctx, owner, desired, keep_config_maps, rolling).await?;
    if !deleted.is_empty() {
        changes.push(format!("deleted {}", deleted.join(", ")));
    }
    Ok((changes, written_stable))
}

/// Whatever we own that the desired set no longer has: old ConfigMaps, a PDB after scaling to
/// one, the headless Service when turned off, a finished canary. Returns what was deleted.
/// Old ConfigMaps wait while a Deployment of the fleet is `rolling`.
async fn delete_orphans(
    ctx: &Context,
    owner: &Owner,
    desired: &crate::desired::DesiredObjects,
    keep_config_maps: &[String],
    rolling: bool,
) -> Result<Vec<String>, ApplyError> {
    let uid = owner.reference.uid.as_str();
    let names = |v: Vec<Option<String>>| v.into_iter().flatten().collect::<Vec<_>>();
    let (s, by) = (&ctx.stores, &ctx.stores.by_owner);
    let ns = owner.namespace.as_str();
    let old_config_maps = match rolling {
        true => Vec::new(),
        false => {
            ctx.applier
                .delete_orphans((&s.config_maps, &by.config_maps), ns, uid, keep_config_maps)
                .await?
        }
    };
    Ok([
        old_config_maps,
        ctx.applier
            .delete_orphans(
                (&s.deployments, &by.deployments),
                ns,
                uid,
                &names(desired.deployments.iter().map(|o| o.metadata.name.clone()).collect()),
            )
            .await?,
        ctx.applier
            .delete_orphans(
                (&s.services, &by.services),
                ns,
                uid,
                &names(desired.services.iter().map(|o| o.metadata.name.clone()).collect()),
            )
            .await?,
        ctx.applier
            .delete_orphans(
                (&s.pdbs, &by.pdbs),
                ns,
                uid,
                &names(vec![desired.pdb.as_ref().and_then(|p| p.metadata.name.clone())]),
            )
            .await?,
    ]
    .concat())
}

/// Pure: whether a Deployment has finished rolling out its current spec: the controller has
/// seen it, and every pod is of it (no old pod left that may still mount an old ConfigMap).
fn rollout_done(d: &Deployment) -> bool {
    let Some(status) = &d.status else { return false };
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let updated = status.updated_replicas.unwrap_or(0);
    status.observed_generation >= d.metadata.generation && updated >= want && status.replicas.unwrap_or(0) <= updated
}

/// Applies `objects` of one kind in turn (a fleet has one or two of each) and says what changed.
async fn apply_each<K>(
    ctx: &Context,
    kind: &str,
    objects: impl IntoIterator<Item = K>,
    cache: &Store<K>,
) -> Result<Vec<String>, ApplyError>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let mut changes = Vec::new();
    for obj in objects {
        note(&mut changes, kind, ctx.applier.apply(obj, cache).await?.0);
    }
    Ok(changes)
}

fn note(changes: &mut Vec<String>, kind: &str, outcome: Outcome) {
    match outcome {
        Outcome::Unchanged => {}
        Outcome::Created => changes.push(format!("created {kind}")),
        Outcome::Updated => changes.push(format!("updated {kind}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::testing::test_context;
    use crate::desired::DesiredObjects;
    use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::client::Body;
    use std::time::Duration;

    /// Rolled out: seen by the controller and every pod of the current spec; not while old
    /// pods remain, a new generation is unseen, or it has no status yet.
    #[test]
    fn a_rollout_is_done_when_no_old_pod_remains() {
        use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};
        let d = |generation, observed, replicas, updated, total| Deployment {
            metadata: ObjectMeta {
                generation: Some(generation),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                ..Default::default()
            }),
            status: Some(DeploymentStatus {
                observed_generation: Some(observed),
                updated_replicas: Some(updated),
                replicas: Some(total),
                ..Default::default()
            }),
        };
        assert!(rollout_done(&d(2, 2, 2, 2, 2)));
        assert!(rollout_done(&d(2, 2, 0, 0, 0)), "scaled to zero");
        assert!(!rollout_done(&d(3, 2, 2, 2, 2)), "a new spec not yet seen");
        assert!(!rollout_done(&d(2, 2, 2, 2, 3)), "an old pod still runs");
        assert!(!rollout_done(&d(2, 2, 2, 1, 2)), "half rolled");
        assert!(!rollout_done(&Deployment::default()), "no status yet");
    }

    /// An object of kind `K` named `name` in team-a, nothing else set.
    fn named<K: kube::Resource + Default>(name: &str) -> K {
        let mut obj = K::default();
        *obj.meta_mut() = ObjectMeta {
            name: Some(name.into()),
            namespace: Some("team-a".into()),
            ..Default::default()
        };
        obj
    }

    fn new_fleet() -> DesiredObjects {
        let mut deployment: Deployment = named("demo");
        deployment.metadata.labels = Some([(crate::labels::TRACK.to_string(), "stable".to_string())].into());
        DesiredObjects {
            service_account: Some(named::<ServiceAccount>("demo-proxy")),
            config_maps: vec![named::<ConfigMap>("demo-config")],
            deployments: vec![deployment],
            services: vec![named::<Service>("demo")],
            pdb: Some(named::<PodDisruptionBudget>("demo")),
            network_policy: Some(named::<NetworkPolicy>("demo")),
        }
    }

    /// The kind a request is for, from its path (`…/namespaces/team-a/<kind>/<name>`).
    fn kind_of(request: &http::Request<Body>) -> String {
        let path: Vec<&str> = request.uri().path().split('/').collect();
        path[path.len() - 2].to_string()
    }

    /// A new fleet against a mocked API server: every object is applied, the Deployment after
    /// its ServiceAccount and ConfigMap, and the pass says what it created, in that order.
    #[tokio::test]
    async fn a_new_fleet_is_applied_its_deployment_after_what_its_pods_need() {
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let ctx = test_context(kube::Client::new(mock, "default"));
        let owner = crate::resources::Owner::of(&crate::resources::fixtures::basic()).expect("owner");
        let server = tokio::spawn(async move {
            let mut order = Vec::new();
            for _ in 0..6 {
                let (kind, request, send) = next(&mut handle).await;
                order.push(kind);
                echo(request, send).await;
            }
            order
        });
        let (changes, stable) = apply_owned_set(&ctx, &owner, &new_fleet(), &[]).await.expect("applied");
        assert!(stable.is_some(), "the stable Deployment as written");
        assert_eq!(
            changes,
            [
                "created ServiceAccount",
                "created ConfigMap",
                "created Deployment",
                "created Service",
                "created PodDisruptionBudget",
                "created NetworkPolicy"
            ]
        );
        drop(ctx);
        let order = server.await.expect("mock server");
        assert_eq!(
            order,
            [
                "serviceaccounts",
                "configmaps",
                "deployments",
                "services",
                "poddisruptionbudgets",
                "networkpolicies"
            ]
        );
    }

    /// A refused Deployment stops the pass with the API server's words; nothing after it is
    /// applied and nothing is deleted.
    #[tokio::test]
    async fn a_refused_object_stops_the_pass() {
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let ctx = test_context(kube::Client::new(mock, "default"));
        let owner = crate::resources::Owner::of(&crate::resources::fixtures::basic()).expect("owner");
        let server = tokio::spawn(async move {
            for _ in 0..2 {
                let (_, request, send) = next(&mut handle).await;
                echo(request, send).await;
            }
            let (kind, _, send) = next(&mut handle).await;
            assert_eq!(kind, "deployments");
            let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "spec.template: invalid", "reason": "Invalid", "code": 422});
            let body = Body::from(serde_json::to_vec(&status).expect("json"));
            send.send_response(http::Response::builder().status(422).body(body).expect("response"));
            assert!(handle.next_request().await.is_none(), "nothing after the refusal");
        });
        let refused = apply_owned_set(&ctx, &owner, &new_fleet(), &[]).await.expect_err("422");
        assert_eq!(
            refused.refusal().as_deref(),
            Some("the API server refused applying Deployment team-a/demo: spec.template: invalid")
        );
        drop(ctx);
        server.await.expect("mock server");
    }

    type Handle = tower_test::mock::Handle<http::Request<Body>, http::Response<Body>>;
    type Reply = tower_test::mock::SendResponse<http::Response<Body>>;

    async fn next_request(handle: &mut Handle) -> (http::Request<Body>, Reply) {
        tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("the next request in time")
            .expect("a request")
    }

    /// The next apply, after the read of its name that precedes a first apply (answered: no
    /// such object).
    async fn next(handle: &mut Handle) -> (String, http::Request<Body>, Reply) {
        let (read, send) = next_request(handle).await;
        assert_eq!(read.method(), http::Method::GET, "the read before a first apply");
        let gone = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "not found", "reason": "NotFound", "code": 404});
        let body = Body::from(serde_json::to_vec(&gone).expect("json"));
        send.send_response(http::Response::builder().status(404).body(body).expect("response"));
        let (request, send) = next_request(handle).await;
        assert_eq!(request.method(), http::Method::PATCH, "an apply");
        assert_eq!(kind_of(&request), kind_of(&read), "the apply of what was read");
        (kind_of(&request), request, send)
    }

    /// Answers an apply with the object it applied (as the API server would, plus a uid).
    async fn echo(request: http::Request<Body>, send: Reply) {
        let bytes = http_body_util::BodyExt::collect(request.into_body())
            .await
            .expect("body")
            .to_bytes();
        let mut obj: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        obj["metadata"]["uid"] = "u".into();
        obj["metadata"]["resourceVersion"] = "1".into();
        let body = Body::from(serde_json::to_vec(&obj).expect("json"));
        send.send_response(http::Response::builder().status(200).body(body).expect("response"));
    }
}
