use k8s_openapi::api::core::v1::ServiceAccount;

use super::Owner;

/// The proxies' ServiceAccount: they never call the API, so no token is mounted.
pub fn desired_service_account(owner: &Owner) -> ServiceAccount {
    ServiceAccount {
        metadata: owner.meta(service_account_name(&owner.name)),
        automount_service_account_token: Some(false),
        ..Default::default()
    }
}

pub fn service_account_name(pxd: &str) -> String {
    format!("{pxd}-proxy")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::fixtures::basic;

    #[test]
    fn no_token_and_owned() {
        let sa = desired_service_account(&Owner::of(&basic()).unwrap());
        assert_eq!(sa.metadata.name.as_deref(), Some("demo-proxy"));
        assert_eq!(sa.automount_service_account_token, Some(false));
        assert_eq!(sa.metadata.owner_references.unwrap()[0].kind, "ProxyDeployment");
    }
}
