//! Writing a status: a forced server-side apply of it under the writer's field manager, the
//! object remembered as the API server returned it (the next pass never decides on an older
//! copy, see `latest_object`) and the write counted.

use kube::api::{Api, Patch, PatchParams};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::latest_object::LatestObject;
use crate::metrics::Metrics;

/// Where a status goes and who writes it.
pub struct StatusWriter<'a, K> {
    pub api: Api<K>,
    pub manager: &'a str,
    pub latest: &'a LatestObject<K>,
    pub metrics: &'a Metrics,
}

impl<K> StatusWriter<'_, K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    /// Applies `status` to `name`, forcing ownership of the fields this manager writes.
    pub async fn apply(&self, name: &str, status: &impl Serialize) -> Result<(), kube::Error> {
        let kind = K::kind(&());
        let patch = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": kind,
            "status": status,
        });
        let params = PatchParams::apply(self.manager).force();
        let written = self.api.patch_status(name, &params, &Patch::Apply(&patch)).await?;
        self.latest.record(written);
        self.metrics.api_write(&format!("{kind}/status"), "apply");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::crd::ProxyDeployment;
    use kube::client::Body;
    use kube::Client;

    fn fleet(rv: &str) -> ProxyDeployment {
        let spec = serde_json::from_value(serde_json::json!({
            "replicas": 1, "listeners": [], "routes": [{"name": "all", "upstream": "app"}],
            "upstreams": [{"name": "app", "endpoints": ["app:8080"]}],
        }))
        .expect("spec");
        let mut p = ProxyDeployment::new("edge", spec);
        p.metadata.namespace = Some("team-a".into());
        p.metadata.uid = Some("u-1".into());
        p.metadata.resource_version = Some(rv.into());
        p
    }

    /// Against a mocked API server: one forced apply of the status under the given manager,
    /// the returned object preferred over an older cached copy, the write counted.
    #[tokio::test]
    async fn a_status_is_applied_recorded_and_counted() {
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let server = tokio::spawn(async move {
            let (request, send) = handle.next_request().await.expect("the apply");
            assert_eq!(request.method(), http::Method::PATCH);
            assert!(request
                .uri()
                .path()
                .ends_with("/namespaces/team-a/proxydeployments/edge/status"));
            let query = request.uri().query().unwrap_or_default().to_string();
            assert!(
                query.contains("fieldManager=tester") && query.contains("force=true"),
                "{query}"
            );
            let body = request.into_body().collect_bytes().await.expect("body");
            let sent: serde_json::Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(sent["kind"], "ProxyDeployment");
            assert_eq!(sent["apiVersion"], "proxyfleet.io/v1alpha1");
            assert_eq!(sent["status"]["observedGeneration"], 3);
            let reply = serde_json::to_vec(&fleet("8")).expect("json");
            send.send_response(http::Response::builder().body(Body::from(reply)).expect("response"));
        });
        let latest = LatestObject::default();
        let metrics = Metrics::default();
        let writer = StatusWriter {
            api: Api::<ProxyDeployment>::namespaced(Client::new(mock, "default"), "team-a"),
            manager: "tester",
            latest: &latest,
            metrics: &metrics,
        };
        writer
            .apply("edge", &serde_json::json!({"observedGeneration": 3}))
            .await
            .expect("applied");
        server.await.expect("server");
        let seen = latest.newest(Arc::new(fleet("5")));
        assert_eq!(seen.metadata.resource_version.as_deref(), Some("8"));
        assert!(
            metrics.encode().contains("kind=\"ProxyDeployment/status\""),
            "{}",
            metrics.encode()
        );
    }
}
