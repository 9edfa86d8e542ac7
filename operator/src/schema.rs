//! The CRD as the API server takes it: kube-derive's schema, made structural.

use kube::CustomResourceExt;
use serde_json::Value;

use crate::app::spec::AppRollout;
use crate::crd::ProxyDeployment;

/// `additionalProperties: false` (from `deny_unknown_fields` on the shared proxy config types) is
/// not allowed in a structural schema; the API server prunes and, with strict field
/// validation, reports unknown fields anyway.
///
/// Integers get the bounds of their Rust type where the field sets none: the API server stores
/// any int64 in a custom resource, and one object our types cannot decode would fail the
/// operator's list of its kind (every fleet, every namespace), not just that object.
fn make_structural(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if map.get("additionalProperties") == Some(&Value::Bool(false)) {
                map.remove("additionalProperties");
            }
            bound_integer(map);
            for (_, child) in map.iter_mut() {
                make_structural(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(make_structural),
        _ => {}
    }
}

/// The range of an integer schema's `format`, where it is narrower than the API server's int64.
fn format_range(format: &str) -> Option<(i64, i64)> {
    Some(match format {
        "int32" => (i32::MIN.into(), i32::MAX.into()),
        "uint32" => (0, u32::MAX.into()),
        "uint16" => (0, u16::MAX.into()),
        "uint8" => (0, u8::MAX.into()),
        "uint64" | "uint" => (0, i64::MAX),
        _ => return None,
    })
}

fn bound_integer(map: &mut serde_json::Map<String, Value>) {
    if map.get("type").and_then(Value::as_str) != Some("integer") {
        return;
    }
    let Some((low, high)) = map.get("format").and_then(Value::as_str).and_then(format_range) else {
        return;
    };
    let within = |v: Option<&Value>, keep: fn(f64, f64) -> bool, bound: i64| {
        v.and_then(Value::as_f64).filter(|&x| keep(x, bound as f64)).is_some()
    };
    if !within(map.get("minimum"), |x, b| x >= b, low) {
        map.insert("minimum".into(), Value::from(low as f64));
    }
    if high < i64::MAX && !within(map.get("maximum"), |x, b| x <= b, high) {
        map.insert("maximum".into(), Value::from(high as f64));
    }
}

type Crd = k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

fn structural<K: CustomResourceExt>() -> Crd {
    let crd = K::crd();
    let mut v = serde_json::to_value(&crd).unwrap_or(Value::Null);
    make_structural(&mut v);
    serde_json::from_value(v).unwrap_or(crd)
}

/// The CustomResourceDefinition of ProxyDeployment, exactly as checked in under crds/.
pub fn crd() -> Crd {
    structural::<ProxyDeployment>()
}

pub fn crd_yaml() -> String {
    serde_yaml::to_string(&crd()).unwrap_or_default()
}

/// The CustomResourceDefinition of AppRollout (crds/approllouts.proxyfleet.io.yaml).
pub fn app_crd_yaml() -> String {
    serde_yaml::to_string(&structural::<AppRollout>()).unwrap_or_default()
}

/// The CustomResourceDefinition of ProxyFleetPolicy (crds/proxyfleetpolicies.proxyfleet.io.yaml).
pub fn policy_crd_yaml() -> String {
    serde_yaml::to_string(&structural::<crate::policy::spec::ProxyFleetPolicy>()).unwrap_or_default()
}

/// Every spec field with its type and description, as a Markdown table (docs/crd-reference.md),
/// generated from the CRD schema so it never drifts.
pub fn reference_markdown() -> String {
    let mut out = String::from("# ProxyDeployment reference (proxyfleet.io/v1alpha1)\n\nGenerated from the CRD by `make crds`; do not edit.\n\n");
    out.push_str(&table(&crd()));
    out.push_str("\n# AppRollout reference (proxyfleet.io/v1alpha1)\n\nGray releases of the application behind a route (docs/app-rollouts.md).\n\n");
    out.push_str(&table(&structural::<AppRollout>()));
    out.push_str("\n# ProxyFleetPolicy reference (proxyfleet.io/v1alpha1, cluster-scoped)\n\nWhat fleets of the selected namespaces may do through the operator (docs/security.md).\n\n");
    out.push_str(&table(&structural::<crate::policy::spec::ProxyFleetPolicy>()));
    out
}

fn table(crd: &Crd) -> String {
    let crd = serde_json::to_value(crd).unwrap_or(Value::Null);
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut rows = Vec::new();
    walk("spec", schema, &mut rows);
    let mut out = String::from("| field | type | description |\n|---|---|---|\n");
    for (path, ty, desc) in rows {
        out.push_str(&format!(
            "| `{path}` | {ty} | {} |\n",
            desc.replace('\n', " ").replace('|', "\\|")
        ));
    }
    out
}

fn walk(path: &str, s: &Value, rows: &mut Vec<(String, String, String)>) {
    let ty = s["type"].as_str().unwrap_or("object").to_string();
    let mut ty_text = ty.clone();
    if let Some(v) = s["enum"].as_array() {
        ty_text = format!(
            "{ty}: {}",
            v.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    if let Some(d) = s.get("default") {
        ty_text.push_str(&format!(" (default `{d}`)"));
    }
    rows.push((
        path.to_string(),
        ty_text,
        s["description"].as_str().unwrap_or("").to_string(),
    ));
    // Kubernetes core types (affinity, tolerations, resources) are documented upstream.
    if path.contains(".affinity")
        || path.contains(".tolerations")
        || path.contains(".resources")
        || path.contains(".topologySpreadConstraints")
    {
        return;
    }
    if let Some(props) = s["properties"].as_object() {
        for (k, v) in props {
            walk(&format!("{path}.{k}"), v, rows);
        }
    }
    if ty == "array" {
        walk(&format!("{path}[]"), &s["items"], rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every integer of every CRD is bounded within its Rust type, so whatever the API server
    /// admits decodes.
    #[test]
    fn every_integer_is_bounded_by_its_type() {
        fn check(path: &str, v: &Value, unbounded: &mut Vec<String>) {
            match v {
                Value::Object(map) => {
                    let range = map.get("format").and_then(Value::as_str).and_then(format_range);
                    if let (Some("integer"), Some((low, high))) = (map.get("type").and_then(Value::as_str), range) {
                        let min = map.get("minimum").and_then(Value::as_f64);
                        let max = map.get("maximum").and_then(Value::as_f64);
                        let fits = min.is_some_and(|m| m >= low as f64)
                            && (high == i64::MAX || max.is_some_and(|m| m <= high as f64));
                        if !fits {
                            unbounded.push(path.to_string());
                        }
                    }
                    for (k, child) in map {
                        check(&format!("{path}.{k}"), child, unbounded);
                    }
                }
                Value::Array(items) => items.iter().for_each(|c| check(path, c, unbounded)),
                _ => {}
            }
        }
        let mut unbounded = Vec::new();
        for crd in [
            crd(),
            structural::<AppRollout>(),
            structural::<crate::policy::spec::ProxyFleetPolicy>(),
        ] {
            check(
                &crd.metadata.name.clone().unwrap_or_default(),
                &serde_json::to_value(&crd).unwrap(),
                &mut unbounded,
            );
        }
        assert!(unbounded.is_empty(), "{unbounded:#?}");
    }

    #[test]
    fn the_largest_admitted_integers_decode() {
        let fleet = serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "ProxyDeployment",
            "metadata": {"name": "big", "namespace": "team-a"},
            "spec": {
                "replicas": 2,
                "maxReplicas": i32::MAX,
                "listeners": [],
                "routes": [{"name": "all", "upstream": "app", "timeout": "300000h"}],
                "upstreams": [{"name": "app", "endpoints": ["app.default.svc:8080"]}],
                "limits": {"maxRequestsPerConnection": u32::MAX, "maxRequestBodyBytes": i64::MAX},
                "placement": {"waves": [{"maxUnavailableClusters": u32::MAX}]},
            },
        });
        let pxd: ProxyDeployment = serde_json::from_value(fleet).expect("decodes");
        assert_eq!(pxd.spec.routes[0].timeout.get().as_secs(), 1_000_000_000);
    }
}
