//! A manual command (`kubectl proxyfleet promote|abort|…`) arrives as an annotation and is acted
//! on once: the shell removes it after deciding, and remembers the object as that removal
//! returned it, so a pass that still reads the cached copy (with the command) reads the newer
//! one instead and does not act on it twice (a `promote` would skip two steps).

use kube::api::{Api, Patch, PatchParams};
use kube::Resource;
use serde::de::DeserializeOwned;

use crate::canary::rollout::{COMMAND_ANNOTATION, RETRY_ASKED_AT, RETRY_TOKEN};
use crate::latest_object::LatestObject;

/// Removes `annotation` from `object`, if it still holds the command `object` carries, recording
/// the object as written in `latest`. A command sent since (an `abort` over the `pause` this pass
/// read) is not removed unseen: the API server refuses the patch (422) and the caller, acting on
/// nothing, decides again on the next pass. Without a command there is nothing to remove.
pub async fn clear<K>(api: &Api<K>, object: &K, annotation: &str, latest: &LatestObject<K>) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let Some(seen) = object.meta().annotations.as_ref().and_then(|a| a.get(annotation)) else {
        return Ok(());
    };
    let name = object.meta().name.as_deref().unwrap_or_default();
    let patch = removal(annotation, seen).map_err(kube::Error::SerdeError)?;
    let cleared = api
        .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await?;
    latest.record(cleared);
    Ok(())
}

/// The JSON pointer to `annotation` (RFC 6901: `~` and `/` escaped).
pub fn annotation_path(annotation: &str) -> String {
    format!(
        "/metadata/annotations/{}",
        annotation.replace('~', "~0").replace('/', "~1")
    )
}

/// A JSON patch removing `annotation` only while its value is `seen`.
fn removal(annotation: &str, seen: &str) -> Result<json_patch::Patch, serde_json::Error> {
    let path = annotation_path(annotation);
    let ops = serde_json::json!([
        {"op": "test", "path": path, "value": seen},
        {"op": "remove", "path": path},
    ]);
    serde_json::from_value(ops)
}

/// The patch the kubectl plugin sends to give `verb` to an object it read as `meta`: it applies
/// only to that version (a 409 if the object changed since), and never replaces a pending
/// `abort` with another command, which would lose the one command that must not be lost.
pub fn send_patch(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    annotation: &str,
    verb: &str,
) -> Result<serde_json::Value, String> {
    let pending = meta.annotations.as_ref().and_then(|a| a.get(annotation));
    if pending.is_some_and(|p| p == "abort") && verb != "abort" {
        return Err(format!(
            "an abort is pending (annotation {annotation}); it acts first: send {verb} once it is gone"
        ));
    }
    let mut annotations = serde_json::json!({annotation: verb});
    if annotation == COMMAND_ANNOTATION {
        // A command by hand is nobody's wave retry: a hub's token left beside it would make the
        // canary take it for a retry it has taken already.
        annotations[RETRY_TOKEN] = serde_json::Value::Null;
        annotations[RETRY_ASKED_AT] = serde_json::Value::Null;
    }
    Ok(serde_json::json!({"metadata": {
        "resourceVersion": meta.resource_version,
        "annotations": annotations,
    }}))
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
            // Only while the annotation still holds the command read.
            let body = request.into_body().collect_bytes().await.expect("body");
            let ops: serde_json::Value = serde_json::from_slice(&body).expect("json patch");
            assert_eq!(
                ops,
                serde_json::json!([
                    {"op": "test", "path": "/metadata/annotations/proxyfleet.io~1command", "value": "promote"},
                    {"op": "remove", "path": "/metadata/annotations/proxyfleet.io~1command"},
                ])
            );
            let body = serde_json::to_vec(&object("8", None)).expect("json");
            send.send_response(http::Response::builder().body(Body::from(body)).expect("response"));
        });
        let api: Api<ConfigMap> = Api::namespaced(Client::new(mock, "default"), "team-a");
        let latest = LatestObject::default();
        clear(&api, &object("7", Some("promote")), "proxyfleet.io/command", &latest)
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
        let err = clear(&api, &object("7", Some("promote")), "proxyfleet.io/command", &latest).await;
        server.await.expect("mock server");
        assert!(matches!(err, Err(kube::Error::Api(ref e)) if e.code == 500), "{err:?}");
        let seen = latest.newest(Arc::new(object("7", Some("promote"))));
        assert!(
            seen.metadata.annotations.is_some(),
            "the command is still there: {seen:?}"
        );
    }

    #[test]
    fn the_plugin_does_not_replace_a_pending_abort_and_sends_to_the_version_it_read() {
        let mut meta = object("7", Some("abort")).metadata;
        let refused = send_patch(&meta, "proxyfleet.io/command", "promote").expect_err("refused");
        assert!(refused.contains("an abort is pending"), "{refused}");
        let again = send_patch(&meta, "proxyfleet.io/command", "abort").expect("abort again");
        assert_eq!(again["metadata"]["resourceVersion"], "7");
        meta.annotations = Some([("proxyfleet.io/command".to_string(), "pause".to_string())].into());
        let over_pause = send_patch(&meta, "proxyfleet.io/command", "abort").expect("abort over pause");
        assert_eq!(over_pause["metadata"]["annotations"]["proxyfleet.io/command"], "abort");
        assert!(
            over_pause["metadata"]["annotations"].get("proxyfleet.io/retry-token") == Some(&serde_json::Value::Null),
            "a hub's retry token is dropped: {over_pause}"
        );
        let other = send_patch(&meta, "proxyfleet.io/wave-command", "resume").expect("wave command");
        assert!(other["metadata"]["annotations"]
            .get("proxyfleet.io/retry-token")
            .is_none());
    }
}
