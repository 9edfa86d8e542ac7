//! Bringing one member cluster to its object: read its copy (and the copies of the fleet's
//! apps), leave it when it already matches, else server-side apply (never taking over a copy
//! propagated from elsewhere).

use k8s_openapi::api::core::v1::Secret;
use kube::Client;

use super::apps::{self, AppCopy, SeenApp};
use super::clusters::MemberCluster;
use super::member::{self, MemberClients, MemberError};
use super::member_apps;
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

/// What a member holds of a fleet: its copy (if any) and its apps' copies.
pub struct Found {
    pub copy: Option<ProxyDeployment>,
    pub apps: Vec<SeenApp>,
}

/// A member's client and what it holds of the fleet. `had_apps`: the fleet's status showed
/// app copies there (`member_apps::observe`).
pub async fn observe_one(
    clients: &MemberClients,
    (cluster, had_apps): (&MemberCluster, bool),
    owner: &Owner,
) -> Result<(Client, Found), MemberError> {
    let client = clients.client(cluster).await?;
    let copy = member::observe(&client, &owner.namespace, &owner.name).await?;
    let apps = member_apps::observe(&client, &owner.namespace, &owner.reference.uid, had_apps).await?;
    Ok((client, Found { copy, apps }))
}

/// What one member is brought to: the fleet's object and its apps' copies.
#[derive(Clone, Copy)]
pub struct Desired<'a> {
    pub fleet: &'a MemberObject,
    pub apps: &'a [AppCopy],
    /// Apps whose copies are left as they are (`hub_apps::HubApps::held`).
    pub held: &'a [String],
}

/// Brings one member to `desired`. Does not take over an object propagated from elsewhere.
pub async fn sync_one(
    clients: &MemberClients,
    (cluster, had_apps): (&MemberCluster, bool),
    owner: &Owner,
    desired: Desired<'_>,
    ca: Option<&Secret>,
) -> Observation {
    match observe_one(clients, (cluster, had_apps), owner).await {
        Ok((client, found)) => bring(&client, found, cluster, owner, desired, ca).await,
        Err(e) => Observation::Failed(e),
    }
}

/// Brings a member whose copies were just read (`found`) to `desired`: the fleet, then its apps.
pub async fn bring(
    client: &Client,
    found: Found,
    cluster: &MemberCluster,
    owner: &Owner,
    desired: Desired<'_>,
    ca: Option<&Secret>,
) -> Observation {
    let fleet = match bring_fleet(client, found.copy, cluster, owner, desired.fleet, ca).await {
        Ok(m) => m,
        Err(e) => return Observation::Failed(e),
    };
    let apps = (desired.apps, desired.held);
    match member_apps::bring(client, &owner.namespace, &owner.reference.uid, apps, found.apps).await {
        Ok(apps) => Observation::Synced {
            member: Box::new(fleet),
            desired_hash: desired.fleet.hash.clone(),
            apps: apps.iter().map(apps::summary).collect(),
        },
        Err(e) => Observation::Failed(e),
    }
}

async fn bring_fleet(
    client: &Client,
    current: Option<ProxyDeployment>,
    cluster: &MemberCluster,
    owner: &Owner,
    desired: &MemberObject,
    ca: Option<&Secret>,
) -> Result<ProxyDeployment, MemberError> {
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
    let object = (&desired.object, &desired.namespace_labels);
    member::apply(client, &owner.namespace, &owner.name, object, ca).await
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
