//! Secrets a fleet's pods mount that the user names (a listener's client CA, an upstream's CA
//! or client certificate): checked before a rollout, so a missing one is `SecretNotFound`
//! naming the field instead of pods stuck in ContainerCreating.

use k8s_openapi::api::core::v1::Secret;
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
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn spec() -> ProxyDeploymentSpec {
        serde_json::from_value(serde_json::json!({
            "listeners": [{"name": "https", "port": 8443, "clientCaSecret": "clients"}],
            "routes": [{"name": "all", "upstream": "app"}],
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
                "spec.upstreams[0].tls.caSecret",
                "spec.upstreams[0].tls.clientCertificateSecret"
            ]
        );
    }

    #[test]
    fn missing_secrets_and_keys_are_named() {
        let refs = references(&spec());
        let msg = problem(&refs[1], "team-a", None).unwrap();
        assert_eq!(
            msg,
            "spec.upstreams[0].tls.caSecret: Secret app-ca not found in namespace team-a"
        );
        let mut s = Secret {
            data: Some([("tls.crt".to_string(), ByteString(b"x".to_vec()))].into()),
            ..Default::default()
        };
        let msg = problem(&refs[2], "team-a", Some(&s)).unwrap();
        assert!(msg.contains("has no tls.key"), "{msg}");
        s.data
            .as_mut()
            .unwrap()
            .insert("tls.key".into(), ByteString(b"k".to_vec()));
        assert_eq!(problem(&refs[2], "team-a", Some(&s)), None);
    }
}
