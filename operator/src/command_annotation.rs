//! A manual command (`kubectl proxyfleet promote|abort|…`) arrives as an annotation and is acted
//! on once: the shell removes it after deciding, and remembers the object as that removal
//! returned it, so a pass that still reads the cached copy (with the command) reads the newer
//! one instead and does not act on it twice (a `promote` would skip two steps).

use kube::api::{Api, Patch, PatchParams};
use kube::Resource;
use serde::de::DeserializeOwned;

use crate::latest_object::LatestObject;

/// Removes `annotation` from `name`, recording the object as written in `latest`.
pub async fn clear<K>(api: &Api<K>, name: &str, annotation: &str, latest: &LatestObject<K>) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({"metadata": {"annotations": {annotation: null}}});
    let cleared = api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    latest.record(cleared);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::client::Body;
    use kube::Client;

    fn object(rv: &str, command: Option<&str>) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some("demo".into());
        c.metadata.namespace = Some("team-a".into());
        c.metadata.uid = Some("u-1".into());
        c.metadata.resource_version = Some(rv.into());
        c.metadata.annotations = command.map(|c| [("proxyfleet.io/command".to_string(), c.to_string())].into());
        c
    }

    /// Against a mocked API server: the patch removes the annotation, and a later pass that
    /// reads the cached copy (still with the command) gets the cleared one.
    #[tokio::test]
    async fn a_cleared_command_is_not_read_again_from_a_lagging_cache() {
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let server = tokio::spawn(async move {
            let (request, send) = handle.next_request().await.expect("the patch");
            assert_eq!(request.method(), http::Method::PATCH);
            assert!(request.uri().path().ends_with("/namespaces/team-a/configmaps/demo"));
            let body = serde_json::to_vec(&object("8", None)).expect("json");
            send.send_response(http::Response::builder().body(Body::from(body)).expect("response"));
        });
        let api: Api<ConfigMap> = Api::namespaced(Client::new(mock, "default"), "team-a");
        let latest = LatestObject::default();
        clear(&api, "demo", "proxyfleet.io/command", &latest)
            .await
            .expect("cleared");
        server.await.expect("mock server");
        let seen = latest.newest(Arc::new(object("7", Some("promote"))));
        assert!(seen.metadata.annotations.is_none(), "the command is gone: {seen:?}");
        let caught_up = latest.newest(Arc::new(object("8", None)));
        assert_eq!(caught_up.metadata.resource_version.as_deref(), Some("8"));
    }

    /// A removal the API server refuses is an error for the caller (which then does not act),
    /// and nothing is recorded: the next pass still sees the command and decides again.
    #[tokio::test]
    async fn a_failed_removal_is_an_error_and_the_command_stays() {
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let server = tokio::spawn(async move {
            let (_, send) = handle.next_request().await.expect("the patch");
            let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500});
            send.send_response(
                http::Response::builder()
                    .status(500)
                    .body(Body::from(serde_json::to_vec(&status).expect("json")))
                    .expect("response"),
            );
        });
        let api: Api<ConfigMap> = Api::namespaced(Client::new(mock, "default"), "team-a");
        let latest = LatestObject::default();
        let err = clear(&api, "demo", "proxyfleet.io/command", &latest).await;
        server.await.expect("mock server");
        assert!(matches!(err, Err(kube::Error::Api(ref e)) if e.code == 500), "{err:?}");
        let seen = latest.newest(Arc::new(object("7", Some("promote"))));
        assert!(
            seen.metadata.annotations.is_some(),
            "the command is still there: {seen:?}"
        );
    }
}
