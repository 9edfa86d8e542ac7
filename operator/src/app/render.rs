//! How a fleet's routes change for the AppRollouts that name them: the route splits between
//! `<rollout>-canary` (first, so sticky users on it stay while its weight grows) and
//! `<rollout>-stable`, two upstreams derived from the route's own upstream (its TLS, pool,
//! outlier and health settings kept; its endpoints replaced by the two Services). The weights
//! rendered here are the resting ones (all on stable); rollouts move them live, so a weight
//! change never changes the fleet's configuration hash.

use proxyfleet_config::{Backend, BackendOverride, Upstream};

use super::spec::AppRollout;
use crate::crd::{ProxyDeployment, ProxyDeploymentSpec};

/// The stable or canary side of an app rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppTrack {
    Stable,
    Canary,
}

impl AppTrack {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stable => "stable",
            Self::Canary => "canary",
        }
    }
}

/// Name of a track's Deployment, Service and proxy upstream.
pub fn track_name(rollout: &str, track: AppTrack) -> String {
    format!("{rollout}-{}", track.as_str())
}

/// The fleet as its AppRollouts shape it (the same object when none names it). Conflicts are
/// reported by the AppRollout controller on the rollouts; the fleet just leaves them out.
pub fn shaped_fleet(
    pxd: &std::sync::Arc<ProxyDeployment>,
    apps: &kube::runtime::reflector::Store<AppRollout>,
    services: &kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Service>,
) -> std::sync::Arc<ProxyDeployment> {
    let (Some(name), Some(namespace)) = (pxd.metadata.name.as_deref(), pxd.metadata.namespace.as_deref()) else {
        return pxd.clone();
    };
    let all = apps.state();
    let mine: Vec<&AppRollout> = all
        .iter()
        .map(|a| a.as_ref())
        .filter(|a| a.metadata.namespace.as_deref() == Some(namespace) && a.spec.route.proxy_deployment == name)
        .filter(|a| has_run(a))
        .collect();
    if mine.is_empty() {
        return pxd.clone();
    }
    let cluster_ip = |service: &str| {
        let svc = services.get(&kube::runtime::reflector::ObjectRef::new(service).within(namespace))?;
        svc.spec
            .as_ref()?
            .cluster_ip
            .clone()
            .filter(|ip| !ip.is_empty() && ip != "None")
    };
    let (spec, _) = shape_spec(&pxd.spec, name, namespace, &mine, &cluster_ip);
    let mut shaped = (**pxd).clone();
    shaped.spec = spec;
    std::sync::Arc::new(shaped)
}

/// Whether an AppRollout has run its tracks (its stable revision is known): only then does its
/// route go to them. One that never could (a typo in workloadRef, a policy refusal) leaves the
/// route serving as it did, not sent to Services that do not exist.
pub fn has_run(ar: &AppRollout) -> bool {
    ar.status.as_ref().is_some_and(|s| s.stable_revision.is_some())
}

/// Why an AppRollout cannot shape its route.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("AppRollout {rollout}: {reason}")]
pub struct RouteConflict {
    pub rollout: String,
    pub reason: String,
}

/// The ClusterIP of a Service, when known.
pub type ClusterIps<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The fleet spec with every AppRollout's route split. `rollouts` are those of the fleet's
/// namespace naming this fleet; one that cannot apply is skipped and reported. A track's
/// endpoint is its Service's ClusterIP when known (no DNS lookup on a proxy's connect path),
/// else the Service's DNS name.
pub fn shape_spec(
    spec: &ProxyDeploymentSpec,
    fleet: &str,
    namespace: &str,
    rollouts: &[&AppRollout],
    cluster_ips: ClusterIps<'_>,
) -> (ProxyDeploymentSpec, Vec<RouteConflict>) {
    let mut out = spec.clone();
    let mut conflicts = Vec::new();
    let mut sorted: Vec<&&AppRollout> = rollouts
        .iter()
        .filter(|r| r.spec.route.proxy_deployment == fleet)
        .collect();
    // The oldest of those naming a route takes it: a newcomer (a copy-paste) never takes it
    // from the one serving it.
    sorted.sort_by_key(|r| (r.metadata.creation_timestamp.clone(), r.metadata.name.clone()));
    for ar in sorted {
        let name = ar.metadata.name.clone().unwrap_or_default();
        if let Err(reason) = split_route(&mut out, &name, namespace, ar, cluster_ips) {
            conflicts.push(RouteConflict { rollout: name, reason });
        }
    }
    (out, conflicts)
}

fn split_route(
    spec: &mut ProxyDeploymentSpec,
    name: &str,
    namespace: &str,
    ar: &AppRollout,
    cluster_ips: ClusterIps<'_>,
) -> Result<(), String> {
    let route_name = &ar.spec.route.name;
    let Some(i) = spec.routes.iter().position(|r| &r.name == route_name) else {
        return Err(format!("the ProxyDeployment has no route {route_name:?}"));
    };
    let route = &spec.routes[i];
    if !route.backends.is_empty() {
        return Err(format!(
            "route {route_name:?} already splits between backends (another AppRollout, or its own)"
        ));
    }
    let Some(base) = spec.upstreams.iter().find(|u| u.name == route.upstream).cloned() else {
        return Err(format!("route {route_name:?} has no upstream to derive from"));
    };
    let [canary, stable] = [AppTrack::Canary, AppTrack::Stable].map(|t| track_name(name, t));
    if spec.upstreams.iter().any(|u| u.name == canary || u.name == stable) {
        return Err(format!(
            "the ProxyDeployment already has an upstream named {canary:?} or {stable:?}"
        ));
    }
    let port = ar.spec.port;
    let endpoint = |service: &str| match cluster_ips(service) {
        Some(ip) if ip.contains(':') => format!("[{ip}]:{port}"),
        Some(ip) => format!("{ip}:{port}"),
        None => format!("{service}.{namespace}.svc:{port}"),
    };
    let derived = |upstream: &str| Upstream {
        name: upstream.to_string(),
        endpoints: vec![endpoint(upstream)],
        dns: None,
        ..base.clone()
    };
    spec.upstreams.push(derived(&canary));
    spec.upstreams.push(derived(&stable));
    let route = &mut spec.routes[i];
    route.upstream.clear();
    route.backends = vec![
        Backend {
            upstream: canary.clone(),
            weight: 0,
        },
        Backend {
            upstream: stable,
            weight: 100,
        },
    ];
    route.sticky = ar.spec.sticky.clone();
    route.overrides = ar
        .spec
        .canary_match
        .iter()
        .map(|m| BackendOverride {
            header: m.header.clone(),
            cookie: m.cookie.clone(),
            upstream: canary.clone(),
        })
        .collect();
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::resources::fixtures::basic;

    pub(crate) fn rollout(name: &str, fleet: &str, route: &str) -> AppRollout {
        let mut ar = AppRollout::new(
            name,
            serde_json::from_value(serde_json::json!({
                "workloadRef": {"name": "shop"},
                "port": 8080,
                "route": {"proxyDeployment": fleet, "name": route},
                "sticky": {"header": "x-user"},
                "canaryMatch": [{"header": {"name": "x-canary", "value": "always"}}],
                "strategy": {"steps": [{"setWeight": 5}, {"setWeight": 30}]}
            }))
            .unwrap(),
        );
        ar.metadata.namespace = Some("team".into());
        ar
    }

    #[test]
    fn the_route_splits_between_two_derived_upstreams() {
        let pxd = basic();
        let route = pxd.spec.routes[0].name.clone();
        let ar = rollout("shop", "demo", &route);
        let (spec, conflicts) = shape_spec(&pxd.spec, "demo", "team", &[&ar], &|s: &str| {
            (s == "shop-canary").then(|| "10.96.0.7".to_string())
        });
        assert!(conflicts.is_empty(), "{conflicts:?}");
        let r = &spec.routes[0];
        assert!(r.upstream.is_empty());
        assert_eq!(
            r.backends
                .iter()
                .map(|b| (b.upstream.as_str(), b.weight))
                .collect::<Vec<_>>(),
            vec![("shop-canary", 0), ("shop-stable", 100)]
        );
        assert_eq!(r.overrides[0].upstream, "shop-canary");
        let stable = spec.upstreams.iter().find(|u| u.name == "shop-stable").unwrap();
        assert_eq!(
            stable.endpoints,
            vec!["shop-stable.team.svc:8080"],
            "no ClusterIP yet: the DNS name"
        );
        let canary = spec.upstreams.iter().find(|u| u.name == "shop-canary").unwrap();
        assert_eq!(canary.endpoints, vec!["10.96.0.7:8080"]);
        let config = crate::resources::config_map::render_proxy_config(&spec, true);
        proxyfleet_config::validate(&config).unwrap();
    }

    #[test]
    fn conflicts_are_reported_not_applied() {
        let pxd = basic();
        let route = pxd.spec.routes[0].name.clone();
        let (a, b) = (rollout("a", "demo", &route), rollout("b", "demo", &route));
        let (spec, conflicts) = shape_spec(&pxd.spec, "demo", "team", &[&b, &a], &|_: &str| None);
        assert_eq!(
            spec.routes[0].backends[0].upstream, "a-canary",
            "the first by name wins"
        );
        assert_eq!(conflicts.len(), 1);
        assert_eq!(conflicts[0].rollout, "b");
        // The older one keeps it, whatever the names.
        let mut older_b = b.clone();
        older_b.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().unwrap(),
        ));
        let mut newer_a = a.clone();
        newer_a.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-06-01T00:00:00Z".parse().unwrap(),
        ));
        let (spec, conflicts) = shape_spec(&pxd.spec, "demo", "team", &[&newer_a, &older_b], &|_: &str| None);
        assert_eq!(spec.routes[0].backends[0].upstream, "b-canary");
        assert_eq!(conflicts[0].rollout, "a");
        // One that never ran its tracks shapes nothing.
        assert!(!has_run(&a));
        let missing = rollout("c", "demo", "nope");
        let (_, conflicts) = shape_spec(&pxd.spec, "demo", "team", &[&missing], &|_: &str| None);
        assert!(conflicts[0].reason.contains("no route \"nope\""), "{conflicts:?}");
        let other = rollout("d", "other-fleet", &route);
        let (spec, conflicts) = shape_spec(&pxd.spec, "demo", "team", &[&other], &|_: &str| None);
        assert!(conflicts.is_empty() && spec == pxd.spec);
    }
}
