//! At most one proxy pod down at a time by voluntary disruption, when there is more than one.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::Owner;
use crate::labels;

/// None when a budget would block every drain (fewer than two replicas).
pub fn desired_pdb(owner: &Owner, replicas: i32) -> Option<PodDisruptionBudget> {
    (replicas >= 2).then(|| PodDisruptionBudget {
        metadata: owner.meta(owner.name.clone()),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(labels::fleet_selector(&owner.name)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::fixtures::basic;

    #[test]
    fn only_with_two_or_more_replicas() {
        let owner = Owner::of(&basic()).unwrap();
        assert!(desired_pdb(&owner, 1).is_none());
        assert!(desired_pdb(&owner, 2).is_some());
    }
}
