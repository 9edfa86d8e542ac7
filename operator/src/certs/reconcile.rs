//! The I/O shell of certificate management: reads and writes the CA and leaf Secrets, the
//! cert-manager Certificate, and reports what the fleet should mount.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use super::cert_manager;
use super::issue::{self, KeyedCert};
use super::spec::{CertSource, CertificateStatus, KeyAlgorithm, ManagedTls, TlsSpec};
use crate::conditions::{Want, CERTIFICATES_READY};
use crate::context::Context;
use crate::crd::{ListenerProtocol, ProxyDeployment};
use crate::metrics::CertLabels;
use crate::resources::deployment::MountedSecrets;
use crate::resources::Owner;

pub use super::ca::CA_SECRET;
pub use super::managed_fleets::{client_secret_name, serving_secret_name, uses_managed_ca};

/// cert-manager fills its own Secret: a switch of source never has two writers on one Secret,
/// and a leaf another source left behind is never adopted as if cert-manager had issued it.
pub fn cert_manager_secret_name(pxd: &str) -> String {
    format!("{pxd}-cert-manager-tls")
}

/// What certificate management decided for one reconcile.
pub struct CertOutcome {
    pub secrets: MountedSecrets,
    pub statuses: Vec<CertificateStatus>,
    pub condition: Want,
    /// When set, the fleet must not roll to a new revision (its certificate is not there).
    pub blocking: Option<String>,
    pub requeue_after: Option<Duration>,
    /// The managed CA's rotation progress (managed issuer only).
    pub ca_rotation: Option<super::spec::CaRotationStatus>,
    /// Where ACME orders stand (ACME only).
    pub acme: Option<super::spec::AcmeStatus>,
}

use super::ca::{now, text};

pub(super) fn status_of(
    kind: &str,
    secret_name: &str,
    info: &issue::CertInfo,
    renew_before: Option<Duration>,
    source: CertSource,
) -> CertificateStatus {
    CertificateStatus {
        source: Some(source),
        kind: kind.to_string(),
        secret_name: secret_name.to_string(),
        serial: Some(info.serial.clone()),
        issuer: Some(info.issuer.clone()),
        not_before: Some(issue::rfc3339(info.not_before)),
        not_after: Some(issue::rfc3339(info.not_after)),
        renewal_time: Some(issue::rfc3339(issue::renewal_time(info, renew_before))),
    }
}

pub(super) fn failure(reason: &str, message: String) -> CertOutcome {
    CertOutcome {
        secrets: MountedSecrets::default(),
        statuses: Vec::new(),
        condition: Want::new(CERTIFICATES_READY, false, reason, message.clone()),
        blocking: Some(message),
        requeue_after: Some(Duration::from_secs(30)),
        ca_rotation: None,
        acme: None,
    }
}

/// Certificates left as the last pass reported them: nothing is issued or requested for a
/// fleet the platform policy refuses (a certificate is something applied on its behalf).
pub fn held(pxd: &ProxyDeployment) -> CertOutcome {
    let status = pxd.status.clone().unwrap_or_default();
    let previous = status.conditions.iter().find(|c| c.type_ == CERTIFICATES_READY);
    let condition = match previous {
        Some(c) => Want::new(
            CERTIFICATES_READY,
            c.status == "True",
            c.reason.clone(),
            c.message.clone(),
        ),
        None => Want::new(
            CERTIFICATES_READY,
            false,
            "PolicyViolation",
            "not issued while the spec violates the platform policy",
        ),
    };
    CertOutcome {
        secrets: MountedSecrets::default(),
        statuses: status.certificates,
        condition,
        blocking: None,
        requeue_after: None,
        ca_rotation: status.ca_rotation,
        acme: status.acme,
    }
}

pub async fn ensure(pxd: &ProxyDeployment, ctx: &std::sync::Arc<Context>) -> CertOutcome {
    let Ok(owner) = Owner::of(pxd) else {
        return failure("NotReady", "ProxyDeployment has no name/uid yet".into());
    };
    let tls = pxd.spec.tls.clone().unwrap_or_default();
    let serves_tls = pxd.spec.listeners.iter().any(|l| l.protocol == ListenerProtocol::HTTPS);
    if !serves_tls && !tls.upstream_client_certificate {
        return CertOutcome {
            secrets: MountedSecrets::default(),
            statuses: Vec::new(),
            condition: Want::new(CERTIFICATES_READY, true, "NotNeeded", "no HTTPS listener"),
            blocking: None,
            requeue_after: None,
            ca_rotation: None,
            acme: None,
        };
    }
    if tls.acme.is_none() {
        ctx.acme_orders.forget(&owner.reference.uid);
    }
    if tls.cert_manager.is_none() {
        if let Some(held) = leave_cert_manager(pxd, &owner, ctx).await {
            return held;
        }
    }
    let outcome = if let Some(secret_name) = &tls.secret_name {
        existing_secret(&owner, secret_name, ctx).await
    } else if tls.cert_manager.is_some() {
        cert_manager(pxd, &owner, &tls, ctx).await
    } else if let Some(acme) = &tls.acme {
        super::acme::ensure(pxd, &owner, &tls, acme, ctx).await
    } else {
        managed(pxd, &owner, &tls, serves_tls, ctx).await
    };
    for s in &outcome.statuses {
        if let Some(info) = s
            .not_after
            .as_deref()
            .and_then(|t| time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok())
        {
            let kind = if s.kind == "ca" { "ca" } else { "leaf" };
            ctx.metrics
                .certificate_expiration
                .get_or_create(&CertLabels {
                    namespace: owner.namespace.clone(),
                    proxydeployment: owner.name.clone(),
                    kind,
                })
                .set(info.unix_timestamp());
        }
    }
    outcome
}

async fn existing_secret(owner: &Owner, secret_name: &str, ctx: &Context) -> CertOutcome {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    match api.get_opt(secret_name).await {
        Ok(Some(secret)) => {
            let Some(info) = text(&secret, "tls.crt").as_deref().and_then(issue::parse_pem) else {
                return failure(
                    "InvalidSecret",
                    format!("spec.tls.secretName: Secret {secret_name} has no PEM certificate in tls.crt"),
                );
            };
            // The key's PEM is not parsed here (it is never read into the operator's logs or
            // memory beyond this check); a missing one would leave every new pod unable to start.
            if !text(&secret, "tls.key").is_some_and(|k| k.contains("PRIVATE KEY-----")) {
                return failure(
                    "InvalidSecret",
                    format!("spec.tls.secretName: Secret {secret_name} has no PEM private key in tls.key"),
                );
            }
            let expired = info.not_after <= now();
            CertOutcome {
                secrets: MountedSecrets {
                    serving: Some(secret_name.to_string()),
                    client: None,
                },
                statuses: vec![status_of("serving", secret_name, &info, None, CertSource::Secret)],
                condition: if expired {
                    Want::new(
                        CERTIFICATES_READY,
                        false,
                        "Expired",
                        format!("certificate in Secret {secret_name} expired"),
                    )
                } else {
                    Want::new(
                        CERTIFICATES_READY,
                        true,
                        "SecretProvided",
                        format!("using Secret {secret_name}"),
                    )
                },
                blocking: None,
                requeue_after: Some(Duration::from_secs(3600)),
                ca_rotation: None,
                acme: None,
            }
        }
        Ok(None) => failure(
            "SecretNotFound",
            format!(
                "spec.tls.secretName: Secret {secret_name} not found in namespace {}",
                owner.namespace
            ),
        ),
        Err(e) => failure("SecretUnreadable", format!("reading Secret {secret_name}: {e}")),
    }
}

async fn cert_manager(pxd: &ProxyDeployment, owner: &Owner, tls: &TlsSpec, ctx: &Context) -> CertOutcome {
    let Some(cm) = &tls.cert_manager else {
        return failure("Invalid", "no certManager".into());
    };
    let secret_name = cert_manager_secret_name(&owner.name);
    let hostnames: Vec<String> = pxd.spec.listeners.iter().flat_map(|l| l.hostnames.clone()).collect();
    let dns_names = issue::serving_dns_names(&owner.name, &owner.namespace, &hostnames, &tls.dns_names);
    let secret = match cert_manager_secret(owner, &secret_name, ctx).await {
        Ok(secret) => secret,
        Err(refused) => return *refused,
    };
    let wanted = cert_manager::certificate(owner, cm, &secret_name, &dns_names);
    let applied = match cert_manager::apply(&ctx.client, &wanted).await {
        Ok((applied, written)) => {
            if written {
                ctx.metrics.api_write("Certificate", "apply");
            }
            applied
        }
        Err(e) => return failure("CertManagerUnavailable", e.to_string()),
    };
    // The requests are read only when they can explain a wait.
    let requests = if cert_manager::is_ready(&applied) {
        Vec::new()
    } else {
        cert_manager::requests(&ctx.client, owner).await
    };
    let judged = cert_manager::judge(&applied, &requests, now());
    let info = secret
        .filter(|s| cert_manager::filled_for(s, &owner.name))
        .and_then(|s| text(&s, "tls.crt"))
        .as_deref()
        .and_then(issue::parse_pem);
    let Some(info) = info else {
        let message = if judged.ready {
            format!("cert-manager has not filled Secret {secret_name} yet")
        } else {
            judged.message
        };
        let mut out = failure("WaitingForCertManager", message);
        out.requeue_after = Some(judged.recheck);
        return out;
    };
    let status = status_of(
        "serving",
        &secret_name,
        &info,
        cm.renew_before.map(|d| d.get()),
        CertSource::CertManager,
    );
    // A Secret with a certificate keeps being served while cert-manager retries a renewal.
    let condition = if judged.ready {
        Want::new(CERTIFICATES_READY, true, "Issued", "issued by cert-manager")
    } else {
        Want::new(CERTIFICATES_READY, false, "CertManagerNotReady", judged.message)
    };
    CertOutcome {
        secrets: MountedSecrets {
            serving: Some(secret_name.clone()),
            client: None,
        },
        statuses: vec![status],
        condition,
        blocking: None,
        requeue_after: Some(judged.recheck),
        ca_rotation: None,
        acme: None,
    }
}

/// The Secret cert-manager fills for the fleet, if there is one and it may be handed to
/// cert-manager. Only what cert-manager filled for us is in the cache (its secret template labels
/// it); anything else of that name is read, to refuse it.
async fn cert_manager_secret(
    owner: &Owner,
    secret_name: &str,
    ctx: &Context,
) -> Result<Option<std::sync::Arc<Secret>>, Box<CertOutcome>> {
    let secret = match cached_secret(ctx, &owner.namespace, secret_name) {
        Some(s) => Some(s),
        None => Api::<Secret>::namespaced(ctx.client.clone(), &owner.namespace)
            .get_opt(secret_name)
            .await
            .map_err(|e| {
                Box::new(failure(
                    "SecretUnreadable",
                    format!("reading Secret {secret_name}: {e}"),
                ))
            })?
            .map(std::sync::Arc::new),
    };
    if let Some(why) = secret
        .as_deref()
        .and_then(|s| cert_manager::foreign_secret(s, &owner.name, &owner.reference.uid))
    {
        return Err(Box::new(failure(
            "SecretNotOurs",
            format!(
                "Secret {}/{secret_name} exists and {why}; it is left as it is (cert-manager would overwrite it): \
                 remove or rename that Secret",
                owner.namespace
            ),
        )));
    }
    Ok(secret)
}

/// A fleet that used cert-manager and now uses another source: its Certificate goes first, so
/// cert-manager stops writing the Secret the new source fills. Until it is gone, nothing else
/// is issued and the previous status stays.
async fn leave_cert_manager(pxd: &ProxyDeployment, owner: &Owner, ctx: &Context) -> Option<CertOutcome> {
    let status = pxd.status.as_ref()?;
    if !status
        .certificates
        .iter()
        .any(|c| c.source == Some(CertSource::CertManager))
    {
        return None;
    }
    match cert_manager::remove(&ctx.client, owner).await {
        Ok(removed) => {
            if removed {
                ctx.record(
                    owner,
                    "CertificateRemoved",
                    "cert-manager Certificate deleted: the fleet uses another TLS source",
                )
                .await;
            }
            None
        }
        Err(e) => {
            let mut out = held(pxd);
            out.condition = Want::new(CERTIFICATES_READY, false, "CertManagerCleanupFailed", e.to_string());
            out.requeue_after = Some(Duration::from_secs(30));
            Some(out)
        }
    }
}

fn cached_secret(ctx: &Context, namespace: &str, name: &str) -> Option<std::sync::Arc<Secret>> {
    ctx.stores.secrets.get(&ObjectRef::new(name).within(namespace))
}

pub(super) fn secret_with(
    meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    data: &[(&str, &str)],
) -> Secret {
    Secret {
        metadata: meta,
        type_: Some("kubernetes.io/tls".into()),
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    }
}

async fn managed(pxd: &ProxyDeployment, owner: &Owner, tls: &TlsSpec, serves_tls: bool, ctx: &Context) -> CertOutcome {
    let settings = tls.managed.clone().unwrap_or_default();
    if settings.key_algorithm == KeyAlgorithm::RSA2048 {
        return failure(
            "UnsupportedKeyAlgorithm",
            issue::IssueError::Unsupported(KeyAlgorithm::RSA2048).to_string(),
        );
    }
    let material = match super::ca::ensure(&owner.namespace, ctx).await {
        Ok(x) => x,
        Err(e) => return failure("CAUnavailable", e.to_string()),
    };
    let (ca, ca_info, bundle) = (&material.ca, &material.info, &material.bundle);
    let hostnames: Vec<String> = pxd.spec.listeners.iter().flat_map(|l| l.hostnames.clone()).collect();
    let mut statuses = vec![status_of("ca", CA_SECRET, ca_info, None, CertSource::Managed)];
    let mut secrets = MountedSecrets::default();
    let mut next_renewal = i64::MAX;
    let mut wanted: Vec<(String, Vec<String>, bool)> = Vec::new();
    if serves_tls {
        wanted.push((
            serving_secret_name(&owner.name),
            issue::serving_dns_names(&owner.name, &owner.namespace, &hostnames, &tls.dns_names),
            false,
        ));
    }
    if tls.upstream_client_certificate {
        wanted.push((
            client_secret_name(&owner.name),
            vec![format!("{}.{}.proxyfleet.client", owner.name, owner.namespace)],
            true,
        ));
    }
    for (secret_name, names, client) in &wanted {
        let client = *client;
        match ensure_leaf(owner, secret_name, names, client, ca, ca_info, bundle, &settings, ctx).await {
            Ok(info) => {
                next_renewal = next_renewal.min(issue::renewal_time(&info, settings.renew_before.map(|d| d.get())));
                statuses.push(status_of(
                    if client { "client" } else { "serving" },
                    secret_name,
                    &info,
                    settings.renew_before.map(|d| d.get()),
                    CertSource::Managed,
                ));
                if client {
                    secrets.client = Some(secret_name.clone());
                } else {
                    secrets.serving = Some(secret_name.clone());
                }
            }
            Err(e) => return keep_serving(ctx, &owner.namespace, &wanted, secrets, secret_name, e),
        }
    }
    let wait = ((next_renewal - now()).clamp(1, 3600) as u64).min(material.requeue.as_secs().max(1));
    CertOutcome {
        secrets,
        statuses,
        // No countdown here: a message that changes every reconcile is a status write each time.
        condition: Want::new(CERTIFICATES_READY, true, "Issued", "issued by the managed CA"),
        blocking: None,
        requeue_after: Some(Duration::from_secs(wait)),
        ca_rotation: Some(material.rotation.clone()),
        acme: None,
    }
}

/// A leaf that could not be issued: the fleet keeps serving with every leaf Secret already
/// there, not only the failed one (dropping the other would change the pods' revision and roll
/// them without it), or is blocked when the failed one was never issued.
fn keep_serving(
    ctx: &Context,
    namespace: &str,
    wanted: &[(String, Vec<String>, bool)],
    mut issued: MountedSecrets,
    failed: &str,
    error: String,
) -> CertOutcome {
    let mut out = failure("IssuanceFailed", format!("issuing {failed}: {error}"));
    if cached_secret(ctx, namespace, failed).is_none() {
        return out;
    }
    out.blocking = None;
    for (name, _, client) in wanted {
        if cached_secret(ctx, namespace, name).is_some() {
            let slot = if *client {
                &mut issued.client
            } else {
                &mut issued.serving
            };
            slot.get_or_insert_with(|| name.clone());
        }
    }
    out.secrets = issued;
    out
}

#[allow(clippy::too_many_arguments)]
async fn ensure_leaf(
    owner: &Owner,
    secret_name: &str,
    names: &[String],
    client: bool,
    ca: &KeyedCert,
    ca_info: &issue::CertInfo,
    bundle: &str,
    settings: &ManagedTls,
    ctx: &Context,
) -> Result<issue::CertInfo, String> {
    let current = cached_secret(ctx, &owner.namespace, secret_name);
    let current_cert = current
        .as_ref()
        .and_then(|s| Some((text(s, "tls.crt")?, text(s, "tls.key")?)));
    let current_info = current_cert.as_ref().and_then(|(c, _)| issue::parse_pem(c));
    let renew_before = settings.renew_before.map(|d| d.get());
    let reason = issue::reissue_reason(current_info.as_ref(), names, ca_info, renew_before, now());
    let (cert_pem, key_pem, info, issued) = match (&reason, current_cert, current_info) {
        (None, Some((c, k)), Some(info)) => (c, k, info, false),
        _ => {
            let leaf = issue::issue_leaf(
                ca,
                names,
                now(),
                settings.duration.get(),
                settings.key_algorithm,
                client,
            )
            .map_err(|e| e.to_string())?;
            let info = issue::parse_pem(&leaf.cert_pem).ok_or("issued certificate unparsable")?;
            tracing::info!(secret = %secret_name, serial = %info.serial, reason = reason.as_deref().unwrap_or(""), "issuing certificate");
            (leaf.cert_pem, leaf.key_pem, info, true)
        }
    };
    let secret = secret_with(
        owner.meta(secret_name),
        &[("tls.crt", &cert_pem), ("tls.key", &key_pem), ("ca.crt", bundle)],
    );
    ctx.applier
        .apply(secret, &ctx.stores.secrets)
        .await
        .map_err(|e| e.to_string())?;
    // Told once the Secret holds it: a Secret we may not write issued nothing.
    if issued {
        let why = reason.as_deref().unwrap_or("renewal");
        let note = format!("{secret_name}: serial {} ({why})", info.serial);
        ctx.record(owner, "CertificateIssued", &note).await;
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::testing::{stores, test_context_with};
    use kube::runtime::{reflector::store, watcher};

    /// A context whose Secret cache holds `names` in team-a, and no API server.
    fn with_secrets(names: &[&str]) -> Context {
        let (secrets, mut writer) = store();
        for name in names {
            let mut s = Secret::default();
            s.metadata.name = Some(name.to_string());
            s.metadata.namespace = Some("team-a".into());
            writer.apply_watcher_event(&watcher::Event::Apply(s));
        }
        let (mock, _handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        test_context_with(
            kube::Client::new(mock, "default"),
            crate::context::Stores { secrets, ..stores() },
        )
    }

    fn wanted() -> Vec<(String, Vec<String>, bool)> {
        vec![
            ("edge-tls".into(), Vec::new(), false),
            ("edge-client".into(), Vec::new(), true),
        ]
    }

    /// The serving leaf's issuance fails while the cache holds `secrets` (in a runtime: the
    /// client needs one, though nothing is sent).
    fn tls_fails_with(secrets: &[&str]) -> CertOutcome {
        let ctx = with_secrets(secrets);
        keep_serving(
            &ctx,
            "team-a",
            &wanted(),
            MountedSecrets::default(),
            "edge-tls",
            "boom".into(),
        )
    }

    /// A failed renewal of the serving leaf keeps the client leaf mounted too: dropping it
    /// would roll the pods without it.
    #[tokio::test]
    async fn a_failed_leaf_keeps_every_leaf_already_there() {
        let out = tls_fails_with(&["edge-tls", "edge-client"]);
        assert!(out.blocking.is_none(), "keeps serving");
        assert_eq!(out.secrets.serving.as_deref(), Some("edge-tls"));
        assert_eq!(out.secrets.client.as_deref(), Some("edge-client"));
        assert_eq!(out.condition.reason, "IssuanceFailed");
    }

    /// A leaf never issued blocks the fleet: there is nothing to serve with.
    #[tokio::test]
    async fn a_leaf_never_issued_blocks() {
        let out = tls_fails_with(&["edge-client"]);
        assert!(out.blocking.is_some());
    }
}
