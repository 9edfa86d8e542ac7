//! Prints the ProxyDeployment CRD YAML (checked in under crds/ and the chart's crds/).
fn main() {
    print!("{}", proxyfleet_operator::schema::crd_yaml());
}
