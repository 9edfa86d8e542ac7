//! Which fleets of a namespace take their certificates from its managed CA, and which leaf
//! Secrets and pods are theirs. A CA rotation waits only for these: an ACME, cert-manager or
//! user-supplied certificate never carries the managed CA's bundle, so counting it would hold
//! the rotation for ever.

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::runtime::reflector::Store;

use crate::crd::{ListenerProtocol, ProxyDeployment, ProxyDeploymentSpec};
use crate::labels;
use crate::owner_index::meta_controller_uid;

/// What a fleet's name is followed by in the names of its serving and client certificate
/// Secrets from the managed CA.
const SERVING_SUFFIX: &str = "-tls";
const CLIENT_SUFFIX: &str = "-client-tls";

/// The Secret of a fleet's serving certificate from the managed CA.
pub fn serving_secret_name(pxd: &str) -> String {
    format!("{pxd}{SERVING_SUFFIX}")
}

/// The Secret of a fleet's upstream client certificate from the managed CA.
pub fn client_secret_name(pxd: &str) -> String {
    format!("{pxd}{CLIENT_SUFFIX}")
}

/// Whether `secret` is the name of one of `pxd`'s leaf Secrets from the managed CA.
fn is_leaf_name(pxd: &str, secret: &str) -> bool {
    secret
        .strip_prefix(pxd)
        .is_some_and(|rest| rest == SERVING_SUFFIX || rest == CLIENT_SUFFIX)
}

/// Whether the fleet's certificates come from the namespace's managed CA.
pub fn uses_managed_ca(spec: &ProxyDeploymentSpec) -> bool {
    let tls = spec.tls.as_ref();
    let serves_tls = spec.listeners.iter().any(|l| l.protocol == ListenerProtocol::HTTPS);
    (serves_tls || tls.is_some_and(|t| t.upstream_client_certificate))
        && tls.is_none_or(|t| t.secret_name.is_none() && t.cert_manager.is_none() && t.acme.is_none())
}

/// The namespace's fleets on the managed CA, as (name, uid).
pub struct ManagedFleets(Vec<(String, String)>);

impl ManagedFleets {
    pub fn of(namespace: &str, fleets: &Store<ProxyDeployment>) -> Self {
        Self::from_fleets(namespace, fleets.state().iter().map(|f| f.as_ref()))
    }

    fn from_fleets<'a>(namespace: &str, fleets: impl Iterator<Item = &'a ProxyDeployment>) -> Self {
        let on_ca = fleets
            .filter(|f| f.metadata.namespace.as_deref() == Some(namespace) && f.metadata.deletion_timestamp.is_none())
            .filter(|f| uses_managed_ca(&f.spec))
            .filter_map(|f| Some((f.metadata.name.clone()?, f.metadata.uid.clone()?)))
            .collect();
        Self(on_ca)
    }

    /// A leaf the managed CA issued to one of these fleets (controlled by it, under the
    /// fleet's serving or client certificate name).
    pub fn has_leaf(&self, secret: &Secret) -> bool {
        let (Some(name), Some(uid)) = (secret.metadata.name.as_deref(), meta_controller_uid(&secret.metadata)) else {
            return false;
        };
        self.0
            .iter()
            .any(|(fleet, fleet_uid)| fleet_uid == uid && is_leaf_name(fleet, name))
    }

    /// A proxy pod of one of these fleets.
    pub fn has_pod(&self, pod: &Pod) -> bool {
        let fleet = pod.metadata.labels.as_ref().and_then(|l| l.get(labels::INSTANCE));
        fleet.is_some_and(|fleet| self.0.iter().any(|(name, _)| name == fleet))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn fleet(name: &str, tls: &str) -> ProxyDeployment {
        let mut f = crate::resources::fixtures::basic();
        f.metadata.name = Some(name.into());
        f.metadata.namespace = Some("team-a".into());
        f.metadata.uid = Some(format!("uid-{name}"));
        f.spec.tls = serde_yaml::from_str(tls).expect("tls");
        f
    }

    fn secret(name: &str, controller: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("team-a".into()),
                owner_references: Some(vec![OwnerReference {
                    uid: format!("uid-{controller}"),
                    controller: Some(true),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// An ACME fleet's leaf (its ca.crt is the ACME chain, never the bundle) and its pods are
    /// not waited for; the managed fleets' leaves and pods are.
    #[test]
    fn only_leaves_and_pods_of_fleets_on_the_managed_ca_count() {
        let fleets = [
            fleet("shop", "{}"),
            fleet("blog", "{acme: {directory: 'https://pebble:14000/dir', email: a@b.c}}"),
            fleet("api", "{certManager: {issuerRef: {name: ca}}}"),
            fleet("own", "{secretName: own-cert}"),
        ];
        let on_ca = ManagedFleets::from_fleets("team-a", fleets.iter());
        assert!(on_ca.has_leaf(&secret("shop-tls", "shop")));
        assert!(on_ca.has_leaf(&secret("shop-client-tls", "shop")));
        assert!(!on_ca.has_leaf(&secret("blog-acme-tls", "blog")));
        assert!(
            !on_ca.has_leaf(&secret("blog-tls", "blog")),
            "left from before the switch to ACME"
        );
        assert!(!on_ca.has_leaf(&secret("api-cert-manager-tls", "api")));
        assert!(!on_ca.has_leaf(&secret("shop-tls", "blog")), "another fleet's object");
        let pod = |fleet: &str| Pod {
            metadata: ObjectMeta {
                labels: Some([(labels::INSTANCE.to_string(), fleet.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(on_ca.has_pod(&pod("shop")));
        assert!(!on_ca.has_pod(&pod("blog")) && !on_ca.has_pod(&pod("api")) && !on_ca.has_pod(&pod("own")));
        let elsewhere = ManagedFleets::from_fleets("team-b", fleets.iter());
        assert!(!elsewhere.has_leaf(&secret("shop-tls", "shop")));
    }
}
