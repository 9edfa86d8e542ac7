//! `spec.tls.acme`: the reconcile's side of ACME. Collects a finished order, decides with the
//! pure plan whether to order, starts the order task, and reports what the fleet serves. The
//! fleet always has something to serve in `<name>-acme-tls`: a self-signed stand-in until the
//! first certificate (the proxies must run to answer HTTP-01), then the ACME chain, replaced in
//! place on renewal so the proxies hot-reload it without a rollout.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::acme_order::{self, OrderJob};
use super::acme_orders::Outcome;
use super::acme_plan::{self, AcmeRecord, Step};
use super::ca::{now, text};
use super::issue::{self, CertInfo};
use super::reconcile::{failure, secret_with, status_of, CertOutcome};
use super::spec::{AcmeTls, CertSource, TlsSpec};
use crate::conditions::{Want, CERTIFICATES_READY};
use crate::context::Context;
use crate::crd::ProxyDeployment;
use crate::resources::deployment::MountedSecrets;
use crate::resources::Owner;

pub fn acme_secret_name(pxd: &str) -> String {
    format!("{pxd}-acme-tls")
}

pub fn account_secret_name(pxd: &str) -> String {
    format!("{pxd}-acme-account")
}

const ACCOUNT_KEY: &str = "credentials.json";
/// On the serving Secret while it holds the self-signed stand-in.
pub const BOOTSTRAP_ANNOTATION: &str = "proxyfleet.io/acme-bootstrap";

/// The names one order covers: every listener hostname and `spec.tls.dnsNames`, sorted.
pub fn order_names(pxd: &ProxyDeployment, tls: &TlsSpec) -> Vec<String> {
    let mut names: Vec<String> = pxd
        .spec
        .listeners
        .iter()
        .flat_map(|l| l.hostnames.iter().cloned())
        .chain(tls.dns_names.iter().cloned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The certificate in the serving Secret, and whether it is the stand-in.
fn current(ctx: &Context, owner: &Owner) -> Option<(CertInfo, bool)> {
    let secret = ctx
        .stores
        .secrets
        .get(&kube::runtime::reflector::ObjectRef::new(&acme_secret_name(&owner.name)).within(&owner.namespace))?;
    let info = text(&secret, "tls.crt").as_deref().and_then(issue::parse_pem)?;
    let bootstrap = secret
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(BOOTSTRAP_ANNOTATION));
    Some((info, bootstrap))
}

pub async fn ensure(
    pxd: &ProxyDeployment,
    owner: &Owner,
    tls: &TlsSpec,
    acme: &AcmeTls,
    ctx: &Arc<Context>,
) -> CertOutcome {
    let uid = owner.reference.uid.clone();
    let names = order_names(pxd, tls);
    let previous = pxd.status.as_ref().and_then(|s| s.acme.as_ref());
    let mut record = AcmeRecord::from_status(previous);
    let mut account = previous.and_then(|s| s.account.clone());
    let finished = ctx.acme_orders.take_finished(&uid);
    let just_collected = finished.is_some();
    if let Some(outcome) = finished {
        let (r, a) = collect(outcome, owner, record, ctx).await;
        (record, account) = (r, a.or(account));
    }
    let mut held = current(ctx, owner);
    if held.is_none() {
        if let Err(e) = write_bootstrap(owner, &names, ctx).await {
            let mut out = failure("AcmeUnavailable", e);
            out.acme = Some(record.to_status(account));
            return out;
        }
        held = current(ctx, owner);
    }
    let real = held.as_ref().filter(|(_, bootstrap)| !bootstrap).map(|(info, _)| info);
    let names_match = real.is_some_and(|info| {
        let mut have = info.dns_names.clone();
        have.sort();
        have == names
    });
    let step = acme_plan::step(real, names_match, ctx.acme_orders.in_flight(&uid), &record, now());
    if matches!(step, Step::Serve { .. }) {
        // The certificate is good for the names asked: an earlier failure no longer matters.
        record = AcmeRecord::default();
    }
    let requeue = match &step {
        // The certificate just stored may not be in the cache yet: look again before ordering
        // another (a second order for the same names spends the CA's duplicate limit).
        Step::Order { .. } if just_collected => Duration::from_secs(2),
        Step::Order { reason } => {
            if let Err(e) = start_order(pxd, owner, acme, names.clone(), reason, ctx).await {
                record = record.failed(now(), e, None);
            }
            Duration::from_secs(5)
        }
        Step::InFlight => Duration::from_secs(5),
        Step::Wait { until } => Duration::from_secs((until - now()).clamp(1, 3600) as u64),
        Step::Serve { recheck } => *recheck,
    };
    report(owner, held, names_match, &step, record, account, requeue)
}

/// Stores what a finished order produced: the certificate (and a clean record), or the failure.
async fn collect(outcome: Outcome, owner: &Owner, record: AcmeRecord, ctx: &Context) -> (AcmeRecord, Option<String>) {
    if let Some(creds) = &outcome.new_credentials {
        let secret = secret_with(owner.meta(account_secret_name(&owner.name)), &[(ACCOUNT_KEY, creds)]);
        let secret = Secret {
            type_: Some("Opaque".into()),
            ..secret
        };
        if let Err(e) = ctx.applier.apply(secret, &ctx.stores.secrets).await {
            tracing::warn!(error = %e, "storing the ACME account failed; the next order creates another");
        }
    }
    match outcome.result {
        Ok(issued) => {
            let secret = secret_with(
                owner.meta(acme_secret_name(&owner.name)),
                &[
                    ("tls.crt", &issued.chain_pem),
                    ("tls.key", &issued.key_pem),
                    ("ca.crt", &issuers_of(&issued.chain_pem)),
                ],
            );
            if let Err(e) = ctx.applier.apply(secret, &ctx.stores.secrets).await {
                return (
                    record.failed(now(), format!("storing the issued certificate: {e}"), None),
                    outcome.account,
                );
            }
            let serial = issue::parse_pem(&issued.chain_pem)
                .map(|i| i.serial)
                .unwrap_or_default();
            ctx.record(
                owner,
                "CertificateIssued",
                &format!("ACME certificate, serial {serial}"),
            )
            .await;
            (AcmeRecord::default(), outcome.account)
        }
        Err(f) => {
            ctx.warn(owner, "AcmeOrderFailed", &f.message).await;
            tracing::warn!(error = %f.message, "ACME order failed");
            (record.failed(now(), f.message, f.retry_after), outcome.account)
        }
    }
}

/// The chain's certificates after the leaf (what issued it), for `ca.crt`: the proxies report
/// the bundle they load, and a client of the fleet can be pointed at it.
fn issuers_of(chain: &str) -> String {
    const END: &str = "-----END CERTIFICATE-----";
    match chain.find(END) {
        Some(i) if chain[i + END.len()..].contains("-----BEGIN CERTIFICATE-----") => {
            chain[i + END.len()..].trim_start().to_string()
        }
        _ => chain.to_string(),
    }
}

async fn write_bootstrap(owner: &Owner, names: &[String], ctx: &Context) -> Result<(), String> {
    let key = rcgen::generate_simple_self_signed(names.to_vec()).map_err(|e| format!("self-signed stand-in: {e}"))?;
    let (cert, key) = (key.cert.pem(), key.signing_key.serialize_pem());
    let mut meta = owner.meta(acme_secret_name(&owner.name));
    meta.annotations = Some([(BOOTSTRAP_ANNOTATION.to_string(), "true".to_string())].into());
    ctx.applier
        .apply(
            secret_with(meta, &[("tls.crt", &cert), ("tls.key", &key), ("ca.crt", &cert)]),
            &ctx.stores.secrets,
        )
        .await
        .map(|_| ())
        .map_err(|e| format!("writing {}: {e}", acme_secret_name(&owner.name)))
}

async fn start_order(
    pxd: &ProxyDeployment,
    owner: &Owner,
    acme: &AcmeTls,
    names: Vec<String>,
    reason: &str,
    ctx: &Arc<Context>,
) -> Result<(), String> {
    let ns = &owner.namespace;
    let credentials = read_key(ctx, ns, &account_secret_name(&owner.name), ACCOUNT_KEY).await?;
    let directory_ca = match &acme.directory_ca_secret {
        Some(name) => Some(
            read_key(ctx, ns, name, "ca.crt")
                .await?
                .ok_or(format!("spec.tls.acme.directoryCaSecret: Secret {name} has no ca.crt"))?,
        ),
        None => None,
    };
    let eab = match &acme.external_account_binding {
        Some(b) => {
            let r = &b.hmac_key_secret;
            let raw = read_key(ctx, ns, &r.name, &r.key).await?.ok_or(format!(
                "spec.tls.acme.externalAccountBinding: Secret {} has no key {}",
                r.name, r.key
            ))?;
            let key = base64_url(raw.trim())
                .ok_or("spec.tls.acme.externalAccountBinding: the HMAC key is not base64url".to_string())?;
            Some((b.key_id.clone(), key))
        }
        None => None,
    };
    let job = OrderJob {
        namespace: ns.clone(),
        fleet: owner.name.clone(),
        names: names.clone(),
        directory: acme.directory.clone(),
        email: acme.email.clone(),
        eab,
        directory_ca,
        credentials,
    };
    if let Err(e) = crate::app::token::ensure(ctx, owner).await {
        // The order goes on; its push needs the token and says so (the fleet's reconcile retries).
        tracing::warn!(error = %e, "ACME: the admin token is missing");
    }
    if ctx
        .acme_orders
        .start(&owner.reference.uid, acme_order::run(job, ctx.clone()))
    {
        let note = format!("ordering a certificate for {} ({reason})", names.join(", "));
        tracing::info!(fleet = %pxd.metadata.name.as_deref().unwrap_or(""), %note, "ACME");
        ctx.record(owner, "AcmeOrderStarted", &note).await;
    }
    Ok(())
}

fn base64_url(s: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .ok()
}

/// A key of a Secret in the fleet's namespace; `None` when the Secret or key is absent.
async fn read_key(ctx: &Context, namespace: &str, name: &str, key: &str) -> Result<Option<String>, String> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(s) => Ok(s.and_then(|s| text(&s, key))),
        Err(e) => Err(format!("reading Secret {name}: {e}")),
    }
}

/// What the fleet serves and how its certificates stand. Never blocking: the fleet's proxies
/// must run for the ACME server to validate them.
fn report(
    owner: &Owner,
    held: Option<(CertInfo, bool)>,
    names_match: bool,
    step: &Step,
    record: AcmeRecord,
    account: Option<String>,
    requeue: Duration,
) -> CertOutcome {
    let secret_name = acme_secret_name(&owner.name);
    let real = held.as_ref().is_some_and(|(_, bootstrap)| !bootstrap);
    let condition = match (&record.last_error, real, step) {
        (Some(e), _, _) => Want::new(CERTIFICATES_READY, false, "AcmeOrderFailed", e.clone()),
        (None, true, Step::Serve { .. }) => Want::new(CERTIFICATES_READY, true, "Issued", "issued by the ACME server"),
        (None, true, _) if names_match => Want::new(
            CERTIFICATES_READY,
            true,
            "Issued",
            "issued by the ACME server; renewing",
        ),
        (None, _, _) => Want::new(
            CERTIFICATES_READY,
            false,
            "WaitingForAcme",
            "the ACME order runs; a self-signed stand-in serves meanwhile",
        ),
    };
    let statuses = held
        .iter()
        .map(|(info, _)| {
            let mut s = status_of("serving", &secret_name, info, None, CertSource::Acme);
            s.renewal_time = Some(issue::rfc3339(acme_plan::renewal_time(info)));
            s
        })
        .collect();
    CertOutcome {
        secrets: MountedSecrets {
            serving: Some(secret_name),
            client: None,
        },
        statuses,
        condition,
        blocking: None,
        requeue_after: Some(requeue),
        ca_rotation: None,
        acme: Some(record.to_status(account)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::fixtures;

    fn info() -> CertInfo {
        CertInfo {
            serial: "1".into(),
            issuer: "Pebble Intermediate".into(),
            subject: String::new(),
            not_before: 0,
            not_after: 90,
            dns_names: vec!["demo.example.com".into()],
            is_ca: false,
        }
    }

    fn run(held: Option<(CertInfo, bool)>, step: Step, record: AcmeRecord) -> CertOutcome {
        let pxd = fixtures::basic();
        let owner = Owner::of(&pxd).unwrap();
        report(&owner, held, true, &step, record, None, Duration::from_secs(5))
    }

    #[test]
    fn ca_crt_is_the_chain_after_the_leaf() {
        let leaf = "-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----\n";
        let inter = "-----BEGIN CERTIFICATE-----\nB\n-----END CERTIFICATE-----\n";
        assert_eq!(issuers_of(&format!("{leaf}{inter}")), inter);
        assert_eq!(issuers_of(leaf), leaf);
    }

    #[test]
    fn names_are_every_hostname_and_dns_name_once() {
        let mut pxd = fixtures::basic();
        let tls = TlsSpec {
            dns_names: vec!["b.example.com".into(), "demo.example.com".into()],
            ..Default::default()
        };
        pxd.spec.listeners[0].hostnames = vec!["demo.example.com".into()];
        assert_eq!(order_names(&pxd, &tls), vec!["b.example.com", "demo.example.com"]);
    }

    #[test]
    fn never_blocks_and_always_mounts_the_acme_secret() {
        for held in [None, Some((info(), true)), Some((info(), false))] {
            let out = run(held, Step::InFlight, AcmeRecord::default());
            assert!(out.blocking.is_none());
            assert_eq!(out.secrets.serving.as_deref(), Some("demo-acme-tls"));
        }
    }

    #[test]
    fn conditions_say_what_serves_and_quote_the_failure() {
        let serve = Step::Serve {
            recheck: Duration::from_secs(1),
        };
        let ok = run(Some((info(), false)), serve.clone(), AcmeRecord::default());
        assert_eq!((ok.condition.status, ok.condition.reason.as_str()), (true, "Issued"));
        let waiting = run(Some((info(), true)), Step::InFlight, AcmeRecord::default());
        assert_eq!(waiting.condition.reason, "WaitingForAcme");
        let failed = AcmeRecord::default().failed(10, "nowhere.example.com: Connection refused".into(), None);
        let out = run(Some((info(), false)), Step::Wait { until: 70 }, failed);
        assert!(!out.condition.status);
        assert_eq!(out.condition.reason, "AcmeOrderFailed");
        assert!(out.condition.message.contains("Connection refused"));
        assert_eq!(out.statuses[0].source, Some(CertSource::Acme));
        assert_eq!(out.statuses[0].renewal_time.as_deref(), Some("1970-01-01T00:01:00Z"));
    }
}
