//! The thin I/O shell towards member clusters: one cached client per cluster Secret version,
//! every call bounded by a timeout so one unreachable member never stalls the others.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::clusters::MemberCluster;
use super::placement::{DELETION_POLICY, FIELD_MANAGER, HUB_CA, HUB_OBJECT, HUB_REVISION, HUB_UID, PROPAGATED_HASH};
use crate::crd::ProxyDeployment;
use crate::labels;

/// How long one member call may take before the member counts as unreachable.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a member could not be brought to the desired state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemberError {
    /// No answer (connection refused, timeout, TLS failure): the member keeps its last state.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The member's API server answered and refused (admission, RBAC, conflict).
    #[error("refused by the member: {0}")]
    Refused(String),
    /// The cluster Secret cannot make a client.
    #[error("{0}")]
    BadCredentials(String),
}

fn classify(what: &str, e: kube::Error) -> MemberError {
    match e {
        kube::Error::Api(s) if s.code < 500 => MemberError::Refused(format!("{what}: {} ({})", s.message, s.reason)),
        other => MemberError::Unreachable(format!("{what}: {other}")),
    }
}

pub(super) async fn bounded<T>(what: &str, f: impl Future<Output = Result<T, kube::Error>>) -> Result<T, MemberError> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => r.map_err(|e| classify(what, e)),
        Err(_) => Err(MemberError::Unreachable(format!(
            "{what}: no answer within {CALL_TIMEOUT:?}"
        ))),
    }
}

/// Clients per member cluster, rebuilt when its Secret changes.
#[derive(Default)]
pub struct MemberClients {
    clients: Mutex<HashMap<String, (String, Client)>>,
}

impl MemberClients {
    pub async fn client(&self, cluster: &MemberCluster) -> Result<Client, MemberError> {
        if let Some((version, c)) = self.clients.lock().ok().and_then(|m| m.get(&cluster.name).cloned()) {
            if version == cluster.secret_version {
                return Ok(c);
            }
        }
        let kubeconfig: Kubeconfig = cluster.kubeconfig.clone().map_err(MemberError::BadCredentials)?;
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| MemberError::BadCredentials(format!("cluster Secret {}: {e}", cluster.secret)))?;
        config.connect_timeout = Some(Duration::from_secs(3));
        config.read_timeout = Some(CALL_TIMEOUT);
        config.write_timeout = Some(CALL_TIMEOUT);
        let client = Client::try_from(config)
            .map_err(|e| MemberError::BadCredentials(format!("cluster Secret {}: {e}", cluster.secret)))?;
        if let Ok(mut m) = self.clients.lock() {
            m.insert(cluster.name.clone(), (cluster.secret_version.clone(), client.clone()));
        }
        Ok(client)
    }

    /// Forgets clients of clusters no longer registered.
    pub fn retain(&self, registered: &[MemberCluster]) {
        if let Ok(mut m) = self.clients.lock() {
            m.retain(|name, _| registered.iter().any(|c| &c.name == name));
        }
    }
}

/// The member's copy of the fleet, if any.
pub async fn observe(client: &Client, namespace: &str, name: &str) -> Result<Option<ProxyDeployment>, MemberError> {
    let api: Api<ProxyDeployment> = Api::namespaced(client.clone(), namespace);
    bounded("reading the ProxyDeployment", api.get_opt(name)).await
}

/// Creates the namespace when missing (never deletes it).
/// The namespace, created when missing with our label and `hub_labels` (the hub namespace's
/// labels: its Pod Security level, what policies select it by); one that exists is left as
/// the member's platform team made it.
async fn ensure_namespace(
    client: &Client,
    namespace: &str,
    hub_labels: &BTreeMap<String, String>,
) -> Result<(), MemberError> {
    let api: Api<Namespace> = Api::all(client.clone());
    if bounded("reading the namespace", api.get_opt(namespace))
        .await?
        .is_some()
    {
        return Ok(());
    }
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(namespace.into()),
            labels: Some(
                hub_labels
                    .clone()
                    .into_iter()
                    .chain([(labels::MANAGED_BY.to_string(), FIELD_MANAGER.to_string())])
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    match bounded("creating the namespace", api.create(&PostParams::default(), &ns)).await {
        Err(MemberError::Refused(m)) if m.contains("AlreadyExists") => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Brings the member to `object`: namespace, then the shared CA (before the fleet, so the
/// member's operator never creates a CA of its own), then the ProxyDeployment.
pub async fn apply(
    client: &Client,
    namespace: &str,
    name: &str,
    (object, hub_labels): (&serde_json::Value, &BTreeMap<String, String>),
    ca: Option<&Secret>,
) -> Result<ProxyDeployment, MemberError> {
    ensure_namespace(client, namespace, hub_labels).await?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    if let Some(ca) = ca {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let ca_name = ca.metadata.name.clone().unwrap_or_default();
        let found = bounded("reading the CA Secret", secrets.get_metadata_opt(&ca_name)).await?;
        if let Some(refusal) = found.and_then(|f| foreign_ca(namespace, &f.metadata, ca)) {
            return Err(MemberError::Refused(refusal));
        }
        bounded(
            "applying the CA Secret",
            secrets.patch(&ca_name, &params, &Patch::Apply(ca)),
        )
        .await?;
    }
    let api: Api<ProxyDeployment> = Api::namespaced(client.clone(), namespace);
    bounded(
        "applying the ProxyDeployment",
        api.patch(name, &params, &Patch::Apply(object)),
    )
    .await
}

/// Why the member's CA Secret must not be overwritten, if it must not: it is not a copy of
/// this hub's CA (the member's own CA, another hub's, a user's Secret of that name).
fn foreign_ca(namespace: &str, found: &kube::api::ObjectMeta, ours: &Secret) -> Option<String> {
    let mark = |m: &kube::api::ObjectMeta| m.annotations.as_ref().and_then(|a| a.get(HUB_CA)).cloned();
    let ours_mark = mark(&ours.metadata);
    if ours_mark.is_some() && mark(found) == ours_mark {
        return None;
    }
    // Copies written before the hub-ca mark existed carry only the hub annotation (which only
    // propagation writes): taken as ours once, and marked by this apply (docs/decisions.md).
    let legacy = found.annotations.as_ref().is_some_and(|a| a.contains_key(HUB_OBJECT));
    if legacy && mark(found).is_none() {
        return None;
    }
    Some(format!(
        "Secret {namespace}/{} exists there and is not a copy of this hub's CA; not overwriting it \
         (the member's fleets keep their own CA: delete that Secret there to let the hub's CA in)",
        found.name.as_deref().unwrap_or_default()
    ))
}

/// What clean-up did in one member.
#[derive(Debug, PartialEq, Eq)]
pub enum Released {
    NothingThere,
    Deleted,
    Orphaned,
}

/// Removes (or, by the policy recorded on it, orphans) the member's copy — only when it carries
/// this hub object's uid. Anything else of that name is not ours and is left alone.
pub async fn release(client: &Client, namespace: &str, name: &str, hub_uid: &str) -> Result<Released, MemberError> {
    let Some(current) = observe(client, namespace, name).await? else {
        return Ok(Released::NothingThere);
    };
    let labels = current.metadata.labels.clone().unwrap_or_default();
    if labels.get(HUB_UID).map(String::as_str) != Some(hub_uid) {
        return Ok(Released::NothingThere);
    }
    let orphan = current
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DELETION_POLICY))
        .is_some_and(|p| p == "Orphan");
    let api: Api<ProxyDeployment> = Api::namespaced(client.clone(), namespace);
    if orphan {
        // Left running, no longer ours: our labels and annotations go, the spec stays.
        let patch = serde_json::json!({"metadata": {
            "labels": {HUB_UID: null, labels::MANAGED_BY: null},
            "annotations": {HUB_OBJECT: null, HUB_REVISION: null, PROPAGATED_HASH: null, DELETION_POLICY: null},
        }});
        bounded(
            "orphaning the ProxyDeployment",
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await?;
        return Ok(Released::Orphaned);
    }
    let uid = current.metadata.uid.clone();
    let params = DeleteParams {
        preconditions: uid.map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match bounded("deleting the ProxyDeployment", api.delete(name, &params)).await {
        Ok(_) => Ok(Released::Deleted),
        Err(MemberError::Refused(m)) if m.contains("NotFound") => Ok(Released::NothingThere),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(mark: Option<&str>) -> kube::api::ObjectMeta {
        kube::api::ObjectMeta {
            name: Some("proxyfleet-ca".into()),
            annotations: mark.map(|m| BTreeMap::from([(HUB_CA.to_string(), m.to_string())])),
            ..Default::default()
        }
    }

    /// The member shell against a mocked member API server: a transport error, a 5xx and no
    /// answer at all are `Unreachable` (the member keeps its state, the wave waits); a 4xx is
    /// `Refused` with the member's own words.
    #[tokio::test(start_paused = true)]
    async fn members_that_fail_are_unreachable_members_that_refuse_are_refused() {
        use kube::client::Body;
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let client = Client::new(mock, "default");
        let server = tokio::spawn(async move {
            let (_, send) = handle.next_request().await.expect("request 1");
            send.send_error(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused",
            ));
            for code in [503u16, 403] {
                let (request, send) = handle.next_request().await.expect("a request");
                assert!(request
                    .uri()
                    .path()
                    .ends_with("/namespaces/team-a/proxydeployments/demo"));
                let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": format!("answered {code}"), "reason": "Forbidden", "code": code});
                let body = Body::from(serde_json::to_vec(&status).expect("json"));
                send.send_response(http::Response::builder().status(code).body(body).expect("response"));
            }
            // The fourth call is never answered: the bound gives up after CALL_TIMEOUT.
            let (_, _never) = handle.next_request().await.expect("request 4");
            tokio::time::sleep(CALL_TIMEOUT * 2).await;
        });
        let refused = observe(&client, "team-a", "demo")
            .await
            .expect_err("refused connection");
        assert!(matches!(refused, MemberError::Unreachable(_)), "{refused}");
        let five = observe(&client, "team-a", "demo").await.expect_err("503");
        assert!(matches!(five, MemberError::Unreachable(_)), "{five}");
        let four = observe(&client, "team-a", "demo").await.expect_err("403");
        assert!(
            matches!(&four, MemberError::Refused(m) if m.contains("answered 403")),
            "{four}"
        );
        let silent = observe(&client, "team-a", "demo").await.expect_err("no answer");
        assert!(
            matches!(&silent, MemberError::Unreachable(m) if m.contains("no answer")),
            "{silent}"
        );
        server.await.expect("mock server");
    }

    /// A namespace the fleet's copy needs is created with the hub namespace's Pod Security
    /// labels, so the team's apps sent with it get no more rights there; one that exists is
    /// left as it is.
    #[tokio::test]
    async fn a_member_namespace_is_created_with_the_hubs_pod_security_labels() {
        use kube::client::Body;
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let client = Client::new(mock, "default");
        let server = tokio::spawn(async move {
            let (request, send) = handle.next_request().await.expect("a read");
            assert_eq!(request.method(), http::Method::GET);
            let missing = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "NotFound", "code": 404});
            let body = Body::from(serde_json::to_vec(&missing).expect("json"));
            send.send_response(http::Response::builder().status(404).body(body).expect("response"));
            let (request, send) = handle.next_request().await.expect("a create");
            let (parts, body) = request.into_parts();
            assert_eq!(parts.method, http::Method::POST);
            let sent = http_body_util::BodyExt::collect(body).await.expect("body").to_bytes();
            let ns: serde_json::Value = serde_json::from_slice(&sent).expect("json");
            let body = Body::from(sent);
            send.send_response(http::Response::builder().status(201).body(body).expect("response"));
            ns
        });
        let labels = BTreeMap::from([(
            "pod-security.kubernetes.io/enforce".to_string(),
            "restricted".to_string(),
        )]);
        ensure_namespace(&client, "team-a", &labels).await.expect("created");
        let ns = server.await.expect("mock server");
        assert_eq!(
            ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted",
            "{ns}"
        );
        assert_eq!(ns["metadata"]["labels"][labels::MANAGED_BY], FIELD_MANAGER);
    }

    #[test]
    fn only_a_copy_of_this_hubs_ca_is_overwritten() {
        let ours = Secret {
            metadata: meta(Some("uid-hub")),
            ..Default::default()
        };
        assert_eq!(foreign_ca("team-a", &meta(Some("uid-hub")), &ours), None);
        let own = foreign_ca("team-a", &meta(None), &ours).expect("the member's own CA is kept");
        assert!(
            own.contains("team-a/proxyfleet-ca") && own.contains("not overwriting"),
            "{own}"
        );
        assert!(foreign_ca("team-a", &meta(Some("uid-other-hub")), &ours).is_some());
        let mut legacy = meta(None);
        legacy.annotations = Some(BTreeMap::from([(HUB_OBJECT.to_string(), "team-a/*".to_string())]));
        assert_eq!(
            foreign_ca("team-a", &legacy, &ours),
            None,
            "a copy from before the mark"
        );
        let unmarked = Secret {
            metadata: meta(None),
            ..Default::default()
        };
        assert!(
            foreign_ca("team-a", &meta(None), &unmarked).is_some(),
            "no mark, no overwrite"
        );
    }
}
