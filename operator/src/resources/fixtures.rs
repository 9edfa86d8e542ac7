//! Test builders.

use crate::crd::{ProxyDeployment, ProxyDeploymentSpec};

pub fn spec_yaml() -> &'static str {
    r#"
replicas: 2
listeners:
  - name: https
    port: 8443
    servicePort: 443
    hostnames: [demo.example.com]
routes:
  - name: all
    upstream: echo
upstreams:
  - name: echo
    endpoints: ["echo.default.svc:8080"]
"#
}

pub fn basic() -> ProxyDeployment {
    let spec: ProxyDeploymentSpec = serde_yaml::from_str(spec_yaml()).unwrap();
    let mut pxd = ProxyDeployment::new("demo", spec);
    pxd.metadata.namespace = Some("default".into());
    pxd.metadata.uid = Some("uid-1".into());
    pxd.metadata.generation = Some(1);
    pxd
}
