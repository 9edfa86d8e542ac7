//! The namespace's managed CA: its Secret (`proxyfleet-ca`), created when missing, and the I/O
//! shell of its rotation (the decisions are in `ca_rotation`).
//!
//! Secret keys: `ca.crt`/`ca.key` (the signing CA), `bundle.crt` (what everything trusts),
//! `next.crt`/`next.key` (the CA being introduced), `previous.crt` (the CA being retired).
//! Every rotation write is a compare-and-swap on the Secret's resourceVersion, so concurrent
//! reconciles of fleets sharing the CA cannot both generate a next CA.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::ByteString;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use sha2::{Digest, Sha256};

use super::ca_rotation::{self, Observations, RotationState, Write};
use super::issue::{self, CertInfo, KeyedCert};
use super::managed_fleets::ManagedFleets;
use super::spec::CaRotationStatus;
use crate::context::Context;
use crate::labels;
use crate::resources::config_map::ADMIN_PORT;

pub const CA_SECRET: &str = "proxyfleet-ca";

/// What went wrong with a namespace's CA, and where.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("reading CA Secret {namespace}/{CA_SECRET}: {source}")]
    Read { namespace: String, source: kube::Error },
    #[error("{what} CA Secret {namespace}/{CA_SECRET}: {source}")]
    Write {
        what: &'static str,
        namespace: String,
        source: kube::Error,
    },
    #[error("listing proxy pods of namespace {namespace}: {source}")]
    ListPods { namespace: String, source: kube::Error },
    #[error("generating a CA for namespace {namespace}: {source}")]
    Generate {
        namespace: String,
        source: issue::IssueError,
    },
    #[error("Secret {namespace}/{CA_SECRET} exists but is not a proxyfleet CA ({problem}); not touching it")]
    NotOurs { namespace: String, problem: &'static str },
    #[error("no CA Secret {namespace}/{CA_SECRET} yet")]
    Missing { namespace: String },
}
/// The label every namespace CA Secret carries (ours and those propagated from a hub).
pub const CA_LABEL: &str = "proxyfleet.io/ca";

/// Whether `secret` is a namespace's CA Secret.
pub fn is_ca_secret(secret: &Secret) -> bool {
    secret.metadata.name.as_deref() == Some(CA_SECRET)
        && secret
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(CA_LABEL))
            .is_some_and(|v| v == "true")
}

/// What leaves are issued with and what they publish.
pub struct CaMaterial {
    pub ca: KeyedCert,
    pub info: CertInfo,
    /// The trust bundle (PEM, one or two CAs).
    pub bundle: String,
    pub rotation: CaRotationStatus,
    pub requeue: Duration,
    /// The uid of the CA Secret: a stable identity across rotations (propagation marks the
    /// members' copies with it and never overwrites a CA Secret that lacks it).
    pub secret_uid: String,
}

/// Unix seconds now.
pub(super) fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A Secret's key as UTF-8 text.
pub(super) fn text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

fn annotation(secret: &Secret, key: &str) -> Option<String> {
    secret.metadata.annotations.as_ref()?.get(key).cloned()
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
}

pub fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn read_secret(namespace: &str, ctx: &Context) -> Result<Option<Secret>, CaError> {
    if let Some(s) = ctx.stores.secrets.get(&ObjectRef::new(CA_SECRET).within(namespace)) {
        return Ok(Some((*s).clone()));
    }
    // Not in the cache: ask the API server before creating one, so a lagging cache never
    // replaces a CA.
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    api.get_opt(CA_SECRET).await.map_err(|source| CaError::Read {
        namespace: namespace.into(),
        source,
    })
}

/// Creates the namespace's first CA, or returns the one another fleet's reconcile created just
/// before: a plain create, which fails on an existing Secret, never an apply that would replace
/// a CA some leaves were already signed by. Its name carries the time, so a CA made after the
/// old one was deleted (the documented recovery) is another issuer and every leaf is reissued.
async fn create(namespace: &str, ctx: &Context) -> Result<Secret, CaError> {
    let now = now();
    let name = format!("proxyfleet CA {namespace} {}", issue::rfc3339(now));
    let ca = issue::new_ca(&name, now, ctx.settings.ca_duration).map_err(|source| CaError::Generate {
        namespace: namespace.into(),
        source,
    })?;
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(CA_SECRET.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
                (CA_LABEL.to_string(), "true".to_string()),
            ])),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(
            [("ca.crt", &ca.cert_pem), ("ca.key", &ca.key_pem)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let params = kube::api::PostParams {
        field_manager: Some(labels::FIELD_MANAGER.to_string()),
        ..Default::default()
    };
    match api.create(&params, &secret).await {
        Ok(written) => {
            ctx.metrics.api_write("Secret", "create");
            tracing::info!(%namespace, "created managed CA");
            Ok(written)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => read_secret(namespace, ctx).await?.ok_or(CaError::Missing {
            namespace: namespace.into(),
        }),
        Err(source) => Err(CaError::Write {
            what: "creating",
            namespace: namespace.into(),
            source,
        }),
    }
}

/// The namespace's CA, created when missing. Rotation steps are the CA controller's
/// (`certs::controller`): fleets only read the CA and follow it.
pub async fn ensure(namespace: &str, ctx: &Context) -> Result<CaMaterial, CaError> {
    let secret = match read_secret(namespace, ctx).await? {
        Some(s) => s,
        None => create(namespace, ctx).await?,
    };
    material(&secret)
}

/// One pass of the CA controller over a namespace's CA Secret: one rotation step when one is
/// due, and the progress message kept on the Secret. Returns when to look again.
pub async fn step(secret: &Secret, ctx: &Context) -> Result<Duration, CaError> {
    let namespace = secret.metadata.namespace.clone().unwrap_or_default();
    if annotation(secret, crate::propagation::placement::HUB_OBJECT).is_some() {
        // Propagated from a hub: rotated there; a change to the Secret wakes us anyway.
        return Ok(Duration::from_secs(3600));
    }
    let Some(step) = rotate(&namespace, secret, ctx).await? else {
        // Another writer moved it first: decide again from what it wrote.
        return Ok(Duration::from_secs(5));
    };
    // The phases that wait for pods look again every 5 s; Stable and Overlap wait for a time.
    let requeue = if [ca_rotation::STABLE, ca_rotation::OVERLAP].contains(&step.state.phase) {
        step.requeue
    } else {
        step.requeue.min(Duration::from_secs(5))
    };
    if step.write.is_none() && annotation(secret, ca_rotation::MESSAGE_ANNOTATION).unwrap_or_default() != step.message {
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": secret.metadata.resource_version,
            "annotations": {ca_rotation::MESSAGE_ANNOTATION: step.message},
        }});
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
        match api
            .patch(CA_SECRET, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => ctx.metrics.api_write("Secret", "patch"),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(source) => {
                return Err(CaError::Write {
                    what: "annotating",
                    namespace,
                    source,
                })
            }
        }
    }
    Ok(requeue)
}

/// The namespace's CA as it stands, without creating it.
pub async fn current(namespace: &str, ctx: &Context) -> Result<CaMaterial, CaError> {
    match read_secret(namespace, ctx).await? {
        Some(secret) => material(&secret),
        None => Err(CaError::Missing {
            namespace: namespace.into(),
        }),
    }
}

fn not_ours(secret: &Secret, problem: &'static str) -> CaError {
    CaError::NotOurs {
        namespace: secret.metadata.namespace.clone().unwrap_or_default(),
        problem,
    }
}

fn material(secret: &Secret) -> Result<CaMaterial, CaError> {
    let cert_pem = text(secret, "ca.crt").ok_or_else(|| not_ours(secret, "no ca.crt"))?;
    let key_pem = text(secret, "ca.key").ok_or_else(|| not_ours(secret, "no ca.key"))?;
    let info = issue::parse_pem(&cert_pem).ok_or_else(|| not_ours(secret, "ca.crt does not parse"))?;
    let bundle = text(secret, "bundle.crt").unwrap_or_else(|| cert_pem.clone());
    let state = state_of(secret);
    let serial_of = |key: &str| text(secret, key).and_then(|p| issue::parse_pem(&p)).map(|i| i.serial);
    // Progress as the CA controller last decided it; fleets look again soon while it moves.
    let message = annotation(secret, ca_rotation::MESSAGE_ANNOTATION).unwrap_or_default();
    let requeue = Duration::from_secs(3600);
    let rotating = state.phase != ca_rotation::STABLE;
    let rotation = CaRotationStatus {
        phase: state.phase,
        old_ca_serial: if state.has_previous {
            serial_of("previous.crt")
        } else if rotating {
            Some(info.serial.clone())
        } else {
            None
        },
        new_ca_serial: if state.has_next {
            serial_of("next.crt")
        } else if rotating {
            Some(info.serial.clone())
        } else {
            None
        },
        phase_started_at: (state.since > 0).then(|| issue::rfc3339(state.since)),
        message: (!message.is_empty()).then_some(message),
    };
    Ok(CaMaterial {
        ca: KeyedCert { cert_pem, key_pem },
        info,
        bundle,
        rotation,
        requeue: if rotating {
            requeue.min(Duration::from_secs(5))
        } else {
            requeue
        },
        secret_uid: secret.metadata.uid.clone().unwrap_or_default(),
    })
}

fn state_of(secret: &Secret) -> RotationState {
    RotationState {
        phase: annotation(secret, ca_rotation::PHASE_ANNOTATION)
            .map(|p| ca_rotation::RotationPhase::parse(&p))
            .unwrap_or_default(),
        since: annotation(secret, ca_rotation::SINCE_ANNOTATION)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        has_next: text(secret, "next.crt").is_some(),
        has_previous: text(secret, "previous.crt").is_some(),
    }
}

/// Leaf Secrets of the namespace issued by the managed CA, as a rotation waits for them.
#[derive(Default)]
struct Leaves {
    total: usize,
    /// Names of those without the wanted bundle, and of those not issued by the signing CA.
    without_bundle: Vec<String>,
    not_reissued: Vec<String>,
    /// Serials of those issued by the signing CA.
    current_serials: Vec<String>,
}

fn leaves(on_ca: &ManagedFleets, bundle: &str, issuer: &str, ctx: &Context) -> Leaves {
    let mut out = Leaves::default();
    for s in ctx.stores.secrets.state() {
        let Some(cert) = text(&s, "tls.crt").filter(|_| on_ca.has_leaf(&s)) else {
            continue;
        };
        out.total += 1;
        let name = s.metadata.name.clone().unwrap_or_default();
        if text(&s, "ca.crt").as_deref() != Some(bundle) {
            out.without_bundle.push(name.clone());
        }
        match issue::parse_pem(&cert).filter(|i| i.issuer == issuer) {
            Some(info) => out.current_serials.push(info.serial),
            None => out.not_reissued.push(name),
        }
    }
    out.without_bundle.sort();
    out.not_reissued.sort();
    out
}

/// What one proxy pod reports on /config.
struct PodReport {
    bundle_sha: Option<String>,
    serials: Vec<String>,
}

/// A pod's admin report; one that cannot be read (an older proxy, a truncated body) reports an
/// empty bundle hash, so the pod counts in the total as not converged (as a pod that cannot be
/// asked does): waiting is safe, guessing is not. Only a report that says no bundle is loaded
/// leaves the pod out of the rotation.
fn parse_config_report(body: &str) -> PodReport {
    match proxyfleet_config::AdminReport::from_json(body) {
        Ok(r) => PodReport {
            bundle_sha: r.trust_bundle_sha256,
            serials: r.certificates.into_iter().map(|c| c.serial).collect(),
        },
        Err(e) => {
            tracing::debug!(error = %e, "unreadable admin report");
            PodReport {
                bundle_sha: Some(String::new()),
                serials: Vec::new(),
            }
        }
    }
}

/// Proxy pods of the namespace that loaded a trust bundle: (total, reporting `sha`, serving only
/// leaves in `current_serials`).
async fn pods_with_bundle(
    (namespace, on_ca): (&str, &ManagedFleets),
    sha: &str,
    current_serials: &[String],
    ctx: &Context,
) -> Result<(usize, usize, usize), CaError> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = format!("{}={}", labels::APP_NAME, labels::PROXY_APP);
    let pods = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| CaError::ListPods {
            namespace: namespace.into(),
            source,
        })?;
    let mut counts = (0, 0, 0);
    for pod in pods.items {
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        if !running || pod.metadata.deletion_timestamp.is_some() || !on_ca.has_pod(&pod) {
            continue;
        }
        // A pod that cannot be asked counts as not converged.
        let url = format!("http://{ip}:{ADMIN_PORT}{}", proxyfleet_config::ADMIN_REPORT_PATH);
        let report = match ctx.http.get(&url).await {
            Ok(body) => parse_config_report(&body),
            Err(_) => PodReport {
                bundle_sha: Some(String::new()),
                serials: Vec::new(),
            },
        };
        // A pod with no trust bundle serves nothing from our CA: not part of the rotation.
        let Some(loaded) = report.bundle_sha else { continue };
        counts.0 += 1;
        if loaded == sha {
            counts.1 += 1;
        }
        if !report.serials.is_empty() && report.serials.iter().all(|s| current_serials.contains(s)) {
            counts.2 += 1;
        }
    }
    Ok(counts)
}

/// One step of the rotation machine: the decision taken (written when it has a write), or
/// `None` when this CA is not ours to rotate or another writer moved it first.
async fn rotate(namespace: &str, secret: &Secret, ctx: &Context) -> Result<Option<ca_rotation::Step>, CaError> {
    if annotation(secret, crate::propagation::placement::HUB_OBJECT).is_some() {
        // A CA propagated from a hub cluster is rotated there, never here.
        return Ok(None);
    }
    let state = state_of(secret);
    let cert_pem = text(secret, "ca.crt").unwrap_or_default();
    let info = issue::parse_pem(&cert_pem).ok_or_else(|| not_ours(secret, "ca.crt does not parse"))?;
    let bundle = text(secret, "bundle.crt").unwrap_or_else(|| cert_pem.clone());
    let mut o = Observations {
        now: now(),
        ca_renewal_time: ca_rotation::ca_renewal_time(info.not_before, info.not_after),
        rotation_requested: annotation(secret, ca_rotation::ROTATE_ANNOTATION).is_some(),
        overlap: annotation(secret, ca_rotation::OVERLAP_ANNOTATION)
            .and_then(|v| v.parse::<proxyfleet_config::HumanDuration>().ok())
            .map(|d| d.get())
            .unwrap_or(ca_rotation::DEFAULT_OVERLAP),
        ..Default::default()
    };
    let phase = state.phase;
    if [
        ca_rotation::PUBLISHING_BUNDLE,
        ca_rotation::WAITING_FOR_BUNDLE,
        ca_rotation::REISSUING,
    ]
    .contains(&phase)
    {
        let on_ca = ManagedFleets::of(namespace, &ctx.stores.fleets);
        let found = leaves(&on_ca, &bundle, &info.subject, ctx);
        o.leaves_total = found.total;
        o.leaves_with_bundle = found.total - found.without_bundle.len();
        o.leaves_on_current_ca = found.total - found.not_reissued.len();
        if phase != ca_rotation::PUBLISHING_BUNDLE {
            (o.pods_total, o.pods_with_bundle, o.pods_on_current_ca) =
                pods_with_bundle((namespace, &on_ca), &sha256_hex(&bundle), &found.current_serials, ctx).await?;
        }
        (o.leaves_without_bundle, o.leaves_not_reissued) = (found.without_bundle, found.not_reissued);
    }
    let step = ca_rotation::decide(&state, &o);
    let Some(write) = step.write.clone() else {
        return Ok(Some(step));
    };
    let mut annotations = step_annotations(&step);
    let data = rotation_data(
        &write,
        namespace,
        secret,
        &cert_pem,
        o.now,
        ctx.settings.ca_duration,
        &mut annotations,
    )?;
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": secret.metadata.resource_version, "annotations": annotations},
        "data": data,
    });
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    match api
        .patch(CA_SECRET, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            ctx.metrics.api_write("Secret", "patch");
            tracing::info!(%namespace, phase = %step.state.phase, message = %step.message, "CA rotation");
            Ok(Some(step))
        }
        // Another reconcile moved it first: take the next step from its result next time.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
        Err(source) => Err(CaError::Write {
            what: "rotating",
            namespace: namespace.into(),
            source,
        }),
    }
}

/// The annotations every rotation step writes: phase, since when, and the progress message.
fn step_annotations(step: &ca_rotation::Step) -> serde_json::Map<String, serde_json::Value> {
    serde_json::Map::from_iter([
        (
            ca_rotation::PHASE_ANNOTATION.to_string(),
            step.state.phase.as_str().into(),
        ),
        (
            ca_rotation::SINCE_ANNOTATION.to_string(),
            step.state.since.to_string().into(),
        ),
        (ca_rotation::MESSAGE_ANNOTATION.to_string(), step.message.clone().into()),
    ])
}

/// The CA Secret's data changes a rotation step writes (a new CA, the swap, dropping the old
/// one); a started rotation also clears the request annotation.
fn rotation_data(
    write: &Write,
    namespace: &str,
    secret: &Secret,
    cert_pem: &str,
    now: i64,
    ca_duration: std::time::Duration,
    annotations: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<serde_json::Map<String, serde_json::Value>, CaError> {
    let mut data = serde_json::Map::new();
    match write {
        Write::StartRotation => {
            let stamp = issue::rfc3339(now);
            let next =
                issue::new_ca(&format!("proxyfleet CA {namespace} {stamp}"), now, ca_duration).map_err(|source| {
                    CaError::Generate {
                        namespace: namespace.into(),
                        source,
                    }
                })?;
            data.insert("next.crt".into(), b64(&next.cert_pem).into());
            data.insert("next.key".into(), b64(&next.key_pem).into());
            data.insert(
                "bundle.crt".into(),
                b64(&format!("{}{}", ensure_newline(cert_pem), next.cert_pem)).into(),
            );
            annotations.insert(ca_rotation::ROTATE_ANNOTATION.into(), serde_json::Value::Null);
        }
        Write::SwapToNext => {
            let next_crt = text(secret, "next.crt").ok_or_else(|| not_ours(secret, "no next.crt to swap to"))?;
            let next_key = text(secret, "next.key").ok_or_else(|| not_ours(secret, "no next.key to swap to"))?;
            data.insert("ca.crt".into(), b64(&next_crt).into());
            data.insert("ca.key".into(), b64(&next_key).into());
            data.insert("previous.crt".into(), b64(cert_pem).into());
            data.insert("next.crt".into(), serde_json::Value::Null);
            data.insert("next.key".into(), serde_json::Value::Null);
        }
        Write::DropPrevious => {
            data.insert("bundle.crt".into(), b64(cert_pem).into());
            data.insert("previous.crt".into(), serde_json::Value::Null);
        }
        Write::Phase => {}
    }
    Ok(data)
}

fn ensure_newline(pem: &str) -> String {
    if pem.ends_with('\n') {
        pem.to_string()
    } else {
        format!("{pem}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_ca_secrets_by_name_and_label() {
        let secret = |name: &str, label: Option<&str>| Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                labels: label.map(|v| BTreeMap::from([(CA_LABEL.to_string(), v.to_string())])),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(is_ca_secret(&secret(CA_SECRET, Some("true"))));
        assert!(!is_ca_secret(&secret(CA_SECRET, Some("false"))));
        assert!(!is_ca_secret(&secret(CA_SECRET, None)));
        assert!(!is_ca_secret(&secret("demo-tls", Some("true"))));
    }

    #[test]
    fn reads_the_proxy_admin_report() {
        let report = proxyfleet_config::AdminReport {
            config: proxyfleet_config::ProxyConfig::from_yaml(
                "listeners: [{name: h, address: '127.0.0.1:0'}]\nroutes: [{name: r, upstream: u}]\nupstreams: [{name: u, endpoints: ['127.0.0.1:1']}]\nadmin: {address: '127.0.0.1:0'}\n",
            )
            .unwrap(),
            certificates: vec![proxyfleet_config::LoadedCertificate {
                listener: "https".into(),
                serial: "0a1b".into(),
                subject: "CN=x".into(),
                not_after: 1,
            }],
            trust_bundle_sha256: Some("abc".into()),
            live_weights: Vec::new(),
            acme_tokens: Vec::new(),
        };
        let r = parse_config_report(&report.to_json());
        assert_eq!(r.bundle_sha.as_deref(), Some("abc"));
        assert_eq!(r.serials, ["0a1b"]);
        assert_eq!(
            parse_config_report("trustBundleSha256: abc\n").bundle_sha.as_deref(),
            Some(""),
            "the old text is not guessed at: the pod counts, not converged"
        );
    }
}

#[cfg(test)]
mod create_tests {
    use super::*;
    use crate::context::testing::test_context;
    use kube::client::Body;

    fn answer(send: tower_test::mock::SendResponse<http::Response<Body>>, code: u16, body: serde_json::Value) {
        let body = Body::from(serde_json::to_vec(&body).expect("json"));
        send.send_response(http::Response::builder().status(code).body(body).expect("response"));
    }

    /// Two fleets of a new namespace both find no CA: the second's create fails on the first's
    /// Secret, and it takes that CA instead of replacing it. A new CA's name carries its time.
    #[tokio::test]
    async fn a_ca_created_meanwhile_is_taken_not_replaced() {
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let ctx = test_context(kube::Client::new(mock, "default"));
        let theirs = issue::new_ca(
            "proxyfleet CA team-a 2026-12-07T00:00:00Z",
            now(),
            Duration::from_secs(86_400),
        )
        .expect("a CA");
        let existing = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": CA_SECRET, "namespace": "team-a", "uid": "ca-uid",
                "labels": {CA_LABEL: "true", labels::MANAGED_BY: labels::MANAGER}},
            "data": {"ca.crt": base64(&theirs.cert_pem), "ca.key": base64(&theirs.key_pem)}});
        let server = tokio::spawn(async move {
            let mut calls = Vec::new();
            let not_found = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "NotFound", "code": 404});
            let conflict = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "AlreadyExists", "code": 409});
            for (code, body) in [(404, not_found), (409, conflict), (200, existing)] {
                let (request, send) = handle.next_request().await.expect("a request");
                let (parts, body_in) = request.into_parts();
                let sent = http_body_util::BodyExt::collect(body_in)
                    .await
                    .expect("body")
                    .to_bytes();
                let named = String::from_utf8_lossy(&sent).contains("proxyfleet CA team-a 20");
                calls.push(format!("{} {named}", parts.method));
                answer(send, code, body);
            }
            calls
        });
        let material = ensure("team-a", &ctx).await.expect("the CA created meanwhile");
        assert_eq!(
            material.info.subject,
            issue::parse_pem(&theirs.cert_pem).expect("parses").subject
        );
        let calls = server.await.expect("mock server");
        assert_eq!(calls[0], "GET false");
        assert!(calls[1].starts_with("POST "), "a create, never an apply: {calls:?}");
        assert_eq!(calls[2], "GET false");
    }

    fn base64(text: &str) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(text)
    }
}
