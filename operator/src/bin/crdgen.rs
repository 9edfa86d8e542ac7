//! Prints the ProxyDeployment CRD YAML (checked in under crds/ and the chart's crds/), or with
//! `--reference` the field reference in Markdown (docs/crd-reference.md).
fn main() {
    if std::env::args().any(|a| a == "--reference") {
        print!("{}", proxyfleet_operator::schema::reference_markdown());
    } else if std::env::args().any(|a| a == "--policy") {
        print!("{}", proxyfleet_operator::schema::policy_crd_yaml());
    } else if std::env::args().any(|a| a == "--app") {
        print!("{}", proxyfleet_operator::schema::app_crd_yaml());
    } else {
        print!("{}", proxyfleet_operator::schema::crd_yaml());
    }
}
