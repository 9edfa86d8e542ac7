//! Revision history: every revision that became stable is kept as an `apps/v1`
//! ControllerRevision (Kubernetes' own record for StatefulSet and DaemonSet history), owned by
//! its ProxyDeployment, so `kubectl proxyfleet undo` can go back to the previous stable
//! revision — or any kept one — by writing its pod-shaping fields back into the spec.
//!
//! The decisions (what to record, renumber, prune; what an undo writes) are pure functions;
//! [`record_stable`] is the thin shell that carries them out.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::Value;

use crate::crd::ProxyDeploymentSpec;
use crate::labels;
use crate::resources::Owner;

/// How many stable revisions are kept per ProxyDeployment (like a Deployment's
/// `revisionHistoryLimit`).
pub const HISTORY_LIMIT: usize = 10;

/// The spec fields a revision is made of: everything that shapes the pods. Not `replicas`
/// (scale is not a revision), not `strategy` (how to roll out is not what is rolled out), not
/// `service` or `placement` (where traffic comes from and which clusters run it).
pub const TEMPLATE_FIELDS: &[&str] = &[
    "image",
    "imagePullPolicy",
    "resources",
    "listeners",
    "routes",
    "upstreams",
    "limits",
    "drain",
    "connect",
    "forwarding",
    "tracing",
    "tls",
    "pod",
    "tuning",
];

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("{action} ControllerRevision {namespace}/{name}: {source}")]
    Api {
        action: &'static str,
        namespace: String,
        name: String,
        source: kube::Error,
    },
}

/// The kept record of one revision, as the decisions need it.
#[derive(Clone, Debug, PartialEq)]
pub struct Kept {
    pub name: String,
    pub revision_hash: String,
    pub number: i64,
}

impl Kept {
    pub fn of(cr: &ControllerRevision) -> Option<Self> {
        Some(Self {
            name: cr.metadata.name.clone()?,
            revision_hash: cr.metadata.labels.as_ref()?.get(labels::REVISION)?.clone(),
            number: cr.revision,
        })
    }
}

/// What to write so that `stable_hash` is the newest kept revision and at most `limit` stay.
#[derive(Debug, Default, PartialEq)]
pub struct HistoryPlan {
    /// Create a record of the stable revision with this number.
    pub create: Option<i64>,
    /// Renumber an existing record (a revision that became stable again).
    pub renumber: Option<(String, i64)>,
    /// Records beyond the limit, oldest first.
    pub prune: Vec<String>,
}

/// Pure: the plan for `kept` (this fleet's records) once `stable_hash` is stable.
pub fn plan(kept: &[Kept], stable_hash: &str, limit: usize) -> HistoryPlan {
    let newest = kept.iter().map(|k| k.number).max().unwrap_or(0);
    let mut out = HistoryPlan::default();
    let mut numbers: Vec<(i64, &str)> = Vec::new();
    match kept.iter().find(|k| k.revision_hash == stable_hash) {
        Some(k) if k.number == newest => {}
        Some(k) => {
            out.renumber = Some((k.name.clone(), newest + 1));
            numbers.push((newest + 1, &k.name));
        }
        None => out.create = Some(newest + 1),
    }
    for k in kept {
        if out.renumber.as_ref().is_some_and(|(n, _)| n == &k.name) {
            continue;
        }
        numbers.push((k.number, &k.name));
    }
    numbers.sort_by_key(|n| std::cmp::Reverse(n.0));
    let keep_existing = if out.create.is_some() {
        limit.saturating_sub(1)
    } else {
        limit
    };
    out.prune = numbers
        .iter()
        .skip(keep_existing)
        .rev()
        .map(|(_, n)| n.to_string())
        .collect();
    out
}

/// The record's name: the fleet's name and the revision hash.
pub fn record_name(fleet: &str, revision_hash: &str) -> String {
    format!("{fleet}-{revision_hash}")
}

/// The template fields of `spec` as JSON (absent fields are left out).
pub fn template_of(spec: &ProxyDeploymentSpec) -> Value {
    let full = serde_json::to_value(spec).unwrap_or(Value::Null);
    let mut out = serde_json::Map::new();
    for field in TEMPLATE_FIELDS {
        if let Some(v) = full.get(*field) {
            out.insert((*field).to_string(), v.clone());
        }
    }
    Value::Object(out)
}

/// Pure builder of the record of a stable revision.
pub fn record(owner: &Owner, spec: &ProxyDeploymentSpec, revision_hash: &str, number: i64) -> ControllerRevision {
    let mut meta = owner.meta(record_name(&owner.name, revision_hash));
    let mut l: BTreeMap<String, String> = meta.labels.take().unwrap_or_default();
    l.insert(labels::REVISION.to_string(), revision_hash.to_string());
    meta.labels = Some(l);
    ControllerRevision {
        metadata: meta,
        data: Some(RawExtension(
            serde_json::json!({ "spec": template_of(spec), "fields": TEMPLATE_FIELDS }),
        )),
        revision: number,
    }
}

/// The template fields a record was made of: its own list, or, for a record from before records
/// listed them, the fields a revision was made of then (without `forwarding` and `tracing`),
/// so an undo to it neither removes nor compares what it never recorded.
fn fields_of(record: &ControllerRevision) -> Vec<String> {
    let listed = record
        .data
        .as_ref()
        .and_then(|d| d.0.get("fields"))
        .and_then(Value::as_array);
    match listed {
        Some(f) => f.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
        None => TEMPLATE_FIELDS
            .iter()
            .filter(|f| !matches!(**f, "forwarding" | "tracing"))
            .map(|f| f.to_string())
            .collect(),
    }
}

/// Whether `record`'s template is `current`'s (a `template_of` value), on the fields it has.
fn same_template(record: &ControllerRevision, current: &Value) -> bool {
    let Some(kept) = record.data.as_ref().and_then(|d| d.0.get("spec")) else {
        return false;
    };
    fields_of(record).iter().all(|f| kept.get(f) == current.get(f))
}

/// Why an undo has nothing to go back to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UndoError {
    #[error("no kept revision {0}; `kubectl proxyfleet history NAME` lists them")]
    NoSuchRevision(i64),
    #[error("no earlier stable revision is kept to go back to")]
    NoEarlier,
    #[error("the kept revision {0} has no spec data")]
    NoSpecData(i64),
    #[error("the spec is already revision {0}'s; nothing to undo")]
    AlreadyThere(i64),
}

/// Pure: which record an undo goes back to. Without `to`, the newest record whose template is
/// not `current` (the spec's template, `template_of`): the revision before the one the spec
/// asks for, whether or not the operator has acted on the spec yet (a blocked or not yet seen
/// spec leaves the status naming the revision before it); with `to`, that record number.
pub fn undo_target<'a>(
    kept: &'a [ControllerRevision],
    current: &Value,
    to: Option<i64>,
) -> Result<&'a ControllerRevision, UndoError> {
    if let Some(n) = to {
        let target = kept
            .iter()
            .find(|c| c.revision == n)
            .ok_or(UndoError::NoSuchRevision(n))?;
        // A patch that changes nothing must not be reported as a rollback.
        return if same_template(target, current) {
            Err(UndoError::AlreadyThere(n))
        } else {
            Ok(target)
        };
    }
    let mut sorted: Vec<&ControllerRevision> = kept.iter().collect();
    sorted.sort_by_key(|c| std::cmp::Reverse(c.revision));
    sorted
        .into_iter()
        .find(|c| !same_template(c, current))
        .ok_or(UndoError::NoEarlier)
}

/// Pure: the JSON patch that writes `target`'s template fields back into `current` (the fleet
/// as read): each field the target set replaces the current one whole (a merge patch would keep
/// nested keys the target lacks, say a memory limit it never had), each it did not set is
/// removed, so the template equals that revision. It applies only to the spec read: its
/// `generation` is tested, which a status write (the operator's, every few seconds during a
/// rollout) leaves alone; a `resourceVersion` test failed on those with 422 (a fleet read
/// without a generation still tests its resourceVersion).
pub fn undo_patch(target: &ControllerRevision, current: &Value) -> Result<json_patch::Patch, UndoError> {
    let template = target
        .data
        .as_ref()
        .and_then(|d| d.0.get("spec"))
        .and_then(Value::as_object)
        .ok_or(UndoError::NoSpecData(target.revision))?;
    let mut ops = Vec::new();
    // The same object: one deleted and made again under the name starts its generations anew.
    if let Some(uid) = current.pointer("/metadata/uid") {
        ops.push(serde_json::json!({"op": "test", "path": "/metadata/uid", "value": uid}));
    }
    if let Some(generation) = current.pointer("/metadata/generation") {
        ops.push(serde_json::json!({"op": "test", "path": "/metadata/generation", "value": generation}));
    } else if let Some(rv) = current.pointer("/metadata/resourceVersion") {
        ops.push(serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}));
    }
    for field in fields_of(target) {
        let path = format!("/spec/{field}");
        match template.get(&field) {
            Some(v) => ops.push(serde_json::json!({"op": "add", "path": path, "value": v})),
            None if current.pointer(&path).is_some() => ops.push(serde_json::json!({"op": "remove", "path": path})),
            None => {}
        }
    }
    serde_json::from_value(Value::Array(ops)).map_err(|_| UndoError::NoSpecData(target.revision))
}

/// Records `stable_hash` as the newest stable revision of the fleet, and prunes beyond the
/// limit. Writes only when something changes; reads the cache, not the API server.
pub async fn record_stable(
    ctx: &crate::context::Context,
    owner: &Owner,
    spec: &ProxyDeploymentSpec,
    stable_hash: &str,
) -> Result<(), HistoryError> {
    let s = &ctx.stores;
    let ours: Vec<Kept> = s
        .by_owner
        .revisions
        .owned(&s.revisions, &owner.namespace, &owner.reference.uid)
        .iter()
        .filter_map(|c| Kept::of(c))
        .collect();
    let plan = plan(&ours, stable_hash, HISTORY_LIMIT);
    if plan == HistoryPlan::default() {
        return Ok(());
    }
    let api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let err = |action: &'static str, name: &str| {
        let namespace = owner.namespace.clone();
        let name = name.to_string();
        move |source| HistoryError::Api {
            action,
            namespace,
            name,
            source,
        }
    };
    if let Some(number) = plan.create {
        let cr = record(owner, spec, stable_hash, number);
        let name = record_name(&owner.name, stable_hash);
        match api.create(&PostParams::default(), &cr).await {
            Ok(_) => ctx.metrics.api_write("ControllerRevision", "create"),
            // Our cache lags our own write: the record is there.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(err("creating", &name)(e)),
        }
        tracing::info!(revision = %stable_hash, number, "recorded stable revision");
    }
    if let Some((name, number)) = &plan.renumber {
        let patch = serde_json::json!({ "revision": number });
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(err("renumbering", name))?;
        ctx.metrics.api_write("ControllerRevision", "patch");
    }
    for name in &plan.prune {
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => ctx.metrics.api_write("ControllerRevision", "delete"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(err("pruning", name)(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(name: &str, hash: &str, number: i64) -> Kept {
        Kept {
            name: name.into(),
            revision_hash: hash.into(),
            number,
        }
    }

    #[test]
    fn the_first_stable_revision_is_number_one() {
        assert_eq!(
            plan(&[], "aaaa", 10),
            HistoryPlan {
                create: Some(1),
                ..Default::default()
            }
        );
    }

    #[test]
    fn the_newest_record_of_the_stable_revision_means_nothing_to_do() {
        let k = [kept("web-aaaa", "aaaa", 1), kept("web-bbbb", "bbbb", 2)];
        assert_eq!(plan(&k, "bbbb", 10), HistoryPlan::default());
    }

    #[test]
    fn a_revision_stable_again_is_renumbered_not_duplicated() {
        let k = [kept("web-aaaa", "aaaa", 1), kept("web-bbbb", "bbbb", 2)];
        let p = plan(&k, "aaaa", 10);
        assert_eq!(p.create, None);
        assert_eq!(p.renumber, Some(("web-aaaa".into(), 3)));
        assert!(p.prune.is_empty());
    }

    #[test]
    fn prunes_the_oldest_beyond_the_limit() {
        let k: Vec<Kept> = (1..=3)
            .map(|n| kept(&format!("web-{n}"), &format!("h{n}"), n))
            .collect();
        let p = plan(&k, "new", 3);
        assert_eq!(p.create, Some(4));
        assert_eq!(p.prune, vec!["web-1".to_string()]);
        let p = plan(&k, "h1", 2);
        assert_eq!(p.renumber, Some(("web-1".into(), 4)));
        assert_eq!(p.prune, vec!["web-2".to_string()]);
    }

    fn cr(hash: &str, number: i64, image: Option<&str>) -> ControllerRevision {
        let mut spec = serde_json::Map::new();
        if let Some(i) = image {
            spec.insert("image".into(), Value::String(i.into()));
        }
        spec.insert("routes".into(), serde_json::json!([]));
        ControllerRevision {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("web-{hash}")),
                labels: Some(BTreeMap::from([(labels::REVISION.to_string(), hash.to_string())])),
                ..Default::default()
            },
            data: Some(RawExtension(
                serde_json::json!({ "spec": spec, "fields": TEMPLATE_FIELDS }),
            )),
            revision: number,
        }
    }

    #[test]
    fn undo_goes_to_the_newest_other_revision_or_the_one_asked_for() {
        let kept = [cr("aaaa", 1, Some("a")), cr("bbbb", 2, Some("b")), cr("cccc", 3, None)];
        let template = |image: Option<&str>| {
            let data = cr("x", 0, image).data.unwrap().0;
            data["spec"].clone()
        };
        assert_eq!(undo_target(&kept, &template(None), None).unwrap().revision, 2);
        // A spec not yet stable (aborted, blocked, or not acted on yet): undo goes to the
        // newest record, the revision before it, whatever the status names.
        assert_eq!(undo_target(&kept, &template(Some("d")), None).unwrap().revision, 3);
        assert_eq!(undo_target(&kept, &template(None), Some(1)).unwrap().revision, 1);
        assert_eq!(
            undo_target(&kept, &template(None), Some(3)).unwrap_err(),
            UndoError::AlreadyThere(3),
            "the revision the spec already is"
        );
        assert_eq!(
            undo_target(&kept, &template(None), Some(9)).unwrap_err(),
            UndoError::NoSuchRevision(9)
        );
        assert!(undo_target(&kept[..1], &template(Some("a")), None).is_err());
    }

    #[test]
    fn undo_restores_the_template_exactly_and_clears_what_it_did_not_set() {
        // The fleet now: an image, a memory limit and tracing the kept revision never had.
        let current = serde_json::json!({
            "metadata": {"name": "web", "resourceVersion": "42", "generation": 5, "uid": "u1"},
            "spec": {"replicas": 3, "image": "b", "routes": [{"name": "r"}],
                     "resources": {"limits": {"memory": "128Mi"}}, "tracing": {"sampleRatio": 1.0},
                     "strategy": {"canary": {"steps": []}}},
        });
        let mut target = cr("aaaa", 1, None);
        target.data.as_mut().unwrap().0["spec"]["resources"] = serde_json::json!({"requests": {"cpu": "100m"}});
        let patch = undo_patch(&target, &current).unwrap();
        let mut undone = current.clone();
        json_patch::patch(&mut undone, &patch).unwrap();
        assert_eq!(
            undone["spec"],
            serde_json::json!({"replicas": 3, "routes": [], "resources": {"requests": {"cpu": "100m"}},
                               "strategy": {"canary": {"steps": []}}}),
            "only the template changed, and it is the kept revision's"
        );
        // Only to the spec read: a status write since is no conflict, a spec change is.
        let mut status_written = current.clone();
        status_written["metadata"]["resourceVersion"] = "43".into();
        assert!(json_patch::patch(&mut status_written, &patch).is_ok());
        let mut moved_on = current.clone();
        moved_on["metadata"]["generation"] = 6.into();
        assert!(json_patch::patch(&mut moved_on, &patch).is_err());
        let mut made_again = current.clone();
        made_again["metadata"]["uid"] = "u2".into();
        assert!(json_patch::patch(&mut made_again, &patch).is_err());
        let patch = undo_patch(&cr("bbbb", 2, Some("b2")), &current).unwrap();
        let mut undone = current.clone();
        json_patch::patch(&mut undone, &patch).unwrap();
        assert_eq!(undone["spec"]["image"], "b2");
    }

    /// A record from before `forwarding` and `tracing` were template fields neither removes them
    /// nor counts as another template for lacking them.
    #[test]
    fn a_record_from_before_forwarding_and_tracing_leaves_them_alone() {
        let mut legacy = cr("aaaa", 1, Some("a"));
        legacy
            .data
            .as_mut()
            .unwrap()
            .0
            .as_object_mut()
            .unwrap()
            .remove("fields");
        let current = serde_json::json!({
            "metadata": {"resourceVersion": "7"},
            "spec": {"image": "a", "routes": [], "tracing": {"sampleRatio": 1.0}},
        });
        assert!(
            same_template(&legacy, &current["spec"]),
            "the same revision, tracing aside"
        );
        let patch = undo_patch(&legacy, &current).unwrap();
        let mut undone = current.clone();
        json_patch::patch(&mut undone, &patch).unwrap();
        assert_eq!(undone["spec"]["tracing"], current["spec"]["tracing"]);
        // A record that lists its fields restores all of them.
        let listed = cr("bbbb", 2, Some("a"));
        assert!(!same_template(&listed, &current["spec"]));
        let patch = undo_patch(&listed, &current).unwrap();
        let mut undone = current.clone();
        json_patch::patch(&mut undone, &patch).unwrap();
        assert!(undone["spec"].get("tracing").is_none());
    }

    /// Every spec field is either part of a revision (so undo restores it) or named here as not:
    /// a new field cannot be left out of undo by forgetting this list.
    #[test]
    fn every_spec_field_is_in_the_template_or_known_not_to_be() {
        use kube::CustomResourceExt;
        let crd = crate::crd::ProxyDeployment::crd();
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let fields = schema["openAPIV3Schema"]["properties"]["spec"]["properties"]
            .as_object()
            .unwrap();
        let not_template = ["replicas", "service", "strategy", "progressDeadline", "placement"];
        for f in fields.keys() {
            assert!(
                TEMPLATE_FIELDS.contains(&f.as_str()) != not_template.contains(&f.as_str()),
                "spec.{f}: in TEMPLATE_FIELDS or the list of fields a revision is not made of, exactly one"
            );
        }
    }

    #[test]
    fn template_leaves_out_scale_strategy_and_placement() {
        let spec: ProxyDeploymentSpec = serde_json::from_value(serde_json::json!({
            "replicas": 3,
            "listeners": [], "routes": [], "upstreams": [],
            "image": "proxy:1",
        }))
        .unwrap();
        let t = template_of(&spec);
        assert_eq!(t["image"], "proxy:1");
        assert!(t.get("replicas").is_none());
    }
}
