//! Measuring an app's canary and stable from the proxies in front of them: every pod of the
//! fleet serves both backends, so each scrape yields a canary and a stable series per pod,
//! told apart by the `upstream` label (`<rollout>-canary`, `<rollout>-stable`).

use std::collections::HashMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::objects::AppOwner;
use super::render::{track_name, AppTrack};
use crate::canary::analysis::Window;
use crate::canary::machine::Measurement;
use crate::canary::rollout::{judge, prometheus_pair, Subject};
use crate::canary::source::{parse_proxy_metrics_of, MeasureError, PodCounters, Snapshot, PODS_AT_ONCE};
use crate::canary::spec::Analysis;
use crate::context::Context;
use crate::labels;
use crate::resources::config_map::ADMIN_PORT;

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// One proxy pod's /metrics, with the pod's name and start.
async fn scrape(
    ctx: &Context,
    pod: String,
    ip: String,
    started_at: Option<i64>,
) -> (String, Option<i64>, Result<String, crate::canary::source::HttpError>) {
    let text = ctx.http.get(&format!("http://{ip}:{ADMIN_PORT}/metrics")).await;
    (pod, started_at, text)
}

/// Key of an app's snapshots (apart from the fleets', which are keyed `namespace/name`).
pub fn snapshot_key(owner: &AppOwner) -> String {
    format!("app:{}/{}", owner.namespace, owner.name)
}

/// The PromQL selector of one backend of the app, as the proxies of `fleet` report it.
pub fn selector(owner: &AppOwner, fleet: &str, track: AppTrack) -> String {
    format!(
        "namespace=\"{}\",proxydeployment=\"{fleet}\",upstream=\"{}\"",
        owner.namespace,
        track_name(&owner.name, track)
    )
}

/// The names, IPs and start times of a fleet's Ready proxy pods: the ones the fleet's Service
/// sends traffic to (one that is not, say crash-looping, carries none, and would hold every
/// weight step waiting for a confirmation it cannot give; once Ready it is pushed to).
pub async fn proxy_pods(
    ctx: &Context,
    namespace: &str,
    fleet: &str,
) -> Result<Vec<(String, String, Option<i64>)>, MeasureError> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let list = pods
        .list(&ListParams::default().labels(&format!("{}={fleet}", labels::INSTANCE)))
        .await
        .map_err(|source| MeasureError::ListPods {
            namespace: namespace.to_string(),
            fleet: fleet.to_string(),
            source,
        })?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        // An evicted or finished pod keeps its IP in its status; the IP may be another pod's now.
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed")) && crate::canary::rollout::pod_ready(p)
        })
        .filter_map(|p| {
            let started = crate::canary::rollout::started_at(&p);
            Some((p.metadata.name?, p.status?.pod_ip?, started))
        })
        .collect())
}

async fn direct_windows(
    ctx: &Context,
    owner: &AppOwner,
    fleet: &str,
    window_secs: i64,
) -> Result<Option<(Window, Window, i64)>, MeasureError> {
    let (canary, stable) = (
        track_name(&owner.name, AppTrack::Canary),
        track_name(&owner.name, AppTrack::Stable),
    );
    let mut snap = Snapshot {
        at: now(),
        canary: HashMap::new(),
        stable: HashMap::new(),
    };
    let mut scraped = 0;
    let mut scrapes = Vec::new();
    for (pod, ip, started_at) in proxy_pods(ctx, &owner.namespace, fleet).await? {
        scrapes.push(scrape(ctx, pod, ip, started_at));
    }
    let answers: Vec<_> = futures::stream::iter(scrapes)
        .buffer_unordered(PODS_AT_ONCE)
        .collect()
        .await;
    for (pod, started_at, text) in answers {
        match text {
            Ok(text) => {
                scraped += 1;
                let of = |upstream: &str| PodCounters {
                    started_at,
                    ..parse_proxy_metrics_of(&text, Some(upstream))
                };
                snap.canary.insert(pod.clone(), of(&canary));
                snap.stable.insert(pod, of(&stable));
            }
            Err(e) => tracing::debug!(%pod, error = %e, "scrape failed"),
        }
    }
    if scraped == 0 {
        return Err(MeasureError::NoPodScraped {
            namespace: owner.namespace.clone(),
            fleet: fleet.to_string(),
        });
    }
    Ok(ctx.snapshots.push(&snapshot_key(owner), snap, window_secs))
}

/// One measurement of every metric of `analysis` for the app's canary against its stable.
pub async fn measure(ctx: &Context, owner: &AppOwner, fleet: &str, analysis: &Analysis) -> Measurement {
    let window_secs = analysis.window.get().as_secs().max(1) as i64;
    let taken_at = now();
    let subject = Subject {
        namespace: &owner.namespace,
        name: &owner.name,
        canary_selector: selector(owner, fleet, AppTrack::Canary),
        stable_selector: selector(owner, fleet, AppTrack::Stable),
    };
    let builtin = analysis.metrics.iter().any(|m| m.prometheus.is_none());
    let windows = if !builtin {
        Ok(None)
    } else if let Some(p) = &analysis.source.prometheus {
        let selectors = [subject.canary_selector.as_str(), subject.stable_selector.as_str()];
        prometheus_pair(ctx, &p.address, selectors, window_secs)
            .await
            .map(|(c, s)| Some((c, s, taken_at - window_secs)))
    } else {
        direct_windows(ctx, owner, fleet, window_secs).await
    };
    judge(ctx, analysis, &subject, windows, taken_at).await
}

/// Drops the app's snapshots (a rollout ended).
pub fn forget(ctx: &Context, owner: &AppOwner) {
    ctx.snapshots.forget(&snapshot_key(owner));
}
