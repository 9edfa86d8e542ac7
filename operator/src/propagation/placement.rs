//! Pure placement decisions: which clusters a fleet goes to, and exactly what object each one
//! gets (the hub's spec, placement stripped, the cluster's overrides applied, ignored fields
//! left out).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::clusters::MemberCluster;
use super::spec::{ClusterOverride, JsonPatchOperation, PatchOp, Placement};
use crate::crd::ProxyDeploymentSpec;
use crate::labels;

/// Label on every propagated object: the uid of the hub ProxyDeployment it comes from. Only
/// objects carrying the uid of the fleet being reconciled are ever deleted.
pub const HUB_UID: &str = "proxyfleet.io/hub-uid";
/// Annotation: `namespace/name` of the hub object (for people reading the member).
pub const HUB_OBJECT: &str = "proxyfleet.io/hub";
/// Annotation: hash of what was applied; a different hash means the member is out of date.
pub const PROPAGATED_HASH: &str = "proxyfleet.io/propagated-hash";
/// Annotation: the deletion policy in force when the object was applied, honoured at clean-up
/// even after `placement` has been removed from the hub object.
pub const DELETION_POLICY: &str = "proxyfleet.io/deletion-policy";
/// Annotation on a member's CA Secret: the uid of the hub CA Secret it is a copy of. A CA
/// Secret in the member without it (the member's own CA, another hub's) is never overwritten.
pub const HUB_CA: &str = "proxyfleet.io/hub-ca";
/// Annotation: the hub revision (spec without placement) the copy carries; waves judge by it.
pub const HUB_REVISION: &str = "proxyfleet.io/hub-revision";
/// Field manager of every write to a member.
pub const FIELD_MANAGER: &str = "proxyfleet-propagation";

/// The clusters a placement selects.
#[derive(Debug, Default)]
pub struct Selection<'a> {
    pub targets: Vec<&'a MemberCluster>,
    /// Names listed in `placement.clusters` with no registered Secret.
    pub unknown: Vec<String>,
    /// Names listed in `placement.clusters` whose Secret does not admit the fleet's namespace.
    /// Clusters a selector matches but that do not admit it are left out silently: a tenant
    /// learns nothing about clusters that are not open to it.
    pub denied: Vec<String>,
}

/// A selector of `spec.placement` (`clusterSelector`, a wave's `clusterSelector`) is not one.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {source}")]
pub struct BadSelector {
    field: String,
    source: kube::core::ParseExpressionError,
}

fn parse_selector(s: &LabelSelector, field: impl FnOnce() -> String) -> Result<Selector, BadSelector> {
    Selector::try_from(s.clone()).map_err(|source| BadSelector { field: field(), source })
}

/// Each wave's selector, parsed: one that is not a selector is refused by `select`, so that its
/// clusters are not left to the last wave.
fn wave_selectors(placement: &Placement) -> Result<Vec<Option<Selector>>, BadSelector> {
    let field = |i: usize| move || format!("spec.placement.waves[{i}].clusterSelector");
    placement
        .waves
        .iter()
        .enumerate()
        .map(|(i, w)| {
            w.cluster_selector
                .as_ref()
                .map(|s| parse_selector(s, field(i)))
                .transpose()
        })
        .collect()
}

/// The clusters `placement` selects for a fleet in `namespace`: only clusters whose Secret
/// admits that namespace (`proxyfleet.io/allowed-namespaces`, deny by default).
pub fn select<'a>(
    placement: &Placement,
    namespace: &str,
    clusters: &'a [MemberCluster],
) -> Result<Selection<'a>, BadSelector> {
    let field = || "spec.placement.clusterSelector".to_string();
    let selector = placement
        .cluster_selector
        .as_ref()
        .map(|s| parse_selector(s, field))
        .transpose()?;
    wave_selectors(placement)?;
    let mut selection = Selection::default();
    for c in clusters {
        let named = placement.clusters.iter().any(|n| n == &c.name);
        if !(named || selector.as_ref().is_some_and(|s| s.matches(&c.labels))) {
            continue;
        }
        if c.admits(namespace) {
            selection.targets.push(c);
        } else if named {
            selection.denied.push(c.name.clone());
        }
    }
    for n in &placement.clusters {
        if !clusters.iter().any(|c| &c.name == n) {
            selection.unknown.push(n.clone());
        }
    }
    selection.targets.sort_by(|a, b| a.name.cmp(&b.name));
    selection.targets.dedup_by(|a, b| a.name == b.name);
    selection.denied.sort();
    selection.denied.dedup();
    Ok(selection)
}

/// Why the hub's object could not be made for a cluster: nothing is written anywhere then.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("spec.placement.overrides{} for cluster {cluster}: {problem}", index.map(|i| format!("[{i}]")).unwrap_or_default())]
pub struct OverrideError {
    /// The override at fault; `None` when only their combined result is invalid.
    pub index: Option<usize>,
    pub cluster: String,
    pub problem: String,
}

fn override_applies(o: &ClusterOverride, cluster: &MemberCluster) -> Result<bool, String> {
    if let Some(n) = &o.cluster_name {
        return Ok(n == &cluster.name);
    }
    match &o.cluster_selector {
        Some(sel) => Selector::try_from(sel.clone())
            .map(|s| s.matches(&cluster.labels))
            .map_err(|e| format!("its clusterSelector: {e}")),
        None => Ok(false),
    }
}

/// Paths an override may not touch: the placement itself would make members propagate further.
fn check_path(op: &JsonPatchOperation) -> Result<(), String> {
    if !op.path.starts_with("/spec/") {
        return Err(format!("patch path {:?} must start with /spec/", op.path));
    }
    if op.path == "/spec/placement" || op.path.starts_with("/spec/placement/") {
        return Err(format!("patch path {:?} may not change the placement", op.path));
    }
    if matches!(op.op, PatchOp::Add | PatchOp::Replace | PatchOp::Test) && op.value.is_none() {
        return Err(format!("patch {:?} {:?} needs a value", op.op, op.path));
    }
    Ok(())
}

fn to_rfc6902(ops: &[JsonPatchOperation]) -> Result<json_patch::Patch, String> {
    let raw: Vec<Value> = ops
        .iter()
        .map(|o| {
            let mut v = serde_json::json!({"op": o.op, "path": o.path});
            if let Some(value) = &o.value {
                v["value"] = value.clone();
            }
            v
        })
        .collect();
    serde_json::from_value(Value::Array(raw)).map_err(|e| format!("not a JSON patch: {e}"))
}

/// One override applied to `doc` when it matches `cluster`.
fn apply_override(doc: &mut Value, o: &ClusterOverride, cluster: &MemberCluster) -> Result<(), String> {
    if !override_applies(o, cluster)? {
        return Ok(());
    }
    o.patches.iter().try_for_each(check_path)?;
    let patch = to_rfc6902(&o.patches)?;
    json_patch::patch(doc, &patch).map_err(|e| e.to_string())
}

/// The hub revision of a spec: a hash of it without its placement (the same for every cluster;
/// overrides are the placement's, not the revision's).
pub fn spec_revision(spec: &ProxyDeploymentSpec) -> String {
    let mut v = serde_json::to_value(spec).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.remove("placement");
    }
    let bytes = serde_json::to_vec(&v).unwrap_or_default();
    Sha256::digest(&bytes)
        .iter()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The spec without its placement, as waves keep it for a rollback.
pub fn spec_without_placement(spec: &ProxyDeploymentSpec) -> Value {
    let mut v = serde_json::to_value(spec).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.remove("placement");
    }
    v
}

/// The waves of `placement` over `targets`: (name, batch limit) in order, and each target's
/// wave index. A target in no wave is in an implicit last wave `rest`.
pub fn assign_waves(placement: &Placement, targets: &[&MemberCluster]) -> (Vec<(String, Option<u32>)>, Vec<usize>) {
    let mut waves: Vec<(String, Option<u32>)> = placement
        .waves
        .iter()
        .enumerate()
        .map(|(i, w)| {
            (
                w.name.clone().unwrap_or_else(|| format!("wave-{i}")),
                w.max_unavailable_clusters,
            )
        })
        .collect();
    // `select` refused the placement if one is not a selector.
    let selectors = wave_selectors(placement).unwrap_or_default();
    let in_wave = |i: usize, c: &MemberCluster| {
        placement.waves[i].clusters.iter().any(|n| n == &c.name)
            || selectors
                .get(i)
                .and_then(Option::as_ref)
                .is_some_and(|s| s.matches(&c.labels))
    };
    let rest = waves.len();
    let index: Vec<usize> = targets
        .iter()
        .map(|c| (0..rest).find(|&i| in_wave(i, c)).unwrap_or(rest))
        .collect();
    if index.contains(&rest) {
        waves.push(("rest".into(), None));
    }
    (waves, index)
}

/// What one member cluster gets.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberObject {
    /// The object to server-side apply (apiVersion, kind, metadata, spec).
    pub object: Value,
    /// Hash of `object`: equal hashes mean nothing to apply.
    pub hash: String,
    /// The spec the cluster gets, overrides applied: what the platform's policy must allow.
    pub spec: ProxyDeploymentSpec,
    /// The hub namespace's Pod Security labels, given to the namespace when it is created in
    /// the member (set once the hub's policy allowed the object, `reconcile::allowed_for`).
    pub namespace_labels: std::collections::BTreeMap<String, String>,
}

/// The hub's object for `cluster`: placement stripped, matching overrides applied in order (all of
/// them or, on any error, none), `ignoreFields` left out so member-side values stand.
pub fn member_object(
    namespace: &str,
    name: &str,
    hub_uid: &str,
    spec: &ProxyDeploymentSpec,
    cluster: &MemberCluster,
) -> Result<MemberObject, OverrideError> {
    let placement = spec.placement.clone().unwrap_or_default();
    let mut doc = serde_json::json!({ "spec": spec });
    if let Some(s) = doc.get_mut("spec").and_then(Value::as_object_mut) {
        s.remove("placement");
    }
    let error = |index: Option<usize>, problem: String| OverrideError {
        index,
        cluster: cluster.name.clone(),
        problem,
    };
    for (i, o) in placement.overrides.iter().enumerate() {
        apply_override(&mut doc, o, cluster).map_err(|p| error(Some(i), p))?;
    }
    // The result must still be a valid spec (the member's admission checks the CEL rules too).
    let patched: ProxyDeploymentSpec = serde_json::from_value(doc["spec"].clone())
        .map_err(|e| error(None, format!("together they make an invalid spec: {e}")))?;
    let mut spec_value = serde_json::to_value(&patched).map_err(|e| error(None, e.to_string()))?;
    let mut ignored = Value::Null;
    for pointer in &placement.ignore_fields {
        remove_pointer(&mut spec_value, pointer.strip_prefix("/spec").unwrap_or(pointer));
        ignored = Value::Bool(true);
    }
    let hash = {
        let bytes = serde_json::to_vec(&(&spec_value, &ignored, &placement.deletion_policy, spec_revision(spec)))
            .unwrap_or_default();
        Sha256::digest(&bytes)
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let policy = format!("{:?}", placement.deletion_policy);
    let labels = BTreeMap::from([
        (labels::MANAGED_BY.to_string(), FIELD_MANAGER.to_string()),
        (HUB_UID.to_string(), hub_uid.to_string()),
    ]);
    let annotations = BTreeMap::from([
        (HUB_OBJECT.to_string(), format!("{namespace}/{name}")),
        (PROPAGATED_HASH.to_string(), hash.clone()),
        (HUB_REVISION.to_string(), spec_revision(spec)),
        (DELETION_POLICY.to_string(), policy),
    ]);
    let object = serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ProxyDeployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": spec_value,
    });
    Ok(MemberObject {
        object,
        hash,
        spec: patched,
        namespace_labels: Default::default(),
    })
}

fn remove_pointer(doc: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    let target = if parent.is_empty() {
        Some(doc)
    } else {
        doc.pointer_mut(parent)
    };
    match target {
        Some(Value::Object(m)) => {
            m.remove(&last);
        }
        Some(Value::Array(a)) => {
            if let Ok(i) = last.parse::<usize>() {
                if i < a.len() {
                    a.remove(i);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn cluster(name: &str, region: &str) -> MemberCluster {
        MemberCluster {
            name: name.into(),
            labels: BTreeMap::from([("region".to_string(), region.to_string())]),
            secret: format!("ns/{name}"),
            secret_version: "1".into(),
            kubeconfig: Err("unused".into()),
            allowed_namespaces: if name.starts_with("closed") {
                vec![]
            } else {
                vec!["team-a".into()]
            },
        }
    }

    fn spec(placement: Placement) -> ProxyDeploymentSpec {
        let mut s: ProxyDeploymentSpec = serde_json::from_value(serde_json::json!({
            "replicas": 2,
            "listeners": [],
            "routes": [{"name": "all", "upstream": "app"}],
            "upstreams": [{"name": "app", "endpoints": ["app.default.svc:8080"]}],
        }))
        .unwrap();
        s.placement = Some(placement);
        s
    }

    fn selector(k: &str, v: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some(BTreeMap::from([(k.to_string(), v.to_string())])),
            ..Default::default()
        }
    }

    fn replace(path: &str, value: Value) -> JsonPatchOperation {
        JsonPatchOperation {
            op: PatchOp::Replace,
            path: path.into(),
            value: Some(value),
        }
    }

    #[test]
    fn names_and_selector_are_united_and_unknown_names_reported() {
        let clusters = vec![cluster("eu-1", "eu"), cluster("eu-2", "eu"), cluster("us-1", "us")];
        let p = Placement {
            clusters: vec!["us-1".into(), "ap-9".into()],
            cluster_selector: Some(selector("region", "eu")),
            ..Default::default()
        };
        let s = select(&p, "team-a", &clusters).unwrap();
        let names: Vec<_> = s.targets.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["eu-1", "eu-2", "us-1"]);
        assert_eq!(s.unknown, ["ap-9"]);
        let none = select(&Placement::default(), "team-a", &clusters).unwrap();
        assert!(none.targets.is_empty());
    }

    #[test]
    fn a_wave_selector_that_is_not_one_is_refused_with_its_field() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
        let clusters = vec![cluster("eu-1", "eu"), cluster("us-1", "us")];
        let bad = |operator: &str, values: Option<Vec<String>>| Placement {
            cluster_selector: Some(LabelSelector::default()),
            waves: vec![
                super::super::spec::Wave::default(),
                super::super::spec::Wave {
                    cluster_selector: Some(LabelSelector {
                        match_expressions: Some(vec![LabelSelectorRequirement {
                            key: "tier".into(),
                            operator: operator.into(),
                            values,
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let canary = Some(vec!["canary".to_string()]);
        for p in [bad("in", canary.clone()), bad("Within", canary.clone())] {
            let Err(e) = select(&p, "team-a", &clusters) else {
                panic!("a wave whose selector is not one must not leave its clusters to the last wave");
            };
            assert!(
                e.to_string().starts_with("spec.placement.waves[1].clusterSelector: "),
                "{e}"
            );
        }
        assert!(select(&bad("In", canary), "team-a", &clusters).is_ok());
    }

    #[test]
    fn only_clusters_that_admit_the_namespace_are_selected() {
        let clusters = vec![
            cluster("eu-1", "eu"),
            cluster("closed-1", "eu"),
            cluster("closed-2", "us"),
        ];
        let everything = Placement {
            clusters: vec!["closed-2".into()],
            cluster_selector: Some(LabelSelector::default()),
            ..Default::default()
        };
        let s = select(&everything, "team-a", &clusters).unwrap();
        let names: Vec<_> = s.targets.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["eu-1"],
            "`clusterSelector: {{}}` selects only clusters open to team-a"
        );
        assert_eq!(
            s.denied,
            ["closed-2"],
            "a named cluster that refuses is reported; a matched one is not"
        );
        let other = select(&everything, "team-b", &clusters).unwrap();
        assert!(other.targets.is_empty(), "a namespace no cluster lists gets nothing");
    }

    #[test]
    fn member_object_is_the_hub_spec_plus_its_overrides() {
        let p = Placement {
            clusters: vec!["eu-1".into(), "us-1".into()],
            overrides: vec![ClusterOverride {
                cluster_name: None,
                cluster_selector: Some(selector("region", "us")),
                patches: vec![replace("/spec/replicas", serde_json::json!(5))],
            }],
            ..Default::default()
        };
        let s = spec(p);
        let eu = member_object("ns", "demo", "uid-1", &s, &cluster("eu-1", "eu")).unwrap();
        let us = member_object("ns", "demo", "uid-1", &s, &cluster("us-1", "us")).unwrap();
        assert_eq!(eu.object["spec"]["replicas"], 2);
        assert_eq!(us.object["spec"]["replicas"], 5);
        assert!(eu.object["spec"].get("placement").is_none());
        assert_ne!(eu.hash, us.hash);
        assert_eq!(us.object["metadata"]["labels"][HUB_UID], "uid-1");
        assert_eq!(us.object["metadata"]["annotations"][DELETION_POLICY], "Delete");
        // Same input, same hash: a resync applies nothing.
        assert_eq!(
            us,
            member_object("ns", "demo", "uid-1", &s, &cluster("us-1", "us")).unwrap()
        );
    }

    #[test]
    fn bad_overrides_are_refused_with_the_field_named() {
        let bad = |patches: Vec<JsonPatchOperation>| {
            let s = spec(Placement {
                overrides: vec![ClusterOverride {
                    cluster_name: Some("eu-1".into()),
                    cluster_selector: None,
                    patches,
                }],
                ..Default::default()
            });
            member_object("ns", "demo", "u", &s, &cluster("eu-1", "eu"))
                .unwrap_err()
                .to_string()
        };
        let e = bad(vec![replace("/spec/placement/clusters", serde_json::json!([]))]);
        assert!(e.contains("overrides[0]") && e.contains("placement"), "{e}");
        let e = bad(vec![replace("/spec/nonexistent/deep", serde_json::json!(1))]);
        assert!(e.contains("overrides[0]"), "{e}");
        let e = bad(vec![replace("/spec/replicas", serde_json::json!("many"))]);
        assert!(e.contains("invalid spec"), "{e}");
        let e = bad(vec![JsonPatchOperation {
            op: PatchOp::Add,
            path: "/spec/replicas".into(),
            value: None,
        }]);
        assert!(e.contains("needs a value"), "{e}");
    }

    #[test]
    fn ignored_fields_are_not_sent() {
        let s = spec(Placement {
            clusters: vec!["eu-1".into()],
            ignore_fields: vec!["/spec/replicas".into()],
            ..Default::default()
        });
        let o = member_object("ns", "demo", "u", &s, &cluster("eu-1", "eu")).unwrap();
        assert!(o.object["spec"].get("replicas").is_none());
        assert!(o.object["spec"].get("routes").is_some());
    }
}
