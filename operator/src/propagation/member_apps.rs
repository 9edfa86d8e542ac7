//! The I/O shell towards a member for a fleet's apps (see `apps`): read the app copies it
//! holds, bring them to the desired ones, release them. Only copies labelled with this hub
//! fleet's uid are ever written or deleted; an AppRollout or Deployment of the same name that
//! did not come from this fleet is never taken over.

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::Client;

use super::apps::{AppCopy, SeenApp, HUB_APP};
use super::member::{bounded, MemberError};
use super::placement::{DELETION_POLICY, FIELD_MANAGER, HUB_OBJECT, HUB_REVISION, HUB_UID, PROPAGATED_HASH};
use crate::app::spec::AppRollout;
use crate::labels;

fn ours(meta: &kube::api::ObjectMeta, hub_uid: &str) -> bool {
    meta.labels.as_ref().and_then(|l| l.get(HUB_UID)).map(String::as_str) == Some(hub_uid)
}

/// The app copies this fleet has in the member. A member without the AppRollout API holds
/// none. One whose credentials may not list AppRollouts holds none only if the fleet's status
/// never showed apps there (`had_apps`: we could not have written one); otherwise copies it
/// may still hold could be neither kept in step nor released, and that is an error, never
/// "none". Sending a member an app it may not hold fails with the member's own words.
pub async fn observe(
    client: &Client,
    namespace: &str,
    hub_uid: &str,
    had_apps: bool,
) -> Result<Vec<SeenApp>, MemberError> {
    let rollouts: Api<AppRollout> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(&format!("{HUB_UID}={hub_uid}"));
    let list = match bounded("listing the AppRollouts", rollouts.list(&params)).await {
        Ok(l) => l.items,
        Err(MemberError::Refused(m)) if m.contains("NotFound") => return Ok(Vec::new()),
        Err(MemberError::Refused(m)) if m.contains("Forbidden") && !had_apps => return Ok(Vec::new()),
        Err(MemberError::Refused(m)) if m.contains("Forbidden") => {
            return Err(MemberError::Refused(format!(
                "{m}; the fleet's status shows app copies there, which can be neither kept in step \
                 nor released until its credentials may list AppRollouts"
            )))
        }
        Err(e) => return Err(e),
    };
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let mut seen = Vec::with_capacity(list.len());
    for rollout in list {
        let found = bounded(
            "reading an app's Deployment",
            deployments.get_opt(&rollout.spec.workload_ref.name),
        )
        .await?;
        seen.push(SeenApp {
            deployment: found.filter(|d| ours(&d.metadata, hub_uid)),
            rollout,
        });
    }
    Ok(seen)
}

fn carries(meta: &kube::api::ObjectMeta, revision: &str) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(HUB_REVISION))
        .map(String::as_str)
        == Some(revision)
}

/// Refuses to write over an object of that name that is not this fleet's copy.
async fn not_foreign<K>(api: &Api<K>, name: &str, hub_uid: &str, what: &str) -> Result<(), MemberError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let found = bounded(&format!("reading {what} {name}"), api.get_metadata_opt(name)).await?;
    match found {
        Some(f) if !ours(&f.metadata, hub_uid) => Err(MemberError::Refused(format!(
            "{what} {name} exists there and was not propagated from this fleet; not taking it over"
        ))),
        _ => Ok(()),
    }
}

/// Brings one app: its Deployment first (the member's AppRollout reads it), then the AppRollout.
async fn apply_one(client: &Client, namespace: &str, hub_uid: &str, copy: &AppCopy) -> Result<SeenApp, MemberError> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let rollouts: Api<AppRollout> = Api::namespaced(client.clone(), namespace);
    not_foreign(&deployments, &copy.workload, hub_uid, "Deployment").await?;
    not_foreign(&rollouts, &copy.name, hub_uid, "AppRollout").await?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let deployment = bounded(
        "applying an app's Deployment",
        deployments.patch(&copy.workload, &params, &Patch::Apply(&copy.deployment)),
    )
    .await?;
    let rollout = bounded(
        "applying the AppRollout",
        rollouts.patch(&copy.name, &params, &Patch::Apply(&copy.rollout)),
    )
    .await?;
    Ok(SeenApp {
        rollout,
        deployment: Some(deployment),
    })
}

/// Brings the member's app copies to `desired`: applies what differs, leaves the `held` ones
/// as they are, deletes copies of apps the fleet no longer has. Returns the copies as they
/// stand after.
pub async fn bring(
    client: &Client,
    namespace: &str,
    hub_uid: &str,
    (desired, held): (&[AppCopy], &[String]),
    seen: Vec<SeenApp>,
) -> Result<Vec<SeenApp>, MemberError> {
    let mut out = Vec::with_capacity(desired.len());
    for copy in desired {
        let current = seen
            .iter()
            .find(|s| s.rollout.metadata.name.as_deref() == Some(copy.name.as_str()));
        let up_to_date = current.is_some_and(|s| {
            carries(&s.rollout.metadata, &copy.revision)
                && s.deployment
                    .as_ref()
                    .is_some_and(|d| carries(&d.metadata, &copy.revision))
        });
        match current {
            Some(s) if up_to_date => out.push(s.clone()),
            _ => out.push(apply_one(client, namespace, hub_uid, copy).await?),
        }
    }
    let name_of = |s: &SeenApp| s.rollout.metadata.name.clone().unwrap_or_default();
    let wanted = |name: &str| desired.iter().any(|d| d.name == name);
    out.extend(
        seen.iter()
            .filter(|s| held.contains(&name_of(s)) && !wanted(&name_of(s)))
            .cloned(),
    );
    for gone in seen.iter().filter(|s| {
        let name = name_of(s);
        !held.contains(&name) && !wanted(&name)
    }) {
        delete_one(client, namespace, gone).await?;
    }
    out.sort_by(|a, b| a.rollout.metadata.name.cmp(&b.rollout.metadata.name));
    Ok(out)
}

fn uid_precondition(meta: &kube::api::ObjectMeta) -> DeleteParams {
    DeleteParams {
        preconditions: meta.uid.clone().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    }
}

async fn delete_one(client: &Client, namespace: &str, app: &SeenApp) -> Result<(), MemberError> {
    let gone = |r: Result<(), MemberError>| match r {
        Err(MemberError::Refused(m)) if m.contains("NotFound") => Ok(()),
        other => other,
    };
    let rollouts: Api<AppRollout> = Api::namespaced(client.clone(), namespace);
    let name = app.rollout.metadata.name.clone().unwrap_or_default();
    gone(
        bounded(
            "deleting an AppRollout",
            rollouts.delete(&name, &uid_precondition(&app.rollout.metadata)),
        )
        .await
        .map(|_| ()),
    )?;
    if let Some(d) = &app.deployment {
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        let name = d.metadata.name.clone().unwrap_or_default();
        gone(
            bounded(
                "deleting an app's Deployment",
                deployments.delete(&name, &uid_precondition(&d.metadata)),
            )
            .await
            .map(|_| ()),
        )?;
    }
    Ok(())
}

/// Takes our marks off an app's copies: they stay, no longer ours (`deletionPolicy: Orphan`).
async fn orphan_one(client: &Client, namespace: &str, app: &SeenApp) -> Result<(), MemberError> {
    let patch = serde_json::json!({"metadata": {
        "labels": {HUB_UID: null, labels::MANAGED_BY: null},
        "annotations": {HUB_OBJECT: null, HUB_APP: null, HUB_REVISION: null, PROPAGATED_HASH: null, DELETION_POLICY: null},
    }});
    let rollouts: Api<AppRollout> = Api::namespaced(client.clone(), namespace);
    let name = app.rollout.metadata.name.clone().unwrap_or_default();
    bounded(
        "orphaning an AppRollout",
        rollouts.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await?;
    if let Some(d) = &app.deployment {
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        let name = d.metadata.name.clone().unwrap_or_default();
        bounded(
            "orphaning an app's Deployment",
            deployments.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await?;
    }
    Ok(())
}

/// Releases every app copy of this fleet in the member (deleted, or orphaned by the policy
/// recorded on it). Returns how many apps were released.
pub async fn release(client: &Client, namespace: &str, hub_uid: &str, had_apps: bool) -> Result<usize, MemberError> {
    let seen = observe(client, namespace, hub_uid, had_apps).await?;
    for app in &seen {
        let orphan = app
            .rollout
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DELETION_POLICY))
            .is_some_and(|p| p == "Orphan");
        if orphan {
            orphan_one(client, namespace, app).await?;
        } else {
            delete_one(client, namespace, app).await?;
        }
    }
    Ok(seen.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::client::Body;

    fn shop(revision_image: &str) -> AppCopy {
        let (r, d) = crate::propagation::apps::tests::hub_app(revision_image);
        crate::propagation::apps::copy(("team-a", "edge", "hub-uid", "Delete"), &r, &d).expect("copy")
    }

    fn respond(send: tower_test::mock::SendResponse<http::Response<Body>>, code: u16, body: serde_json::Value) {
        let body = Body::from(serde_json::to_vec(&body).expect("json"));
        send.send_response(http::Response::builder().status(code).body(body).expect("response"));
    }

    fn not_found() -> serde_json::Value {
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "not found",
            "reason": "NotFound", "code": 404})
    }

    /// Against a mocked member API server: a new app is written Deployment first, then its
    /// AppRollout; a copy of an app the fleet no longer has is deleted (with its uid as a
    /// precondition); an object of that name that is not ours is never written.
    #[tokio::test]
    async fn apps_are_written_deployment_first_removed_when_gone_and_never_taken_over() {
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let client = Client::new(mock, "default");
        let desired = shop("shop:v2");
        let (gone_r, gone_d) = (
            serde_json::from_value::<AppRollout>(shop("shop:v1").rollout).map(|mut r| {
                r.metadata.name = Some("old".into());
                r.metadata.uid = Some("uid-old".into());
                r
            }),
            serde_json::from_value::<Deployment>(shop("shop:v1").deployment).map(|mut d| {
                d.metadata.name = Some("old-shop".into());
                d.metadata.uid = Some("uid-old-shop".into());
                d
            }),
        );
        let seen = vec![SeenApp {
            rollout: gone_r.expect("rollout"),
            deployment: Some(gone_d.expect("deployment")),
        }];
        let (rollout, deployment) = (desired.rollout.clone(), desired.deployment.clone());
        let server = tokio::spawn(async move {
            let mut calls = Vec::new();
            for answer in [not_found(), not_found(), deployment, rollout] {
                let (request, send) = handle.next_request().await.expect("a request");
                calls.push(format!("{} {}", request.method(), request.uri().path()));
                respond(send, if answer["code"] == 404 { 404 } else { 200 }, answer);
            }
            for _ in 0..2 {
                let (request, send) = handle.next_request().await.expect("a delete");
                let (parts, body) = request.into_parts();
                let body = http_body_util::BodyExt::collect(body).await.expect("body").to_bytes();
                calls.push(format!(
                    "{} {} {}",
                    parts.method,
                    parts.uri.path(),
                    String::from_utf8_lossy(&body).contains("uid-old")
                ));
                respond(
                    send,
                    200,
                    serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}),
                );
            }
            // A foreign AppRollout of that name: read, and nothing written after.
            let (_, send) = handle.next_request().await.expect("deployment read");
            respond(send, 404, not_found());
            let (_, send) = handle.next_request().await.expect("rollout read");
            respond(
                send,
                200,
                serde_json::json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": {"name": "shop", "labels": {"team": "theirs"}}}),
            );
            calls
        });
        let out = bring(
            &client,
            "team-a",
            "hub-uid",
            (std::slice::from_ref(&desired), &[]),
            seen,
        )
        .await
        .expect("brought");
        assert_eq!(out.len(), 1);
        let refused = bring(
            &client,
            "team-a",
            "hub-uid",
            (std::slice::from_ref(&desired), &[]),
            Vec::new(),
        )
        .await
        .expect_err("a foreign AppRollout");
        assert!(
            matches!(&refused, MemberError::Refused(m) if m.contains("AppRollout shop exists there and was not propagated")),
            "{refused}"
        );
        let calls = server.await.expect("mock server");
        let base = "/namespaces/team-a";
        assert_eq!(
            calls,
            [
                format!("GET /apis/apps/v1{base}/deployments/shop"),
                format!("GET /apis/proxyfleet.io/v1alpha1{base}/approllouts/shop"),
                format!("PATCH /apis/apps/v1{base}/deployments/shop"),
                format!("PATCH /apis/proxyfleet.io/v1alpha1{base}/approllouts/shop"),
                format!("DELETE /apis/proxyfleet.io/v1alpha1{base}/approllouts/old true"),
                format!("DELETE /apis/apps/v1{base}/deployments/old-shop true"),
            ]
        );
    }

    /// An app whose Deployment is missing on the hub is held: its member copy is neither
    /// written nor deleted, and still reported.
    /// Credentials that may not list AppRollouts: a member never shown holding app copies holds
    /// none; one the status showed holding some is an error, so its copies are never taken for
    /// released (a deletion waits, then warns, instead of leaving them silently).
    #[tokio::test]
    async fn a_member_that_may_not_list_approllouts_holds_none_only_if_it_never_showed_any() {
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let client = Client::new(mock, "default");
        let server = tokio::spawn(async move {
            for _ in 0..3 {
                let (_, send) = handle.next_request().await.expect("a list");
                respond(
                    send,
                    403,
                    serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "approllouts is forbidden", "reason": "Forbidden", "code": 403}),
                );
            }
        });
        let never = observe(&client, "team-a", "hub-uid", false).await.expect("none");
        assert!(never.is_empty());
        let had = observe(&client, "team-a", "hub-uid", true)
            .await
            .expect_err("unknowable");
        assert!(
            matches!(&had, MemberError::Refused(m) if m.contains("Forbidden") && m.contains("neither kept in step nor released")),
            "{had}"
        );
        let released = release(&client, "team-a", "hub-uid", true).await;
        assert!(released.is_err(), "a release that cannot see the copies is not done");
        server.await.expect("mock server");
    }

    #[tokio::test]
    async fn a_held_app_is_left_as_it_is() {
        let (mock, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let client = Client::new(mock, "default");
        let copy = shop("shop:v1");
        let seen = vec![SeenApp {
            rollout: serde_json::from_value(copy.rollout).expect("rollout"),
            deployment: Some(serde_json::from_value(copy.deployment).expect("deployment")),
        }];
        let server = tokio::spawn(async move {
            assert!(handle.next_request().await.is_none(), "no request to the member");
        });
        let out = bring(&client, "team-a", "hub-uid", (&[], &["shop".to_string()]), seen)
            .await
            .expect("brought");
        assert_eq!(out.len(), 1, "still reported");
        drop(client);
        server.await.expect("mock server");
    }
}
