//! Bringing one member cluster to its object: read its copy, leave it when it already
//! matches, else server-side apply (never taking over a copy propagated from elsewhere).

use k8s_openapi::api::core::v1::Secret;
use kube::Client;

use super::clusters::MemberCluster;
use super::member::{self, MemberClients, MemberError};
use super::placement::{self, MemberObject, HUB_UID};
use super::status::Observation;
use crate::crd::ProxyDeployment;
use crate::resources::Owner;

/// `desired` ⊆ `actual`: every field we set has our value (the member may add defaults).
fn contains(actual: &serde_json::Value, desired: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (actual, desired) {
        (Value::Object(a), Value::Object(d)) => d.iter().all(|(k, dv)| a.get(k).is_some_and(|av| contains(av, dv))),
        (Value::Array(a), Value::Array(d)) => a.len() == d.len() && a.iter().zip(d).all(|(av, dv)| contains(av, dv)),
        (a, d) => a == d,
    }
}

/// A member's client and its copy of the fleet (if any).
pub async fn observe_one(
    clients: &MemberClients,
    cluster: &MemberCluster,
    owner: &Owner,
) -> Result<(Client, Option<ProxyDeployment>), MemberError> {
    let client = clients.client(cluster).await?;
    let current = member::observe(&client, &owner.namespace, &owner.name).await?;
    Ok((client, current))
}

/// Brings one member to its object. Does not take over an object propagated from elsewhere.
pub async fn sync_one(
    clients: &MemberClients,
    cluster: &MemberCluster,
    owner: &Owner,
    desired: &MemberObject,
    ca: Option<&Secret>,
) -> Observation {
    match observe_one(clients, cluster, owner).await {
        Ok((client, current)) => bring(&client, current, cluster, owner, desired, ca).await,
        Err(e) => Observation::Failed(e),
    }
}

/// Brings a member whose copy was just read (`current`) to `desired`.
pub async fn bring(
    client: &Client,
    current: Option<ProxyDeployment>,
    cluster: &MemberCluster,
    owner: &Owner,
    desired: &MemberObject,
    ca: Option<&Secret>,
) -> Observation {
    let run = async {
        if let Some(current) = current {
            let labels = current.metadata.labels.clone().unwrap_or_default();
            if labels.get(HUB_UID) != Some(&owner.reference.uid) {
                return Err(MemberError::Refused(format!(
                    "{}/{} exists there and was not propagated from this object; not taking it over",
                    owner.namespace, owner.name
                )));
            }
            let hash_matches = current
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(placement::PROPAGATED_HASH))
                == Some(&desired.hash);
            let spec_matches =
                serde_json::to_value(&current.spec).is_ok_and(|actual| contains(&actual, &desired.object["spec"]));
            if hash_matches && spec_matches {
                return Ok(current);
            }
            tracing::info!(cluster = %cluster.name, drift = hash_matches, "applying to member");
        }
        member::apply(client, &owner.namespace, &owner.name, &desired.object, ca).await
    };
    match run.await {
        Ok(m) => Observation::Synced {
            member: Box::new(m),
            desired_hash: desired.hash.clone(),
        },
        Err(e) => Observation::Failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::contains;
    use serde_json::json;

    #[test]
    fn contains_tolerates_member_defaults_but_not_edits() {
        let desired = json!({"replicas": 2, "routes": [{"name": "a"}]});
        assert!(contains(
            &json!({"replicas": 2, "routes": [{"name": "a", "timeout": "15s"}], "x": 1}),
            &desired
        ));
        assert!(!contains(&json!({"replicas": 7, "routes": [{"name": "a"}]}), &desired));
        assert!(!contains(&json!({"replicas": 2, "routes": []}), &desired));
    }
}
