//! One ACME order, start to finish: the account (created once, kept in a Secret), the order
//! for the fleet's names, HTTP-01 answered through every proxy, finalisation with a fresh
//! P-256 key, the certificate chain. Runs as a task beside the reconciles; its result is
//! collected by the next reconcile of the fleet (see `acme_orders`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, ExternalAccountKey, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use proxyfleet_config::AcmeChallenges;

use super::acme_http::AcmeHttp;
use super::acme_orders::{Failure, Issued, Outcome};
use crate::context::Context;

/// Everything an order needs, read by the reconcile before the task starts.
pub struct OrderJob {
    pub namespace: String,
    pub fleet: String,
    pub names: Vec<String>,
    pub directory: String,
    pub email: Option<String>,
    /// Key id and raw HMAC key.
    pub eab: Option<(String, Vec<u8>)>,
    pub directory_ca: Option<String>,
    /// The stored account, if there is one.
    pub credentials: Option<String>,
}

fn fail(message: impl Into<String>) -> Failure {
    Failure {
        message: message.into(),
        retry_after: None,
    }
}

fn from_acme(doing: &str, e: instant_acme::Error) -> Failure {
    let retry_after = match &e {
        instant_acme::Error::Api(p) if p.r#type.as_deref().is_some_and(|t| t.ends_with(":rateLimited")) => {
            Some(super::ca::now() + 3600)
        }
        _ => None,
    };
    Failure {
        message: format!("{doing}: {e}"),
        retry_after,
    }
}

/// How long the ACME server may take to validate, and to issue after finalisation.
const VALIDATION: RetryPolicy = RetryPolicy::new()
    .initial_delay(Duration::from_millis(500))
    .backoff(1.5)
    .timeout(Duration::from_secs(120));
const ISSUANCE: RetryPolicy = RetryPolicy::new().timeout(Duration::from_secs(90));

pub async fn run(job: OrderJob, ctx: Arc<Context>) -> Outcome {
    let (account, new_credentials) = match account(&job).await {
        Ok(x) => x,
        Err(f) => {
            return Outcome {
                result: Err(f),
                new_credentials: None,
                account: None,
            }
        }
    };
    let result = order(&job, &account, &ctx).await;
    // The answers go whatever happened: a token is good for one order only.
    super::acme_push::push(
        &ctx,
        &job.namespace,
        &job.fleet,
        &AcmeChallenges::default(),
        Duration::ZERO,
    )
    .await;
    Outcome {
        result,
        new_credentials,
        account: Some(account.id().to_string()),
    }
}

async fn account(job: &OrderJob) -> Result<(Account, Option<String>), Failure> {
    let http = AcmeHttp::new(job.directory_ca.as_deref()).map_err(|e| fail(e.to_string()))?;
    let builder = Account::builder_with_http(Box::new(http));
    if let Some(stored) = &job.credentials {
        let creds: AccountCredentials =
            serde_json::from_str(stored).map_err(|e| fail(format!("reading the stored ACME account: {e}")))?;
        let account = builder
            .from_credentials(creds)
            .await
            .map_err(|e| from_acme("restoring the ACME account", e))?;
        return Ok((account, None));
    }
    let contact = job.email.as_ref().map(|e| format!("mailto:{e}"));
    let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
    let eab = job
        .eab
        .as_ref()
        .map(|(id, key)| ExternalAccountKey::new(id.clone(), key));
    let (account, creds) = builder
        .create(
            &NewAccount {
                contact: &contacts,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            job.directory.clone(),
            eab.as_ref(),
        )
        .await
        .map_err(|e| from_acme(&format!("creating an account at {}", job.directory), e))?;
    let stored = serde_json::to_string(&creds).map_err(|e| fail(format!("storing the ACME account: {e}")))?;
    Ok((account, Some(stored)))
}

async fn order(job: &OrderJob, account: &Account, ctx: &Context) -> Result<Issued, Failure> {
    let ids: Vec<Identifier> = job.names.iter().map(|n| Identifier::Dns(n.clone())).collect();
    let mut order = account
        .new_order(&NewOrder::new(&ids))
        .await
        .map_err(|e| from_acme("placing the order", e))?;
    let tokens = pending_challenges(&mut order).await?;
    if !tokens.is_empty() {
        let doc = AcmeChallenges { tokens };
        let (taken, total) =
            super::acme_push::push(ctx, &job.namespace, &job.fleet, &doc, Duration::from_secs(60)).await;
        if taken == 0 {
            return Err(fail(format!(
                "no proxy pod took the HTTP-01 challenges ({total} running): the fleet must run to be validated"
            )));
        }
        mark_ready(&mut order).await?;
    }
    let status = order
        .poll_ready(&VALIDATION)
        .await
        .map_err(|e| from_acme("waiting for validation", e))?;
    if status != OrderStatus::Ready {
        return Err(fail(why_invalid(&mut order, status).await));
    }
    let key_pem = order
        .finalize()
        .await
        .map_err(|e| from_acme("finalizing the order", e))?;
    let chain_pem = order
        .poll_certificate(&ISSUANCE)
        .await
        .map_err(|e| from_acme("downloading the certificate", e))?;
    Ok(Issued { chain_pem, key_pem })
}

/// token → key authorization for every authorization still pending.
async fn pending_challenges(order: &mut instant_acme::Order) -> Result<BTreeMap<String, String>, Failure> {
    let mut tokens = BTreeMap::new();
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz.map_err(|e| from_acme("reading an authorization", e))?;
        if authz.status != AuthorizationStatus::Pending {
            continue;
        }
        let name = authz.identifier().to_string();
        let challenge = authz
            .challenge(ChallengeType::Http01)
            .ok_or_else(|| fail(format!("the ACME server offers no http-01 challenge for {name}")))?;
        tokens.insert(
            challenge.token.clone(),
            challenge.key_authorization().as_str().to_string(),
        );
    }
    Ok(tokens)
}

async fn mark_ready(order: &mut instant_acme::Order) -> Result<(), Failure> {
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz.map_err(|e| from_acme("reading an authorization", e))?;
        if authz.status != AuthorizationStatus::Pending {
            continue;
        }
        if let Some(mut challenge) = authz.challenge(ChallengeType::Http01) {
            challenge
                .set_ready()
                .await
                .map_err(|e| from_acme("answering the challenge", e))?;
        }
    }
    Ok(())
}

/// The server's own words for an order that did not become ready: each failed challenge's
/// problem, else the order's.
async fn why_invalid(order: &mut instant_acme::Order, status: OrderStatus) -> String {
    let mut reasons = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(Ok(mut authz)) = authorizations.next().await {
        let name = authz.identifier().to_string();
        let Ok(state) = authz.refresh().await else { continue };
        for c in &state.challenges {
            if let Some(problem) = &c.error {
                reasons.push(format!("{name}: {problem}"));
            }
        }
    }
    if reasons.is_empty() {
        if let Some(problem) = &order.state().error {
            reasons.push(problem.to_string());
        }
    }
    if reasons.is_empty() {
        return format!("the order ended {status:?} without a reason from the server");
    }
    format!("validation failed: {}", reasons.join("; "))
}
