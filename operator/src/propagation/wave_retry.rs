//! The canary retry `resume` asks of a member whose canary aborted in a wave rollout
//! (`waves::Retry`, `WaveStatus::retrying`). Without it, the aborted canary there would abort the
//! resumed rollout again at once. The hub writes, on each aborted canary's object in the
//! member (the fleet's copy, an app's copy), the `retry` command and a token naming the
//! revision and the hub's retry serial; the member's operator records the token in that
//! canary's status when the retry restarts it (and keeps it there). Last, the token goes on the
//! fleet's copy as the record that the member was asked. The hub reads all of it back: asked
//! (the record), taken (every canary asked either restarted or records the token), so a failure
//! after the retry counts again and one before it never does.
//!
//! A member can drop a retry: its operator clears the command and stops before it writes the
//! status that records the token. The canary then shows the token on its object, no command,
//! and an abort without the token. Seen so `LOST_AFTER` or more after the ask (written beside
//! the token; the member writes that status right after clearing the command), only that
//! canary is asked again. The canary takes a token once (`canary::machine`), so an ask that
//! crosses a late status write restarts nothing twice.

use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::apps::{self, SeenApp};
use super::member::{bounded, MemberError};
use super::status;
use super::waves::{Progress, Retry};
use crate::app::spec::AppRollout;
use crate::canary::rollout::{COMMAND_ANNOTATION, RETRY_ASKED_AT, RETRY_TOKEN};
use crate::canary::spec::{CanaryPhase, CanaryStatus};
use crate::crd::ProxyDeployment;

/// Annotation on a member's fleet copy: the token of the last retry the hub asked there.
pub const WAVE_RETRY: &str = "proxyfleet.io/wave-retry";
/// How long after its ask a dropped retry is asked again.
pub const LOST_AFTER: i64 = 60;
const FIELD_MANAGER: &str = "proxyfleet-wave-retry";

pub use super::waves::retry_token as token;

/// The serial a token names, if it is one of `revision`'s.
fn serial_of(token: &str, revision: &str) -> Option<u32> {
    let (serial, of) = token.split_once('/')?;
    (of == revision).then(|| serial.parse().ok()).flatten()
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

fn aborted(canary: Option<&CanaryStatus>) -> bool {
    canary.is_some_and(|c| c.phase == CanaryPhase::Aborted)
}

fn fleet_canary(copy: &ProxyDeployment) -> Option<&CanaryStatus> {
    copy.status.as_ref()?.canary.as_ref()
}

fn app_canary(app: &SeenApp) -> Option<&CanaryStatus> {
    app.rollout.status.as_ref()?.canary.as_ref()
}

/// The canary of `meta` was asked with `token` `LOST_AFTER` or more before `now`, its command
/// is gone, and it is still aborted without the token in its status: the member dropped the
/// retry. (Sooner, it may be writing that status now; an ask without its time, from an older
/// hub, is never taken for dropped.)
fn dropped(meta: &ObjectMeta, canary: Option<&CanaryStatus>, token: &str, now: i64) -> bool {
    let at = annotation(meta, RETRY_ASKED_AT).and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok());
    annotation(meta, RETRY_TOKEN) == Some(token)
        && at.is_some_and(|at| now - at.timestamp() >= LOST_AFTER)
        && annotation(meta, COMMAND_ANNOTATION).is_none()
        && aborted(canary)
        && canary.and_then(|c| c.retry_token.as_deref()) != Some(token)
}

/// Every canary's object in the member, with its status.
fn canaries<'a>(
    copy: &'a ProxyDeployment,
    apps: &'a [SeenApp],
) -> impl Iterator<Item = (&'a ObjectMeta, Option<&'a CanaryStatus>)> {
    std::iter::once((&copy.metadata, fleet_canary(copy)))
        .chain(apps.iter().map(|a| (&a.rollout.metadata, app_canary(a))))
}

/// One canary a retry restarts: its object and status, and whether it is the fleet's (else an
/// app's).
struct Retried<'a> {
    meta: &'a ObjectMeta,
    status: Option<&'a CanaryStatus>,
    fleet: bool,
}

/// The canaries a retry restarts (`retriable`).
fn retried<'a>(copy: &'a ProxyDeployment, apps: &'a [SeenApp]) -> Vec<Retried<'a>> {
    let Some((fleet, apps)) = retriable(copy, apps) else {
        return Vec::new();
    };
    let fleet = fleet.then(|| Retried {
        meta: &copy.metadata,
        status: fleet_canary(copy),
        fleet: true,
    });
    let apps = apps.into_iter().map(|a| Retried {
        meta: &a.rollout.metadata,
        status: app_canary(a),
        fleet: false,
    });
    fleet.into_iter().chain(apps).collect()
}

/// The member's canaries a retry restarts: its fleet's, if aborted, and each (judged) app whose
/// canary aborted on the template it holds. `None` when it fails otherwise too (its fleet
/// degraded): a retry cannot clear that.
fn retriable<'a>(copy: &'a ProxyDeployment, apps: &'a [SeenApp]) -> Option<(bool, Vec<&'a SeenApp>)> {
    let fleet = aborted(fleet_canary(copy));
    if !fleet && matches!(status::progress(copy), Progress::Failed(_)) {
        return None;
    }
    let apps: Vec<&SeenApp> = apps
        .iter()
        .filter(|a| matches!(apps::progress(a), Progress::Failed(_)))
        .collect();
    Some((fleet, apps))
}

/// What the member's copy and its (judged) apps say of the retry, for the rollout of `revision`,
/// at `now` (seconds).
pub fn observe(copy: &ProxyDeployment, apps: &[SeenApp], revision: &str, now: i64) -> Retry {
    let asked_token = annotation(&copy.metadata, WAVE_RETRY).filter(|t| serial_of(t, revision).is_some());
    let mut retry = Retry {
        aborted: retriable(copy, apps).is_some_and(|(fleet, apps)| fleet || !apps.is_empty()),
        asked: asked_token.and_then(|t| serial_of(t, revision)),
        taken: asked_token.is_some(),
        lost: asked_token.is_some_and(|t| retried(copy, apps).iter().any(|c| dropped(c.meta, c.status, t, now))),
        pending: Vec::new(),
    };
    for (meta, canary) in canaries(copy, apps) {
        // Taken: restarted (no longer aborted), or aborted again after recording the token.
        // Aborted without the token is the retry not taken yet (the member clears the command
        // before it writes the status).
        let asked_here = asked_token.is_some() && annotation(meta, RETRY_TOKEN) == asked_token;
        if asked_here && aborted(canary) && canary.and_then(|c| c.retry_token.as_deref()) != asked_token {
            retry.taken = false;
        }
        retry.pending.extend(pending_retry(meta).map(str::to_string));
    }
    retry
}

/// The token of a hub's retry still pending on the canary of `meta`: the `retry` command beside
/// the hub's token, not read yet by the member. (The plugin's commands drop the token.)
fn pending_retry(meta: &ObjectMeta) -> Option<&str> {
    let token = annotation(meta, RETRY_TOKEN)?;
    (annotation(meta, COMMAND_ANNOTATION) == Some("retry")).then_some(token)
}

/// Takes back the hub's retries still pending in the member (`Send::Withdraw`), all but the
/// one of token `keep`: the command is removed only while it is still that retry (a JSON patch
/// that tests the command and the token first), so a retry the member read meanwhile, or a
/// command sent since, is left alone; the API server's refusal of the test is not an error.
pub async fn withdraw(
    client: &Client,
    copy: &ProxyDeployment,
    apps: &[SeenApp],
    keep: Option<&str>,
) -> Result<(), MemberError> {
    let namespace = copy.metadata.namespace.as_deref().unwrap_or_default();
    let pending_retry = |meta| pending_retry(meta).filter(|t| Some(*t) != keep);
    if let Some(token) = pending_retry(&copy.metadata) {
        take_back::<ProxyDeployment>(
            client,
            namespace,
            &copy.metadata,
            token,
            "taking back the fleet's retry",
        )
        .await?;
    }
    for app in apps {
        let meta = &app.rollout.metadata;
        if let Some(token) = pending_retry(meta) {
            take_back::<AppRollout>(client, namespace, meta, token, "taking back an app's retry").await?;
        }
    }
    Ok(())
}

async fn take_back<K>(
    client: &Client,
    namespace: &str,
    meta: &ObjectMeta,
    token: &str,
    what: &str,
) -> Result<(), MemberError>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let path = crate::command_annotation::annotation_path;
    let ops = serde_json::json!([
        {"op": "test", "path": path(COMMAND_ANNOTATION), "value": "retry"},
        {"op": "test", "path": path(RETRY_TOKEN), "value": token},
        {"op": "remove", "path": path(COMMAND_ANNOTATION)},
    ]);
    let patch: json_patch::Patch =
        serde_json::from_value(ops).map_err(|e| MemberError::Refused(format!("{what}: {e}")))?;
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let name = meta.name.as_deref().unwrap_or_default();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let patched = async {
        match api.patch(name, &params, &Patch::Json::<()>(patch)).await {
            // A test failed: the member read the retry already, or another command came.
            // The API server answers a failed patch operation with a bare 422 (checked against
            // a real one: "the server rejected our request due to an error in our request").
            Err(kube::Error::Api(s)) if s.code == 422 => {
                if s.message.contains("error in our request") {
                    tracing::info!(object = name, message = %s.message, "retry not taken back: no longer pending");
                } else {
                    tracing::warn!(object = name, message = %s.message, "retry not taken back: refused");
                }
                Ok(())
            }
            Ok(_) => {
                tracing::info!(object = name, token, "retry taken back: the hub no longer waits for it");
                Ok(())
            }
            Err(e) => Err(e),
        }
    };
    bounded(what, patched).await
}

/// Why a member was not asked this pass (it is, on a later one).
#[derive(Debug, PartialEq, Eq)]
pub enum NotAsked {
    /// A command someone sent is still pending on one of its canaries: never replaced.
    CommandPending(String),
    /// One of its canaries' objects changed since it was read.
    Changed,
    /// It has nothing a retry restarts.
    NothingToRetry,
}

/// Asks every aborted canary of the member to retry, with `token` and the time (`now`,
/// seconds): those already asked with it are not asked again, unless they dropped it; then
/// records on the fleet's copy that it was asked. Once recorded, only canaries that dropped it
/// are asked (one that aborted after the ask counts as a failure). Each ask goes to the
/// version read, and none replaces a pending command: the member is then asked on a later
/// pass. A failure leaves the record unwritten, so the next pass asks what is left.
pub async fn ask(
    client: &Client,
    copy: &ProxyDeployment,
    apps: &[SeenApp],
    token: &str,
    now: i64,
) -> Result<Result<(), NotAsked>, MemberError> {
    if retriable(copy, apps).is_none() {
        return Ok(Err(NotAsked::NothingToRetry));
    }
    let recorded = annotation(&copy.metadata, WAVE_RETRY) == Some(token);
    let unasked = |m: &ObjectMeta, c| {
        let dropped = dropped(m, c, token, now);
        dropped || !recorded && annotation(m, RETRY_TOKEN) != Some(token)
    };
    let to_ask: Vec<Retried> = retried(copy, apps)
        .into_iter()
        .filter(|c| unasked(c.meta, c.status))
        .collect();
    if recorded && to_ask.is_empty() {
        return Ok(Ok(()));
    }
    let pending = to_ask.iter().map(|c| c.meta).find_map(|m| {
        let command = annotation(m, COMMAND_ANNOTATION)?;
        Some(format!("{command} on {}", m.name.as_deref().unwrap_or_default()))
    });
    if let Some(p) = pending {
        return Ok(Err(NotAsked::CommandPending(p)));
    }
    let namespace = copy.metadata.namespace.as_deref().unwrap_or_default();
    let asked = async {
        for c in to_ask {
            let ask = Ask::Retry(token, now);
            if c.fleet {
                patch::<ProxyDeployment>(client, namespace, c.meta, ask, "asking the fleet's canary to retry").await?;
            } else {
                patch::<AppRollout>(client, namespace, c.meta, ask, "asking an app's canary to retry").await?;
            }
        }
        patch::<ProxyDeployment>(
            client,
            namespace,
            &copy.metadata,
            Ask::Record(token),
            "recording the retry asked",
        )
        .await
    };
    match asked.await {
        Ok(()) => Ok(Ok(())),
        Err(MemberError::Refused(m)) if m.contains("(Conflict)") => Ok(Err(NotAsked::Changed)),
        Err(e) => Err(e),
    }
}

/// One write of an ask.
#[derive(Clone, Copy)]
enum Ask<'a> {
    /// The retry command, its token and the time (seconds), to the version read.
    Retry(&'a str, i64),
    /// The record of the token asked (`WAVE_RETRY`), on the fleet's copy.
    Record(&'a str),
}

async fn patch<K>(
    client: &Client,
    namespace: &str,
    meta: &ObjectMeta,
    ask: Ask<'_>,
    what: &str,
) -> Result<(), MemberError>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let body = match ask {
        Ask::Retry(token, now) => {
            let at = chrono::DateTime::from_timestamp(now, 0)
                .unwrap_or_default()
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            serde_json::json!({"metadata": {
                "resourceVersion": meta.resource_version,
                "annotations": {COMMAND_ANNOTATION: "retry", RETRY_TOKEN: token, RETRY_ASKED_AT: at},
            }})
        }
        Ask::Record(token) => serde_json::json!({"metadata": {"annotations": {WAVE_RETRY: token}}}),
    };
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let name = meta.name.as_deref().unwrap_or_default();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    bounded(what, api.patch(name, &params, &Patch::Merge(&body)))
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(record: Option<&str>, canary: Option<(CanaryPhase, Option<&str>)>, token: Option<&str>) -> ProxyDeployment {
        let mut pxd: ProxyDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1", "kind": "ProxyDeployment",
            "metadata": {"name": "edge", "namespace": "team-a"},
            "spec": {"replicas": 1, "listeners": [], "routes": [], "upstreams": []},
        }))
        .expect("copy");
        let mut annotations = std::collections::BTreeMap::new();
        if let Some(r) = record {
            annotations.insert(WAVE_RETRY.to_string(), r.to_string());
        }
        if let Some(t) = token {
            annotations.insert(RETRY_TOKEN.to_string(), t.to_string());
        }
        pxd.metadata.annotations = Some(annotations);
        pxd.status = Some(crate::crd::ProxyDeploymentStatus {
            canary: canary.map(|(phase, echo)| CanaryStatus {
                phase,
                retry_token: echo.map(str::to_string),
                ..CanaryStatus::default()
            }),
            ..Default::default()
        });
        pxd
    }

    #[test]
    fn a_retry_is_asked_for_one_revision_and_attempt() {
        assert_eq!(serial_of(&token("r2", 3), "r2"), Some(3));
        assert_eq!(serial_of(&token("r2", 3), "r3"), None, "another revision's");
        assert_eq!(serial_of("garbage", "r2"), None);
    }

    /// Taken only once the canary restarted or recorded the token: aborted without it is the
    /// member between clearing the command and writing the status.
    #[test]
    fn a_retry_is_taken_only_once_the_canary_shows_it() {
        let t = token("r1", 1);
        let aborted = |echo| Some((CanaryPhase::Aborted, echo));
        let not_asked = observe(&copy(None, aborted(None), None), &[], "r1", 0);
        assert_eq!(
            not_asked,
            Retry {
                aborted: true,
                asked: None,
                taken: false,
                lost: false,
                pending: Vec::new()
            }
        );
        let pending = observe(
            &with_command(copy(Some(&t), aborted(None), Some(&t)), "retry"),
            &[],
            "r1",
            0,
        );
        assert_eq!(
            (pending.asked, pending.taken, pending.lost, pending.pending),
            (Some(1), false, false, vec![t.clone()])
        );
        let restarted = observe(
            &copy(Some(&t), Some((CanaryPhase::Progressing, Some(&t))), Some(&t)),
            &[],
            "r1",
            0,
        );
        assert_eq!(
            (restarted.aborted, restarted.asked, restarted.taken),
            (false, Some(1), true)
        );
        let failed_again = observe(&copy(Some(&t), aborted(Some(&t)), Some(&t)), &[], "r1", 0);
        assert_eq!(
            (failed_again.aborted, failed_again.taken),
            (true, true),
            "aborted after the retry"
        );
        let older = observe(&copy(Some(&token("r0", 1)), aborted(None), None), &[], "r1", 0);
        assert_eq!(older.asked, None, "a retry of another revision is not this one's");
    }

    /// The command cleared and the status not written: the member writing it now, or one that
    /// dropped the retry, which is what it is once that has lasted `LOST_AFTER`.
    #[test]
    fn a_retry_dropped_for_a_while_is_lost() {
        let t = token("r1", 1);
        let mut cleared = copy(Some(&t), Some((CanaryPhase::Aborted, None)), Some(&t));
        cleared
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(RETRY_ASKED_AT.into(), "2026-12-07T10:00:00Z".into());
        let asked = 1_796_637_600; // 2026-12-07T10:00:00Z
        let just = observe(&cleared, &[], "r1", asked + 5);
        assert_eq!((just.taken, just.lost), (false, false), "maybe writing its status");
        let later = observe(&cleared, &[], "r1", asked + LOST_AFTER);
        assert_eq!((later.taken, later.lost), (false, true), "dropped");
        let mut took = cleared.clone();
        took.status
            .as_mut()
            .and_then(|s| s.canary.as_mut())
            .expect("canary")
            .retry_token = Some(t.clone());
        assert!(
            !observe(&took, &[], "r1", asked + LOST_AFTER).lost,
            "taken, aborted again"
        );
    }

    fn with_command(mut pxd: ProxyDeployment, command: &str) -> ProxyDeployment {
        pxd.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(COMMAND_ANNOTATION.to_string(), command.to_string());
        pxd
    }

    /// A command someone sent (an abort, a pause) still pending on an aborted canary is never
    /// replaced by the retry: nothing is written, the member is asked on a later pass. A member
    /// whose fleet fails otherwise has nothing a retry restarts.
    #[tokio::test]
    async fn a_pending_command_is_never_replaced() {
        let (mock, mut handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let client = Client::new(mock, "default");
        let server = tokio::spawn(async move {
            assert!(handle.next_request().await.is_none(), "nothing written");
        });
        let aborted = copy(None, Some((CanaryPhase::Aborted, None)), None);
        let pending = ask(&client, &with_command(aborted, "abort"), &[], "1/r1", 0)
            .await
            .expect("read");
        assert_eq!(pending, Err(NotAsked::CommandPending("abort on edge".into())));
        let mut degraded = copy(None, None, None);
        degraded.status.get_or_insert_with(Default::default).conditions =
            vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: crate::conditions::DEGRADED.into(),
                status: "True".into(),
                reason: "SecretMissing".into(),
                message: "no Secret edge-tls".into(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ),
                observed_generation: None,
            }];
        let nothing = ask(&client, &degraded, &[], "1/r1", 0).await.expect("read");
        assert_eq!(nothing, Err(NotAsked::NothingToRetry));
        drop(client);
        server.await.expect("mock server");
    }

    /// Asked: the retry and its token to the version read, then the record; a canary already
    /// asked with the token is not asked again (only the record is written), unless it dropped
    /// the ask.
    #[tokio::test]
    async fn the_retry_goes_to_the_version_read_and_then_the_record() {
        let (mock, mut handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let client = Client::new(mock, "default");
        let server = tokio::spawn(async move {
            let mut bodies = Vec::new();
            while let Some((request, send)) = handle.next_request().await {
                let body = request.into_body().collect_bytes().await.expect("body");
                bodies.push(serde_json::from_slice::<serde_json::Value>(&body).expect("json"));
                let answer = serde_json::json!({
                    "apiVersion": "proxyfleet.io/v1alpha1", "kind": "ProxyDeployment",
                    "metadata": {"name": "edge", "namespace": "team-a"},
                    "spec": {"replicas": 1, "listeners": [], "routes": [], "upstreams": []},
                });
                let answer = kube::client::Body::from(serde_json::to_vec(&answer).expect("json"));
                send.send_response(http::Response::builder().status(200).body(answer).expect("response"));
            }
            bodies
        });
        let mut aborted = copy(None, Some((CanaryPhase::Aborted, None)), None);
        aborted.metadata.resource_version = Some("41".into());
        assert_eq!(ask(&client, &aborted, &[], "1/r1", 0).await.expect("asked"), Ok(()));
        let already = copy(None, Some((CanaryPhase::Aborted, None)), Some("1/r1"));
        let already = with_command(already, "retry");
        assert_eq!(ask(&client, &already, &[], "1/r1", 0).await.expect("asked"), Ok(()));
        let mut dropped = copy(Some("1/r1"), Some((CanaryPhase::Aborted, None)), Some("1/r1"));
        let at = (RETRY_ASKED_AT.to_string(), "1970-01-01T00:00:00Z".to_string());
        dropped
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .extend([at]);
        assert_eq!(
            ask(&client, &dropped, &[], "1/r1", 59).await.expect("asked"),
            Ok(()),
            "not yet"
        );
        assert_eq!(ask(&client, &dropped, &[], "1/r1", 60).await.expect("asked"), Ok(()));
        drop(client);
        let bodies = server.await.expect("mock server");
        let annotations = |i: usize| bodies[i]["metadata"]["annotations"].clone();
        assert_eq!(bodies.len(), 5, "{bodies:?}");
        assert_eq!(bodies[0]["metadata"]["resourceVersion"], "41");
        let retry =
            |at: &str| serde_json::json!({COMMAND_ANNOTATION: "retry", RETRY_TOKEN: "1/r1", RETRY_ASKED_AT: at});
        assert_eq!(annotations(0), retry("1970-01-01T00:00:00Z"));
        let record = serde_json::json!({WAVE_RETRY: "1/r1"});
        assert_eq!(annotations(1), record);
        assert_eq!(annotations(2), record, "only the record");
        assert_eq!(
            annotations(3),
            retry("1970-01-01T00:01:00Z"),
            "a dropped ask is asked again, once it has been a while"
        );
        assert_eq!(annotations(4), record);
    }

    /// The retries still pending are taken back: the command is removed only while it is still
    /// that retry (tested in the patch); a refused test (the member read it meanwhile) is no
    /// error; the retry to keep, and another command, get no write.
    #[tokio::test]
    async fn an_abort_takes_back_the_retries_still_pending() {
        let (mock, mut handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let client = Client::new(mock, "default");
        let server = tokio::spawn(async move {
            let mut bodies = Vec::new();
            let mut n = 0;
            while let Some((request, send)) = handle.next_request().await {
                n += 1;
                let body = request.into_body().collect_bytes().await.expect("body");
                bodies.push(serde_json::from_slice::<serde_json::Value>(&body).expect("json"));
                let (code, answer) = if n == 1 {
                    let ok = serde_json::json!({
                        "apiVersion": "proxyfleet.io/v1alpha1", "kind": "ProxyDeployment",
                        "metadata": {"name": "edge", "namespace": "team-a"},
                        "spec": {"replicas": 1, "listeners": [], "routes": [], "upstreams": []},
                    });
                    (200, ok)
                } else {
                    let refused = serde_json::json!({
                        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 422,
                        "reason": "Invalid", "message": "the test operation failed",
                    });
                    (422, refused)
                };
                let answer = kube::client::Body::from(serde_json::to_vec(&answer).expect("json"));
                send.send_response(http::Response::builder().status(code).body(answer).expect("response"));
            }
            bodies
        });
        let t = token("r1", 2);
        let pending = with_command(copy(Some(&t), Some((CanaryPhase::Aborted, None)), Some(&t)), "retry");
        assert_eq!(observe(&pending, &[], "r1", 0).pending, vec!["2/r1".to_string()]);
        withdraw(&client, &pending, &[], None).await.expect("taken back");
        withdraw(&client, &pending, &[], None)
            .await
            .expect("read meanwhile: no error");
        withdraw(&client, &pending, &[], Some("2/r1"))
            .await
            .expect("the current retry is kept");
        let other = with_command(copy(Some(&t), Some((CanaryPhase::Aborted, None)), Some(&t)), "abort");
        assert!(observe(&other, &[], "r1", 0).pending.is_empty());
        withdraw(&client, &other, &[], None)
            .await
            .expect("nothing to take back");
        drop(client);
        let bodies = server.await.expect("mock server");
        assert_eq!(bodies.len(), 2, "{bodies:?}");
        assert_eq!(
            bodies[0],
            serde_json::json!([
                {"op": "test", "path": "/metadata/annotations/proxyfleet.io~1command", "value": "retry"},
                {"op": "test", "path": "/metadata/annotations/proxyfleet.io~1retry-token", "value": "2/r1"},
                {"op": "remove", "path": "/metadata/annotations/proxyfleet.io~1command"},
            ])
        );
    }
}
