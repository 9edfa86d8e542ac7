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
//! and an abort without the token. Seen so for `LOST_AFTER` after the ask (the member writes
//! that status right after clearing the command), it is asked again; the canary takes a token
//! once (`canary::machine`), so an ask that crosses its status write restarts nothing twice.

use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::apps::{self, SeenApp};
use super::member::{bounded, MemberError};
use super::status;
use super::waves::{Progress, Retry};
use crate::app::spec::AppRollout;
use crate::canary::rollout::{COMMAND_ANNOTATION, RETRY_TOKEN};
use crate::canary::spec::{CanaryPhase, CanaryStatus};
use crate::crd::ProxyDeployment;

/// Annotation on a member's fleet copy: the token of the last retry the hub asked there.
pub const WAVE_RETRY: &str = "proxyfleet.io/wave-retry";
/// Annotation beside it: when it was asked (RFC 3339).
pub const WAVE_RETRY_AT: &str = "proxyfleet.io/wave-retry-at";
/// How long a dropped retry is left before it is asked again.
pub const LOST_AFTER: i64 = 60;
const FIELD_MANAGER: &str = "proxyfleet-wave-retry";

/// The token of the retry `serial` (`WaveStatus::retry_serial`) of the rollout of `revision`.
pub fn token(revision: &str, serial: u32) -> String {
    format!("{serial}/{revision}")
}

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

/// The canary of `meta` was asked with `token`, its command is gone, and it is still aborted
/// without the token in its status: the member dropped the retry (or is writing the status).
fn dropped(meta: &ObjectMeta, canary: Option<&CanaryStatus>, token: &str) -> bool {
    annotation(meta, RETRY_TOKEN) == Some(token)
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

fn asked_at(copy: &ProxyDeployment) -> Option<i64> {
    let at = annotation(&copy.metadata, WAVE_RETRY_AT)?;
    chrono::DateTime::parse_from_rfc3339(at).ok().map(|d| d.timestamp())
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
        lost: false,
    };
    let overdue = asked_at(copy).is_none_or(|at| now - at >= LOST_AFTER);
    for (meta, canary) in canaries(copy, apps) {
        // Taken: restarted (no longer aborted), or aborted again after recording the token.
        // Aborted without the token is the retry not taken yet (the member clears the command
        // before it writes the status).
        let asked_here = asked_token.is_some() && annotation(meta, RETRY_TOKEN) == asked_token;
        if asked_here && aborted(canary) && canary.and_then(|c| c.retry_token.as_deref()) != asked_token {
            retry.taken = false;
        }
        if let Some(token) = asked_token.filter(|_| overdue) {
            retry.lost |= dropped(meta, canary, token);
        }
    }
    retry
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

/// Asks every aborted canary of the member to retry, with `token` (those already asked with it
/// are not asked again, unless they dropped it); then records on the fleet's copy that it was
/// asked, and when (`now`, seconds). Each ask goes to
/// the version read, and none replaces a pending command: the member is then asked on a later
/// pass. A failure leaves the record unwritten, so the next pass asks what is left.
pub async fn ask(
    client: &Client,
    copy: &ProxyDeployment,
    apps: &[SeenApp],
    token: &str,
    now: i64,
) -> Result<Result<(), NotAsked>, MemberError> {
    let Some((fleet, apps)) = retriable(copy, apps) else {
        return Ok(Err(NotAsked::NothingToRetry));
    };
    let unasked = |m: &ObjectMeta, c| annotation(m, RETRY_TOKEN) != Some(token) || dropped(m, c, token);
    let fleet_meta = Some(&copy.metadata).filter(|m| fleet && unasked(m, fleet_canary(copy)));
    let app_metas: Vec<&ObjectMeta> = apps
        .iter()
        .filter(|a| unasked(&a.rollout.metadata, app_canary(a)))
        .map(|a| &a.rollout.metadata)
        .collect();
    let pending = fleet_meta.iter().chain(&app_metas).find_map(|m| {
        let command = annotation(m, COMMAND_ANNOTATION)?;
        Some(format!("{command} on {}", m.name.as_deref().unwrap_or_default()))
    });
    if let Some(p) = pending {
        return Ok(Err(NotAsked::CommandPending(p)));
    }
    let namespace = copy.metadata.namespace.as_deref().unwrap_or_default();
    let asked = async {
        if let Some(meta) = fleet_meta {
            patch::<ProxyDeployment>(
                client,
                namespace,
                meta,
                Ask::Retry(token),
                "asking the fleet's canary to retry",
            )
            .await?;
        }
        for meta in app_metas {
            patch::<AppRollout>(
                client,
                namespace,
                meta,
                Ask::Retry(token),
                "asking an app's canary to retry",
            )
            .await?;
        }
        patch::<ProxyDeployment>(
            client,
            namespace,
            &copy.metadata,
            Ask::Record(token, now),
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
    /// The retry command and its token, to the version read.
    Retry(&'a str),
    /// The record of the token asked (`WAVE_RETRY`) and when (`WAVE_RETRY_AT`), on the fleet's
    /// copy.
    Record(&'a str, i64),
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
        Ask::Retry(token) => serde_json::json!({"metadata": {
            "resourceVersion": meta.resource_version,
            "annotations": {COMMAND_ANNOTATION: "retry", RETRY_TOKEN: token},
        }}),
        Ask::Record(token, now) => {
            let at = chrono::DateTime::from_timestamp(now, 0)
                .unwrap_or_default()
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            serde_json::json!({"metadata": {"annotations": {WAVE_RETRY: token, WAVE_RETRY_AT: at}}})
        }
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
                lost: false
            }
        );
        let pending = observe(
            &with_command(copy(Some(&t), aborted(None), Some(&t)), "retry"),
            &[],
            "r1",
            0,
        );
        assert_eq!((pending.asked, pending.taken, pending.lost), (Some(1), false, false));
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
            .insert(WAVE_RETRY_AT.into(), "2026-12-07T10:00:00Z".into());
        let asked = 1_796_637_600; // 2026-12-07T10:00:00Z
        let just = observe(&cleared, &[], "r1", asked + 5);
        assert_eq!((just.taken, just.lost), (false, false), "maybe writing its status");
        let later = observe(&cleared, &[], "r1", asked + LOST_AFTER);
        assert_eq!((later.taken, later.lost), (false, true), "dropped");
        let took = copy(Some(&t), Some((CanaryPhase::Aborted, Some(&t))), Some(&t));
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
        let dropped = copy(None, Some((CanaryPhase::Aborted, None)), Some("1/r1"));
        assert_eq!(ask(&client, &dropped, &[], "1/r1", 60).await.expect("asked"), Ok(()));
        drop(client);
        let bodies = server.await.expect("mock server");
        let annotations = |i: usize| bodies[i]["metadata"]["annotations"].clone();
        assert_eq!(bodies.len(), 5, "{bodies:?}");
        assert_eq!(bodies[0]["metadata"]["resourceVersion"], "41");
        assert_eq!(
            annotations(0),
            serde_json::json!({COMMAND_ANNOTATION: "retry", RETRY_TOKEN: "1/r1"})
        );
        let record = |at: &str| serde_json::json!({WAVE_RETRY: "1/r1", WAVE_RETRY_AT: at});
        assert_eq!(annotations(1), record("1970-01-01T00:00:00Z"));
        assert_eq!(annotations(2), record("1970-01-01T00:00:00Z"), "only the record");
        assert_eq!(
            annotations(3),
            serde_json::json!({COMMAND_ANNOTATION: "retry", RETRY_TOKEN: "1/r1"}),
            "a dropped ask is asked again"
        );
        assert_eq!(annotations(4), record("1970-01-01T00:01:00Z"));
    }
}
