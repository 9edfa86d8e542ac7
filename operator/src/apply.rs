//! Writes owned objects with server-side apply, only when they differ from what was last
//! applied, and deletes owned objects that the desired set no longer contains.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, DeleteParams, GetParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::labels;
use crate::metrics::Metrics;
use crate::owner_index::{meta_controller_uid, OwnerIndex};

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("applying {kind} {namespace}/{name}: {source}")]
    Apply {
        kind: String,
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("deleting {kind} {namespace}/{name}: {source}")]
    Delete {
        kind: String,
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("reading {kind} {namespace}/{name} before its first apply: {source}")]
    Read {
        kind: String,
        namespace: String,
        name: String,
        source: kube::Error,
    },
    /// An object of that name exists and is not this fleet's: we neither take it over nor
    /// delete it later.
    #[error(
        "{kind} {namespace}/{name} exists and is not this ProxyDeployment's ({why}); it is left as it is: \
         rename the ProxyDeployment or remove that {kind}"
    )]
    NotOurs {
        kind: String,
        namespace: String,
        name: String,
        why: &'static str,
    },
}

impl ApplyError {
    /// The API server refused the object itself (invalid, forbidden, too large): retrying the
    /// same object cannot succeed, so the user must be told. Conflicts and throttling are
    /// transient and not included.
    pub fn refusal(&self) -> Option<String> {
        let (verb, kind, namespace, name, source) = match self {
            ApplyError::Apply {
                kind,
                namespace,
                name,
                source,
            } => ("applying", kind, namespace, name, source),
            ApplyError::Delete {
                kind,
                namespace,
                name,
                source,
            } => ("deleting", kind, namespace, name, source),
            ApplyError::Read {
                kind,
                namespace,
                name,
                source,
            } => ("reading", kind, namespace, name, source),
            ApplyError::NotOurs { .. } => return Some(self.to_string()),
        };
        match source {
            kube::Error::Api(e) if (400..500).contains(&e.code) && e.code != 409 && e.code != 429 => Some(format!(
                "the API server refused {verb} {kind} {namespace}/{name}: {}",
                e.message
            )),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Unchanged,
    Created,
    Updated,
}

/// Writes owned objects. Remembers what it applied (the object's generation, or its
/// resourceVersion for kinds without one) so an edit by someone else is noticed and reverted.
pub struct Applier {
    client: Client,
    applied: Mutex<HashMap<String, String>>,
    metrics: std::sync::Arc<Metrics>,
}

fn desired_hash<K: Serialize>(obj: &K) -> String {
    crate::desired::short_hash(obj, 8)
}

fn version_token<K: Resource>(obj: &K) -> Option<String> {
    let m = obj.meta();
    m.generation
        .map(|g| format!("g{g}"))
        .or_else(|| m.resource_version.clone())
}

impl Applier {
    pub fn new(client: Client, metrics: std::sync::Arc<Metrics>) -> Self {
        Self {
            client,
            applied: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// Applies `obj` unless the cache shows it already applied and untouched since.
    /// Returns the outcome and, when written, the object as the API server returned it.
    pub async fn apply<K>(&self, mut obj: K, cache: &Store<K>) -> Result<(Outcome, Option<K>), ApplyError>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + Serialize
            + DeserializeOwned
            + Debug
            + Send
            + Sync
            + 'static,
    {
        let name = obj.name_any();
        let namespace = obj.namespace().unwrap_or_default();
        let kind = K::kind(&()).to_string();
        let hash = desired_hash(&obj);
        obj.annotations_mut()
            .insert(labels::DESIRED_HASH.to_string(), hash.clone());
        let key = format!("{kind}/{namespace}/{name}");
        let cached = cache.get(&ObjectRef::new(&name).within(&namespace));
        let api: Api<K> = Api::namespaced(self.client.clone(), &namespace);
        let foreign = match &cached {
            Some(current) => not_ours(current.meta(), obj.meta()),
            None => (self.existing(&api, &kind, &namespace, &name).await?).and_then(|m| not_ours(&m, obj.meta())),
        };
        if let Some(why) = foreign {
            return Err(ApplyError::NotOurs {
                kind,
                namespace,
                name,
                why,
            });
        }
        if let Some(current) = &cached {
            let same_hash = current.annotations().get(labels::DESIRED_HASH) == Some(&hash);
            let untouched = match self.applied.lock().ok().and_then(|m| m.get(&key).cloned()) {
                Some(token) => version_token(current.as_ref()) == Some(token),
                // After a restart we have no record; the hash is our best evidence.
                None => true,
            };
            if same_hash && untouched {
                return Ok((Outcome::Unchanged, None));
            }
        }
        let params = PatchParams::apply(labels::FIELD_MANAGER).force();
        let written = api
            .patch(&name, &params, &Patch::Apply(&obj))
            .await
            .map_err(|source| ApplyError::Apply {
                kind: kind.clone(),
                namespace: namespace.clone(),
                name: name.clone(),
                source,
            })?;
        self.metrics.api_write(&kind, "apply");
        if let (Ok(mut m), Some(t)) = (self.applied.lock(), version_token(&written)) {
            m.insert(key, t);
        }
        let outcome = if cached.is_some() {
            Outcome::Updated
        } else {
            Outcome::Created
        };
        tracing::info!(%kind, %namespace, %name, ?outcome, "applied");
        Ok((outcome, Some(written)))
    }

    /// The metadata of an object our cache does not hold (only ours are cached), read before
    /// its first apply so a forced apply never takes over someone else's object of that name.
    /// Read from the API server's watch cache: a new fleet's objects cost it no etcd read.
    async fn existing<K>(
        &self,
        api: &Api<K>,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ObjectMeta>, ApplyError>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        match api.get_metadata_opt_with(name, &GetParams::any()).await {
            Ok(found) => Ok(found.map(|m| m.metadata)),
            Err(source) => Err(ApplyError::Read {
                kind: kind.to_string(),
                namespace: namespace.to_string(),
                name: name.to_string(),
                source,
            }),
        }
    }

    /// Deletes objects of kind K that carry our labels, are controlled by `owner_uid`, and are
    /// not in `keep`. Only what the cache shows is considered (found through `index`, see
    /// `owner_index`), so a cache that failed to sync deletes nothing.
    pub async fn delete_orphans<K>(
        &self,
        (cache, index): (&Store<K>, &OwnerIndex),
        namespace: &str,
        owner_uid: &str,
        keep: &[String],
    ) -> Result<Vec<String>, ApplyError>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + Sync
            + 'static,
    {
        let kind = K::kind(&()).to_string();
        let mut deleted = Vec::new();
        for obj in index.owned(cache, namespace, owner_uid) {
            let name = obj.name_any();
            if keep.contains(&name) || obj.meta().deletion_timestamp.is_some() {
                continue;
            }
            let api: Api<K> = Api::namespaced(self.client.clone(), namespace);
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(source) => {
                    return Err(ApplyError::Delete {
                        kind,
                        namespace: namespace.to_string(),
                        name,
                        source,
                    })
                }
            }
            self.metrics.api_write(&kind, "delete");
            tracing::info!(%kind, %namespace, %name, "deleted object the spec no longer produces");
            deleted.push(name);
        }
        Ok(deleted)
    }
}

/// Pure: why an existing object (`existing`) is not ours to write as `desired`, if it is not:
/// it must carry our managed-by label and be controlled by the same owner `desired` names.
pub(crate) fn not_ours(existing: &ObjectMeta, desired: &ObjectMeta) -> Option<&'static str> {
    let managed = existing
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::MANAGED_BY))
        .map(String::as_str);
    if managed != Some(labels::MANAGER) {
        return Some("it has no app.kubernetes.io/managed-by=proxyfleet label");
    }
    match (meta_controller_uid(existing), meta_controller_uid(desired)) {
        (Some(have), Some(want)) if have == want => None,
        (_, None) => None,
        _ => Some("another object controls it"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn cm(labels_: bool, uid: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("x".into()),
                labels: labels_.then(|| labels::owned("demo")),
                owner_references: Some(vec![OwnerReference {
                    uid: uid.into(),
                    controller: Some(true),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    type Handle = tower_test::mock::Handle<http::Request<kube::client::Body>, http::Response<kube::client::Body>>;

    fn reply(
        send: tower_test::mock::SendResponse<http::Response<kube::client::Body>>,
        code: u16,
        body: serde_json::Value,
    ) {
        let body = kube::client::Body::from(serde_json::to_vec(&body).expect("json"));
        send.send_response(http::Response::builder().status(code).body(body).expect("response"));
    }

    /// Answers the read before a first apply: `found` as the object's metadata, or 404.
    async fn answer_read(handle: &mut Handle, found: Option<ObjectMeta>) {
        let (request, send) = handle.next_request().await.expect("a read");
        assert_eq!(request.method(), http::Method::GET);
        assert!(request.uri().query().is_some_and(|q| q.contains("resourceVersion=0")));
        match found {
            Some(metadata) => reply(
                send,
                200,
                serde_json::json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": metadata}),
            ),
            None => reply(
                send,
                404,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": "not found", "reason": "NotFound", "code": 404}),
            ),
        }
    }

    /// An object of the name we are about to apply for the first time that is not ours (no
    /// label: a user's own Secret or Service; or another fleet's) is neither written nor taken
    /// over, and the user is told which; one that is ours (a cache behind) is applied.
    #[tokio::test]
    async fn an_existing_object_not_ours_is_never_taken_over() {
        let (mock, mut handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let applier = Applier::new(Client::new(mock, "default"), std::sync::Arc::new(Metrics::new()));
        let (cache, _writer) = kube::runtime::reflector::store::<ConfigMap>();
        let server = tokio::spawn(async move {
            answer_read(
                &mut handle,
                Some(ObjectMeta {
                    name: Some("x".into()),
                    ..Default::default()
                }),
            )
            .await;
            answer_read(&mut handle, Some(cm(true, "u2").metadata)).await;
            answer_read(&mut handle, Some(cm(true, "u1").metadata)).await;
            let (request, send) = handle.next_request().await.expect("the apply");
            assert_eq!(request.method(), http::Method::PATCH);
            let mut written = cm(true, "u1");
            written.metadata.namespace = Some("team-a".into());
            reply(send, 200, serde_json::to_value(&written).expect("json"));
            assert!(handle.next_request().await.is_none(), "no write to the others");
        });
        let mut obj = cm(true, "u1");
        obj.metadata.namespace = Some("team-a".into());
        let users = applier.apply(obj.clone(), &cache).await.expect_err("not ours");
        let message = users.refusal().expect("reported");
        assert!(
            message.contains("ConfigMap team-a/x exists and is not this ProxyDeployment's"),
            "{message}"
        );
        assert!(message.contains("managed-by"), "{message}");
        let other_fleets = applier.apply(obj.clone(), &cache).await.expect_err("not ours");
        assert!(
            other_fleets.to_string().contains("another object controls it"),
            "{other_fleets}"
        );
        let (outcome, _) = applier.apply(obj, &cache).await.expect("ours: applied");
        assert_eq!(outcome, Outcome::Created);
        drop(applier);
        server.await.expect("mock server");
    }

    #[test]
    fn only_our_label_and_the_same_controller_make_an_object_ours() {
        let desired = cm(true, "u1").metadata;
        assert_eq!(not_ours(&cm(true, "u1").metadata, &desired), None);
        assert!(not_ours(&cm(false, "u1").metadata, &desired).is_some());
        assert!(not_ours(&cm(true, "u2").metadata, &desired).is_some());
        let mut uncontrolled = cm(true, "u1").metadata;
        uncontrolled.owner_references = None;
        assert!(
            not_ours(&uncontrolled, &desired).is_some(),
            "labelled by hand, controlled by none"
        );
    }

    /// The shell against a mocked API server: a 422 is the user's to fix and is reported with
    /// the API server's own words; a 409 is transient and is not.
    #[tokio::test]
    async fn a_refused_object_is_reported_a_conflict_is_not() {
        use kube::client::Body;
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let applier = Applier::new(Client::new(mock, "default"), std::sync::Arc::new(Metrics::new()));
        let (cache, _writer) = kube::runtime::reflector::store::<ConfigMap>();
        let server = tokio::spawn(async move {
            for code in [422u16, 409] {
                answer_read(&mut handle, None).await;
                let (request, send) = handle.next_request().await.expect("a request");
                assert_eq!(request.method(), http::Method::PATCH);
                assert!(request.uri().path().ends_with("/namespaces/team-a/configmaps/x"));
                let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": format!("refused with {code}"), "reason": "Invalid", "code": code});
                let body = Body::from(serde_json::to_vec(&status).expect("json"));
                send.send_response(http::Response::builder().status(code).body(body).expect("response"));
            }
        });
        let mut obj = cm(true, "u1");
        obj.metadata.namespace = Some("team-a".into());
        let refused = applier.apply(obj.clone(), &cache).await.expect_err("422");
        assert_eq!(
            refused.refusal().as_deref(),
            Some("the API server refused applying ConfigMap team-a/x: refused with 422")
        );
        let conflict = applier.apply(obj, &cache).await.expect_err("409");
        assert_eq!(conflict.refusal(), None);
        server.await.expect("mock server");
    }

    /// Orphan collection against a mocked API server: a cache that has listed nothing deletes
    /// nothing; from a listed cache only what carries our label and a controller reference to
    /// this owner goes; a failed delete stops the pass and says which object.
    #[tokio::test]
    async fn orphans_are_only_ours_and_a_failed_delete_stops_the_pass() {
        use kube::client::Body;
        use kube::runtime::watcher::Event;
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let applier = Applier::new(Client::new(mock, "default"), std::sync::Arc::new(Metrics::new()));
        let (not_synced, _unused) = kube::runtime::reflector::store::<ConfigMap>();
        let index = OwnerIndex::default();
        let deleted = applier.delete_orphans((&not_synced, &index), "team-a", "u1", &[]).await;
        assert!(deleted.expect("no calls").is_empty());

        let (cache, mut writer) = kube::runtime::reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&Event::Init);
        for (name, labelled, uid) in [
            ("orphan", true, "u1"),
            ("kept", true, "u1"),
            ("theirs", true, "u2"),
            ("bare", false, "u1"),
        ] {
            let mut o = cm(labelled, uid);
            o.metadata.name = Some(name.into());
            o.metadata.namespace = Some("team-a".into());
            index.note(&o);
            writer.apply_watcher_event(&Event::InitApply(o));
        }
        writer.apply_watcher_event(&Event::InitDone);
        let server = tokio::spawn(async move {
            for code in [200u16, 500] {
                let (request, send) = handle.next_request().await.expect("a request");
                assert_eq!(request.method(), http::Method::DELETE);
                assert!(request.uri().path().ends_with("/namespaces/team-a/configmaps/orphan"));
                let status = serde_json::json!({"kind": "Status", "apiVersion": "v1",
                    "status": if code == 200 { "Success" } else { "Failure" }, "message": "m", "code": code});
                let body = Body::from(serde_json::to_vec(&status).expect("json"));
                send.send_response(http::Response::builder().status(code).body(body).expect("response"));
            }
            // Nothing else was asked for: the kept, foreign and unlabelled objects stay.
            assert!(handle.next_request().await.is_none());
        });
        let keep = vec!["kept".to_string()];
        let deleted = applier
            .delete_orphans((&cache, &index), "team-a", "u1", &keep)
            .await
            .expect("deleted");
        assert_eq!(deleted, vec!["orphan".to_string()]);
        let failed = applier
            .delete_orphans((&cache, &index), "team-a", "u1", &keep)
            .await
            .expect_err("500");
        assert!(failed.to_string().contains("team-a/orphan"), "{failed}");
        drop(applier);
        server.await.expect("mock server");
    }

    #[test]
    fn hash_is_deterministic() {
        assert_eq!(desired_hash(&cm(true, "a")), desired_hash(&cm(true, "a")));
        assert_ne!(desired_hash(&cm(true, "a")), desired_hash(&cm(true, "b")));
    }
}
