//! The proxy configuration rendered from the spec, and the ConfigMap carrying it. ConfigMaps
//! are named by content hash and immutable, so a canary and its stable revision can each keep
//! their own configuration.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use sha2::{Digest, Sha256};

use proxyfleet_config::{Admin, CertificateFiles, Listener, ListenerTls, ProxyConfig, Upstream};

use super::Owner;
use crate::crd::{ListenerProtocol, ProxyDeploymentSpec};

pub const CONFIG_DIR: &str = "/etc/proxyfleet/config";
pub const CONFIG_FILE: &str = "proxy.yaml";
pub const TLS_DIR: &str = "/etc/proxyfleet/tls";
pub const CLIENT_TLS_DIR: &str = "/etc/proxyfleet/client";
pub const CLIENT_CA_DIR: &str = "/etc/proxyfleet/client-ca";
pub const UPSTREAM_TLS_DIR: &str = "/etc/proxyfleet/upstream";
pub const JWKS_DIR: &str = "/etc/proxyfleet/jwks";
pub const ADMIN_PORT: i32 = 9901;
/// The fleet's admin token Secret (authorises live-weight pushes).
pub const ADMIN_TOKEN_DIR: &str = "/etc/proxyfleet/admin-token";
/// The fleet's live-weights ConfigMap (written by its AppRollouts; optional).
pub const LIVE_WEIGHTS_DIR: &str = "/etc/proxyfleet/weights";

/// Where route `i`'s JWKS Secret or ConfigMap is mounted (the key set is `jwks.json` in it).
pub fn jwks_dir(i: usize) -> String {
    format!("{JWKS_DIR}/{i}")
}

/// The key of the certificate Secret holding a DER OCSP response to staple (optional).
pub const OCSP_KEY: &str = "tls.ocsp";

/// The key of a JWKS Secret or ConfigMap the pods read.
pub const JWKS_KEY: &str = "jwks.json";

pub const DESCRIPTORS_DIR: &str = "/etc/proxyfleet/descriptors";

/// Where route `i`'s descriptor-set ConfigMap or Secret is mounted (`descriptors.pb` in it).
pub fn descriptors_dir(i: usize) -> String {
    format!("{DESCRIPTORS_DIR}/{i}")
}

/// Routes as the proxy reads them: JWKS and descriptor-set references become the files they
/// are mounted as.
fn routes_with_mounted_files(routes: &[proxyfleet_config::Route]) -> Vec<proxyfleet_config::Route> {
    let mut out = routes.to_vec();
    for (i, r) in out.iter_mut().enumerate() {
        if let Some(j) = r.jwt.as_mut() {
            if j.jwks_secret.take().is_some() | j.jwks_config_map.take().is_some() {
                j.jwks_file = Some(format!("{}/{JWKS_KEY}", jwks_dir(i)));
            }
        }
        if let Some(t) = r.grpc_transcoding.as_mut() {
            // A file path in a ProxyDeployment is refused at admission; only the ConfigMap counts.
            let mounted = t.descriptor_set_config_map.take().is_some() | t.descriptor_set_secret.take().is_some();
            t.descriptor_set_file =
                mounted.then(|| format!("{}/{}", descriptors_dir(i), proxyfleet_config::DESCRIPTOR_SET_KEY));
        }
    }
    out
}

/// Where listener `i`'s SOCKS5 credentials Secret is mounted (`username`, `password`).
pub fn socks5_dir(i: usize) -> String {
    format!("{SOCKS5_DIR}/{i}")
}
pub const SOCKS5_DIR: &str = "/etc/proxyfleet/socks5";

/// A TCP listener as the proxy reads it: a SOCKS5 credentials Secret becomes its mount.
fn tcp_with_mounted_secrets(
    i: usize,
    tcp: &Option<proxyfleet_config::TcpProxy>,
) -> Option<proxyfleet_config::TcpProxy> {
    let mut tcp = tcp.clone()?;
    if let Some(a) = tcp.socks5.as_mut() {
        if a.credentials_secret.take().is_some() {
            a.credentials_dir = Some(socks5_dir(i));
        }
    }
    Some(tcp)
}

/// Where upstream `i`'s CA Secret (`ca`) or client certificate Secret (`client`) is mounted.
pub fn upstream_secret_dir(i: usize, what: &str) -> String {
    format!("{UPSTREAM_TLS_DIR}/{i}/{what}")
}

/// Upstreams as the proxy reads them: Secret references become the files they are mounted as.
fn upstreams_with_mounted_secrets(upstreams: &[Upstream]) -> Vec<Upstream> {
    let mut out = upstreams.to_vec();
    for (i, u) in out.iter_mut().enumerate() {
        let Some(t) = u.tls.as_mut() else { continue };
        if t.ca_secret.take().is_some() {
            t.ca_file = Some(format!("{}/ca.crt", upstream_secret_dir(i, "ca")));
        }
        if t.client_certificate_secret.take().is_some() {
            let dir = upstream_secret_dir(i, "client");
            t.client_certificate = Some(CertificateFiles {
                cert_file: format!("{dir}/tls.crt"),
                key_file: format!("{dir}/tls.key"),
                server_names: Vec::new(),
                default: false,
                ocsp_file: None,
            });
        }
    }
    out
}

/// The proxy's configuration for a spec. `tls_mounted` says whether a serving certificate
/// Secret is mounted at TLS_DIR (HTTPS listeners need one).
pub fn render_proxy_config(spec: &ProxyDeploymentSpec, tls_mounted: bool) -> ProxyConfig {
    let listeners = spec
        .listeners
        .iter()
        .enumerate()
        .map(|(i, l)| Listener {
            name: l.name.clone(),
            address: format!("0.0.0.0:{}", l.port),
            tls: (l.protocol == ListenerProtocol::HTTPS && tls_mounted).then(|| ListenerTls {
                certificates: vec![CertificateFiles {
                    cert_file: format!("{TLS_DIR}/tls.crt"),
                    key_file: format!("{TLS_DIR}/tls.key"),
                    server_names: Vec::new(),
                    default: true,
                    // Stapled when the Secret carries one (cert-manager and our CA do not).
                    ocsp_file: Some(format!("{TLS_DIR}/{OCSP_KEY}")),
                }],
                client_ca_file: l
                    .client_ca_secret
                    .as_ref()
                    .map(|_| format!("{CLIENT_CA_DIR}/{}/ca.crt", l.name)),
                session_resumption: true,
                // Alt-Svc names the port clients reach: the Service's.
                http3: l.http3.clone().map(|h| proxyfleet_config::Http3 {
                    advertised_port: h.advertised_port.or(u16::try_from(l.service_port()).ok()),
                    ..h
                }),
            }),
            https_redirect: l.https_redirect.clone(),
            // Lines go to the pod's standard output (`kubectl logs`), never to a file a
            // tenant names.
            access_log: l
                .access_log
                .clone()
                .map(|a| proxyfleet_config::AccessLog { path: None, ..a }),
            tcp: tcp_with_mounted_secrets(i, &l.tcp),
        })
        .collect();
    ProxyConfig {
        listeners,
        routes: routes_with_mounted_files(&spec.routes),
        upstreams: upstreams_with_mounted_secrets(&spec.upstreams),
        admin: Admin {
            address: format!("0.0.0.0:{ADMIN_PORT}"),
            token_file: Some(format!("{ADMIN_TOKEN_DIR}/token")),
            live_weights_dir: Some(LIVE_WEIGHTS_DIR.to_string()),
        },
        limits: spec.limits.clone().unwrap_or_default(),
        drain: spec.drain.clone().unwrap_or_default(),
        connect: spec.connect.clone(),
        worker_threads: spec.tuning.as_ref().and_then(|t| t.worker_threads),
        idle_spin_micros: spec.tuning.as_ref().and_then(|t| t.idle_spin_micros),
        forwarding: spec.forwarding.clone().unwrap_or_default(),
        tracing: spec.tracing.clone(),
        trust_bundle_files: if tls_mounted {
            vec![format!("{TLS_DIR}/ca.crt")]
        } else {
            Vec::new()
        },
    }
}

pub fn config_hash(yaml: &str) -> String {
    let digest = Sha256::digest(yaml.as_bytes());
    digest.iter().take(5).map(|b| format!("{b:02x}")).collect()
}

pub fn config_map_name(pxd: &str, hash: &str) -> String {
    format!("{pxd}-config-{hash}")
}

/// The immutable ConfigMap holding one rendered configuration.
pub fn desired_config_map(owner: &Owner, yaml: &str, hash: &str) -> ConfigMap {
    ConfigMap {
        metadata: owner.meta(config_map_name(&owner.name, hash)),
        data: Some(BTreeMap::from([(CONFIG_FILE.to_string(), yaml.to_string())])),
        immutable: Some(true),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::fixtures::basic;

    #[test]
    fn renders_a_valid_proxy_config() {
        let pxd = basic();
        let config = render_proxy_config(&pxd.spec, true);
        proxyfleet_config::validate(&config).unwrap();
        assert_eq!(config.listeners[0].address, "0.0.0.0:8443");
        assert!(config.listeners[0].tls.is_some());
        assert_eq!(config.trust_bundle_files, vec!["/etc/proxyfleet/tls/ca.crt"]);
    }

    #[test]
    fn jwks_references_become_mounted_files_and_volumes() {
        let mut pxd = basic();
        let mut route = pxd.spec.routes[0].clone();
        route.jwt = serde_json::from_value(serde_json::json!({"jwksSecret": "keys", "issuer": "i"})).unwrap();
        pxd.spec.routes.insert(0, route.clone());
        pxd.spec.routes[0].name = "a".into();
        route.jwt = serde_json::from_value(serde_json::json!({"jwksConfigMap": "public"})).unwrap();
        pxd.spec.routes.insert(1, route);
        pxd.spec.routes[1].name = "b".into();
        let config = render_proxy_config(&pxd.spec, true);
        proxyfleet_config::validate(&config).unwrap();
        let files: Vec<_> = config
            .routes
            .iter()
            .map(|r| r.jwt.as_ref().and_then(|j| j.jwks_file.clone()))
            .collect();
        assert_eq!(
            files,
            [
                Some("/etc/proxyfleet/jwks/0/jwks.json".to_string()),
                Some("/etc/proxyfleet/jwks/1/jwks.json".to_string()),
                None
            ]
        );
        let j = config.routes[0].jwt.as_ref().unwrap();
        assert!(j.jwks_secret.is_none() && j.jwks_config_map.is_none());

        let mut volumes = Vec::new();
        let mut mounts = Vec::new();
        crate::resources::deployment::jwks_volumes(&pxd.spec, &mut volumes, &mut mounts);
        assert_eq!(volumes[0].secret.as_ref().unwrap().secret_name.as_deref(), Some("keys"));
        assert_eq!(volumes[1].config_map.as_ref().unwrap().name, "public");
        assert_eq!(mounts[1].mount_path, "/etc/proxyfleet/jwks/1");
    }

    #[test]
    fn descriptor_set_references_become_mounted_files_volumes_and_checks() {
        let mut pxd = basic();
        pxd.spec.upstreams[0].protocol = proxyfleet_config::UpstreamProtocol::H2;
        let mut route = pxd.spec.routes[0].clone();
        route.grpc_transcoding =
            serde_json::from_value(serde_json::json!({"descriptorSetSecret": "private-api"})).unwrap();
        pxd.spec.routes.insert(0, route.clone());
        pxd.spec.routes[0].name = "a".into();
        route.grpc_transcoding = serde_json::from_value(serde_json::json!({"descriptorSetConfigMap": "api"})).unwrap();
        pxd.spec.routes.insert(1, route);
        pxd.spec.routes[1].name = "b".into();
        let config = render_proxy_config(&pxd.spec, true);
        proxyfleet_config::validate(&config).unwrap();
        let files: Vec<_> = config
            .routes
            .iter()
            .map(|r| r.grpc_transcoding.as_ref().and_then(|t| t.descriptor_set_file.clone()))
            .collect();
        assert_eq!(
            files,
            [
                Some("/etc/proxyfleet/descriptors/0/descriptors.pb".to_string()),
                Some("/etc/proxyfleet/descriptors/1/descriptors.pb".to_string()),
                None
            ]
        );
        let (mut volumes, mut mounts) = (Vec::new(), Vec::new());
        crate::resources::deployment::descriptor_volumes(&pxd.spec, &mut volumes, &mut mounts);
        assert_eq!(
            volumes[0].secret.as_ref().unwrap().secret_name.as_deref(),
            Some("private-api")
        );
        assert_eq!(volumes[1].config_map.as_ref().unwrap().name, "api");
        assert_eq!(mounts[1].mount_path, "/etc/proxyfleet/descriptors/1");
        let secrets = crate::secret_refs::references(&pxd.spec);
        assert_eq!(secrets[0].field, "spec.routes[0].grpcTranscoding.descriptorSetSecret");
        assert_eq!(secrets[0].keys, ["descriptors.pb"]);
        let maps = crate::secret_refs::config_map_references(&pxd.spec);
        assert_eq!(maps[0].field, "spec.routes[1].grpcTranscoding.descriptorSetConfigMap");
    }

    #[test]
    fn a_socks5_credentials_secret_becomes_a_mounted_directory() {
        let mut pxd = basic();
        pxd.spec.connect = Some(serde_json::from_value(serde_json::json!({"allow": ["*.example.com:443"]})).unwrap());
        pxd.spec.listeners.push(
            serde_json::from_value(serde_json::json!({
                "name": "socks", "port": 1080, "protocol": "TCP",
                "tcp": {"mode": "socks5", "socks5": {"credentialsSecret": "socks-user"}}
            }))
            .unwrap(),
        );
        let config = render_proxy_config(&pxd.spec, true);
        proxyfleet_config::validate(&config).unwrap();
        let i = config.listeners.len() - 1;
        let auth = config.listeners[i].tcp.as_ref().and_then(|t| t.socks5.clone()).unwrap();
        assert_eq!(auth.credentials_dir, Some(format!("/etc/proxyfleet/socks5/{i}")));
        assert!(auth.credentials_secret.is_none());
        let (mut volumes, mut mounts) = (Vec::new(), Vec::new());
        crate::resources::deployment::socks5_volumes(&pxd.spec, &mut volumes, &mut mounts);
        assert_eq!(
            volumes[0].secret.as_ref().unwrap().secret_name.as_deref(),
            Some("socks-user")
        );
        assert_eq!(mounts[0].mount_path, format!("/etc/proxyfleet/socks5/{i}"));
        let refs = crate::secret_refs::references(&pxd.spec);
        assert_eq!(
            refs[0].field,
            format!("spec.listeners[{i}].tcp.socks5.credentialsSecret")
        );
        assert_eq!(refs[0].keys, ["username", "password"]);
    }

    #[test]
    fn a_tcp_listener_is_rendered_without_tls() {
        let mut pxd = basic();
        pxd.spec.listeners.push(serde_json::from_value(serde_json::json!({
            "name": "pass", "port": 9443, "protocol": "TCP",
            "tcp": {"routes": [{"name": "db", "serverNames": ["db.example.com"], "upstream": pxd.spec.upstreams[0].name}]}
        })).unwrap());
        let config = render_proxy_config(&pxd.spec, true);
        proxyfleet_config::validate(&config).unwrap();
        let l = &config.listeners[1];
        assert!(l.tls.is_none());
        assert_eq!(l.tcp.as_ref().unwrap().routes[0].server_names, ["db.example.com"]);
    }

    #[test]
    fn upstream_secret_references_become_mounted_files() {
        let mut pxd = basic();
        pxd.spec.upstreams[0].tls = serde_json::from_value(serde_json::json!(
            {"caSecret": "upstream-ca", "clientCertificateSecret": "upstream-client"}
        ))
        .unwrap();
        let config = render_proxy_config(&pxd.spec, true);
        proxyfleet_config::validate(&config).unwrap();
        let tls = config.upstreams[0].tls.as_ref().unwrap();
        assert_eq!(tls.ca_file.as_deref(), Some("/etc/proxyfleet/upstream/0/ca/ca.crt"));
        assert_eq!(
            tls.client_certificate.as_ref().unwrap().key_file,
            "/etc/proxyfleet/upstream/0/client/tls.key"
        );
        assert!(tls.ca_secret.is_none() && tls.client_certificate_secret.is_none());
    }

    #[test]
    fn hash_changes_with_content_and_names_the_map() {
        let owner = Owner::of(&basic()).unwrap();
        let a = config_hash("a");
        assert_ne!(a, config_hash("b"));
        let cm = desired_config_map(&owner, "a", &a);
        assert_eq!(cm.metadata.name.unwrap(), format!("demo-config-{a}"));
        assert_eq!(cm.immutable, Some(true));
    }
}
