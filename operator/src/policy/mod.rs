//! Platform policy (ProxyFleetPolicy): enforced before anything of a fleet is applied, and
//! at admission by the chart's ValidatingAdmissionPolicy where CEL can express it.

pub mod check;
pub mod spec;

use std::collections::BTreeMap;

use kube::runtime::reflector::{ObjectRef, Store};

use std::sync::Arc;

use crate::canary::spec::CanaryStrategy;
use crate::crd::ProxyDeploymentSpec;
use check::Violation;
use spec::ProxyFleetPolicy;

/// Why a fleet may not be applied as written, as (reason, message) for its status.
pub fn refusal(
    policies: &Store<ProxyFleetPolicy>,
    namespaces: &Namespaces,
    namespace: &str,
    spec: &ProxyDeploymentSpec,
    default_image: &str,
) -> Option<(String, String)> {
    judged(policies, namespaces, namespace, |governing| {
        check::violations(spec, governing, default_image)
    })
}

/// Why an AppRollout's canary strategy may not run as written (the Prometheus its analyses
/// would have the operator query), as (reason, message) for its status.
pub fn app_refusal(
    policies: &Store<ProxyFleetPolicy>,
    namespaces: &Namespaces,
    namespace: &str,
    strategy: &CanaryStrategy,
) -> Option<(String, String)> {
    judged(policies, namespaces, namespace, |governing| {
        check::strategy_violations(strategy, governing)
    })
}

/// What `judge` finds against the policies governing `namespace`, as a refusal.
fn judged(
    policies: &Store<ProxyFleetPolicy>,
    namespaces: &Namespaces,
    namespace: &str,
    judge: impl FnOnce(&[&ProxyFleetPolicy]) -> Vec<Violation>,
) -> Option<(String, String)> {
    let governing = match governing_in(policies, namespaces, namespace) {
        Ok(g) => g,
        Err(unknown) => return Some(unknown),
    };
    let governing: Vec<&ProxyFleetPolicy> = governing.iter().map(|p| p.as_ref()).collect();
    as_refusal(judge(&governing))
}

type Namespaces = Store<kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Namespace>>;

/// The policies governing `namespace`; without its labels, when some policy selects by them,
/// they are unknown (fail closed).
fn governing_in(
    policies: &Store<ProxyFleetPolicy>,
    namespaces: &Namespaces,
    namespace: &str,
) -> Result<Vec<Arc<ProxyFleetPolicy>>, (String, String)> {
    let all = policies.state();
    if all.is_empty() {
        return Ok(Vec::new());
    }
    let labels: BTreeMap<String, String> = match namespaces.get(&ObjectRef::new(namespace)) {
        Some(ns) => ns.metadata.labels.clone().unwrap_or_default(),
        None if all.iter().any(|p| p.spec.namespace_selector.is_some()) => {
            return Err((
                "PolicyUnavailable".into(),
                format!("namespace {namespace} is not in the cache yet; its policies cannot be evaluated"),
            ))
        }
        None => BTreeMap::new(),
    };
    Ok(all.into_iter().filter(|p| check::governs(p, &labels)).collect())
}

fn as_refusal(violations: Vec<Violation>) -> Option<(String, String)> {
    if violations.is_empty() {
        return None;
    }
    let message = violations
        .iter()
        .map(Violation::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    Some(("PolicyViolation".into(), message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Namespace;
    use kube::core::PartialObjectMeta;
    use kube::runtime::{reflector, watcher};

    fn spec(replicas: i32) -> ProxyDeploymentSpec {
        serde_json::from_value(serde_json::json!({
            "replicas": replicas, "listeners": [], "routes": [{"name": "all", "upstream": "app"}],
            "upstreams": [{"name": "app", "endpoints": ["app:8080"]}],
        }))
        .expect("a spec")
    }

    #[test]
    fn no_policy_allows_a_governed_namespace_is_refused_an_uncached_one_fails_closed() {
        let (policies, mut pw) = reflector::store::<ProxyFleetPolicy>();
        let (namespaces, mut nw) = reflector::store::<PartialObjectMeta<Namespace>>();
        assert_eq!(
            refusal(&policies, &namespaces, "team-a", &spec(9), "img"),
            None,
            "no policy, no limits"
        );
        let policy: spec::ProxyFleetPolicySpec = serde_json::from_value(serde_json::json!({
            "namespaceSelector": {"matchLabels": {"tenant": "true"}}, "maxReplicas": 2,
        }))
        .expect("a policy");
        pw.apply_watcher_event(&watcher::Event::Apply(ProxyFleetPolicy::new("tenants", policy)));
        let refused = refusal(&policies, &namespaces, "team-a", &spec(9), "img").expect("fails closed");
        assert_eq!(refused.0, "PolicyUnavailable");
        let mut ns: PartialObjectMeta<Namespace> = PartialObjectMeta::default();
        ns.metadata.name = Some("team-a".into());
        ns.metadata.labels = Some([("tenant".to_string(), "true".to_string())].into());
        nw.apply_watcher_event(&watcher::Event::Apply(ns));
        let (reason, message) = refusal(&policies, &namespaces, "team-a", &spec(9), "img").expect("refused");
        assert_eq!(reason, "PolicyViolation");
        assert_eq!(
            message,
            "spec.replicas: 9 is more than the 2 allowed (ProxyFleetPolicy tenants)"
        );
        assert_eq!(refusal(&policies, &namespaces, "team-a", &spec(2), "img"), None);
    }
}
