//! The CRD as the API server takes it: kube-derive's schema, made structural.

use kube::CustomResourceExt;
use serde_json::Value;

use crate::app::spec::AppRollout;
use crate::crd::ProxyDeployment;

/// `additionalProperties: false` (from `deny_unknown_fields` on the shared proxy config types) is
/// not allowed in a structural schema; the API server prunes and, with strict field
/// validation, reports unknown fields anyway.
fn make_structural(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if map.get("additionalProperties") == Some(&Value::Bool(false)) {
                map.remove("additionalProperties");
            }
            for (_, child) in map.iter_mut() {
                make_structural(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(make_structural),
        _ => {}
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
