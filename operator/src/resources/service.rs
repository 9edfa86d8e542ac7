//! The Service in front of every proxy pod of the fleet (stable and canary), and the optional
//! headless Service.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec as K8sServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::config_map::ADMIN_PORT;
use super::Owner;
use crate::crd::{ProxyDeploymentSpec, ServiceType};
use crate::labels;

fn ports(spec: &ProxyDeploymentSpec, with_admin: bool) -> Vec<ServicePort> {
    let mut ports: Vec<ServicePort> = spec
        .listeners
        .iter()
        .map(|l| ServicePort {
            name: Some(l.name.clone()),
            port: l.service_port.unwrap_or(l.port),
            target_port: Some(IntOrString::String(l.name.clone())),
            protocol: Some("TCP".into()),
            ..Default::default()
        })
        .collect();
    // HTTP/3: the same port number over UDP, to the container's UDP port (unnamed: container
    // port names are at most 15 characters and must be unique).
    ports.extend(
        spec.listeners
            .iter()
            .filter(|l| l.http3.is_some())
            .map(|l| ServicePort {
                name: Some(format!("{}-h3", l.name)),
                port: l.service_port(),
                target_port: Some(IntOrString::Int(l.port)),
                protocol: Some("UDP".into()),
                ..Default::default()
            }),
    );
    if with_admin {
        ports.push(ServicePort {
            name: Some("admin".into()),
            port: ADMIN_PORT,
            target_port: Some(IntOrString::String("admin".into())),
            protocol: Some("TCP".into()),
            ..Default::default()
        });
    }
    ports
}

pub fn desired_service(owner: &Owner, spec: &ProxyDeploymentSpec) -> Service {
    let svc = spec.service.clone().unwrap_or_default();
    let mut meta = owner.meta(owner.name.clone());
    if !svc.annotations.is_empty() {
        meta.annotations = Some(svc.annotations.clone());
    }
    let type_ = match svc.r#type.unwrap_or(ServiceType::ClusterIP) {
        ServiceType::ClusterIP => "ClusterIP",
        ServiceType::NodePort => "NodePort",
        ServiceType::LoadBalancer => "LoadBalancer",
    };
    Service {
        metadata: meta,
        spec: Some(K8sServiceSpec {
            type_: Some(type_.into()),
            selector: Some(labels::fleet_selector(&owner.name)),
            ports: Some(ports(spec, false)),
            ..Default::default()
        }),
        status: None,
    }
}

pub fn headless_service_name(pxd: &str) -> String {
    format!("{pxd}-headless")
}

/// Every proxy pod, including not-ready ones, with the admin port (metrics scraping, debugging).
pub fn desired_headless_service(owner: &Owner, spec: &ProxyDeploymentSpec) -> Service {
    Service {
        metadata: owner.meta(headless_service_name(&owner.name)),
        spec: Some(K8sServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(labels::fleet_selector(&owner.name)),
            ports: Some(ports(spec, true)),
            publish_not_ready_addresses: Some(true),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::fixtures::basic;

    #[test]
    fn selects_both_tracks_and_maps_ports() {
        let pxd = basic();
        let svc = desired_service(&Owner::of(&pxd).unwrap(), &pxd.spec);
        let spec = svc.spec.unwrap();
        assert!(!spec.selector.unwrap().contains_key(labels::TRACK));
        let p = &spec.ports.unwrap()[0];
        assert_eq!(p.port, 443);
        assert_eq!(p.target_port, Some(IntOrString::String("https".into())));
    }

    #[test]
    fn http3_adds_the_same_port_over_udp_everywhere_it_is_reached() {
        let mut pxd = basic();
        pxd.spec.listeners[0].http3 = Some(Default::default());
        let owner = Owner::of(&pxd).unwrap();
        let ports = desired_service(&owner, &pxd.spec).spec.unwrap().ports.unwrap();
        let udp: Vec<_> = ports.iter().filter(|p| p.protocol.as_deref() == Some("UDP")).collect();
        assert_eq!(udp.len(), 1);
        assert_eq!(
            (udp[0].name.as_deref(), udp[0].port, udp[0].target_port.clone()),
            (Some("https-h3"), 443, Some(IntOrString::Int(8443)))
        );
        let np = crate::resources::network_policy::desired_network_policy(&owner, &pxd.spec, "ops");
        let rule = &np.spec.unwrap().ingress.unwrap()[0];
        let udp_allowed = rule
            .ports
            .iter()
            .flatten()
            .any(|p| p.protocol.as_deref() == Some("UDP"));
        assert!(udp_allowed, "the NetworkPolicy lets QUIC in");
        // Alt-Svc names the Service port, not the container port.
        let config = crate::resources::config_map::render_proxy_config(&pxd.spec, true);
        let h3 = config.listeners[0].tls.as_ref().unwrap().http3.as_ref().unwrap();
        assert_eq!(h3.advertised_port, Some(443));
        proxyfleet_config::validate(&config).unwrap();
    }
}
