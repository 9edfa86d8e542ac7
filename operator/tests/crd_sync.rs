//! The checked-in CRD YAML must be exactly what the code generates (`make crds` regenerates).

#[test]
fn checked_in_crds_match_the_code() {
    let generated = proxyfleet_operator::schema::crd_yaml();
    let root = std::path::PathBuf::from(
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into()),
    )
    .join("..");
    for path in [
        "crds/proxydeployments.proxyfleet.io.yaml",
        "charts/proxyfleet/crds/proxydeployments.proxyfleet.io.yaml",
    ] {
        let on_disk = std::fs::read_to_string(root.join(path)).unwrap_or_default();
        assert!(on_disk == generated, "{path} is out of date: run `make crds`");
    }
    let generated = proxyfleet_operator::schema::app_crd_yaml();
    for path in [
        "crds/approllouts.proxyfleet.io.yaml",
        "charts/proxyfleet/crds/approllouts.proxyfleet.io.yaml",
    ] {
        let on_disk = std::fs::read_to_string(root.join(path)).unwrap_or_default();
        assert!(on_disk == generated, "{path} is out of date: run `make crds`");
    }
    let generated = proxyfleet_operator::schema::policy_crd_yaml();
    for path in [
        "crds/proxyfleetpolicies.proxyfleet.io.yaml",
        "charts/proxyfleet/crds/proxyfleetpolicies.proxyfleet.io.yaml",
    ] {
        let on_disk = std::fs::read_to_string(root.join(path)).unwrap_or_default();
        assert!(on_disk == generated, "{path} is out of date: run `make crds`");
    }
}

#[test]
fn field_reference_matches_the_code() {
    let generated = proxyfleet_operator::schema::reference_markdown();
    let root = std::path::PathBuf::from(
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into()),
    )
    .join("..");
    let on_disk = std::fs::read_to_string(root.join("docs/crd-reference.md")).unwrap_or_default();
    assert!(
        on_disk == generated,
        "docs/crd-reference.md is out of date: run `make crds`"
    );
}
