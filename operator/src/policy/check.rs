//! Pure: which policies govern a namespace, and what of a fleet's spec they do not allow.

use std::collections::BTreeMap;

use kube::core::{Selector, SelectorExt};
use kube::ResourceExt;

use super::spec::{ProxyFleetPolicy, ProxyFleetPolicySpec};
use crate::canary::spec::CanaryStrategy;
use crate::certs::spec::IssuerKind;
use crate::crd::ProxyDeploymentSpec;

/// One thing a policy does not allow, naming the field and the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// The policies whose namespace selector matches `labels` (a selector that does not parse
/// governs every namespace: a broken policy fails closed).
/// Whether `policy` governs a namespace with `labels`.
pub fn governs(policy: &ProxyFleetPolicy, labels: &BTreeMap<String, String>) -> bool {
    match &policy.spec.namespace_selector {
        None => true,
        Some(s) => Selector::try_from(s.clone()).map_or(true, |s| s.matches(labels)),
    }
}

/// Every violation of `spec` against every governing policy, in field order.
pub fn violations(spec: &ProxyDeploymentSpec, policies: &[&ProxyFleetPolicy], default_image: &str) -> Vec<Violation> {
    let mut out = Vec::new();
    for p in policies {
        check(spec, &p.spec, &p.name_any(), default_image, &mut out);
    }
    out
}

fn check(
    spec: &ProxyDeploymentSpec,
    p: &ProxyFleetPolicySpec,
    name: &str,
    default_image: &str,
    out: &mut Vec<Violation>,
) {
    let mut deny = |field: String, what: String| {
        out.push(Violation {
            field,
            message: format!("{what} (ProxyFleetPolicy {name})"),
        })
    };
    if let Some(max) = p.max_replicas.filter(|max| spec.replicas > *max) {
        deny(
            "spec.replicas".into(),
            format!("{} is more than the {max} allowed", spec.replicas),
        );
    }
    check_image(spec, p, default_image, &mut deny);
    if let Some(canary) = spec.strategy.as_ref().and_then(|s| s.canary.as_ref()) {
        check_prometheus((canary, "spec.strategy.canary"), p, &mut deny);
    }
    check_service(spec, p, &mut deny);
    check_certificates(spec, p, &mut deny);
    if p.allow_pod_overrides == Some(false) && spec.pod.is_some() {
        deny("spec.pod".into(), "pod overrides are not allowed".into());
    }
    if p.allow_tuning == Some(false) && spec.tuning.is_some() {
        deny("spec.tuning".into(), "tuning is not allowed".into());
    }
    if p.allow_insecure_skip_verify == Some(false) {
        for (i, u) in spec.upstreams.iter().enumerate() {
            if u.tls.as_ref().is_some_and(|t| t.insecure_skip_verify) {
                deny(
                    format!("spec.upstreams[{i}].tls.insecureSkipVerify"),
                    "skipping upstream certificate verification is not allowed".into(),
                );
            }
        }
    }
    if p.allow_secret_references == Some(false) {
        let tls_secret = spec.tls.as_ref().and_then(|t| t.secret_name.as_ref());
        if tls_secret.is_some() {
            deny(
                "spec.tls.secretName".into(),
                "naming Secrets for the pods to mount is not allowed".into(),
            );
        }
        for r in crate::secret_refs::references(spec) {
            deny(r.field, "naming Secrets for the pods to mount is not allowed".into());
        }
        // Read by the operator with its own rights: the tenant's account may not read them.
        if let Some(acme) = spec.tls.as_ref().and_then(|t| t.acme.as_ref()) {
            let read = "naming Secrets for the operator to read is not allowed";
            if acme.directory_ca_secret.is_some() {
                deny("spec.tls.acme.directoryCaSecret".into(), read.into());
            }
            if acme.external_account_binding.is_some() {
                deny("spec.tls.acme.externalAccountBinding.hmacKeySecret".into(), read.into());
            }
        }
    }
}

/// `image` is `repository`, or `repository:tag`, or `repository@digest`.
fn in_repository(image: &str, repository: &str) -> bool {
    let repository = repository.trim_end_matches('/');
    image
        .strip_prefix(repository)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(':') || rest.starts_with('@'))
}

fn check_image(
    spec: &ProxyDeploymentSpec,
    p: &ProxyFleetPolicySpec,
    default_image: &str,
    deny: &mut impl FnMut(String, String),
) {
    let (Some(image), Some(allowed)) = (&spec.image, &p.allowed_image_repositories) else {
        return;
    };
    if image != default_image && !allowed.iter().any(|r| in_repository(image, r)) {
        deny(
            "spec.image".into(),
            format!("{image:?} is not in an allowed repository ({})", allowed.join(", ")),
        );
    }
}

fn check_service(spec: &ProxyDeploymentSpec, p: &ProxyFleetPolicySpec, deny: &mut impl FnMut(String, String)) {
    let Some(service) = &spec.service else { return };
    if let (Some(t), Some(allowed)) = (service.r#type, &p.allowed_service_types) {
        if !allowed.contains(&t) {
            deny(
                "spec.service.type".into(),
                format!("{t:?} is not an allowed Service type ({allowed:?})"),
            );
        }
    }
    if p.allow_service_annotations == Some(false) && !service.annotations.is_empty() {
        deny(
            "spec.service.annotations".into(),
            "Service annotations are not allowed".into(),
        );
    }
}

/// `name` is `suffix` or below it; a wildcard name is checked by its parent.
fn under(name: &str, suffix: &str) -> bool {
    let (name, suffix) = (
        name.trim_start_matches("*.").to_ascii_lowercase(),
        suffix.trim_start_matches('.').to_ascii_lowercase(),
    );
    name == suffix || name.ends_with(&format!(".{suffix}"))
}

/// Every Prometheus address a canary strategy's analyses would query, with its field (under
/// `prefix`: `spec.strategy.canary` for a fleet, `spec.strategy` for an AppRollout).
fn prometheus_addresses<'a>(canary: &'a CanaryStrategy, prefix: &str) -> Vec<(String, &'a str)> {
    let background = canary.analysis.iter().map(|a| (format!("{prefix}.analysis"), a));
    let steps = canary
        .steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| Some((format!("{prefix}.steps[{i}].analysis"), s.analysis.as_ref()?)));
    let mut out = Vec::new();
    for (field, a) in background.chain(steps) {
        if let Some(source) = &a.source.prometheus {
            out.push((format!("{field}.source.prometheus.address"), source.address.as_str()));
        }
        for (j, m) in a.metrics.iter().enumerate() {
            if let Some(q) = &m.prometheus {
                out.push((format!("{field}.metrics[{j}].prometheus.address"), q.address.as_str()));
            }
        }
    }
    out
}

fn check_prometheus(
    (canary, prefix): (&CanaryStrategy, &str),
    p: &ProxyFleetPolicySpec,
    deny: &mut impl FnMut(String, String),
) {
    let Some(allowed) = &p.allowed_prometheus_addresses else {
        return;
    };
    // As written, as admission compares them.
    for (field, address) in prometheus_addresses(canary, prefix) {
        if !allowed.iter().any(|a| a == address) {
            deny(
                field,
                format!("Prometheus {address:?} is not allowed ({})", allowed.join(", ")),
            );
        }
    }
}

/// What governing policies do not allow of an AppRollout's canary strategy (the Prometheus its
/// analyses query).
pub fn strategy_violations(canary: &CanaryStrategy, policies: &[&ProxyFleetPolicy]) -> Vec<Violation> {
    let mut out = Vec::new();
    for p in policies {
        let name = p.name_any();
        let mut deny = |field: String, what: String| {
            out.push(Violation {
                field,
                message: format!("{what} (ProxyFleetPolicy {name})"),
            })
        };
        check_prometheus((canary, "spec.strategy"), &p.spec, &mut deny);
    }
    out
}

fn check_certificates(spec: &ProxyDeploymentSpec, p: &ProxyFleetPolicySpec, deny: &mut impl FnMut(String, String)) {
    if let Some(suffixes) = &p.dns_name_suffixes {
        // Every name the fleet's certificate covers (its Service names are always allowed).
        let hostnames = spec.listeners.iter().enumerate().flat_map(|(i, l)| {
            l.hostnames
                .iter()
                .enumerate()
                .map(move |(j, n)| (format!("spec.listeners[{i}].hostnames[{j}]"), n))
        });
        let extra = spec
            .tls
            .iter()
            .flat_map(|t| t.dns_names.iter().enumerate())
            .map(|(i, n)| (format!("spec.tls.dnsNames[{i}]"), n));
        // A passthrough route claims its SNI names as a hostname does.
        let sni = spec.listeners.iter().enumerate().flat_map(|(i, l)| {
            l.tcp
                .iter()
                .flat_map(|t| t.routes.iter().enumerate())
                .flat_map(move |(j, r)| {
                    r.server_names
                        .iter()
                        .enumerate()
                        .map(move |(k, n)| (format!("spec.listeners[{i}].tcp.routes[{j}].serverNames[{k}]"), n))
                })
        });
        for (field, n) in hostnames.chain(extra).chain(sni) {
            if !suffixes.iter().any(|s| under(n, s)) {
                deny(
                    field,
                    format!("{n:?} is not under an allowed suffix ({})", suffixes.join(", ")),
                );
            }
        }
    }
    let Some(tls) = &spec.tls else { return };
    if let (Some(acme), Some(allowed)) = (&tls.acme, &p.allowed_acme_directories) {
        if !allowed.contains(&acme.directory) {
            deny(
                "spec.tls.acme.directory".into(),
                format!(
                    "ACME directory {:?} is not allowed ({})",
                    acme.directory,
                    allowed.join(", ")
                ),
            );
        }
    }
    if let (Some(cm), Some(allowed)) = (&tls.cert_manager, &p.allowed_cluster_issuers) {
        let issuer = &cm.issuer_ref;
        // Another API group's ClusterIssuer (an external issuer) is another object: it is
        // allowed only when the list names it with its group.
        let key = if issuer.group == CERT_MANAGER_GROUP {
            issuer.name.clone()
        } else {
            format!("{}/{}", issuer.group, issuer.name)
        };
        if issuer.kind == IssuerKind::ClusterIssuer && !allowed.contains(&key) {
            deny(
                "spec.tls.certManager.issuerRef".into(),
                format!("ClusterIssuer {key:?} is not allowed ({})", allowed.join(", ")),
            );
        }
    }
}

/// cert-manager's own API group: its ClusterIssuers are named in a policy without it.
const CERT_MANAGER_GROUP: &str = "cert-manager.io";

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn fleet(extra: serde_json::Value) -> ProxyDeploymentSpec {
        let mut base = serde_json::json!({
            "replicas": 2,
            "listeners": [{"name": "https", "port": 8443, "protocol": "HTTPS"}],
            "routes": [{"name": "all", "upstream": "app"}],
            "upstreams": [{"name": "app", "endpoints": ["app:8080"]}],
        });
        if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        serde_json::from_value(base).expect("a fleet spec")
    }

    fn policy(name: &str, spec: serde_json::Value) -> Arc<ProxyFleetPolicy> {
        let spec: ProxyFleetPolicySpec = serde_json::from_value(spec).expect("a policy");
        Arc::new(ProxyFleetPolicy::new(name, spec))
    }

    const DEFAULT: &str = "proxyfleet.local/proxy:0.1.0";

    fn fields(spec: &ProxyDeploymentSpec, p: &Arc<ProxyFleetPolicy>) -> Vec<String> {
        violations(spec, &[p.as_ref()], DEFAULT)
            .into_iter()
            .map(|v| v.field)
            .collect()
    }

    #[test]
    fn an_empty_policy_restricts_nothing() {
        let everything = fleet(serde_json::json!({
            "image": "evil.example/miner:1", "service": {"type": "NodePort", "annotations": {"a": "b"}},
            "pod": {"priorityClassName": "system-cluster-critical"}, "tuning": {"workerThreads": 2},
        }));
        assert!(fields(&everything, &policy("open", serde_json::json!({}))).is_empty());
    }

    #[test]
    fn each_restriction_names_its_field_and_the_policy() {
        let p = policy(
            "tenants",
            serde_json::json!({
                "allowedImageRepositories": ["registry.example/proxyfleet/proxy"],
                "allowedServiceTypes": ["ClusterIP"], "allowServiceAnnotations": false,
                "allowedClusterIssuers": ["public"], "dnsNameSuffixes": ["team-a.example.com"],
                "allowPodOverrides": false, "allowTuning": false, "allowInsecureSkipVerify": false,
                "allowSecretReferences": false, "maxReplicas": 3,
            }),
        );
        let bad = fleet(serde_json::json!({
            "replicas": 9,
            "listeners": [{"name": "https", "port": 8443, "protocol": "HTTPS", "hostnames": ["evil.example.org"]},
                          {"name": "pass", "port": 9443, "protocol": "TCP", "tcp": {"routes": [
                              {"name": "db", "serverNames": ["db.team-a.example.com", "db.bank.example.com"], "upstream": "app"}]}}],
            "routes": [{"name": "r", "upstream": "app", "jwt": {"jwksSecret": "keys"}}],
            "image": "registry.example/proxyfleet/proxy-evil:1",
            "service": {"type": "LoadBalancer", "annotations": {"lb": "internet"}},
            "tls": {"certManager": {"issuerRef": {"name": "internal-ca", "kind": "ClusterIssuer"}},
                    "dnsNames": ["api.team-a.example.com", "bank.example.com"]},
            "pod": {"nodeSelector": {"gpu": "true"}}, "tuning": {"workerThreads": 2},
            "upstreams": [{"name": "app", "endpoints": ["app:8443"],
                           "tls": {"insecureSkipVerify": true, "caSecret": "someone-elses"}}],
        }));
        let all = violations(&bad, &[p.as_ref()], DEFAULT);
        let got: Vec<&str> = all.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(
            got,
            [
                "spec.replicas",
                "spec.image",
                "spec.service.type",
                "spec.service.annotations",
                "spec.listeners[0].hostnames[0]",
                "spec.tls.dnsNames[1]",
                "spec.listeners[1].tcp.routes[0].serverNames[1]",
                "spec.tls.certManager.issuerRef",
                "spec.pod",
                "spec.tuning",
                "spec.upstreams[0].tls.insecureSkipVerify",
                "spec.routes[0].jwt.jwksSecret",
                "spec.upstreams[0].tls.caSecret",
            ]
        );
        assert!(
            all.iter().all(|v| v.message.ends_with("(ProxyFleetPolicy tenants)")),
            "{all:?}"
        );
        let good = fleet(serde_json::json!({
            "listeners": [{"name": "https", "port": 8443, "protocol": "HTTPS", "hostnames": ["www.team-a.example.com"]}],
            "image": "registry.example/proxyfleet/proxy@sha256:abcd",
            "service": {"type": "ClusterIP"},
            "tls": {"certManager": {"issuerRef": {"name": "public", "kind": "ClusterIssuer"}},
                    "dnsNames": ["team-a.example.com", "*.api.team-a.example.com"]},
        }));
        assert!(fields(&good, &p).is_empty(), "{:?}", fields(&good, &p));
        let other_group = fleet(serde_json::json!({"tls": {"certManager": {"issuerRef":
            {"name": "public", "kind": "ClusterIssuer", "group": "issuers.example.com"}}}}));
        assert_eq!(
            fields(&other_group, &p),
            vec!["spec.tls.certManager.issuerRef".to_string()],
            "another group's ClusterIssuer of an allowed name is another issuer"
        );
        let mut named_with_group = p.as_ref().clone();
        named_with_group.spec.allowed_cluster_issuers = Some(vec!["issuers.example.com/public".into()]);
        assert!(fields(&other_group, &Arc::new(named_with_group)).is_empty());
        let own_issuer = fleet(serde_json::json!({"tls": {"certManager": {"issuerRef": {"name": "mine"}}}}));
        assert!(
            fields(&own_issuer, &p).is_empty(),
            "an Issuer of the namespace is the tenant's own"
        );
        let default_image = fleet(serde_json::json!({"image": DEFAULT}));
        assert!(
            fields(&default_image, &p).is_empty(),
            "the operator's own image is always allowed"
        );
    }

    /// A canary analysis queries only the platform's Prometheus: the operator makes the request.
    #[test]
    fn prometheus_addresses_are_the_platform_teams_choice() {
        let p = policy(
            "prom",
            serde_json::json!({"allowedPrometheusAddresses": ["http://prometheus.monitoring:9090"]}),
        );
        let analysis = |source: &str, query: &str| {
            serde_json::json!({"interval": "10s", "source": {"prometheus": {"address": source}},
                "metrics": [{"name": "q", "prometheus": {"address": query, "query": "up", "successCondition": "result > 0"}}]})
        };
        let canary = |a: serde_json::Value| {
            fleet(
                serde_json::json!({"strategy": {"canary": {"steps": [{"setWeight": 10}, {"analysis": a.clone()}],
                "analysis": a}}}),
            )
        };
        let ours = "http://prometheus.monitoring:9090";
        assert!(fields(&canary(analysis(ours, ours)), &p).is_empty());
        assert_eq!(
            fields(&canary(analysis(ours, "http://team-b-proxy.team-b:9901")), &p),
            vec![
                "spec.strategy.canary.analysis.metrics[0].prometheus.address",
                "spec.strategy.canary.steps[1].analysis.metrics[0].prometheus.address"
            ]
        );
        assert_eq!(
            fields(&canary(analysis("http://10.0.0.1:8080", ours)), &p)[0],
            "spec.strategy.canary.analysis.source.prometheus.address"
        );
    }

    #[test]
    fn acme_directories_are_the_platform_teams_choice() {
        let p = policy(
            "acme",
            serde_json::json!({"allowedAcmeDirectories": ["https://acme.example.com/directory"]}),
        );
        let acme = |dir: &str| fleet(serde_json::json!({"tls": {"acme": {"directory": dir}}}));
        assert_eq!(
            fields(&acme("https://elsewhere.example.net/dir"), &p),
            vec!["spec.tls.acme.directory"]
        );
        assert!(fields(&acme("https://acme.example.com/directory"), &p).is_empty());
    }

    /// Secrets an ACME order reads with the operator's rights are Secret references too: a
    /// tenant who may not name Secrets may not have the operator read them either.
    #[test]
    fn acme_secret_references_are_secret_references() {
        let p = policy("no-secrets", serde_json::json!({"allowSecretReferences": false}));
        let acme = fleet(serde_json::json!({"tls": {"acme": {
            "directory": "https://acme.example.com/directory",
            "directoryCaSecret": "their-ca",
            "externalAccountBinding": {"keyId": "k", "hmacKeySecret": {"name": "db-password", "key": "password"}}}}}));
        assert_eq!(
            fields(&acme, &p),
            vec![
                "spec.tls.acme.directoryCaSecret",
                "spec.tls.acme.externalAccountBinding.hmacKeySecret"
            ]
        );
        let allowed = policy("secrets", serde_json::json!({"allowSecretReferences": true}));
        assert!(fields(&acme, &allowed).is_empty());
    }

    #[test]
    fn selectors_choose_the_governed_namespaces_and_a_broken_one_fails_closed() {
        let policies = [
            policy("all", serde_json::json!({})),
            policy(
                "tenants",
                serde_json::json!({"namespaceSelector": {"matchLabels": {"tenant": "true"}}}),
            ),
            policy(
                "broken",
                serde_json::json!({"namespaceSelector": {"matchExpressions": [{"key": "x", "operator": "Bogus"}]}}),
            ),
        ];
        let names = |labels: &[(&str, &str)]| -> Vec<String> {
            let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            policies
                .iter()
                .filter(|p| governs(p, &labels))
                .map(|p| p.name_any())
                .collect()
        };
        assert_eq!(names(&[("tenant", "true")]), ["all", "tenants", "broken"]);
        assert_eq!(names(&[]), ["all", "broken"]);
    }
}
