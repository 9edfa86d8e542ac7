//! Secrets a fleet's pods mount that the user names (a listener's client CA, an upstream's CA
//! or client certificate): checked before a rollout, so a missing one is `SecretNotFound`
//! naming the field instead of pods stuck in ContainerCreating.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;

use crate::context::Context;
use crate::crd::ProxyDeploymentSpec;

/// One reference: the field that names it, the Secret, and the keys the pods read from it.
#[derive(Clone, Debug, PartialEq)]
pub struct SecretRef {
    pub field: String,
    pub secret: String,
    pub keys: &'static [&'static str],
}

const CA_KEYS: &[&str] = &["ca.crt"];
const TLS_KEYS: &[&str] = &["tls.crt", "tls.key"];
const JWKS_KEYS: &[&str] = &[crate::resources::config_map::JWKS_KEY];
const DESCRIPTOR_KEYS: &[&str] = &[proxyfleet_config::DESCRIPTOR_SET_KEY];
const SOCKS5_KEYS: &[&str] = &[
    proxyfleet_config::SOCKS5_USERNAME_FILE,
    proxyfleet_config::SOCKS5_PASSWORD_FILE,
];

/// A ConfigMap the pods mount, and the key they read from it.
#[derive(Debug, PartialEq)]
pub struct ConfigMapRef {
    pub field: String,
    pub name: String,
    pub key: &'static str,
}

/// ConfigMaps the spec names for the pods to mount: a route's JWKS, a route's descriptor set.
pub fn config_map_references(spec: &ProxyDeploymentSpec) -> Vec<ConfigMapRef> {
    let mut out = Vec::new();
    for (i, r) in spec.routes.iter().enumerate() {
        if let Some(c) = r.jwt.as_ref().and_then(|j| j.jwks_config_map.as_ref()) {
            out.push(ConfigMapRef {
                field: format!("spec.routes[{i}].jwt.jwksConfigMap"),
                name: c.clone(),
                key: crate::resources::config_map::JWKS_KEY,
            });
        }
        if let Some(c) = r
            .grpc_transcoding
            .as_ref()
            .and_then(|t| t.descriptor_set_config_map.as_ref())
        {
            out.push(ConfigMapRef {
                field: format!("spec.routes[{i}].grpcTranscoding.descriptorSetConfigMap"),
                name: c.clone(),
                key: proxyfleet_config::DESCRIPTOR_SET_KEY,
            });
        }
    }
    out
}

/// Every Secret the spec names for the pods to mount.
pub fn references(spec: &ProxyDeploymentSpec) -> Vec<SecretRef> {
    let mut out = Vec::new();
    for (i, l) in spec.listeners.iter().enumerate() {
        if let Some(s) = &l.client_ca_secret {
            out.push(SecretRef {
                field: format!("spec.listeners[{i}].clientCaSecret"),
                secret: s.clone(),
                keys: CA_KEYS,
            });
        }
        if let Some(s) = l
            .tcp
            .as_ref()
            .and_then(|t| t.socks5.as_ref()?.credentials_secret.as_ref())
        {
            out.push(SecretRef {
                field: format!("spec.listeners[{i}].tcp.socks5.credentialsSecret"),
                secret: s.clone(),
                keys: SOCKS5_KEYS,
            });
        }
    }
    for (i, r) in spec.routes.iter().enumerate() {
        if let Some(s) = r.jwt.as_ref().and_then(|j| j.jwks_secret.as_ref()) {
            out.push(SecretRef {
                field: format!("spec.routes[{i}].jwt.jwksSecret"),
                secret: s.clone(),
                keys: JWKS_KEYS,
            });
        }
        if let Some(s) = r
            .grpc_transcoding
            .as_ref()
            .and_then(|t| t.descriptor_set_secret.as_ref())
        {
            out.push(SecretRef {
                field: format!("spec.routes[{i}].grpcTranscoding.descriptorSetSecret"),
                secret: s.clone(),
                keys: DESCRIPTOR_KEYS,
            });
        }
    }
    for (i, u) in spec.upstreams.iter().enumerate() {
        let Some(t) = &u.tls else { continue };
        if let Some(s) = &t.ca_secret {
            out.push(SecretRef {
                field: format!("spec.upstreams[{i}].tls.caSecret"),
                secret: s.clone(),
                keys: CA_KEYS,
            });
        }
        if let Some(s) = &t.client_certificate_secret {
            out.push(SecretRef {
                field: format!("spec.upstreams[{i}].tls.clientCertificateSecret"),
                secret: s.clone(),
                keys: TLS_KEYS,
            });
        }
    }
    out
}

/// What is wrong with one reference, given the Secret as read (None: not found).
pub fn problem(r: &SecretRef, namespace: &str, secret: Option<&Secret>) -> Option<String> {
    let Some(secret) = secret else {
        return Some(format!(
            "{}: Secret {} not found in namespace {namespace}",
            r.field, r.secret
        ));
    };
    let has = |k: &str| secret.data.as_ref().is_some_and(|d| d.contains_key(k));
    let missing: Vec<&str> = r.keys.iter().copied().filter(|k| !has(k)).collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{}: Secret {} has no {} (the pods read it from there)",
            r.field,
            r.secret,
            missing.join(", ")
        )
    })
}

/// Reads each referenced Secret; the first problem, if any, as (reason, message).
pub async fn check(ctx: &Context, namespace: &str, spec: &ProxyDeploymentSpec) -> Option<(String, String)> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    for r in references(spec) {
        let found = match api.get_opt(&r.secret).await {
            Ok(s) => s,
            Err(e) => {
                return Some((
                    "SecretUnreadable".into(),
                    format!("{}: reading Secret {}: {e}", r.field, r.secret),
                ))
            }
        };
        if let Some(message) = problem(&r, namespace, found.as_ref()) {
            let reason = if found.is_none() {
                "SecretNotFound"
            } else {
                "InvalidSecret"
            };
            return Some((reason.into(), message));
        }
    }
    check_config_maps(ctx, namespace, spec).await
}

/// What is wrong with a ConfigMap reference, given the ConfigMap as read (None: not found).
pub fn config_map_problem(r: &ConfigMapRef, namespace: &str, found: Option<&ConfigMap>) -> Option<String> {
    let ConfigMapRef { field, name, key } = r;
    let Some(cm) = found else {
        return Some(format!("{field}: ConfigMap {name} not found in namespace {namespace}"));
    };
    let has = cm.data.as_ref().is_some_and(|d| d.contains_key(*key))
        || cm.binary_data.as_ref().is_some_and(|d| d.contains_key(*key));
    (!has).then(|| format!("{field}: ConfigMap {name} has no {key} (the pods read it from there)"))
}

async fn check_config_maps(ctx: &Context, namespace: &str, spec: &ProxyDeploymentSpec) -> Option<(String, String)> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
    for r in config_map_references(spec) {
        let found = match api.get_opt(&r.name).await {
            Ok(c) => c,
            Err(e) => {
                return Some((
                    "ConfigMapUnreadable".into(),
                    format!("{}: reading ConfigMap {}: {e}", r.field, r.name),
                ))
            }
        };
        if let Some(message) = config_map_problem(&r, namespace, found.as_ref()) {
            let reason = if found.is_none() {
                "ConfigMapNotFound"
            } else {
                "InvalidConfigMap"
            };
            return Some((reason.into(), message));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn spec() -> ProxyDeploymentSpec {
        serde_json::from_value(serde_json::json!({
            "listeners": [{"name": "https", "port": 8443, "clientCaSecret": "clients"}],
            "routes": [{"name": "all", "upstream": "app"},
                       {"name": "api", "upstream": "app", "jwt": {"jwksSecret": "keys"}},
                       {"name": "v2", "upstream": "app", "jwt": {"jwksConfigMap": "public-keys"}}],
            "upstreams": [{"name": "app", "endpoints": ["10.0.0.1:443"],
                           "tls": {"caSecret": "app-ca", "clientCertificateSecret": "app-client"}}],
        }))
        .unwrap()
    }

    #[test]
    fn every_reference_names_its_field() {
        let fields: Vec<String> = references(&spec()).into_iter().map(|r| r.field).collect();
        assert_eq!(
            fields,
            [
                "spec.listeners[0].clientCaSecret",
                "spec.routes[1].jwt.jwksSecret",
                "spec.upstreams[0].tls.caSecret",
                "spec.upstreams[0].tls.clientCertificateSecret"
            ]
        );
    }

    #[test]
    fn missing_secrets_and_keys_are_named() {
        let refs = references(&spec());
        let msg = problem(&refs[2], "team-a", None).unwrap();
        assert_eq!(
            msg,
            "spec.upstreams[0].tls.caSecret: Secret app-ca not found in namespace team-a"
        );
        let mut s = Secret {
            data: Some([("tls.crt".to_string(), ByteString(b"x".to_vec()))].into()),
            ..Default::default()
        };
        let msg = problem(&refs[3], "team-a", Some(&s)).unwrap();
        assert!(msg.contains("has no tls.key"), "{msg}");
        s.data
            .as_mut()
            .unwrap()
            .insert("tls.key".into(), ByteString(b"k".to_vec()));
        assert_eq!(problem(&refs[3], "team-a", Some(&s)), None);
    }

    #[test]
    fn jwks_config_maps_are_checked_for_their_key() {
        let refs = config_map_references(&spec());
        assert_eq!(
            refs,
            [ConfigMapRef {
                field: "spec.routes[2].jwt.jwksConfigMap".to_string(),
                name: "public-keys".to_string(),
                key: "jwks.json",
            }]
        );
        let r = &refs[0];
        assert!(config_map_problem(r, "team-a", None)
            .unwrap()
            .contains("ConfigMap public-keys not found"));
        let mut cm = ConfigMap::default();
        assert!(config_map_problem(r, "team-a", Some(&cm))
            .unwrap()
            .contains("has no jwks.json"));
        cm.data = Some([("jwks.json".to_string(), "{}".to_string())].into());
        assert_eq!(config_map_problem(r, "team-a", Some(&cm)), None);
    }
}
