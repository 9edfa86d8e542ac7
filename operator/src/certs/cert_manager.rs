//! The cert-manager source: the Certificate the operator asks cert-manager for, how its and its
//! CertificateRequest's conditions become the fleet's `CertificatesReady`, and removing the
//! Certificate when the fleet switches to another source (so cert-manager never rewrites a
//! Secret another source now fills).

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::reflector::ObjectRef;
use serde_json::{json, Value};

use super::spec::CertManagerTls;
use crate::crd::ProxyDeployment;
use crate::labels;
use crate::resources::Owner;

/// The annotation cert-manager puts on a Secret it filled: the Certificate's name.
const CERTIFICATE_NAME: &str = "cert-manager.io/certificate-name";

fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cert-manager.io", "v1", kind))
}

#[derive(Debug, thiserror::Error)]
pub enum CertManagerError {
    #[error("applying cert-manager Certificate {namespace}/{name}: {source}")]
    Apply {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error(
        "cert-manager Certificate {namespace}/{name} exists and is not this ProxyDeployment's ({why}); it is left \
         as it is: rename the ProxyDeployment or remove that Certificate"
    )]
    NotOurs {
        namespace: String,
        name: String,
        why: &'static str,
    },
    #[error("deleting cert-manager Certificate {namespace}/{name} (the fleet no longer uses cert-manager): {source}")]
    Delete {
        namespace: String,
        name: String,
        source: kube::Error,
    },
}

/// The Certificate cert-manager should fulfil for the fleet: its Secret, names and issuer.
pub fn certificate(owner: &Owner, cm: &CertManagerTls, secret_name: &str, dns_names: &[String]) -> DynamicObject {
    let mut spec = json!({
        "secretName": secret_name,
        "dnsNames": dns_names,
        "issuerRef": {"name": cm.issuer_ref.name, "kind": format!("{:?}", cm.issuer_ref.kind), "group": cm.issuer_ref.group},
        "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
        "usages": ["server auth", "digital signature", "key encipherment"],
        // Our labels put the Secret in the operator's cache: no read per reconcile, and a new
        // certificate wakes the fleet at once.
        "secretTemplate": {"labels": labels::owned(&owner.name)},
    });
    if let Some(d) = cm.duration {
        spec["duration"] = json!(format!("{}s", d.get().as_secs()));
    }
    if let Some(d) = cm.renew_before {
        spec["renewBefore"] = json!(format!("{}s", d.get().as_secs()));
    }
    let mut obj = DynamicObject::new(&owner.name, &resource("Certificate"))
        .within(&owner.namespace)
        .data(json!({ "spec": spec }));
    obj.metadata.labels = Some(labels::owned(&owner.name));
    obj.metadata.owner_references = Some(vec![owner.reference.clone()]);
    obj
}

/// Applies the Certificate, unless the API server already has it as wanted, and returns it as
/// the API server has it (with cert-manager's status) and whether it was written. A Certificate
/// of that name that is not the fleet's (a user's own) is neither written nor taken over.
pub async fn apply(client: &kube::Client, obj: &DynamicObject) -> Result<(DynamicObject, bool), CertManagerError> {
    let (namespace, name) = (
        obj.metadata.namespace.clone().unwrap_or_default(),
        obj.metadata.name.clone().unwrap_or_default(),
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource("Certificate"));
    let failed = |source| CertManagerError::Apply {
        namespace: namespace.clone(),
        name: name.clone(),
        source,
    };
    let existing = api.get_opt(&name).await.map_err(failed)?;
    if let Some(existing) = existing {
        if let Some(why) = crate::apply::not_ours(&existing.metadata, &obj.metadata) {
            return Err(CertManagerError::NotOurs { namespace, name, why });
        }
        if up_to_date(&existing, obj) {
            return Ok((existing, false));
        }
    }
    api.patch(
        &name,
        &PatchParams::apply(labels::FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .map(|written| (written, true))
    .map_err(failed)
}

/// The spec fields `certificate` sets only when the fleet gives them: when it does not, the
/// Certificate must not have them either (a removed `renewBefore` is removed there too).
const OPTIONAL_SPEC_FIELDS: [&str; 2] = ["duration", "renewBefore"];

/// Whether the Certificate as the API server has it already says everything we would apply:
/// fields cert-manager or the API server added do not count, a field someone changed does, and
/// so does one we no longer set.
pub fn up_to_date(existing: &DynamicObject, wanted: &DynamicObject) -> bool {
    let mut spec = wanted.data["spec"].clone();
    if let Some(fields) = spec.as_object_mut() {
        for key in OPTIONAL_SPEC_FIELDS {
            fields.entry(key).or_insert(Value::Null);
        }
    }
    let labels = |o: &DynamicObject| json!(o.metadata.labels);
    // Another owner reference (someone else's) is no difference: apply cannot remove it anyway.
    let ours_referenced = wanted
        .metadata
        .owner_references
        .iter()
        .flatten()
        .all(|w| existing.metadata.owner_references.iter().flatten().any(|h| h == w));
    holds(&existing.data["spec"], &spec) && holds(&labels(existing), &labels(wanted)) && ours_referenced
}

/// Whether `have` holds all of `want`: objects key by key (a null wanted is an absent key),
/// arrays item by item, anything else equal.
fn holds(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w.iter().all(|(k, v)| match h.get(k) {
            Some(hv) => holds(hv, v),
            None => v.is_null(),
        }),
        (Value::Array(h), Value::Array(w)) => h.len() == w.len() && h.iter().zip(w).all(|(a, b)| holds(a, b)),
        _ => have == want,
    }
}

/// Why the Secret cert-manager would fill for the fleet must not be handed to it: it exists and
/// neither cert-manager filled it for this Certificate nor does the fleet control it (a user's
/// own Secret of that name, which cert-manager would overwrite).
pub fn foreign_secret(secret: &Secret, certificate: &str, owner_uid: &str) -> Option<&'static str> {
    let ours =
        filled_for(secret, certificate) || crate::owner_index::meta_controller_uid(&secret.metadata) == Some(owner_uid);
    (!ours).then_some("cert-manager did not fill it for this fleet's Certificate")
}

/// The fleet whose Certificate cert-manager filled this Secret for (the Certificate is named
/// after the fleet, and its secret template labels the Secret with the fleet's name).
pub fn fleet_of(secret: &Secret) -> Option<ObjectRef<ProxyDeployment>> {
    let certificate = secret.metadata.annotations.as_ref()?.get(CERTIFICATE_NAME)?;
    let fleet = secret.metadata.labels.as_ref()?.get(labels::INSTANCE)?;
    let namespace = secret.metadata.namespace.as_deref()?;
    (certificate == fleet).then(|| ObjectRef::new(fleet).within(namespace))
}

/// The CertificateRequests cert-manager made for the fleet's Certificate (they carry its labels).
pub async fn requests(client: &kube::Client, owner: &Owner) -> Vec<DynamicObject> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &owner.namespace, &resource("CertificateRequest"));
    let selector = format!("{}={}", labels::INSTANCE, owner.name);
    match api.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::debug!(error = %e, "listing CertificateRequests");
            Vec::new()
        }
    }
}

/// Deletes the fleet's Certificate if it has one that we own. A missing Certificate, or no
/// cert-manager installed at all, is success.
pub async fn remove(client: &kube::Client, owner: &Owner) -> Result<bool, CertManagerError> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &owner.namespace, &resource("Certificate"));
    let err = |source| CertManagerError::Delete {
        namespace: owner.namespace.clone(),
        name: owner.name.clone(),
        source,
    };
    let existing = match api.get_opt(&owner.name).await {
        Ok(x) => x,
        Err(kube::Error::Api(e)) if e.code == 404 => None,
        Err(source) => return Err(err(source)),
    };
    let Some(existing) = existing else { return Ok(false) };
    if !crate::owner_index::is_owned_by(&existing, &owner.reference.uid) {
        return Ok(false);
    }
    match api.delete(&owner.name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(source) => Err(err(source)),
    }
}

/// Whether cert-manager filled this Secret for the named Certificate. A Secret another source
/// left behind (the managed CA's leaf, say) is not served as if cert-manager had issued it.
pub fn filled_for(secret: &Secret, certificate: &str) -> bool {
    secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CERTIFICATE_NAME))
        .is_some_and(|n| n == certificate)
}

/// A condition as cert-manager writes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Condition {
    pub status: String,
    pub reason: String,
    pub message: String,
}

fn condition(obj: &Value, type_: &str) -> Option<Condition> {
    let c = obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"].as_str() == Some(type_))?;
    let s = |k: &str| c[k].as_str().unwrap_or("").to_string();
    Some(Condition {
        status: s("status"),
        reason: s("reason"),
        message: s("message"),
    })
}

/// cert-manager considers the Certificate issued and up to date.
pub fn is_ready(certificate: &DynamicObject) -> bool {
    condition(&certificate.data, "Ready").is_some_and(|c| c.status == "True")
}

/// What cert-manager says about the fleet's certificate, in the words the user needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Judgement {
    /// cert-manager considers the certificate issued and up to date.
    pub ready: bool,
    /// Why not, quoting cert-manager's own reasons and messages (empty when ready).
    pub message: String,
    /// When to look again.
    pub recheck: Duration,
}

/// Judges the Certificate (as applied) and its requests. The newest request that is not Ready
/// explains a wait (an issuer that does not exist shows only there).
pub fn judge(certificate: &DynamicObject, requests: &[DynamicObject], now_unix: i64) -> Judgement {
    let name = certificate.metadata.name.as_deref().unwrap_or("");
    let ready = condition(&certificate.data, "Ready");
    if is_ready(certificate) {
        let renewal = certificate.data["status"]["renewalTime"]
            .as_str()
            .and_then(|t| time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok())
            .map(|t| t.unix_timestamp() - now_unix);
        // Look again just after cert-manager renews, so status shows the new serial.
        let recheck = renewal.map_or(600, |s| (s + 5).clamp(5, 600)) as u64;
        return Judgement {
            ready: true,
            message: String::new(),
            recheck: Duration::from_secs(recheck),
        };
    }
    let mut parts = vec![match &ready {
        Some(c) => format!("Certificate {name} Ready=False ({}): {}", c.reason, c.message),
        None => format!("Certificate {name} has no Ready condition yet (is cert-manager running?)"),
    }];
    let newest = requests
        .iter()
        .filter(|r| condition(&r.data, "Ready").is_none_or(|c| c.status != "True"))
        .max_by_key(|r| r.metadata.creation_timestamp.as_ref().map(|t| t.0));
    if let Some(r) = newest {
        let rname = r.metadata.name.as_deref().unwrap_or("");
        match condition(&r.data, "Ready") {
            Some(c) => parts.push(format!("CertificateRequest {rname} {}: {}", c.reason, c.message)),
            None => parts.push(format!("CertificateRequest {rname} is not processed yet")),
        }
        if let Some(c) = condition(&r.data, "Denied").filter(|c| c.status == "True") {
            parts.push(format!("denied ({}): {}", c.reason, c.message));
        }
    }
    Judgement {
        ready: false,
        message: format!("cert-manager: {}", parts.join("; ")),
        recheck: Duration::from_secs(15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(name: &str, status: Value, created: &str) -> DynamicObject {
        let mut o = DynamicObject::new(name, &resource("Certificate")).data(json!({ "status": status }));
        o.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            created.parse().expect("timestamp"),
        ));
        o
    }

    #[test]
    fn a_missing_issuer_is_quoted_from_the_request() {
        let cert = obj(
            "demo",
            json!({"conditions": [{"type": "Ready", "status": "False", "reason": "DoesNotExist", "message": "Issuing certificate as Secret does not exist"}]}),
            "2026-01-01T00:00:00Z",
        );
        let old = obj(
            "demo-1",
            json!({"conditions": [{"type": "Ready", "status": "True", "reason": "Issued", "message": "ok"}]}),
            "2026-01-01T00:00:00Z",
        );
        let new = obj(
            "demo-2",
            json!({"conditions": [{"type": "Ready", "status": "False", "reason": "Pending", "message": "Referenced \"Issuer\" not found: issuer.cert-manager.io \"nope\" not found"}]}),
            "2026-01-01T00:01:00Z",
        );
        let j = judge(&cert, &[old, new], 0);
        assert!(!j.ready);
        assert!(j.message.contains("DoesNotExist"), "{}", j.message);
        assert!(
            j.message.contains("demo-2 Pending: Referenced \"Issuer\" not found"),
            "{}",
            j.message
        );
        assert!(!j.message.contains("demo-1"), "{}", j.message);
    }

    #[test]
    fn ready_rechecks_just_after_renewal() {
        let cert = obj(
            "demo",
            json!({"renewalTime": "2026-01-01T00:01:00Z", "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": ""}]}),
            "2026-01-01T00:00:00Z",
        );
        let now = time::OffsetDateTime::parse("2026-01-01T00:00:00Z", &time::format_description::well_known::Rfc3339)
            .expect("time")
            .unix_timestamp();
        let j = judge(&cert, &[], now);
        assert!(j.ready);
        assert_eq!(j.recheck, Duration::from_secs(65));
    }

    fn fleet_certificate() -> DynamicObject {
        let pxd = crate::resources::fixtures::basic();
        let owner = Owner::of(&pxd).expect("owner");
        let cm: CertManagerTls = serde_yaml::from_str("{issuerRef: {name: ca}}").expect("spec");
        certificate(&owner, &cm, "demo-cert-manager-tls", &["demo.example.com".into()])
    }

    /// What cert-manager and the API server add is no reason to write again; a field someone
    /// changed, or our label removed, is.
    #[test]
    fn a_certificate_is_written_only_when_it_differs_from_what_we_want() {
        let wanted = fleet_certificate();
        let mut stored = wanted.clone();
        stored.data["spec"]["secretTemplate"]["annotations"] = json!({"x": "y"});
        stored.data["spec"]["isCA"] = json!(false);
        stored.data["status"] = json!({"conditions": []});
        stored.metadata.resource_version = Some("7".into());
        stored
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("team".into(), "a".into());
        assert!(up_to_date(&stored, &wanted));
        let mut edited = stored.clone();
        edited.data["spec"]["dnsNames"] = json!(["evil.example.com"]);
        assert!(!up_to_date(&edited, &wanted));
        let mut relabelled = stored.clone();
        relabelled.metadata.labels = None;
        assert!(!up_to_date(&relabelled, &wanted));
        let mut missing = stored.clone();
        missing.data["spec"].as_object_mut().expect("spec").remove("privateKey");
        assert!(!up_to_date(&missing, &wanted));
        let mut no_longer_wanted = stored.clone();
        no_longer_wanted.data["spec"]["renewBefore"] = json!("360h");
        assert!(
            !up_to_date(&no_longer_wanted, &wanted),
            "a renewBefore the fleet dropped is removed"
        );
        let mut also_owned = stored;
        also_owned
            .metadata
            .owner_references
            .get_or_insert_with(Vec::new)
            .insert(
                0,
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    uid: "someone-else".into(),
                    ..Default::default()
                },
            );
        assert!(
            up_to_date(&also_owned, &wanted),
            "another owner reference is no difference"
        );
        assert!(
            holds(&json!({"a": 1}), &json!({"a": 1, "b": null})),
            "a null wanted is an absent key"
        );
        assert!(!holds(&json!({"a": [1, 2]}), &json!({"a": [1]})));
    }

    fn secret(annotations: &[(&str, &str)], labels: &[(&str, &str)], controller: Option<&str>) -> Secret {
        let map = |kv: &[(&str, &str)]| Some(kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        let mut s = Secret::default();
        s.metadata.namespace = Some("team-a".into());
        s.metadata.annotations = map(annotations);
        s.metadata.labels = map(labels);
        s.metadata.owner_references = controller.map(|uid| {
            vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                uid: uid.into(),
                controller: Some(true),
                ..Default::default()
            }]
        });
        s
    }

    /// A user's own Secret of the name cert-manager would fill is refused; one cert-manager
    /// filled for this Certificate, or one the fleet controls, is not.
    #[test]
    fn a_users_secret_is_never_handed_to_cert_manager() {
        assert!(foreign_secret(&secret(&[], &[], None), "demo", "uid-1").is_some());
        assert!(foreign_secret(&secret(&[(CERTIFICATE_NAME, "other")], &[], None), "demo", "uid-1").is_some());
        assert!(foreign_secret(&secret(&[], &[], Some("uid-2")), "demo", "uid-1").is_some());
        assert!(foreign_secret(&secret(&[(CERTIFICATE_NAME, "demo")], &[], None), "demo", "uid-1").is_none());
        assert!(foreign_secret(&secret(&[], &[], Some("uid-1")), "demo", "uid-1").is_none());
    }

    #[test]
    fn a_filled_secret_wakes_the_fleet_it_was_filled_for() {
        let filled = secret(&[(CERTIFICATE_NAME, "demo")], &[(labels::INSTANCE, "demo")], None);
        assert_eq!(fleet_of(&filled), Some(ObjectRef::new("demo").within("team-a")));
        let other = secret(&[(CERTIFICATE_NAME, "x")], &[(labels::INSTANCE, "demo")], None);
        assert_eq!(fleet_of(&other), None);
        assert_eq!(fleet_of(&secret(&[], &[(labels::INSTANCE, "demo")], None)), None);
    }

    #[test]
    fn no_status_means_cert_manager_may_not_run() {
        let cert = obj("demo", json!({}), "2026-01-01T00:00:00Z");
        let j = judge(&cert, &[], 0);
        assert!(
            !j.ready && j.message.contains("is cert-manager running"),
            "{}",
            j.message
        );
    }
}
