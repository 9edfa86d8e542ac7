//! Who may reach a fleet's pods: its listeners from anywhere (it is an edge proxy), its admin
//! port (metrics, the loaded config, the live-update channel) only from the operator's
//! namespace and from namespaces the platform team labels `proxyfleet.io/scrape: "true"`
//! (where Prometheus runs). A namespace label, not a pod label: a tenant can label its own pods,
//! not namespaces. Enforced by CNIs that implement NetworkPolicy.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::config_map::ADMIN_PORT;
use super::Owner;
use crate::crd::ProxyDeploymentSpec;
use crate::labels;

/// The namespace label that lets a namespace's pods scrape every fleet's admin port.
pub const SCRAPE_LABEL: &str = "proxyfleet.io/scrape";

fn tcp(port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

fn udp(port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some("UDP".into()),
        ..tcp(port)
    }
}

fn namespaces(labels: &[(&str, &str)]) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn desired_network_policy(owner: &Owner, spec: &ProxyDeploymentSpec, operator_namespace: &str) -> NetworkPolicy {
    let listeners = NetworkPolicyIngressRule {
        from: None,
        ports: Some(
            spec.listeners
                .iter()
                .map(|l| tcp(l.port))
                .chain(spec.listeners.iter().filter(|l| l.http3.is_some()).map(|l| udp(l.port)))
                .collect(),
        ),
    };
    let admin = NetworkPolicyIngressRule {
        from: Some(vec![
            namespaces(&[("kubernetes.io/metadata.name", operator_namespace)]),
            namespaces(&[(SCRAPE_LABEL, "true")]),
        ]),
        ports: Some(vec![tcp(ADMIN_PORT)]),
    };
    NetworkPolicy {
        metadata: owner.meta(owner.name.clone()),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(labels::fleet_selector(&owner.name)),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![listeners, admin]),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::fixtures::basic;

    #[test]
    fn listeners_open_admin_port_only_to_the_operator_and_scrapers() {
        let pxd = basic();
        let owner = Owner::of(&pxd).unwrap();
        let np = desired_network_policy(&owner, &pxd.spec, "proxyfleet-system");
        let rules = np.spec.unwrap().ingress.unwrap();
        assert!(rules[0].from.is_none(), "listeners are open");
        let listener_ports: Vec<_> = rules[0].ports.iter().flatten().map(|p| p.port.clone()).collect();
        assert!(!listener_ports.contains(&Some(IntOrString::Int(ADMIN_PORT))));
        assert_eq!(
            rules[1].ports.as_ref().unwrap()[0].port,
            Some(IntOrString::Int(ADMIN_PORT))
        );
        assert_eq!(rules[1].from.as_ref().unwrap().len(), 2);
    }
}
