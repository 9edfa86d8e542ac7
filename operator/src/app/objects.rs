//! The objects an AppRollout owns, as pure builders: a Deployment and a Service per track,
//! from the team's pod template. Labels never include the fleet's instance label, so a fleet's
//! scrapes and garbage collection never see app pods.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{PodTemplateSpec, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use sha2::{Digest, Sha256};

use super::render::{track_name, AppTrack};
use super::spec::AppRollout;
use crate::labels;

pub const APP_ROLLOUT: &str = "proxyfleet.io/app-rollout";
pub const APP_TRACK: &str = "proxyfleet.io/app-track";

/// Who owns an app object.
#[derive(Clone, Debug, PartialEq)]
pub struct AppOwner {
    pub name: String,
    pub namespace: String,
    pub reference: OwnerReference,
}

impl AppOwner {
    pub fn of(ar: &AppRollout) -> Option<Self> {
        let name = ar.metadata.name.clone()?;
        Some(Self {
            namespace: ar.metadata.namespace.clone()?,
            reference: OwnerReference {
                api_version: AppRollout::api_version(&()).to_string(),
                kind: AppRollout::kind(&()).to_string(),
                name: name.clone(),
                uid: ar.metadata.uid.clone()?,
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
            name,
        })
    }

    pub fn meta(&self, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![self.reference.clone()]),
            ..Default::default()
        }
    }
}

/// What a track's Service and Deployment select.
pub fn selector(rollout: &str, track: AppTrack) -> BTreeMap<String, String> {
    BTreeMap::from([
        (APP_ROLLOUT.to_string(), rollout.to_string()),
        (APP_TRACK.to_string(), track.as_str().to_string()),
    ])
}

fn object_labels(rollout: &str, track: AppTrack) -> BTreeMap<String, String> {
    let mut l = selector(rollout, track);
    l.insert(labels::MANAGED_BY.to_string(), labels::MANAGER.to_string());
    l
}

/// Short hash of a pod template: the app's revision.
pub fn template_revision(template: &PodTemplateSpec) -> String {
    let digest = Sha256::digest(serde_json::to_vec(template).unwrap_or_default());
    digest.iter().take(5).map(|b| format!("{b:02x}")).collect()
}

/// A track's Deployment running `template` (the team's, or the one stable keeps).
pub fn deployment(
    owner: &AppOwner,
    track: AppTrack,
    template: &PodTemplateSpec,
    revision: &str,
    replicas: i32,
) -> Deployment {
    let mut template = template.clone();
    let meta = template.metadata.get_or_insert_with(Default::default);
    let pod_labels = meta.labels.get_or_insert_with(Default::default);
    // Ours only: a template carrying `proxyfleet.io/proxydeployment` would make the app's pods
    // look like the fleet's proxies, and be sent its admin token with the weights.
    pod_labels.retain(|k, _| !k.starts_with("proxyfleet.io/"));
    pod_labels.extend(selector(&owner.name, track));
    pod_labels.insert(labels::REVISION.to_string(), revision.to_string());
    Deployment {
        metadata: owner.meta(track_name(&owner.name, track), object_labels(&owner.name, track)),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector(&owner.name, track)),
                ..Default::default()
            },
            // Never fewer ready pods than asked for while a template changes (promotion).
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::String("25%".into())),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template,
            ..Default::default()
        }),
        status: None,
    }
}

/// A track's ClusterIP Service: the proxies' upstream `<name>-<track>`.
pub fn service(owner: &AppOwner, track: AppTrack, port: u16) -> Service {
    Service {
        metadata: owner.meta(track_name(&owner.name, track), object_labels(&owner.name, track)),
        spec: Some(ServiceSpec {
            selector: Some(selector(&owner.name, track)),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: i32::from(port),
                target_port: Some(IntOrString::Int(i32::from(port))),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The template a Deployment runs now (kept by stable during a rollout).
pub fn template_of(d: &Deployment) -> Option<PodTemplateSpec> {
    let mut t = d.spec.as_ref()?.template.clone();
    // Our own labels are added again by `deployment`; strip them so the template round-trips.
    if let Some(l) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        l.remove(APP_ROLLOUT);
        l.remove(APP_TRACK);
        l.remove(labels::REVISION);
    }
    Some(t)
}

/// An owner for the app module's tests: AppRollout team/shop.
#[cfg(test)]
pub mod fixture {
    use super::*;

    pub fn owner() -> AppOwner {
        AppOwner {
            name: "shop".into(),
            namespace: "team".into(),
            reference: OwnerReference {
                uid: "u1".into(),
                ..Default::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> PodTemplateSpec {
        serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"app": "shop"}},
            "spec": {"containers": [{"name": "app", "image": "shop:v1"}]}
        }))
        .unwrap()
    }

    use super::fixture::owner;

    #[test]
    fn a_track_runs_the_template_with_its_own_selector() {
        let rev = template_revision(&template());
        let d = deployment(&owner(), AppTrack::Canary, &template(), &rev, 1);
        assert_eq!(d.metadata.name.as_deref(), Some("shop-canary"));
        let labels = d
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .clone()
            .unwrap();
        assert_eq!(labels["app"], "shop");
        assert_eq!(labels[APP_TRACK], "canary");
        assert_eq!(crate::status::revision_of(&d), Some(rev.clone()));
        assert!(!d.metadata.labels.as_ref().unwrap().contains_key(labels::INSTANCE));
        assert_eq!(template_of(&d), Some(template()), "the kept template round-trips");
        assert_eq!(template_revision(&template_of(&d).unwrap()), rev);
        let s = service(&owner(), AppTrack::Canary, 8080);
        assert_eq!(s.spec.unwrap().selector, Some(selector("shop", AppTrack::Canary)));
    }

    /// A template posing as the fleet's proxy pods (which are sent its admin token) loses the
    /// fleet's labels.
    #[test]
    fn a_template_cannot_label_its_pods_as_the_fleets_proxies() {
        let mut t = template();
        let l = t.metadata.as_mut().unwrap().labels.as_mut().unwrap();
        l.insert(labels::INSTANCE.to_string(), "edge".to_string());
        let d = deployment(&owner(), AppTrack::Stable, &t, "r1", 1);
        let pod_labels = d.spec.unwrap().template.metadata.unwrap().labels.unwrap();
        assert!(!pod_labels.contains_key(labels::INSTANCE), "{pod_labels:?}");
        assert_eq!(pod_labels["app"], "shop");
    }
}
