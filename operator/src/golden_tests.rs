//! Snapshot of everything a fleet owns, as YAML under operator/tests/golden/: a change to any
//! builder shows as a diff in review. `UPDATE_GOLDEN=1 cargo test -p proxyfleet-operator
//! golden` rewrites the files after an intended change.

use crate::desired::{desired_objects, desired_revision, TrackPlan};
use crate::labels::Track;
use crate::resources::deployment::MountedSecrets;
use crate::resources::fixtures::basic;
use crate::resources::OperatorSettings;

fn yaml_stream<T: serde::Serialize>(objects: &[T]) -> String {
    objects
        .iter()
        .map(|o| serde_yaml::to_string(o).expect("serializable"))
        .collect::<Vec<_>>()
        .join("---\n")
}

fn check(name: &str, actual: &str) {
    let path = std::path::PathBuf::from(
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into()),
    )
    .join("tests/golden")
    .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("golden dir");
        std::fs::write(&path, actual).expect("writing golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        expected == actual,
        "{} differs from what the builders produce; review, then UPDATE_GOLDEN=1 cargo test -p proxyfleet-operator golden\n--- produced:\n{actual}",
        path.display()
    );
}

#[test]
fn golden_owned_objects_of_a_fleet_in_a_canary() {
    let mut pxd = basic();
    pxd.spec.upstreams[0].tls = serde_json::from_value(serde_json::json!({"caSecret": "echo-ca"})).ok();
    let secrets = MountedSecrets {
        serving: Some("demo-tls".into()),
        client: None,
    };
    let settings = OperatorSettings {
        default_proxy_image: "proxyfleet.local/proxy:golden".into(),
        ..Default::default()
    };
    let rev = desired_revision(&pxd, &settings, &secrets).expect("a valid spec");
    let plans = [
        TrackPlan {
            track: Track::Stable,
            replicas: 1,
            revision: rev.clone(),
        },
        TrackPlan {
            track: Track::Canary,
            replicas: 1,
            revision: rev,
        },
    ];
    let d = desired_objects(&pxd, &plans, &secrets, "proxyfleet-system").expect("desired objects");
    let mut out = String::new();
    out += &yaml_stream(&d.service_account.into_iter().collect::<Vec<_>>());
    out += "---\n";
    out += &yaml_stream(&d.config_maps);
    out += "---\n";
    out += &yaml_stream(&d.deployments);
    out += "---\n";
    out += &yaml_stream(&d.services);
    out += "---\n";
    out += &yaml_stream(&d.pdb.into_iter().collect::<Vec<_>>());
    out += "---\n";
    out += &yaml_stream(&d.network_policy.into_iter().collect::<Vec<_>>());
    check("basic-fleet-in-canary.yaml", &out);
}
