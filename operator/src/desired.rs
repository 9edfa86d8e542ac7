//! What a ProxyDeployment should own right now: a pure function of the spec, the settings and
//! the certificate Secrets in use. One place decides the desired set; everything owned that is
//! not in it is deleted.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use sha2::{Digest, Sha256};

use crate::crd::{ListenerProtocol, ProxyDeployment, PullPolicy};
use crate::labels::Track;
use crate::resources::config_map::{config_hash, config_map_name, desired_config_map, render_proxy_config};
use crate::resources::deployment::{desired_deployment, proxy_image, MountedSecrets, PodRevision};
use crate::resources::pdb::desired_pdb;
use crate::resources::service::{desired_headless_service, desired_service};
use crate::resources::service_account::desired_service_account;
use crate::resources::{OperatorSettings, Owner};

pub use crate::spec_check::SpecError;

/// Everything of the pod template the spec shapes, hashed as JSON into the revision: a field
/// added here changes every revision, a field left out never rolls the pods.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct RevisionInputs<'a> {
    image: &'a str,
    config_hash: &'a str,
    pod: &'a Option<crate::crd::PodOverrides>,
    resources: &'a Option<k8s_openapi::api::core::v1::ResourceRequirements>,
    tuning: &'a Option<crate::crd::Tuning>,
    image_pull_policy: &'a Option<PullPolicy>,
    serving_secret: Option<&'a str>,
    client_secret: Option<&'a str>,
}

impl RevisionInputs<'_> {
    /// The short revision hash shown in status and on the pods.
    fn revision(&self) -> String {
        short_hash(self, 4)
    }
}

/// The first `bytes` bytes of the SHA-256 of `value`'s JSON, in hex: revision, desired-object
/// and strategy hashes (changing it changes every running fleet's revision).
pub fn short_hash<T: serde::Serialize + ?Sized>(value: &T, bytes: usize) -> String {
    let json = serde_json::to_vec(value).unwrap_or_default();
    Sha256::digest(&json)
        .iter()
        .take(bytes)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One revision of the fleet's pods with its ConfigMap.
#[derive(Clone, Debug)]
pub struct RevisionObjects {
    pub pod: PodRevision,
    pub config_map: ConfigMap,
}

/// The revision the current spec asks for.
pub fn desired_revision(
    pxd: &ProxyDeployment,
    settings: &OperatorSettings,
    secrets: &MountedSecrets,
) -> Result<RevisionObjects, SpecError> {
    let owner = Owner::of(pxd).map_err(|e| SpecError(e.to_string()))?;
    let spec = &pxd.spec;
    crate::spec_check::check(spec)?;
    let needs_tls = spec.listeners.iter().any(|l| l.protocol == ListenerProtocol::HTTPS);
    if needs_tls && secrets.serving.is_none() {
        return Err(SpecError(
            "HTTPS listeners need a serving certificate, and none is available".into(),
        ));
    }
    let config = render_proxy_config(spec, secrets.serving.is_some());
    if let Err(errors) = proxyfleet_config::validate(&config) {
        let msg = errors
            .iter()
            .map(|e| format!("spec.{e}"))
            .collect::<Vec<_>>()
            .join("; ");
        return Err(SpecError(msg));
    }
    let yaml = config.to_yaml();
    let hash = config_hash(&yaml);
    let image = proxy_image(spec, settings);
    let revision = RevisionInputs {
        image: &image,
        config_hash: &hash,
        pod: &spec.pod,
        resources: &spec.resources,
        tuning: &spec.tuning,
        image_pull_policy: &spec.image_pull_policy,
        serving_secret: secrets.serving.as_deref(),
        client_secret: secrets.client.as_deref(),
    }
    .revision();
    Ok(RevisionObjects {
        pod: PodRevision {
            image,
            config_map: config_map_name(&owner.name, &hash),
            config_hash: hash.clone(),
            revision,
        },
        config_map: desired_config_map(&owner, &yaml, &hash),
    })
}

/// A Deployment to run, with its replica count.
#[derive(Clone, Debug)]
pub struct TrackPlan {
    pub track: Track,
    pub replicas: i32,
    pub revision: RevisionObjects,
}

/// Everything owned, for a set of track plans (one stable; a canary during a rollout).
#[derive(Clone, Debug, Default)]
pub struct DesiredObjects {
    pub service_account: Option<ServiceAccount>,
    pub config_maps: Vec<ConfigMap>,
    pub deployments: Vec<Deployment>,
    pub services: Vec<Service>,
    pub pdb: Option<PodDisruptionBudget>,
    pub network_policy: Option<k8s_openapi::api::networking::v1::NetworkPolicy>,
}

pub fn desired_objects(
    pxd: &ProxyDeployment,
    plans: &[TrackPlan],
    secrets: &MountedSecrets,
    operator_namespace: &str,
) -> Result<DesiredObjects, SpecError> {
    let owner = Owner::of(pxd).map_err(|e| SpecError(e.to_string()))?;
    let spec = &pxd.spec;
    let pull = spec.image_pull_policy.unwrap_or(PullPolicy::IfNotPresent).as_str();
    let mut out = DesiredObjects {
        service_account: Some(desired_service_account(&owner)),
        ..Default::default()
    };
    for plan in plans {
        if !out
            .config_maps
            .iter()
            .any(|c| c.metadata.name == plan.revision.config_map.metadata.name)
        {
            out.config_maps.push(plan.revision.config_map.clone());
        }
        out.deployments.push(desired_deployment(
            &owner,
            spec,
            plan.track,
            plan.replicas,
            &plan.revision.pod,
            secrets,
            pull,
        ));
    }
    out.services.push(desired_service(&owner, spec));
    if spec.service.as_ref().is_some_and(|s| s.headless) {
        out.services.push(desired_headless_service(&owner, spec));
    }
    out.pdb = desired_pdb(&owner, spec.replicas);
    out.network_policy = Some(crate::resources::network_policy::desired_network_policy(
        &owner,
        spec,
        operator_namespace,
    ));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::fixtures::basic;

    fn secrets() -> MountedSecrets {
        MountedSecrets {
            serving: Some("demo-tls".into()),
            client: None,
        }
    }

    #[test]
    fn revision_is_stable_for_the_same_spec_and_changes_with_it() {
        let pxd = basic();
        let s = OperatorSettings::default();
        let a = desired_revision(&pxd, &s, &secrets()).unwrap();
        let b = desired_revision(&pxd, &s, &secrets()).unwrap();
        assert_eq!(a.pod, b.pod);
        let mut changed = pxd.clone();
        changed.spec.routes[0].timeout = "3s".parse().unwrap();
        let c = desired_revision(&changed, &s, &secrets()).unwrap();
        assert_ne!(a.pod.config_hash, c.pod.config_hash);
        assert_ne!(a.pod.revision, c.pod.revision);
    }

    #[test]
    fn https_without_a_certificate_is_a_spec_error() {
        let pxd = basic();
        let e = desired_revision(&pxd, &OperatorSettings::default(), &MountedSecrets::default()).unwrap_err();
        assert!(e.0.contains("certificate"));
    }

    #[test]
    fn semantic_errors_name_the_field() {
        let mut pxd = basic();
        pxd.spec.upstreams[0].endpoints = vec!["no-port".into()];
        let e = desired_revision(&pxd, &OperatorSettings::default(), &secrets()).unwrap_err();
        assert!(e.0.contains("spec.upstreams[0].endpoints[0]"), "{e}");
    }

    #[test]
    fn one_plan_gives_the_full_set() {
        let pxd = basic();
        let rev = desired_revision(&pxd, &OperatorSettings::default(), &secrets()).unwrap();
        let d = desired_objects(
            &pxd,
            &[TrackPlan {
                track: Track::Stable,
                replicas: 2,
                revision: rev,
            }],
            &secrets(),
            "proxyfleet-system",
        )
        .unwrap();
        assert_eq!(d.deployments.len(), 1);
        assert_eq!(d.config_maps.len(), 1);
        assert_eq!(d.services.len(), 1);
        assert!(d.pdb.is_some());
        assert!(d.service_account.is_some());
    }
}
