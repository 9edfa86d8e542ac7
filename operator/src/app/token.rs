//! The admin token of a fleet: a random bearer secret its proxies require for weight pushes.
//! Created once per fleet (owned by it, so it goes with it) and never rewritten: rotating it
//! would lock out pushes until every pod's mounted copy caught up.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;
use ring::rand::SecureRandom;

use super::weights::{token_secret_name, TOKEN_KEY};
use crate::context::Context;
use crate::resources::Owner;

fn random_token() -> Option<String> {
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Why the fleet's token Secret could not be created.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("creating the admin token Secret {namespace}/{name}: the system has no randomness")]
    NoRandomness { namespace: String, name: String },
    #[error(
        "the admin token Secret {namespace}/{name} exists and is not this fleet's (it is not controlled by it): \
         it is never used; remove or rename it"
    )]
    Foreign { namespace: String, name: String },
    #[error("creating the admin token Secret {namespace}/{name}: {source}")]
    Create {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Creates the fleet's token Secret when it does not exist yet.
pub async fn ensure(ctx: &Context, owner: &Owner) -> Result<(), TokenError> {
    let name = token_secret_name(&owner.name);
    if let Some(cached) = ctx.stores.secrets.get(&ObjectRef::new(&name).within(&owner.namespace)) {
        // Our labels alone prove nothing (anyone who may create Secrets can set them).
        return match ours(&cached.metadata, owner) {
            true => Ok(()),
            false => Err(TokenError::Foreign {
                namespace: owner.namespace.clone(),
                name,
            }),
        };
    }
    let Some(token) = random_token() else {
        return Err(TokenError::NoRandomness {
            namespace: owner.namespace.clone(),
            name,
        });
    };
    let secret = Secret {
        metadata: owner.meta(name.clone()),
        data: Some(BTreeMap::from([(
            TOKEN_KEY.to_string(),
            ByteString(token.into_bytes()),
        )])),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            ctx.metrics.api_write("Secret", "create");
            Ok(())
        }
        // Not in our cache (it holds only our objects) yet there: ours and the cache lags, or
        // someone else's of that name, which is never taken for the fleet's token.
        Err(kube::Error::Api(e)) if e.code == 409 => match api.get_metadata_opt(&name).await {
            Ok(Some(found)) if ours(&found.metadata, owner) => Ok(()),
            Ok(_) => Err(TokenError::Foreign {
                namespace: owner.namespace.clone(),
                name,
            }),
            Err(source) => Err(TokenError::Create {
                namespace: owner.namespace.clone(),
                name,
                source,
            }),
        },
        Err(source) => Err(TokenError::Create {
            namespace: owner.namespace.clone(),
            name,
            source,
        }),
    }
}

/// Whether the token Secret is the fleet's own: controlled by it and labelled by us.
fn ours(meta: &kube::api::ObjectMeta, owner: &Owner) -> bool {
    label(meta, crate::labels::MANAGED_BY) == Some(crate::labels::MANAGER)
        && crate::owner_index::meta_controller_uid(meta) == Some(owner.reference.uid.as_str())
}

fn label<'a>(meta: &'a kube::api::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// The fleet's admin token, read from the API server (the pods' mounted copy is what counts,
/// and it is never rewritten, so any read is current).
pub async fn read(ctx: &Context, namespace: &str, fleet: &str) -> Option<String> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let s = secrets.get_opt(&token_secret_name(fleet)).await.ok()??;
    // Only the Secret we made for this fleet is a token (never one someone else named so).
    let meta = &s.metadata;
    let controlled_by_fleet = meta
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.kind == "ProxyDeployment" && r.name == fleet);
    if label(meta, crate::labels::MANAGED_BY) != Some(crate::labels::MANAGER)
        || label(meta, crate::labels::INSTANCE) != Some(fleet)
        || !controlled_by_fleet
    {
        return None;
    }
    let bytes = s.data?.get(TOKEN_KEY)?.0.clone();
    String::from_utf8(bytes).ok().map(|t| t.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::testing::test_context;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::client::Body;

    fn owner() -> Owner {
        Owner {
            name: "edge".into(),
            namespace: "team-a".into(),
            reference: OwnerReference {
                uid: "u1".into(),
                ..Default::default()
            },
        }
    }

    /// A refused creation is an error naming the Secret (the reconcile tells it and retries);
    /// one that already exists is not, if it is the fleet's; someone else's of that name is an
    /// error and never the token. The token's value is in none of them.
    #[tokio::test]
    async fn a_refused_token_creation_is_an_error_naming_the_secret() {
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let ctx = test_context(kube::Client::new(mock, "default"));
        let server = tokio::spawn(async move {
            let mut first = true;
            for (code, reason) in [(403, "Forbidden"), (409, "AlreadyExists"), (409, "AlreadyExists")] {
                let (request, send) = handle.next_request().await.expect("a create");
                assert_eq!(request.method(), http::Method::POST);
                let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": format!("secrets is {reason}"), "reason": reason, "code": code});
                let body = Body::from(serde_json::to_vec(&body).expect("json"));
                send.send_response(http::Response::builder().status(code).body(body).expect("response"));
                if code != 409 {
                    continue;
                }
                // The existing one is read: first ours (the cache lagged), then someone else's.
                let (request, send) = handle.next_request().await.expect("a read");
                assert_eq!(request.method(), http::Method::GET);
                let mine = std::mem::replace(&mut first, false);
                let meta = if mine {
                    serde_json::json!({"name": "edge-admin-token", "labels": {crate::labels::MANAGED_BY: crate::labels::MANAGER},
                        "ownerReferences": [{"apiVersion": "proxyfleet.io/v1alpha1", "kind": "ProxyDeployment",
                            "name": "edge", "uid": "u1", "controller": true}]})
                } else {
                    serde_json::json!({"name": "edge-admin-token", "labels": {"team": "theirs"}})
                };
                let body = serde_json::json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": meta});
                let body = Body::from(serde_json::to_vec(&body).expect("json"));
                send.send_response(http::Response::builder().status(200).body(body).expect("response"));
            }
        });
        let refused = ensure(&ctx, &owner()).await.expect_err("refused");
        let said = refused.to_string();
        assert!(
            said.contains("team-a/edge-admin-token") && said.contains("Forbidden"),
            "{said}"
        );
        ensure(&ctx, &owner()).await.expect("already there, ours, is fine");
        let foreign = ensure(&ctx, &owner()).await.expect_err("someone else's");
        assert!(matches!(foreign, TokenError::Foreign { .. }), "{foreign}");
        server.await.expect("mock server");
    }

    /// Our labels on a Secret of the token's name are not enough to be sent as the token: it
    /// must be controlled by the fleet (anyone who may create Secrets can set labels).
    #[tokio::test]
    async fn a_labelled_secret_the_fleet_does_not_control_is_not_the_token() {
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let ctx = test_context(kube::Client::new(mock, "default"));
        let server = tokio::spawn(async move {
            for controlled in [false, true] {
                let (request, send) = handle.next_request().await.expect("a read");
                assert_eq!(request.method(), http::Method::GET);
                let mut meta = serde_json::json!({"name": "edge-admin-token", "namespace": "team-a",
                    "labels": {crate::labels::MANAGED_BY: crate::labels::MANAGER, crate::labels::INSTANCE: "edge"}});
                if controlled {
                    meta["ownerReferences"] = serde_json::json!([{"apiVersion": "proxyfleet.io/v1alpha1",
                        "kind": "ProxyDeployment", "name": "edge", "uid": "u1", "controller": true}]);
                }
                let body = serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta,
                    "data": {TOKEN_KEY: "czNjcmV0"}});
                let body = Body::from(serde_json::to_vec(&body).expect("json"));
                send.send_response(http::Response::builder().status(200).body(body).expect("response"));
            }
        });
        assert_eq!(read(&ctx, "team-a", "edge").await, None, "labels alone");
        assert_eq!(read(&ctx, "team-a", "edge").await.as_deref(), Some("s3cret"));
        server.await.expect("mock server");
    }
}
