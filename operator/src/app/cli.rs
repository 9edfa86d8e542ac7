//! `kubectl proxyfleet` for AppRollouts (`approllout/NAME` or `apr/NAME`): the same verbs as
//! for fleets — get [--watch], promote [--full], abort, retry, pause, resume, status.

use std::process::ExitCode;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;

use super::spec::AppRollout;
use crate::canary::rollout::COMMAND_ANNOTATION;
use crate::canary::spec::CanaryPhase;

/// The AppRollout a plugin argument names, if it names one.
pub fn app_name(arg: &str) -> Option<&str> {
    arg.strip_prefix("approllout/")
        .or_else(|| arg.strip_prefix("apr/"))
        .or_else(|| arg.strip_prefix("approllouts/"))
}

/// Sends `cmd` to the AppRollout's version read; read and sent again if it changed meanwhile.
pub async fn command(api: &Api<AppRollout>, name: &str, cmd: &str) -> Result<(), String> {
    for _ in 0..3 {
        let ar = api.get(name).await.map_err(|e| format!("approllout/{name}: {e}"))?;
        let canary = ar.status.as_ref().and_then(|s| s.canary.as_ref());
        if let Some(why) = crate::verdict::command_refusal(canary, cmd) {
            return Err(format!("approllout/{name}: {cmd} not sent: {why}"));
        }
        let patch = crate::command_annotation::send_patch(&ar.metadata, COMMAND_ANNOTATION, cmd)
            .map_err(|e| format!("approllout/{name}: {e}"))?;
        match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                println!("approllout/{name}: {cmd} requested");
                return Ok(());
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(format!("approllout/{name}: {e}")),
        }
    }
    Err(format!(
        "approllout/{name}: it kept changing while {cmd} was sent; try again"
    ))
}

pub fn render(ar: &AppRollout) -> String {
    let st = ar.status.clone().unwrap_or_default();
    let name = ar.metadata.name.clone().unwrap_or_default();
    let mut out = format!(
        "approllout/{name}  workload=deployment/{}  route={}/{}  weight={}%  stable={}  weights applied on {} proxy pods\n",
        ar.spec.workload_ref.name,
        ar.spec.route.proxy_deployment,
        ar.spec.route.name,
        st.weight,
        st.stable_revision.as_deref().unwrap_or("-"),
        st.weights_applied.as_deref().unwrap_or("-"),
    );
    for c in &st.conditions {
        out.push_str(&format!(
            "├─ condition {}={} ({}) {}\n",
            c.type_, c.status, c.reason, c.message
        ));
    }
    if let Some(canary) = &st.canary {
        out.push_str(&crate::canary::tree::render(Some(&ar.spec.strategy), canary));
    }
    out
}

pub async fn get(api: &Api<AppRollout>, name: &str, watch: bool) -> Result<(), String> {
    loop {
        let ar = api.get(name).await.map_err(|e| format!("approllout/{name}: {e}"))?;
        if watch {
            print!("\x1b[2J\x1b[H");
        }
        println!("{}", render(&ar));
        if !watch {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// What `status` concludes for `ar`, whose workload's template is at `template_revision` now
/// (None when it cannot be read): 0 only when that template is the stable one, 1 only when it
/// is the one aborted; a status from before a template change, or with a command not yet taken,
/// is no verdict (a workload's change does not move the AppRollout's generation).
pub fn verdict(ar: &AppRollout, template_revision: Option<&str>) -> crate::verdict::Verdict {
    use crate::verdict::Verdict;
    let pending = ar.annotations().contains_key(COMMAND_ANNOTATION);
    let st = ar.status.clone().unwrap_or_default();
    if pending || st.observed_generation != ar.metadata.generation {
        return Verdict::Pending;
    }
    let is_now = |rev: Option<&String>| template_revision.is_none_or(|t| rev.map(String::as_str) == Some(t));
    match st.canary.as_ref() {
        Some(c) if c.phase == CanaryPhase::Aborted && is_now(c.canary_revision.as_ref()) => {
            Verdict::Failed(format!("Aborted: {}", c.message.clone().unwrap_or_default()))
        }
        Some(c)
            if matches!(c.phase, CanaryPhase::Completed | CanaryPhase::Idle) && is_now(st.stable_revision.as_ref()) =>
        {
            Verdict::Ready(format!("stable at {}", st.stable_revision.clone().unwrap_or_default()))
        }
        _ => Verdict::Pending,
    }
}

/// Waits for the rollout to end: 0 when the workload's template is stable (or nothing rolls
/// out), 1 when it was aborted, 2 on timeout.
pub async fn status(api: &Api<AppRollout>, name: &str, timeout: u64) -> ExitCode {
    let label = format!("approllout/{name}");
    crate::verdict_wait::wait(&label, Duration::from_secs(timeout), || async {
        let ar = api.get(name).await?;
        Ok(verdict(&ar, workload_revision(api, &ar).await.as_deref()))
    })
    .await
}

/// The revision of the template the AppRollout's workload carries now, if it can be read.
async fn workload_revision(api: &Api<AppRollout>, ar: &AppRollout) -> Option<String> {
    let namespace = ar.metadata.namespace.as_deref()?;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(api.clone().into_client(), namespace);
    let d = deployments.get(&ar.spec.workload_ref.name).await.ok()?;
    Some(super::objects::template_revision(&d.spec?.template))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canary::spec::CanaryStatus;
    use crate::verdict::Verdict;

    fn rollout(phase: CanaryPhase, canary: &str, stable: &str) -> AppRollout {
        let spec = serde_json::from_value(serde_json::json!({
            "workloadRef": {"name": "shop"}, "port": 8080,
            "route": {"proxyDeployment": "edge", "name": "shop"},
            "strategy": {"steps": [{"setWeight": 50}]},
        }))
        .expect("spec");
        let mut ar = AppRollout::new("shop", spec);
        ar.metadata.generation = Some(2);
        ar.status = Some(super::super::spec::AppRolloutStatus {
            observed_generation: Some(2),
            stable_revision: Some(stable.into()),
            canary: Some(CanaryStatus {
                phase,
                canary_revision: Some(canary.into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        ar
    }

    /// `kubectl set image deploy/shop` moves the template, not the AppRollout's generation: a
    /// Completed status of the template before is no pass, an Aborted one no failure.
    #[test]
    fn only_the_workloads_template_now_decides() {
        let done = rollout(CanaryPhase::Completed, "v1", "v1");
        assert!(matches!(verdict(&done, Some("v1")), Verdict::Ready(_)));
        assert_eq!(verdict(&done, Some("v2")), Verdict::Pending);
        let aborted = rollout(CanaryPhase::Aborted, "v2", "v1");
        assert!(matches!(verdict(&aborted, Some("v2")), Verdict::Failed(_)));
        assert_eq!(verdict(&aborted, Some("v3")), Verdict::Pending);
        let mut retried = rollout(CanaryPhase::Aborted, "v2", "v1");
        retried.metadata.annotations = Some([(COMMAND_ANNOTATION.to_string(), "retry".to_string())].into());
        assert_eq!(verdict(&retried, Some("v2")), Verdict::Pending);
    }
}
