//! The Deployment running one track (stable or canary) of the proxies.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, HTTPGetAction, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, SeccompProfile, SecretVolumeSource, SecurityContext, Sysctl, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::config_map::{
    jwks_dir, socks5_dir, upstream_secret_dir, ADMIN_PORT, ADMIN_TOKEN_DIR, CLIENT_CA_DIR, CLIENT_TLS_DIR, CONFIG_DIR,
    CONFIG_FILE, LIVE_WEIGHTS_DIR, TLS_DIR,
};
use super::service_account::service_account_name;
use super::{OperatorSettings, Owner};
use crate::crd::ProxyDeploymentSpec;
use crate::labels::{self, Track};

/// One revision of the pods: what they run and with which configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct PodRevision {
    pub image: String,
    pub config_map: String,
    pub config_hash: String,
    /// Short hash of everything that shapes the pods; shown in status and on the pods.
    pub revision: String,
}

/// Secrets mounted into the proxy pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MountedSecrets {
    /// Serving certificate (`tls.crt`, `tls.key`, `ca.crt`).
    pub serving: Option<String>,
    /// Client certificate for mTLS to upstreams.
    pub client: Option<String>,
}

const TERMINATION_LOG: &str = "/dev/termination-log";

pub fn deployment_name(pxd: &str, track: Track) -> String {
    match track {
        Track::Stable => pxd.to_string(),
        Track::Canary => format!("{pxd}-canary"),
    }
}

pub fn proxy_image(spec: &ProxyDeploymentSpec, settings: &OperatorSettings) -> String {
    spec.image
        .clone()
        .unwrap_or_else(|| settings.default_proxy_image.clone())
}

/// Seconds the kubelet waits after SIGTERM: the proxy's drain grace + deadline + margin.
pub fn termination_grace_seconds(spec: &ProxyDeploymentSpec) -> i64 {
    let drain = spec.drain.clone().unwrap_or_default();
    (drain.grace_period.get() + drain.deadline.get()).as_secs() as i64 + 5
}

/// The admin token (authorising weight pushes) and the live-weights ConfigMap, both optional:
/// a fleet without app rollouts has neither, and its pods start all the same.
fn live_weight_volumes(fleet: &str, volumes: &mut Vec<Volume>, mounts: &mut Vec<VolumeMount>) {
    volumes.push(Volume {
        name: "admin-token".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(crate::app::weights::token_secret_name(fleet)),
            default_mode: Some(0o440),
            optional: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    });
    volumes.push(Volume {
        name: "live-weights".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: crate::app::weights::config_map_name(fleet),
            optional: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    });
    for (name, path) in [("admin-token", ADMIN_TOKEN_DIR), ("live-weights", LIVE_WEIGHTS_DIR)] {
        mounts.push(VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
}

/// Each SOCKS5 listener's credentials Secret (hot-reloaded by the proxy).
pub(crate) fn socks5_volumes(spec: &ProxyDeploymentSpec, volumes: &mut Vec<Volume>, mounts: &mut Vec<VolumeMount>) {
    for (i, l) in spec.listeners.iter().enumerate() {
        let Some(secret) = l
            .tcp
            .as_ref()
            .and_then(|t| t.socks5.as_ref()?.credentials_secret.as_ref())
        else {
            continue;
        };
        let name = format!("socks5-{i}");
        volumes.push(Volume {
            name: name.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.clone()),
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name,
            mount_path: socks5_dir(i),
            read_only: Some(true),
            ..Default::default()
        });
    }
}

/// Each JWT route's key set, from its Secret or ConfigMap (hot-reloaded by the proxy).
pub(crate) fn jwks_volumes(spec: &ProxyDeploymentSpec, volumes: &mut Vec<Volume>, mounts: &mut Vec<VolumeMount>) {
    for (i, r) in spec.routes.iter().enumerate() {
        let Some(j) = &r.jwt else { continue };
        let source = (j.jwks_secret.as_deref(), j.jwks_config_map.as_deref());
        mount_read_only(format!("jwks-{i}"), source, jwks_dir(i), volumes, mounts);
    }
}

/// Each transcoding route's descriptor set, from its ConfigMap or Secret (hot-reloaded by the
/// proxy).
pub(crate) fn descriptor_volumes(spec: &ProxyDeploymentSpec, volumes: &mut Vec<Volume>, mounts: &mut Vec<VolumeMount>) {
    for (i, r) in spec.routes.iter().enumerate() {
        let Some(t) = &r.grpc_transcoding else { continue };
        let source = (
            t.descriptor_set_secret.as_deref(),
            t.descriptor_set_config_map.as_deref(),
        );
        mount_read_only(
            format!("descriptors-{i}"),
            source,
            super::config_map::descriptors_dir(i),
            volumes,
            mounts,
        );
    }
}

/// A volume from a Secret (preferred) or else a ConfigMap, mounted read-only at `path`; nothing
/// when neither is named.
fn mount_read_only(
    name: String,
    (secret, config_map): (Option<&str>, Option<&str>),
    path: String,
    volumes: &mut Vec<Volume>,
    mounts: &mut Vec<VolumeMount>,
) {
    let mut volume = Volume {
        name: name.clone(),
        ..Default::default()
    };
    if let Some(s) = secret {
        volume.secret = Some(SecretVolumeSource {
            secret_name: Some(s.to_owned()),
            default_mode: Some(0o440),
            ..Default::default()
        });
    } else if let Some(c) = config_map {
        volume.config_map = Some(ConfigMapVolumeSource {
            name: c.to_owned(),
            default_mode: Some(0o440),
            ..Default::default()
        });
    } else {
        return;
    }
    volumes.push(volume);
    mounts.push(VolumeMount {
        name,
        mount_path: path,
        read_only: Some(true),
        ..Default::default()
    });
}

/// The pod's volumes and the proxy's mounts: its ConfigMap, certificate and CA Secrets, the
/// upstreams' Secrets, the admin token and the live weights.
fn pod_volumes(
    fleet: &str,
    spec: &ProxyDeploymentSpec,
    pod: &PodRevision,
    secrets: &MountedSecrets,
) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut volumes = vec![Volume {
        name: "config".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: pod.config_map.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: "config".into(),
        mount_path: CONFIG_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    }];
    let mut secret_volume = |name: &str, secret: &str, path: String| {
        volumes.push(Volume {
            name: name.to_string(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.to_string()),
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: name.to_string(),
            mount_path: path,
            read_only: Some(true),
            ..Default::default()
        });
    };
    if let Some(s) = &secrets.serving {
        secret_volume("tls", s, TLS_DIR.to_string());
    }
    if let Some(s) = &secrets.client {
        secret_volume("client-tls", s, CLIENT_TLS_DIR.to_string());
    }
    for l in &spec.listeners {
        if let Some(ca) = &l.client_ca_secret {
            secret_volume(
                &format!("client-ca-{}", l.name),
                ca,
                format!("{CLIENT_CA_DIR}/{}", l.name),
            );
        }
    }
    for (i, u) in spec.upstreams.iter().enumerate() {
        let Some(t) = &u.tls else { continue };
        if let Some(ca) = &t.ca_secret {
            secret_volume(&format!("upstream-{i}-ca"), ca, upstream_secret_dir(i, "ca"));
        }
        if let Some(client) = &t.client_certificate_secret {
            secret_volume(
                &format!("upstream-{i}-client"),
                client,
                upstream_secret_dir(i, "client"),
            );
        }
    }
    jwks_volumes(spec, &mut volumes, &mut mounts);
    descriptor_volumes(spec, &mut volumes, &mut mounts);
    socks5_volumes(spec, &mut volumes, &mut mounts);
    live_weight_volumes(fleet, &mut volumes, &mut mounts);
    (volumes, mounts)
}

/// The proxy container: its ports, probes, mounts and a locked-down security context.
fn proxy_container(
    spec: &ProxyDeploymentSpec,
    pod: &PodRevision,
    pull_policy: &str,
    mounts: Vec<VolumeMount>,
) -> Container {
    let mut ports: Vec<ContainerPort> = spec
        .listeners
        .iter()
        .map(|l| ContainerPort {
            name: Some(l.name.clone()),
            container_port: l.port,
            protocol: Some("TCP".into()),
            ..Default::default()
        })
        .collect();
    ports.extend(
        spec.listeners
            .iter()
            .filter(|l| l.http3.is_some())
            .map(|l| ContainerPort {
                container_port: l.port,
                protocol: Some("UDP".into()),
                ..Default::default()
            }),
    );
    ports.push(ContainerPort {
        name: Some("admin".into()),
        container_port: ADMIN_PORT,
        protocol: Some("TCP".into()),
        ..Default::default()
    });

    let probe = |path: &str, period: i32, failure: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("admin".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failure),
        timeout_seconds: Some(3),
        ..Default::default()
    };

    Container {
        name: "proxy".into(),
        image: Some(pod.image.clone()),
        image_pull_policy: Some(pull_policy.to_string()),
        args: Some(vec![
            "--config".into(),
            format!("{CONFIG_DIR}/{CONFIG_FILE}"),
            "--termination-log".into(),
            TERMINATION_LOG.into(),
        ]),
        // The proxy writes a fatal start-up error there; the operator quotes it in status.
        termination_message_path: Some(TERMINATION_LOG.into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ports: Some(ports),
        volume_mounts: Some(mounts),
        // A loaded node can make one probe slow; never pull every pod at once for that.
        // Drain does not depend on readiness: endpoints go when a pod starts terminating.
        readiness_probe: Some(probe("/readyz", 2, 3)),
        liveness_probe: Some(probe("/healthz", 10, 3)),
        resources: Some(spec.resources.clone().unwrap_or_else(default_resources)),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Non-root, seccomp RuntimeDefault, the spec's sysctls.
fn pod_security(spec: &ProxyDeploymentSpec) -> PodSecurityContext {
    let sysctls: Vec<Sysctl> = spec
        .tuning
        .as_ref()
        .map(|t| {
            t.sysctls
                .iter()
                .map(|s| Sysctl {
                    name: s.name.clone(),
                    value: s.value.clone(),
                })
                .collect()
        })
        .unwrap_or_default();

    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(65532),
        run_as_group: Some(65532),
        fs_group: Some(65532),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        sysctls: (!sysctls.is_empty()).then_some(sysctls),
        ..Default::default()
    }
}

pub fn desired_deployment(
    owner: &Owner,
    spec: &ProxyDeploymentSpec,
    track: Track,
    replicas: i32,
    pod: &PodRevision,
    secrets: &MountedSecrets,
    pull_policy: &str,
) -> Deployment {
    let selector = labels::track_selector(&owner.name, track);
    let overrides = spec.pod.clone().unwrap_or_default();
    let mut pod_labels = overrides.labels.clone();
    pod_labels.extend(selector.clone());
    pod_labels.insert(labels::REVISION.to_string(), pod.revision.clone());
    let mut annotations = overrides.annotations.clone();
    annotations.insert(labels::CONFIG_HASH.to_string(), pod.config_hash.clone());
    annotations.insert("prometheus.io/scrape".to_string(), "true".to_string());
    annotations.insert("prometheus.io/port".to_string(), ADMIN_PORT.to_string());

    let (volumes, mounts) = pod_volumes(&owner.name, spec, pod, secrets);
    let container = proxy_container(spec, pod, pull_policy, mounts);
    let mut meta = owner.meta(deployment_name(&owner.name, track));
    if let Some(l) = meta.labels.as_mut() {
        l.insert(labels::TRACK.to_string(), track.as_str().to_string());
    }
    Deployment {
        metadata: meta,
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            },
            revision_history_limit: Some(3),
            progress_deadline_seconds: Some(spec.progress_deadline.map_or(600, |d| d.get().as_secs() as i32)),
            // Never fewer ready pods than asked for during a roll.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(service_account_name(&owner.name)),
                    automount_service_account_token: Some(false),
                    containers: vec![container],
                    volumes: Some(volumes),
                    termination_grace_period_seconds: Some(termination_grace_seconds(spec)),
                    security_context: Some(pod_security(spec)),
                    node_selector: (!overrides.node_selector.is_empty()).then(|| overrides.node_selector.clone()),
                    tolerations: (!overrides.tolerations.is_empty()).then(|| overrides.tolerations.clone()),
                    affinity: overrides.affinity.clone(),
                    topology_spread_constraints: (!overrides.topology_spread_constraints.is_empty())
                        .then(|| overrides.topology_spread_constraints.clone()),
                    priority_class_name: overrides.priority_class_name.clone(),
                    enable_service_links: Some(false),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// Requests when the spec names none: the scheduler accounts for the proxy, and under memory
/// pressure it is not evicted first (Burstable, not BestEffort). No limits: a CPU limit throttles
/// a proxy at its busiest moment, and a memory limit is the team's call (docs/security.md).
fn default_resources() -> k8s_openapi::api::core::v1::ResourceRequirements {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(
            [("cpu", "50m"), ("memory", "64Mi")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
        ),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::fixtures::basic;

    fn build() -> Deployment {
        let pxd = basic();
        let owner = Owner::of(&pxd).unwrap();
        let rev = PodRevision {
            image: "img:1".into(),
            config_map: "demo-config-abc".into(),
            config_hash: "abc".into(),
            revision: "r1".into(),
        };
        desired_deployment(
            &owner,
            &pxd.spec,
            Track::Stable,
            2,
            &rev,
            &MountedSecrets {
                serving: Some("demo-tls".into()),
                client: None,
            },
            "IfNotPresent",
        )
    }

    #[test]
    fn pods_are_locked_down() {
        let d = build();
        let pod = d.spec.unwrap().template.spec.unwrap();
        let psc = pod.security_context.unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let c = &pod.containers[0];
        let sc = c.security_context.clone().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), vec!["ALL"]);
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(
            c.readiness_probe.clone().unwrap().http_get.unwrap().path.as_deref(),
            Some("/readyz")
        );
        assert_eq!(
            c.liveness_probe.clone().unwrap().http_get.unwrap().path.as_deref(),
            Some("/healthz")
        );
    }

    #[test]
    fn grace_period_covers_the_drain() {
        let d = build();
        // Default drain: 5s grace + 20s deadline.
        assert_eq!(
            d.spec.unwrap().template.spec.unwrap().termination_grace_period_seconds,
            Some(30)
        );
    }

    #[test]
    fn config_hash_rolls_pods_and_selector_is_per_track() {
        let d = build();
        let spec = d.spec.unwrap();
        let ann = spec.template.metadata.unwrap().annotations.unwrap();
        assert_eq!(ann.get(labels::CONFIG_HASH).map(String::as_str), Some("abc"));
        let sel = spec.selector.match_labels.unwrap();
        assert_eq!(sel.get(labels::TRACK).map(String::as_str), Some("stable"));
        assert_eq!(
            spec.strategy.unwrap().rolling_update.unwrap().max_unavailable,
            Some(IntOrString::Int(0))
        );
    }
}
