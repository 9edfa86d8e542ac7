//! The CRD as the API server takes it: kube-derive's schema, made structural.

use kube::CustomResourceExt;
use schemars::{json_schema, Schema, SchemaGenerator};
use serde_json::Value;

use crate::crd::ProxyDeployment;

/// Any JSON value (a JSON patch's `value`).
pub fn any_value(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}

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

/// The CustomResourceDefinition of ProxyDeployment, exactly as checked in under crds/.
pub fn crd() -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    let crd = ProxyDeployment::crd();
    let mut v = serde_json::to_value(&crd).unwrap_or(Value::Null);
    make_structural(&mut v);
    serde_json::from_value(v).unwrap_or(crd)
}

pub fn crd_yaml() -> String {
    serde_yaml::to_string(&crd()).unwrap_or_default()
}
