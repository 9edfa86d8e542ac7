//! Checks of the spec that admission cannot afford (CEL's cost budget has no bound for map
//! keys or Kubernetes' own maps): run before anything is applied, reported as
//! Degraded/InvalidSpec with the field named.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::crd::ProxyDeploymentSpec;

/// A spec that passed admission but cannot run; reported in status as Degraded/InvalidSpec.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

/// Kubernetes' quantity grammar: a signed decimal with an optional suffix (binary SI, decimal
/// SI or an exponent), as `resource.ParseQuantity` accepts.
pub fn is_quantity(q: &str) -> bool {
    let body = q.strip_prefix(['+', '-']).unwrap_or(q);
    let digits_end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(digits_end);
    let number_ok = !number.is_empty() && number != "." && number.matches('.').count() <= 1;
    let suffix_ok = match suffix {
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E" => true,
        s => s
            .strip_prefix(['e', 'E'])
            .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e))
            .is_some_and(|e| !e.is_empty() && e.chars().all(|c| c.is_ascii_digit())),
    };
    number_ok && suffix_ok
}

/// A label or annotation key: `[prefix/]name`, the prefix a DNS subdomain of at most 253
/// characters, the name at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends.
pub fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| p.len() <= 253 && p.split('.').all(is_dns_label));
    let name_ok = (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    prefix_ok && name_ok
}

fn is_dns_label(l: &str) -> bool {
    (1..=63).contains(&l.len())
        && l.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && l.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && l.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn is_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric())
            && v.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)))
}

fn check_quantities(field: &str, map: Option<&BTreeMap<String, Quantity>>, errors: &mut Vec<String>) {
    for (name, q) in map.into_iter().flatten() {
        if !is_quantity(&q.0) {
            errors.push(format!(
                "{field}.{name}: {:?} is not a quantity (e.g. 500m, 2, 256Mi)",
                q.0
            ));
        }
    }
}

/// Every problem of the pod-shaping fields, each naming its field.
pub fn check(spec: &ProxyDeploymentSpec) -> Result<(), SpecError> {
    let mut errors = Vec::new();
    if let Some(r) = &spec.resources {
        check_quantities("spec.resources.limits", r.limits.as_ref(), &mut errors);
        check_quantities("spec.resources.requests", r.requests.as_ref(), &mut errors);
    }
    if let Some(pod) = &spec.pod {
        for (k, v) in &pod.labels {
            if !is_qualified_name(k) {
                errors.push(format!("spec.pod.labels: key {k:?} is not a valid label key"));
            } else if !is_label_value(v) {
                errors.push(format!("spec.pod.labels.{k}: value {v:?} is not a valid label value"));
            }
        }
        for k in pod.annotations.keys().filter(|k| !is_qualified_name(k)) {
            errors.push(format!("spec.pod.annotations: key {k:?} is not a valid annotation key"));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(SpecError(errors.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_as_kubernetes_parses_them() {
        for ok in ["1", "500m", "0.5", "2Gi", "256Mi", "1e3", "1E-2", "+1", ".5", "100k"] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["lots", "", "1.2.3", "5 m", "1GB", "m", "1e", "Gi"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn label_keys_and_values() {
        for ok in ["team", "app.kubernetes.io/name", "a_b.c-d", "example.com/x"] {
            assert!(is_qualified_name(ok), "{ok}");
        }
        for bad in ["bad key!", "", "-x", "Example.com/x", "a/b/c!", &"x".repeat(64)] {
            assert!(!is_qualified_name(bad), "{bad}");
        }
        assert!(is_label_value("") && is_label_value("v1.2_a-b"));
        assert!(!is_label_value("bad value!") && !is_label_value("-x"));
    }

    #[test]
    fn every_problem_is_named() {
        let mut spec: ProxyDeploymentSpec = serde_json::from_value(serde_json::json!({
            "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP"}],
            "routes": [{"name": "all", "upstream": "app"}],
            "upstreams": [{"name": "app", "endpoints": ["10.0.0.1:80"]}],
            "resources": {"limits": {"cpu": "lots", "memory": "1Gi"}},
            "pod": {"labels": {"team": "bad value!"}, "annotations": {"ok": "x", "no way": "y"}},
        }))
        .unwrap();
        let msg = check(&spec).unwrap_err().0;
        assert!(msg.contains("spec.resources.limits.cpu: \"lots\""), "{msg}");
        assert!(msg.contains("spec.pod.labels.team: value \"bad value!\""), "{msg}");
        assert!(msg.contains("spec.pod.annotations: key \"no way\""), "{msg}");
        spec.resources = None;
        spec.pod = None;
        assert!(check(&spec).is_ok());
    }
}
