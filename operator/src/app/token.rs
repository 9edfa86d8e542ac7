//! The admin token of a fleet: a random bearer secret its proxies require for weight pushes.
//! Created once per fleet (owned by it, so it goes with it) and never rewritten: rotating it
//! would lock out pushes until every pod's mounted copy caught up.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;
use ring::rand::SecureRandom;

use super::weights::{token_secret_name, TOKEN_KEY};
use crate::context::Context;
use crate::resources::Owner;

fn random_token() -> Option<String> {
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Creates the fleet's token Secret when it does not exist yet.
pub async fn ensure(ctx: &Context, owner: &Owner) {
    let name = token_secret_name(&owner.name);
    if ctx
        .stores
        .secrets
        .get(&ObjectRef::new(&name).within(&owner.namespace))
        .is_some()
    {
        return;
    }
    let Some(token) = random_token() else {
        tracing::error!("no randomness for the admin token");
        return;
    };
    let secret = Secret {
        metadata: owner.meta(name.clone()),
        data: Some(BTreeMap::from([(
            TOKEN_KEY.to_string(),
            ByteString(token.into_bytes()),
        )])),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => ctx.metrics.api_write("Secret", "create"),
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => tracing::warn!(secret = %name, error = %e, "creating the admin token failed"),
    }
}

/// The fleet's admin token, read from the API server (the pods' mounted copy is what counts,
/// and it is never rewritten, so any read is current).
pub async fn read(ctx: &Context, namespace: &str, fleet: &str) -> Option<String> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let s = secrets.get_opt(&token_secret_name(fleet)).await.ok()??;
    let bytes = s.data?.get(TOKEN_KEY)?.0.clone();
    String::from_utf8(bytes).ok().map(|t| t.trim().to_string())
}
