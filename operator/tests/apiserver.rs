//! Integration tests against a real kube-apiserver (the local cluster's): server-side apply,
//! the zero-write no-op, reverting someone else's edit, orphan deletion that spares what is
//! not ours, and admission messages that name the field.
//!
//! They need a cluster: set PROXYFLEET_TEST_KUBECONFIG (e2e/tests/15-apiserver.sh does, inside
//! `make test`). Without it each test says so and passes, so `cargo test` stays runnable
//! anywhere.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Config};

use proxyfleet_operator::apply::{Applier, Outcome};
use proxyfleet_operator::crd::ProxyDeployment;
use proxyfleet_operator::labels;
use proxyfleet_operator::metrics::Metrics;
use proxyfleet_operator::owner_index::OwnerIndex;

/// The real API server these tests need. They are `#[ignore]`d in `cargo test` (reported as
/// ignored, never as passed) and run by e2e/tests/15-apiserver.sh with `--include-ignored`,
/// where a missing cluster fails them.
async fn client() -> Client {
    proxyfleet_operator::crypto::install_provider();
    let path = std::env::var("PROXYFLEET_TEST_KUBECONFIG")
        .expect("PROXYFLEET_TEST_KUBECONFIG: these tests need the local cluster (e2e/tests/15-apiserver.sh)");
    let kubeconfig = Kubeconfig::read_from(&path).expect("reading PROXYFLEET_TEST_KUBECONFIG");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("client config");
    Client::try_from(config).expect("client")
}

/// A fresh namespace for one test.
struct TestNamespace {
    client: Client,
    name: String,
}

impl TestNamespace {
    async fn new(client: &Client, tag: &str) -> Self {
        let name = format!("it-{tag}-{}", fastrand::u32(..) % 100_000);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("creating the test namespace");
        Self {
            client: client.clone(),
            name,
        }
    }
}

impl TestNamespace {
    /// Deletes the namespace. (Not in Drop: the client's connection task lives on the test's
    /// runtime, which a blocking Drop would stall. A failed test leaves its namespace; the e2e
    /// cluster is torn down at the end of the run anyway.)
    async fn delete(self) {
        let _ = Api::<Namespace>::all(self.client)
            .delete(&self.name, &DeleteParams::background())
            .await;
    }
}

/// A cache of ConfigMaps in `namespace`, as the operator keeps one.
async fn config_map_store(client: &Client, namespace: &str) -> Store<ConfigMap> {
    config_map_store_indexed(client, namespace, OwnerIndex::default()).await
}

/// A cache of the namespace's ConfigMaps, each noted in `index` as the operator's caches do.
async fn config_map_store_indexed(client: &Client, namespace: &str, index: OwnerIndex) -> Store<ConfigMap> {
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(
            Api::<ConfigMap>::namespaced(client.clone(), namespace),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .touched_objects()
    .for_each(move |o| {
        if let Ok(o) = o {
            index.note(&o);
        }
        futures::future::ready(())
    });
    tokio::spawn(stream);
    reader.wait_until_ready().await.expect("cache ready");
    reader
}

async fn until_cached(store: &Store<ConfigMap>, namespace: &str, name: &str, rv: &str) {
    for _ in 0..100 {
        if let Some(o) = store.get(&ObjectRef::new(name).within(namespace)) {
            if o.metadata.resource_version.as_deref() == Some(rv) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{namespace}/{name} at resourceVersion {rv} never reached the cache");
}

fn writes(metrics: &Metrics) -> f64 {
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with("proxyfleet_operator_api_writes_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The owner: a plain ConfigMap, so the garbage collector sees a real object.
async fn create_owner(client: &Client, namespace: &str, name: &str) -> OwnerReference {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let created = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &cm)
        .await
        .expect("creating the owner");
    OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: name.into(),
        uid: created.metadata.uid.expect("uid"),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

fn owned_config_map(namespace: &str, name: &str, owner: &OwnerReference, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(labels::owned("it")),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("k".to_string(), value.to_string())])),
        ..Default::default()
    }
}

#[tokio::test]
#[ignore = "needs the local cluster; run by e2e/tests/15-apiserver.sh"]
async fn apply_creates_then_writes_nothing_then_reverts_an_edit() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "apply").await;
    let store = config_map_store(&client, &ns.name).await;
    let owner = create_owner(&client, &ns.name, "owner").await;
    let metrics = Arc::new(Metrics::new());
    let applier = Applier::new(client.clone(), metrics.clone());
    let desired = owned_config_map(&ns.name, "cfg", &owner, "v1");

    let (outcome, written) = applier.apply(desired.clone(), &store).await.expect("apply");
    assert_eq!(outcome, Outcome::Created);
    let rv = written.and_then(|w| w.metadata.resource_version).expect("rv");
    until_cached(&store, &ns.name, "cfg", &rv).await;
    assert_eq!(writes(&metrics), 1.0);

    // The same desired object again: nothing is written.
    let (outcome, _) = applier.apply(desired.clone(), &store).await.expect("apply");
    assert_eq!(outcome, Outcome::Unchanged);
    assert_eq!(writes(&metrics), 1.0, "a no-op apply wrote to the API");

    // Someone else edits a field we manage: the next apply puts it back.
    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns.name);
    let edited = api
        .patch(
            "cfg",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"data": {"k": "edited"}})),
        )
        .await
        .expect("edit");
    until_cached(
        &store,
        &ns.name,
        "cfg",
        edited.metadata.resource_version.as_deref().unwrap_or(""),
    )
    .await;
    let (outcome, _) = applier.apply(desired, &store).await.expect("apply");
    assert_eq!(outcome, Outcome::Updated);
    let now = api.get("cfg").await.expect("get");
    assert_eq!(now.data.unwrap_or_default().get("k").map(String::as_str), Some("v1"));
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs the local cluster; run by e2e/tests/15-apiserver.sh"]
async fn orphan_deletion_spares_what_is_not_ours() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "orphans").await;
    let index = OwnerIndex::default();
    let store = config_map_store_indexed(&client, &ns.name, index.clone()).await;
    let owner = create_owner(&client, &ns.name, "owner").await;
    let applier = Applier::new(client.clone(), Arc::new(Metrics::new()));
    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns.name);

    let keep = owned_config_map(&ns.name, "keep", &owner, "1");
    let stale = owned_config_map(&ns.name, "stale", &owner, "1");
    // Labelled ours, but controlled by another (real) object.
    let second = create_owner(&client, &ns.name, "second-owner").await;
    let other_owner = owned_config_map(&ns.name, "other-owner", &second, "1");
    // Owned by the right object, but without our label (someone else's).
    let mut unlabelled = owned_config_map(&ns.name, "unlabelled", &owner, "1");
    unlabelled.metadata.labels = None;
    let mut last_rv = String::new();
    for cm in [keep, stale, other_owner, unlabelled] {
        let created = api.create(&PostParams::default(), &cm).await.expect("create");
        last_rv = created.metadata.resource_version.unwrap_or_default();
    }
    until_cached(&store, &ns.name, "unlabelled", &last_rv).await;

    let deleted = applier
        .delete_orphans((&store, &index), &ns.name, &owner.uid, &["keep".to_string()])
        .await
        .expect("delete_orphans");
    assert_eq!(deleted, ["stale"]);
    for name in ["keep", "other-owner", "unlabelled", "owner"] {
        assert!(api.get_opt(name).await.expect("get").is_some(), "{name} was deleted");
    }
    ns.delete().await;
}

#[tokio::test]
#[ignore = "needs the local cluster; run by e2e/tests/15-apiserver.sh"]
async fn admission_refuses_a_malformed_proxydeployment_naming_the_field() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "admission").await;
    let api = Api::<ProxyDeployment>::namespaced(client.clone(), &ns.name);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let good: ProxyDeployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1", "kind": "ProxyDeployment",
        "metadata": {"name": "it"},
        "spec": {
            "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP"}],
            "routes": [{"name": "all", "match": {"pathPrefix": "/"}, "upstream": "app"}],
            "upstreams": [{"name": "app", "endpoints": ["10.0.0.1:80"]}],
        },
    }))
    .expect("valid object");
    api.create(&dry_run, &good)
        .await
        .expect("a valid ProxyDeployment is admitted");

    let mut unknown_upstream = good.clone();
    unknown_upstream.spec.routes[0].upstream = "missing".into();
    let err = api
        .create(&dry_run, &unknown_upstream)
        .await
        .expect_err("admitted a route to nowhere");
    assert!(err.to_string().contains("spec.routes"), "{err}");

    let mut negative = good.clone();
    negative.spec.replicas = -1;
    let err = api.create(&dry_run, &negative).await.expect_err("admitted replicas -1");
    assert!(err.to_string().contains("spec.replicas"), "{err}");

    // Issue 16: what the API server would refuse later is refused at admission, field named.
    let refused: Vec<(&str, serde_json::Value)> = vec![
        (
            "spec.pod.labels.team",
            serde_json::json!({"spec": {"pod": {"labels": {"team": "bad value!"}}}}),
        ),
        (
            "spec.listeners[0].hostnames[0]",
            serde_json::json!({"spec": {"listeners": [{"name": "https", "port": 8443, "hostnames": ["a.*.example.com"]}]}}),
        ),
        (
            "spec.listeners[0].clientCaSecret",
            serde_json::json!({"spec": {"listeners": [{"name": "https", "port": 8443, "clientCaSecret": "kube-system/ca"}]}}),
        ),
        (
            "spec.tls.secretName",
            serde_json::json!({"spec": {"tls": {"secretName": "other/tls"}}}),
        ),
        (
            "spec.progressDeadline",
            serde_json::json!({"spec": {"progressDeadline": "1s"}}),
        ),
        (
            "metadata.name",
            serde_json::json!({"metadata": {"name": "a-name-longer-than-fifty-four-characters-is-refused-at-admission"}}),
        ),
    ];
    for (field, patch) in refused {
        let mut value = serde_json::to_value(&good).expect("serializable");
        json_merge(&mut value, &patch);
        let bad: ProxyDeployment = serde_json::from_value(value).expect("well-typed");
        let err = api.create(&dry_run, &bad).await.expect_err(field);
        assert!(err.to_string().contains(field), "{field}: {err}");
    }
    ns.delete().await;
}

/// Whatever admission lets through must decode into our types, or one object would fail the
/// operator's list of its kind for every namespace: integers beyond their Rust type and names
/// that are not names are refused with the field named; a duration beyond the longest is
/// admitted and read as the longest.
#[tokio::test]
#[ignore = "needs the local cluster; run by e2e/tests/15-apiserver.sh"]
async fn what_admission_lets_through_always_decodes() {
    use kube::api::{ApiResource, DynamicObject};
    use kube::Resource;
    let client = client().await;
    let ns = TestNamespace::new(&client, "decodes").await;
    let fleets =
        Api::<DynamicObject>::namespaced_with(client.clone(), &ns.name, &ApiResource::erase::<ProxyDeployment>(&()));
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let fleet = |patch: serde_json::Value| {
        let mut v = serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1", "kind": "ProxyDeployment",
            "metadata": {"name": "it"},
            "spec": {
                "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP"}],
                "routes": [{"name": "all", "upstream": "app"}],
                "upstreams": [{"name": "app", "endpoints": ["10.0.0.1:80"]}],
            },
        });
        json_merge(&mut v, &patch);
        serde_json::from_value::<DynamicObject>(v).expect("an object")
    };
    let too_big = fleet(serde_json::json!({"spec": {"limits": {"maxRequestsPerConnection": 5_000_000_000_u64}}}));
    let err = fleets
        .create(&dry_run, &too_big)
        .await
        .expect_err("admitted a u32 overflow");
    assert!(
        err.to_string().contains("spec.limits.maxRequestsPerConnection"),
        "{err}"
    );
    let long =
        fleet(serde_json::json!({"spec": {"routes": [{"name": "all", "upstream": "app", "timeout": "300000h"}]}}));
    let admitted = fleets
        .create(&dry_run, &long)
        .await
        .expect("a long timeout is admitted");
    let read: ProxyDeployment =
        serde_json::from_value(serde_json::to_value(&admitted).expect("json")).expect("what was admitted decodes");
    assert_eq!(read.spec.routes[0].timeout.get(), Duration::from_secs(1_000_000_000));

    let apps = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &ns.name,
        &ApiResource::erase::<proxyfleet_operator::app::spec::AppRollout>(&()),
    );
    let app: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": proxyfleet_operator::app::spec::AppRollout::api_version(&()), "kind": "AppRollout",
        "metadata": {"name": "shop"},
        "spec": {
            "workloadRef": {"name": "../../../namespaces/other/deployments/x"},
            "port": 8080,
            "route": {"proxyDeployment": "edge", "name": "shop"},
            "strategy": {"steps": [{"setWeight": 100}]},
        },
    }))
    .expect("an object");
    let err = apps
        .create(&dry_run, &app)
        .await
        .expect_err("admitted a path as a name");
    assert!(err.to_string().contains("spec.workloadRef.name"), "{err}");
    ns.delete().await;
}

/// RFC 7386 merge of `patch` into `target`.
fn json_merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
    match (target, patch) {
        (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                json_merge(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
        (t, p) => *t = p.clone(),
    }
}
