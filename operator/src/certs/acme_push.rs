//! Hands the pending HTTP-01 challenges to every proxy of a fleet through its admin listener
//! (the same authenticated channel as live weights), so whichever replica the ACME server's
//! validation reaches answers it.

use std::time::Duration;

use proxyfleet_config::{AcmeChallenges, ACME_CHALLENGES_PATH};

use crate::context::Context;
use crate::resources::config_map::ADMIN_PORT;

/// Pushes `doc` to each running proxy pod of the fleet, retrying the pods that did not take
/// it (starting, or the admin token not mounted yet) for up to `patience`. Returns how many
/// took it and how many there are.
pub async fn push(
    ctx: &Context,
    namespace: &str,
    fleet: &str,
    doc: &AcmeChallenges,
    patience: Duration,
) -> (usize, usize) {
    let deadline = tokio::time::Instant::now() + patience;
    let body = doc.to_json();
    loop {
        let (mut taken, mut total) = (0, 0);
        let token = crate::app::token::read(ctx, namespace, fleet).await;
        if let (Ok(pods), Some(token)) = (crate::app::measure::proxy_pods(ctx, namespace, fleet).await, &token) {
            total = pods.len();
            for (pod, ip, _) in &pods {
                let url = format!("http://{ip}:{ADMIN_PORT}{ACME_CHALLENGES_PATH}");
                match ctx.http.put(&url, token, body.clone()).await {
                    Ok(()) => taken += 1,
                    Err(e) => tracing::info!(%pod, error = %e, "ACME challenges not taken yet"),
                }
            }
        }
        if (total > 0 && taken == total) || tokio::time::Instant::now() >= deadline {
            return (taken, total);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
